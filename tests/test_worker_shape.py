"""The workers a fit runs without settings: one per executor, computing with that executor's
cores (local mode: one worker with the local cores); explicit ``numWorkers``,
``spark.task.cpus`` and ``spark.pystrads.worker.threads`` still win.  And one pre-flight: the Spark
handle is built once per fit and the task slots are read once."""

import pytest

from pystrads import spark as spark_module
from pystrads.config import Config
from pystrads.engine.driver import preflight as pf
from pystrads.ml import StradsLasso
from pystrads.testing import _linear_data


class _Handle(spark_module.SparkHandle):
    """A handle of a made-up application: its master and settings."""

    def __init__(self, master, conf=None, connect=False, default_parallelism=None, executors=None):
        self._master, self._conf, self.connect = master, dict(conf or {}), connect
        if default_parallelism is not None:
            self.sc = type("SC", (), {"defaultParallelism": default_parallelism})()
        self._executors = executors

    @property
    def master(self):
        return self._master

    def conf(self, key, default=None):
        return self._conf.get(key, default)

    def conf_items(self, prefix):
        return {k: v for k, v in self._conf.items() if k.startswith(prefix)}


class _Input:
    """An input of 16 partitions."""

    def getNumPartitions(self):
        return 16


def _shape(h, requested=None, data=_Input(), config=None, per_executor=True):
    return pf.worker_shape(h, Config.resolve(h.conf_items("spark.pystrads."), config), data, requested,
                           pf._slots(h), per_executor)


def test_local_mode_runs_one_worker_with_the_local_cores():
    assert _shape(_Handle("local[2]")) == (1, 2, None)
    assert _shape(_Handle("local[8]")) == (1, 8, None)
    assert _shape(_Handle("local")) == (1, 1, None)
    assert _shape(_Handle("local[2]", connect=True)) == (1, 2, None)  # a Connect server in local mode


def test_explicit_settings_keep_one_worker_per_task_slot():
    assert _shape(_Handle("local[4]"), requested=3) == (3, 1, None)
    assert _shape(_Handle("local[4]", {"spark.task.cpus": "2"})) == (2, 2, None)
    assert _shape(_Handle("local[4]"), requested=2, config={"worker.threads": 2}) == (2, 2, None)


def test_the_program_api_and_single_threaded_programs_keep_one_worker_per_task_slot(sc):
    """The Program API's default (a program's schedules give one work item per worker), and SGD
    matrix factorisation (one thread per worker: one worker per executor would idle the rest)."""
    from pystrads.engine import Engine
    from pystrads.ml import StradsMF
    from pystrads.programs import examples

    assert _shape(_Handle("local[4]"), per_executor=False) == (4, 1, None)
    assert StradsMF()._multithreaded() and not StradsMF(algorithm="sgd")._multithreaded()
    engine = Engine(examples.RotationSum(10, iterations=1), sc.parallelize(range(10), 2))
    assert (engine.num_workers, engine.threads) == (2, 1)


def test_a_cluster_runs_one_worker_per_executor_asking_for_its_cores(monkeypatch):
    monkeypatch.setattr(pf, "_profiles_run", lambda h, data: True)
    assert _shape(_Handle("local-cluster[2, 4, 1024]")) == (2, 4, 4)
    connect = _Handle("spark://m:7077", {"spark.executor.instances": "3", "spark.executor.cores": "8"}, connect=True)
    assert _shape(connect) == (3, 8, 8)
    monkeypatch.setattr(pf, "expected_executors", lambda h: 2)
    assert _shape(_Handle("spark://m:7077", default_parallelism=8)) == (2, 4, 4)  # standalone: every core
    assert _shape(_Handle("yarn", {"spark.executor.cores": "3"}, default_parallelism=6)) == (2, 3, 3)


def test_without_task_profiles_a_cluster_keeps_a_worker_per_slot_and_says_what_to_set(monkeypatch, caplog):
    monkeypatch.setattr(pf, "_profiles_run", lambda h, data: False)
    with caplog.at_level("INFO", logger="pystrads.engine.driver.preflight"):
        assert _shape(_Handle("local-cluster[2, 4, 1024]")) == (8, 1, None)
    assert "set spark.task.cpus=4 to run one worker per executor with 4 threads" in caplog.text


def test_a_default_local_fit_runs_one_worker_with_both_cores(spark):
    df = _linear_data(spark, False)
    default = StradsLasso(regParam=0.01, maxIter=20).fit(df).summary.fixed
    assert (default["workers"], default["threads"]) == (1, 2)
    explicit = StradsLasso(regParam=0.01, maxIter=20, numWorkers=2).fit(df).summary.fixed
    assert (explicit["workers"], explicit["threads"]) == (2, 1)
    with pytest.raises(Exception, match=r"numWorkers=3 needs 3 task slots .* offers 2; lower numWorkers to 2"):
        StradsLasso(numWorkers=3).fit(df)


def test_one_estimator_fit_builds_one_spark_handle_and_reads_the_slots_once(spark, monkeypatch):
    df = _linear_data(spark, False)
    built, slot_reads = [], []
    for cls in (spark_module.ClassicHandle, spark_module.ConnectHandle):
        init = cls.__init__
        monkeypatch.setattr(cls, "__init__", lambda self, *a, _init=init, **k: (built.append(self), _init(self, *a, **k))[1])
    slots = pf._slots
    monkeypatch.setattr(pf, "_slots", lambda h: (slot_reads.append(h), slots(h))[1])
    StradsLasso(regParam=0.01, maxIter=5).fit(df)
    assert len(built) == 1 and len(slot_reads) == 1


CLUSTER_FIT = """
import json, sys
from pystrads.session import spark_session
from pystrads.testing import _lda_data, _linear_data
from pystrads.ml import StradsLDA, StradsLasso

spark = spark_session("local-cluster[2,2,1024]", "pystrads-shape", {"spark.ui.enabled": "false"})
spark.sparkContext.setLogLevel("ERROR")
out = {}
for name, est, df in (("lda", StradsLDA(k=2, maxIter=10, seed=1), _lda_data(spark)),
                      ("lasso", StradsLasso(regParam=0.01, maxIter=50), _linear_data(spark, False))):
    model = est.fit(df)
    out[name] = {"workers": model.summary.fixed["workers"], "threads": model.summary.fixed["threads"]}
    if name == "lasso":
        out[name]["coefficients"] = model.coefficients.toArray().tolist()
print(json.dumps(out))
spark.stop()
"""


@pytest.mark.slow
def test_a_default_fit_on_two_two_core_executors_runs_one_two_threaded_worker_on_each(spark):
    """A standalone cluster (``local-cluster``: a master and two workers of 2 cores): the barrier
    task asks for 2 cores through a task resource profile, so each executor holds one worker
    computing with 2 threads; the model is the one of local mode."""
    import json
    import subprocess
    import sys

    import numpy as np

    proc = subprocess.run([sys.executable, "-c", CLUSTER_FIT], capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, proc.stderr[-4000:]
    got = json.loads(lines[-1])
    for name in ("lda", "lasso"):
        assert (got[name]["workers"], got[name]["threads"]) == (2, 2), got
    local = StradsLasso(regParam=0.01, maxIter=50, numWorkers=2).fit(_linear_data(spark, False))
    np.testing.assert_allclose(got["lasso"]["coefficients"], local.coefficients.toArray(), atol=1e-9)
