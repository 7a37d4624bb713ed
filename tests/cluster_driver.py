"""Driver script for the multi-executor tests: run the four program shapes
against a Spark master given on the command line and print one JSON line.

    python tests/cluster_driver.py spark://127.0.0.1:7077 2 [SHAPES]

SHAPES: comma-separated subset of rotation,block_lstsq,priority_lasso,sgd,estimators,checkpoint_refusal,
partition (default: the four shapes; ``estimators`` fits StradsLDA, StradsMF and StradsLasso;
``checkpoint_refusal`` tries a fit with a bare checkpoint path; ``partition`` cuts a host off
mid-fit with the commands in ``CLUSTER_DRIVER_CUT``). Extra Spark settings come as JSON
in ``CLUSTER_DRIVER_CONF``; with ``CLUSTER_DRIVER_HOLD`` set the driver waits for a line on stdin
after its result, before ``spark.stop()``.
Besides each result, it reports every shard's advertised address and the addresses its
port listens on (read from /proc/<shard pid>/net/tcp: the shards run on this machine, if
perhaps in another network namespace).
"""

import faulthandler
import ipaddress
import json
import os
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
faulthandler.enable(all_threads=True)  # a native crash prints every thread's Python stack to the test's log

import numpy as np  # noqa: E402

from pystrads.programs import examples as ex  # noqa: E402
from pystrads.session import spark_session  # noqa: E402
from shapes import run_block_lstsq, run_estimators, run_priority_lasso, run_rotation, run_sgd  # noqa: E402


def listen_addresses(port, pid=None):
    """Addresses on which some process listens on ``port`` in the network namespace of ``pid``
    (default: this process's) -- its net/tcp and tcp6 tables; gRPC listens on an IPv6 socket,
    where an IPv4 address shows as ::ffff:a.b.c.d."""
    found = []
    base = f"/proc/{pid}/net" if pid else "/proc/net"
    for table in (f"{base}/tcp", f"{base}/tcp6"):
        if not os.path.exists(table):
            continue
        with open(table) as fh:
            for line in fh.readlines()[1:]:
                local, _remote, state = line.split()[1:4]
                addr, hex_port = local.split(":")
                if state != "0A" or int(hex_port, 16) != port:  # 0A: LISTEN
                    continue
                raw = bytes.fromhex(addr)  # 32-bit words in host (little-endian) order
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                ip = ipaddress.ip_address(raw)
                found.append(str(ip.ipv4_mapped or ip) if ip.version == 6 else str(ip))
    return sorted(set(found))


def connects(host, port):
    try:
        with socket.create_connection((host, port), timeout=5):
            return True
    except OSError:
        return False


SHAPES = {"rotation": run_rotation, "block_lstsq": run_block_lstsq, "priority_lasso": run_priority_lasso,
          "sgd": run_sgd}


def refuse_bare_checkpoint_path(sc):
    """A fit with a scheme-less checkpoint.dir on this multi-host cluster: the error, and the
    Spark jobs started on the way (none)."""
    from pystrads.engine import Engine
    from pystrads.errors import ConfigurationError
    from pystrads.programs.examples import EmptyProgram

    jobs = len(sc.statusTracker().getJobIdsForGroup())
    try:
        Engine(EmptyProgram(4), sc.parallelize(range(4), 2),
               config={"checkpoint.dir": "/tmp/pystrads-ckpt", "checkpoint.interval": 1}).fit()
        error = None
    except ConfigurationError as exc:
        error = str(exc)
    return {"error": error, "jobs": len(sc.statusTracker().getJobIdsForGroup()) - jobs}


class CutOffOnce(ex.RotationSum):
    """RotationSum whose ``schedule`` of step ``at`` cuts a host off from the others for
    ``seconds`` (``down`` / ``up``: the commands), once in the driver process; each push takes
    20 ms, so the fit runs well past the cut."""

    def __init__(self, num_keys, iterations, at, down, up, seconds):
        super().__init__(num_keys, iterations)
        self.at, self.down, self.up, self.seconds = at, down, up, seconds

    def schedule(self, ctx):
        if ctx.step == self.at and not _CUTS:
            _CUTS.append(time.time())
            subprocess.run(self.down, check=True)

            def plug_back():
                time.sleep(self.seconds)
                subprocess.run(self.up, check=True)
                _CUTS.append(time.time())

            threading.Thread(target=plug_back, daemon=True).start()
        return super().schedule(ctx)

    def push(self, ctx, data, state, block):
        time.sleep(0.02)
        return super().push(ctx, data, state, block)


_CUTS = []  # when the cut began and ended (this process's clock)


def partition(sc, cut):
    """A fit whose second worker host is cut off from the others mid-fit (its shard, its
    executor, its worker) for ``cut["seconds"]``: its sums, the closed form, recoveries, and
    the fit's seconds from the cut to its end."""
    from pystrads.engine import Engine

    rng = np.random.default_rng(0)
    keys, vals = rng.integers(0, 300, 5000), rng.random(5000)
    rdd = sc.parallelize(list(zip(keys.tolist(), vals.tolist())), 2)
    program = CutOffOnce(300, 60, 3, cut["down"], cut["up"], cut["seconds"])
    with Engine(program, rdd, seed=1, config={"step.targetSeconds": 0.3}).fit() as res:
        got = res.read_table("sums")[:, 0]
        summary = res.summary
    ended = time.time()
    return {"result": got.tolist(), "expected": (60 * np.bincount(keys, vals, 300)).tolist(),
            "recoveries": summary.fixed.get("recoveries", 0), "cut_to_end_s": ended - _CUTS[0],
            "cut_s": _CUTS[1] - _CUTS[0] if len(_CUTS) > 1 else None}


def main(master, executors, shapes=None):
    conf = {"spark.executor.cores": "1", "spark.cores.max": str(executors), "spark.executor.memory": "1g",
            "spark.ui.enabled": "false", "spark.pystrads.executor.waitSeconds": "120"}
    conf.update(json.loads(os.environ.get("CLUSTER_DRIVER_CONF", "{}")))  # e.g. Spark's own authentication
    spark = spark_session(master, "pystrads-cluster-test", conf)
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    deadline = time.time() + 120
    while sc._jsc.sc().getExecutorMemoryStatus().size() - 1 < executors and time.time() < deadline:
        time.sleep(0.5)
    out = {"executors": sc._jsc.sc().getExecutorMemoryStatus().size() - 1,
           "driver_host": sc.getConf().get("spark.driver.host")}
    for name in shapes or list(SHAPES):
        if name == "estimators":
            out[name] = run_estimators(spark)
            continue
        if name == "checkpoint_refusal":
            out[name] = refuse_bare_checkpoint_path(sc)
            continue
        if name == "partition":  # CLUSTER_DRIVER_CUT: {"down": [...], "up": [...], "seconds": s}
            out[name] = partition(sc, json.loads(os.environ["CLUSTER_DRIVER_CUT"]))
            continue
        got, expected, summary = SHAPES[name](sc)[:3]
        out[name] = {"result": np.asarray(got).tolist(), "expected": np.asarray(expected).tolist(),
                     "rounds": summary.total_rounds}
    from pystrads.ps import launcher

    manager = next(iter(launcher._MANAGERS.values()))
    out["token"], out["admin_token"] = manager.token, manager.admin_token  # to look for on the wire
    out["trust"] = (manager.group.tls_root_certs or b"").decode()  # the run's certificates (public)
    # the run's client certificate and key (mutual TLS): the test dials a shard with and without them
    out["client_cert"] = [c.decode() for c in manager.group.client_cert] if manager.group.client_cert else None
    out["shards"] = [{"executor": s.executor, "host": s.host, "port": s.port, "pid": s.pid, "uri": s.uri,
                      "listen": listen_addresses(s.port, s.pid), "loopback_connects": connects("127.0.0.1", s.port),
                      "host_connects": connects(s.host, s.port)}
                     for s in manager.group.shards]
    print("RESULT " + json.dumps(out), flush=True)
    if os.environ.get("CLUSTER_DRIVER_HOLD"):  # the test kills an executor meanwhile
        sys.stdin.readline()
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",") if len(sys.argv) > 3 else None)
