"""Creating a SparkSession that pystrads can use.

In a notebook or under ``spark-submit`` you already have a session and do
not need this module; it is what the jobs and tests use to start one
correctly: Java is checked first (with a clear message), and the executors'
Python is pinned to the driver's (``PYSPARK_PYTHON``), without which
executors may start a system Python that lacks pystrads and its
dependencies.  RDD jobs and DataFrame jobs (``mapInArrow``, what a fit runs) share one pool
of Python workers (see :data:`ONE_WORKER_POOL`), forked from a daemon that loaded numba once
(see :data:`PRELOADED_WORKERS`).
"""

from __future__ import annotations

import os
import sys
from typing import Mapping, Optional

from .engine.driver.preflight import check_java

#: Spark keys its Python worker pools by the workers' environment, and DataFrame jobs add
#: ``SPARK_SIMPLIFIED_TRACEBACK=1`` to it: without this setting an application whose data came
#: from ``createDataFrame`` over Python rows (an RDD job) starts a second daemon and a second set
#: of workers for its first fit, each paying the Python start-up and imports again.  With it
#: both kinds of job use the same workers (RDD tasks' tracebacks are then simplified too).
ONE_WORKER_POOL = {"spark.executorEnv.SPARK_SIMPLIFIED_TRACEBACK": "1"}

#: Spark forks every Python worker from one daemon per executor: :mod:`pystrads.daemon` loads
#: numba (and readies its CPU target) before the first fork, so that a fit's new workers do not
#: each pay it (~0.5-1.5 s of CPU per worker).  Needs pystrads installed where the executors'
#: Python finds it at start: :func:`worker_settings` leaves it out when pystrads came from an
#: archive (``--py-files``), which Spark puts on a worker's path only once the daemon forked it.
PRELOADED_WORKERS = {"spark.python.daemon.module": "pystrads.daemon"}


def worker_settings() -> dict:
    """The Python worker settings :func:`spark_session` applies: :data:`ONE_WORKER_POOL`, and
    :data:`PRELOADED_WORKERS` when pystrads is installed as files (not imported from a zip)."""
    import pystrads

    installed = os.path.isfile(pystrads.__file__)
    return {**ONE_WORKER_POOL, **(PRELOADED_WORKERS if installed else {})}


def spark_session(master: Optional[str] = None, app_name: str = "pystrads",
                  conf: Optional[Mapping[str, str]] = None):
    """Get or create a SparkSession (``local[2]`` unless ``master``, ``spark.master`` in
    ``conf`` or Spark's own ``MASTER`` environment variable names another), after checking
    Java and pinning Python."""
    check_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    elif "spark.master" not in (conf or {}) and not os.environ.get("MASTER"):
        builder = builder.config("spark.master", "local[2]")
    defaults = {
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.python.worker.reuse": "true",
        **worker_settings(),
    }
    for key, value in {**defaults, **(conf or {})}.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
