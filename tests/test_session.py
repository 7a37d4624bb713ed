"""Session helpers: what the engine reads of a classic session and of a Spark Connect one."""

import pytest

from pystrads.spark import ClassicHandle, ConnectHandle, handle_of, slots_from_master
from pystrads.errors import ConfigurationError


def test_classic_inputs_give_their_context(spark, sc):
    for obj in (spark.range(1), spark, sc, sc.parallelize([1])):
        h = handle_of(obj)
        assert isinstance(h, ClassicHandle) and h.sc is sc and not h.connect
    assert handle_of(spark).master == "local[2]" and handle_of(spark).local_mode()


def test_connect_sessions_get_the_connect_handle_and_other_objects_are_refused():
    ConnectSession = type("SparkSession", (), {"__module__": "pyspark.sql.connect.session"})
    frame = type("DataFrame", (), {"sparkSession": ConnectSession(), "__module__": "pyspark.sql.connect.dataframe"})()
    assert isinstance(handle_of(frame), ConnectHandle) and handle_of(frame).connect
    with pytest.raises(ConfigurationError, match="expected a SparkContext, SparkSession, RDD or DataFrame, got int"):
        handle_of(3)


def test_slots_known_from_the_master_url():
    assert slots_from_master("local", 1) == 1
    assert slots_from_master("local[4]", 2) == 2
    assert slots_from_master("local-cluster[3, 2, 1024]", 1) == 6
    assert slots_from_master("spark://host:7077", 1) is None


def test_rdd_and_dataframe_jobs_share_one_pool_of_python_workers(spark, sc):
    """A session from spark_session runs RDD tasks and mapInArrow tasks in workers forked by one
    Python daemon (the workers' parent), so a first fit does not start a second pool."""
    import os

    import pyarrow as pa

    def parent(batches):
        for _ in batches:
            pass
        yield pa.RecordBatch.from_arrays([pa.array([os.getppid()], pa.int64())], ["ppid"])

    rdd_parents = set(sc.parallelize(range(2), 2).mapPartitions(lambda it: [os.getppid()]).collect())
    frame_parents = {r.ppid for r in spark.range(0, 2, 1, 2).mapInArrow(parent, "ppid long").collect()}
    assert len(rdd_parents) == 1 and frame_parents == rdd_parents, (rdd_parents, frame_parents)


def test_python_workers_fork_from_a_daemon_that_loaded_numba(sc):
    """A session from spark_session forks its Python workers from pystrads.daemon, which loaded
    numba (its compiler library is mapped in the daemon) and readied its CPU target before
    forking: a worker's first kernel call does not load them again."""
    import os

    def probe(_):
        parent = os.getppid()
        with open(f"/proc/{parent}/cmdline", "rb") as fh:
            cmdline = fh.read().split(b"\0")
        with open(f"/proc/{parent}/maps") as fh:
            llvm_in_daemon = "libllvmlite" in fh.read()
        from numba.core.registry import cpu_target

        ready = bool(cpu_target.target_context._registries)  # what refresh() fills in
        return [(b"pystrads.daemon" in cmdline, llvm_in_daemon, ready)]

    assert sc.parallelize(range(2), 2).mapPartitions(probe).collect() == [(True, True, True)] * 2


def test_the_preloading_daemon_is_set_only_where_its_module_is_installed(monkeypatch):
    """Spark's daemon starts before a worker adds --py-files archives to its path: a pystrads
    imported from a zip gets Spark's own daemon, an installed one pystrads.daemon."""
    import pystrads
    from pystrads.session import ONE_WORKER_POOL, PRELOADED_WORKERS, worker_settings

    assert worker_settings() == {**ONE_WORKER_POOL, **PRELOADED_WORKERS}
    monkeypatch.setattr(pystrads, "__file__", "/jobs/pystrads.zip/pystrads/__init__.py")
    assert worker_settings() == ONE_WORKER_POOL
