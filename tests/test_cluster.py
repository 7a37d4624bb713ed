"""The distributed path on a real multi-executor cluster: a Spark standalone
master and two workers on 127.0.0.1, started with pyspark's own
``bin/spark-class``; a driver subprocess runs the four program shapes."""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyspark
import pytest

from shapes import run_block_lstsq, run_priority_lasso, run_rotation, run_sgd

HERE = os.path.dirname(os.path.abspath(__file__))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(path, text, proc, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{path}: process exited with {proc.returncode}:\n{open(path).read()[-3000:]}")
        if os.path.exists(path) and text in open(path, errors="replace").read():
            return
        time.sleep(0.3)
    raise TimeoutError(f"{path}: no {text!r} within {timeout} s:\n{open(path).read()[-3000:]}")


#: Workers beyond the two an application uses: each executor-loss test kills one (with its
#: executor), and the master moves the application onto a spare.
SPARE_WORKERS = 3


@pytest.fixture(scope="module")
def standalone_cluster():
    spark_home = os.path.dirname(pyspark.__file__)
    spark_class = os.path.join(spark_home, "bin", "spark-class")
    work = tempfile.mkdtemp(prefix="pystrads-cluster-")
    env = dict(os.environ, SPARK_HOME=spark_home, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
               SPARK_WORKER_DIR=work, SPARK_LOG_DIR=work)
    port = _free_port()
    url = f"spark://127.0.0.1:{port}"
    procs = []

    def start(args, log):
        path = os.path.join(work, log)
        proc = subprocess.Popen([spark_class] + args, env=env, stdout=open(path, "w"), stderr=subprocess.STDOUT,
                                start_new_session=True)
        procs.append(proc)
        return proc, path

    try:
        master, mlog = start(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                              "--webui-port", str(_free_port())], "master.log")
        _wait_for(mlog, "I have been elected leader", master, 120)
        workers = [start(["org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1", "--cores", "1",
                          "--memory", "2g", "--webui-port", str(_free_port()), "--work-dir",
                          os.path.join(work, f"w{i}")], f"worker{i}.log") for i in range(2 + SPARE_WORKERS)]
        for proc, path in workers:
            _wait_for(path, "Successfully registered with master", proc, 120)
        yield url, work
    finally:
        for proc in procs:  # each in its own process group, executors included
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in procs:
            proc.wait(30)


@pytest.mark.slow
def test_program_shapes_on_two_executors_match_local_mode(standalone_cluster, sc):
    url, work = standalone_cluster
    proc = subprocess.run([sys.executable, os.path.join(HERE, "cluster_driver.py"), url, "2"],
                          capture_output=True, text=True, timeout=900, cwd=os.path.dirname(HERE),
                          env=dict(os.environ, PYSPARK_PYTHON=sys.executable))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"driver failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    out = json.loads(lines[0][len("RESULT "):])
    assert out["executors"] == 2
    # one shard per executor, each on the loopback address
    executors = [s["executor"] for s in out["shards"]]
    assert len(out["shards"]) == 2 and len(set(executors)) == 2, out["shards"]
    assert all(s["host"] == "127.0.0.1" for s in out["shards"])
    local = {"rotation": run_rotation(sc), "block_lstsq": run_block_lstsq(sc),
             "priority_lasso": run_priority_lasso(sc), "sgd": run_sgd(sc)}
    tolerances = {"rotation": 1e-9, "block_lstsq": 1e-8, "priority_lasso": 1e-6, "sgd": 1e-6}
    for name, (got_local, expected, _summary, *_rest) in local.items():
        cluster = np.array(out[name]["result"])
        assert np.allclose(cluster, expected, atol=tolerances[name]), (name, np.abs(cluster - expected).max())
        assert np.allclose(cluster, got_local, atol=tolerances[name]), (name, np.abs(cluster - got_local).max())


@pytest.mark.slow
@pytest.mark.parametrize("program", ["lda", "mf", "lasso"])
def test_lost_executor_is_replaced_and_the_fit_recovers(standalone_cluster, program):
    """A lost machine: SIGKILL a standalone worker JVM, its executor and that executor's shard
    mid-step. Spark moves the application to a spare worker; the engine restarts the shards and
    continues from the latest checkpoint."""
    from test_faults import check, reference, run_driver

    url, work = standalone_cluster
    ref = reference(program)
    got = run_driver(program, "executor", tempfile.mkdtemp(dir=work), master=url)
    assert got["recoveries"] >= 1 and got["resumed_from_step"] is not None
    check(program, "SIGKILL executor + worker JVM", got, ref)
