"""What pystrads needs from a Spark application, for a classic session and for Spark Connect.

A classic application has a SparkContext: RDDs, job groups, a status tracker
and the executors' registry.  A Spark Connect session (Databricks serverless
and standard-access compute, ``SparkSession.builder.remote(...)``) has none
of them, only DataFrames, runtime configuration and job tags.  The engine
and the shard launcher talk to Spark through a :class:`SparkHandle` so that
both kinds run the same code; each method says what it does on either side.

``handle_of(obj)`` accepts a SparkContext, a SparkSession (classic or
Connect), an RDD or a DataFrame.
"""

from __future__ import annotations

import pickle
import re
from typing import Any, Callable, Dict, List, Optional

from .errors import ConfigurationError


def is_connect_session(spark) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")


def is_dataframe(obj) -> bool:
    return type(obj).__name__ == "DataFrame" and type(obj).__module__.startswith("pyspark.sql")


class SparkHandle:
    """The Spark application a fit runs in (see the module docstring)."""

    connect = False

    @property
    def master(self) -> str:
        raise NotImplementedError

    def conf(self, key: str, default: Optional[str] = None) -> Optional[str]:
        raise NotImplementedError

    def conf_items(self, prefix: str) -> Dict[str, str]:
        raise NotImplementedError

    def run_tasks(self, fn: Callable[[int], List[Any]], num_tasks: int) -> List[Any]:
        """Run ``fn(index)`` in ``num_tasks`` tasks on the executors; the concatenated results."""
        raise NotImplementedError

    @property
    def key(self) -> Any:
        """Identifies the application (one shard group per application)."""
        raise NotImplementedError

    def alive(self) -> bool:
        raise NotImplementedError

    def local_mode(self) -> bool:
        return self.master.startswith("local")

    def hosts(self) -> Optional[set]:
        """Hosts of the driver and the registered executors, or None where Spark does not say
        (Spark Connect)."""
        return None


class ClassicHandle(SparkHandle):
    def __init__(self, sc):
        self.sc = sc

    @property
    def master(self) -> str:
        return self.sc.master

    def _conf(self):
        # the context's own SparkConf: one py4j call per read; getConf() copies every entry
        # first (~30 ms each time, and a fit reads a few keys)
        conf = getattr(self.sc, "_conf", None)
        return conf if conf is not None else self.sc.getConf()

    def conf(self, key, default=None):
        return self._conf().get(key, default)

    def conf_items(self, prefix):
        conf = self._conf()
        jconf = getattr(conf, "_jconf", None)
        if jconf is not None:  # one py4j call, plus two per matching key: getAll() costs two per
            # key of the whole conf (~70 ms a fit with a busy JVM)
            return {prefix + t._1(): t._2() for t in jconf.getAllWithPrefix(prefix)}
        return {k: v for k, v in conf.getAll() if k.startswith(prefix)}

    def run_tasks(self, fn, num_tasks):
        return self.sc.parallelize(range(num_tasks), num_tasks).mapPartitions(
            lambda it: [r for i in it for r in fn(i)]).collect()

    @property
    def key(self):
        return id(self.sc._jsc)

    def alive(self):
        return getattr(self.sc, "_jsc", None) is not None

    def hosts(self):
        if self.local_mode():
            return {"localhost"}
        infos = self.sc._jsc.sc().statusTracker().getExecutorInfos()
        return {i.host() for i in infos}


class ConnectHandle(SparkHandle):
    """A Spark Connect session: DataFrame jobs only; results come back as pickled rows."""

    connect = True

    def __init__(self, spark):
        self.spark = spark

    @property
    def master(self) -> str:
        return self.conf("spark.master", "") or ""

    def conf(self, key, default=None):
        try:
            value = self.spark.conf.get(key, None)
        except Exception:  # noqa: BLE001 -- a key the server does not expose
            value = None
        return default if value is None else value

    def conf_items(self, prefix):
        try:
            items = self.spark.conf.getAll
        except Exception:  # noqa: BLE001 -- older servers
            return {}
        return {k: v for k, v in dict(items).items() if k.startswith(prefix)}

    def run_tasks(self, fn, num_tasks):
        import pyarrow as pa
        from pyspark import cloudpickle

        def run(batches):
            for batch in batches:
                for index in batch.column(0).to_pylist():
                    out = [cloudpickle.dumps(r) for r in fn(int(index))]
                    yield pa.RecordBatch.from_arrays([pa.array(out, pa.binary())], ["result"])

        rows = self.spark.range(0, num_tasks, 1, num_tasks).mapInArrow(run, "result binary").collect()
        return [pickle.loads(r.result) for r in rows]

    @property
    def key(self):
        return ("connect", id(self.spark))

    def alive(self):
        try:
            return not bool(getattr(self.spark, "is_stopped", False))
        except Exception:  # noqa: BLE001
            return False


def handle_of(obj) -> SparkHandle:
    """The :class:`SparkHandle` of a SparkContext, SparkSession, RDD or DataFrame."""
    if isinstance(obj, SparkHandle):
        return obj
    if is_dataframe(obj):
        obj = obj.sparkSession
    if type(obj).__name__ == "SparkSession":
        if is_connect_session(obj):
            return ConnectHandle(obj)
        return ClassicHandle(obj.sparkContext)
    if hasattr(obj, "context") and hasattr(obj, "mapPartitions"):  # an RDD
        return ClassicHandle(obj.context)
    if hasattr(obj, "_jsc") and hasattr(obj, "parallelize"):  # a SparkContext
        return ClassicHandle(obj)
    raise ConfigurationError(f"expected a SparkContext, SparkSession, RDD or DataFrame, got {type(obj).__name__}")


def slots_from_master(master: str, task_cpus: int) -> Optional[int]:
    """Task slots implied by a local master URL (None for a cluster manager)."""
    import os

    m = re.match(r"local\[(\*|\d+)(?:,\s*\d+)?\]$", master)
    if master == "local":
        return 1
    if m:
        n = (os.cpu_count() or 1) if m.group(1) == "*" else int(m.group(1))
        return max(1, n // task_cpus)
    m = re.match(r"local-cluster\[(\d+),\s*(\d+),\s*\d+\]$", master)
    if m:
        return int(m.group(1)) * int(m.group(2)) // task_cpus
    return None
