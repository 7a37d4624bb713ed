"""The workers a fit runs without settings: one per executor, computing with that executor's
cores (local mode: one worker with the local cores); explicit ``numWorkers``,
``spark.task.cpus`` and ``spark.pystrads.worker.threads`` still win.  And one pre-flight: the Spark
handle is built once per fit and the task slots are read once."""

import pytest

from pystrads import spark as spark_module
from pystrads.config import Config
from pystrads.engine import preflight as pf
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


def test_a_program_that_computes_on_one_thread_keeps_one_worker_per_task_slot():
    """A Program without ``multithreaded`` (a user's, or SGD matrix factorisation) would leave
    every core but one idle in one worker per executor."""
    from pystrads.ml import StradsMF
    from pystrads.programs import examples
    from pystrads.programs.lda import LDAProgram

    assert _shape(_Handle("local[4]"), per_executor=False) == (4, 1, None)
    assert not examples.RotationSum.multithreaded and LDAProgram.multithreaded
    assert StradsMF()._multithreaded() and not StradsMF(algorithm="sgd")._multithreaded()


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
    with caplog.at_level("INFO", logger="pystrads.engine.preflight"):
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
