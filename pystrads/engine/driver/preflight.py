"""Pre-flight checks: what must hold before a fit starts any Spark job.

:func:`preflight` is the one step a fit runs first: it resolves the Spark handle, the settings
and the number of workers, and checks the cluster (task slots for every worker at once for the
barrier job, dynamic allocation off, the executors registered and running the driver's Python),
returning a :class:`FitSetup` that the :class:`~pystrads.engine.driver.engine.Engine` takes, so each
check runs once.  Also here: Java on the driver and checkpoint storage that every host reaches.
Each error names the setting and the fix.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import shutil
import sys
import time
from typing import Any, Mapping, Optional

import numpy as np

from ...config import Config
from ...errors import ConfigurationError
from ...ps import launcher, storage
from ...spark import SparkHandle, handle_of, is_dataframe, slots_from_master

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class FitSetup:
    """What a fit needs from its Spark application: the handle, the resolved settings and the
    number of workers; ``checked``: :func:`check_cluster` passed for them; ``threads``: the
    threads each worker computes with; ``task_cpus``: the cores each worker's task asks for
    through a stage-level task resource profile (None: the application's ``spark.task.cpus``)."""

    spark: SparkHandle
    config: Config
    num_workers: int
    checked: bool
    threads: int = 1
    task_cpus: Optional[int] = None


def preflight(data, num_workers: Optional[int] = None, config: Optional[Mapping[str, Any]] = None,
              check: bool = True, workers_param: str = "num_workers", per_executor: bool = False) -> FitSetup:
    """The fit's pre-flight step over ``data`` (an RDD or a DataFrame, or a session): the Spark
    handle (built here once, then passed on), the settings (the application's ``spark.pystrads.*``
    keys, then ``config``), the workers and their threads (:func:`worker_shape`; one worker in
    serial mode, ``debug.serial``) and, with ``check``, the cluster's checks
    (:func:`check_cluster`); no Spark job runs.  ``workers_param``: how errors name
    ``num_workers`` (an estimator's ``numWorkers``); ``per_executor``: without an explicit shape,
    one worker per executor with its cores (:func:`worker_shape`; the estimators, whose programs
    compute with their workers' threads), else one worker per task slot (the Program API's
    default: a program's ``num_workers`` and its schedules' work items follow the slots)."""
    h = handle_of(data)
    resolved = Config.from_spark(h, config)
    slots = _slots(h)
    workers, threads, task_cpus = worker_shape(h, resolved, data, num_workers, slots, per_executor)
    if not isinstance(workers, (int, np.integer)) or isinstance(workers, bool) or workers < 1:
        raise ConfigurationError(f"num_workers={workers!r} must be a positive integer")
    if resolved["debug.serial"] and workers != 1:  # serial mode: one worker holds all the data
        log.info("spark.pystrads.debug.serial: one worker instead of %d", workers)
        workers, threads, task_cpus = 1, worker_threads(h, resolved), None
    if check and num_workers is not None and slots is not None and num_workers > slots:
        raise _too_few_slots(num_workers, slots, workers_param)
    if check:
        check_cluster(h, int(workers), resolved, slots=slots if task_cpus is None else None)
    return FitSetup(h, resolved, int(workers), check, threads, task_cpus)


def worker_shape(h: SparkHandle, config: Config, data, requested: Optional[int], slots: Optional[int],
                 per_executor: bool = True):
    """``(workers, threads per worker, task cpus or None)`` for a fit over ``data``.

    By default (``per_executor``: an estimator's fit, whose program computes with its workers'
    threads) one worker per executor computes with all of that executor's cores: in local mode
    one worker with the local cores; on a cluster (standalone, YARN, Kubernetes, Connect) one
    worker per executor whose barrier task asks for the executor's cores through a stage-level
    task resource profile, where this Spark offers one for the input's kind (DataFrames need
    pyspark 4), else one single-threaded worker per task slot, logged with the setting that
    would change it.  An explicit ``requested`` worker count, ``spark.task.cpus`` or
    ``spark.pystrads.worker.threads`` keeps the application's slots: the workers are
    ``requested`` (else :func:`default_num_workers`), each with :func:`worker_threads`."""
    if not per_executor or requested is not None or h.conf("spark.task.cpus") or int(config["worker.threads"]):
        return default_num_workers(data, requested, h, slots), worker_threads(h, config), None
    master = h.master or ""
    if master == "local" or master.startswith("local["):
        return 1, slots_from_master(master, 1), None  # one executor: its cores in one worker
    executors, cores = executor_shape(h)
    if executors and cores and cores > 1:
        if _profiles_run(h, data):
            return executors, cores, cores
        log.info("one single-threaded worker per task slot: this Spark cannot give a %s's barrier job a task "
                 "resource profile; set spark.task.cpus=%d to run one worker per executor with %d threads",
                 "DataFrame" if is_dataframe(data) else "input", cores, cores)
    return default_num_workers(data, None, h, slots), 1, None


def executor_shape(h: SparkHandle):
    """``(executors, cores per executor)`` as far as known without a job (None where not)."""
    master = h.master or ""
    m = re.match(r"local-cluster\[(\d+),\s*(\d+),", master)
    if m:
        return int(m.group(1)), int(m.group(2))
    cores = h.conf("spark.executor.cores")
    if h.connect:
        instances = h.conf("spark.executor.instances")
        return (int(instances) if instances else None), (int(cores) if cores else None)
    executors = expected_executors(h)
    if cores:
        return executors, int(cores)
    if h.conf("spark.default.parallelism"):
        return executors, None  # the executors' cores are not what defaultParallelism says then
    return executors, max(1, h.sc.defaultParallelism // executors)  # standalone: every core of a worker


def _profiles_run(h: SparkHandle, data) -> bool:
    """Whether the fit's barrier job can carry a task resource profile: dynamic allocation off
    (check_cluster refuses it anyway), and for a DataFrame input ``mapInArrow(profile=)``
    (pyspark 4)."""
    import inspect

    if (h.conf("spark.dynamicAllocation.enabled", "false") or "false").lower() == "true":
        return False
    if is_dataframe(data):
        return "profile" in inspect.signature(type(data).mapInArrow).parameters
    return not h.connect


def worker_threads(spark, config: Config) -> int:
    """Threads per worker: ``worker.threads``, else the cores Spark gives each task
    (``spark.task.cpus``).  More threads than task cores is allowed (it oversubscribes the
    executor: logged)."""
    cpus = int(handle_of(spark).conf("spark.task.cpus", "1") or 1)
    threads = int(config["worker.threads"]) or cpus
    if threads > cpus:
        log.warning("worker.threads=%d exceeds spark.task.cpus=%d: each worker's threads share %d core(s); "
                    "set spark.task.cpus=%d so Spark reserves them", threads, cpus, cpus, threads)
    return threads


def _slots(spark) -> Optional[int]:
    """Task slots known without a job (local masters, or a cluster's fixed executor count and
    cores); None when only the running application can tell."""
    h = handle_of(spark)
    cpus = int(h.conf("spark.task.cpus", "1") or 1)
    slots = slots_from_master(h.master, cpus)
    if slots is None and h.connect:
        instances, cores = h.conf("spark.executor.instances"), h.conf("spark.executor.cores")
        if instances and cores:
            slots = int(instances) * int(cores) // cpus
    return slots


def free_slots(spark, num_workers: int) -> Optional[int]:
    """Task slots beside ``num_workers`` barrier tasks, when known without a job (else None)."""
    slots = _slots(spark)
    return None if slots is None else slots - num_workers


def default_num_workers(data, requested: Optional[int] = None, handle: Optional[SparkHandle] = None,
                        slots: Optional[int] = -1) -> int:
    """Workers an :class:`Engine` over ``data`` (an RDD or a DataFrame) uses with one task slot
    each: ``requested``, else its partitions capped by the task slots known without a job
    (``slots``, when the caller has them)."""
    if requested is not None:
        return requested
    h = handle or handle_of(data)
    slots = _slots(h) if slots == -1 else slots
    if h.connect:  # a Connect DataFrame's partitions are only known by running a job
        if slots:
            return slots
        raise ConfigurationError(
            "under Spark Connect the number of workers cannot be inferred on this cluster; set num_workers "
            "(numWorkers on the estimators) to at most the task slots the cluster offers")
    parts = (data.rdd if is_dataframe(data) else data).getNumPartitions()
    return max(1, min(parts, slots) if slots else parts)  # (an input without partitions: one worker)


def barrier_ready(jrdd, num_workers: int) -> bool:
    """Whether a barrier stage may run over ``jrdd`` (a JVM RDD) as it is, one task per worker:
    it has ``num_workers`` partitions and so has every RDD it reaches without a shuffle.  Spark
    refuses a barrier stage whose narrow lineage changes the partition count
    (``BarrierJobUnsupportedRDDChainException``: a ``coalesce``, a ``union``, a ``limit`` under
    some plans), so an input that fails this is shuffled to the workers first.  Walks the
    lineage in the JVM; runs no job."""
    seen, todo = set(), [jrdd]
    while todo:
        r = todo.pop()
        if r.id() in seen:
            continue
        seen.add(r.id())
        if r.getNumPartitions() != num_workers:
            return False
        deps = r.dependencies().iterator()
        while deps.hasNext():
            dep = deps.next()
            if dep.getClass().getName() != "org.apache.spark.ShuffleDependency":  # else another stage
                todo.append(dep.rdd())
    return True


def to_workers(rdd, num_workers: int):
    """``rdd`` with ``num_workers`` partitions that a barrier stage can run over.  More partitions
    are merged whole (partition i goes to worker ``i mod U``), so records a program needs
    together -- e.g. a user's ratings, partitioned by user -- stay in one worker; fewer are
    spread by ``repartition``.  Both shuffle; an RDD that :func:`barrier_ready` passes is not
    shuffled again."""
    parts = rdd.getNumPartitions()
    if parts < num_workers:
        return rdd.repartition(num_workers)
    if parts == num_workers and barrier_ready(rdd._jrdd.rdd(), num_workers):
        return rdd
    U = int(num_workers)
    keyed = rdd.mapPartitionsWithIndex(lambda index, records: ((index % U, r) for r in records))
    return keyed.partitionBy(U, lambda worker: worker).values()


def frame_to_workers(frame, num_workers: int, classic: bool):
    """``frame`` with ``num_workers`` partitions that a barrier stage can run over: as it is if
    :func:`barrier_ready` passes its plan's RDD (classic sessions), else ``repartition``-ed
    (always under Spark Connect, where the plan's RDDs are out of reach)."""
    if classic and barrier_ready(frame._jdf.queryExecution().toRdd(), num_workers):
        return frame
    return frame.repartition(num_workers)


def check_java() -> None:
    """Raise :class:`ConfigurationError` unless a Java 17+ runtime is available."""
    java = os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else shutil.which("java")
    if not java or not os.path.exists(java):
        raise ConfigurationError(
            "Spark needs Java 17 or newer and none was found (JAVA_HOME unset and no java on PATH); "
            "install OpenJDK 17 (e.g. apt-get install openjdk-17-jre-headless) and retry")
    import subprocess

    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    major = int(m.group(1)) if m else 0
    if major == 1 and m and m.group(2):
        major = int(m.group(2))
    if major < 17:
        raise ConfigurationError(f"Spark needs Java 17 or newer; {java} is version {major or out!r}. "
                                 "Install OpenJDK 17 and point JAVA_HOME at it")


def expected_executors(spark) -> int:
    """Executors this application should have: 1 in local mode, n for
    ``local-cluster[n,c,m]``, ``spark.executor.instances`` when set, else as
    many as have registered (classic) or 1 (Spark Connect: the shard launcher
    then starts shards on every executor its tasks reach)."""
    h = handle_of(spark)
    master = h.master
    if master.startswith("local["):
        return 1
    m = re.match(r"local-cluster\[(\d+),", master)
    if m:
        return int(m.group(1))
    instances = h.conf("spark.executor.instances", None)
    if instances:
        return int(instances)
    if h.connect:
        return 1
    return max(1, launcher._count_executors(h.sc))


def check_cluster(spark, num_workers: int, config: Optional[Mapping[str, Any]] = None,
                  slots: Optional[int] = -1) -> None:
    """Pre-flight checks of the cluster for ``num_workers`` barrier tasks (no Spark job):
    dynamic allocation off, enough task slots (``slots``: known to the caller, None where only
    the running application can tell, e.g. tasks of a resource profile), executors' Python;
    each error says what to change."""
    h = handle_of(spark)
    config = config if isinstance(config, Config) else Config.from_spark(h, config)
    U = num_workers
    if (h.conf("spark.dynamicAllocation.enabled", "false") or "false").lower() == "true":
        raise ConfigurationError(
            "spark.dynamicAllocation.enabled=true: pystrads runs barrier stages whose tasks must all "
            "run at once on fixed executors; set spark.dynamicAllocation.enabled=false")
    if slots == -1:
        slots = _slots(h)
    if h.connect:
        # no executor registry and no default parallelism through Connect: the slots known from
        # the master or spark.executor.instances/cores are checked; otherwise Spark's own barrier
        # check refuses a stage larger than the cluster when the fit starts
        if slots is not None and slots < U:
            raise _too_few_slots(U, slots)
        return
    sc = h.sc
    if not launcher.executors_run_this_python(sc):
        python = launcher.executors_python(sc)
        log.warning("executors use Python %r, the driver %r; set PYSPARK_PYTHON=%s if the "
                    "executors lack pystrads or its dependencies", python, sys.executable, sys.executable)
    wanted = expected_executors(h)
    deadline = time.monotonic() + config["executor.waitSeconds"]
    while launcher._count_executors(sc) < wanted and time.monotonic() < deadline:
        time.sleep(0.2)  # executors still registering (shards go one per executor)
    if launcher._count_executors(sc) < wanted:
        raise ConfigurationError(
            f"only {launcher._count_executors(sc)} of {wanted} executors registered within "
            f"spark.pystrads.executor.waitSeconds={config['executor.waitSeconds']}; raise it or check the "
            "cluster manager")
    if slots is None:
        cpus = int(sc.getConf().get("spark.task.cpus", "1"))
        while True:
            executors = launcher._count_executors(sc)
            slots = sc.defaultParallelism // cpus if executors else 0
            if slots >= U or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    if slots < U:
        raise _too_few_slots(U, slots)


def _machine(host: str) -> str:
    """``host`` as a machine: "this machine" for a loopback name or address and for any address
    this process can bind to (names resolved), else its address."""
    import socket

    try:
        address = socket.gethostbyname(host)
    except OSError:
        return host
    if launcher.is_loopback(address):
        return "this machine"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.bind((address, 0))  # only this machine's own addresses bind
        return "this machine"
    except OSError:
        return address


def check_checkpoint_storage(directory: Optional[str], hosts: Optional[set]) -> None:
    """A bare checkpoint path names each host's own disk: refuse it when the fit spans machines
    (one machine's snapshots would be invisible to the others when the fit resumes).  Names of
    one machine (its host name, 127.0.0.1, its address, as Spark lists the driver and the
    executors of a single-machine cluster) count once."""
    if not directory or hosts is None or len(hosts) <= 1 or storage.has_scheme(directory) \
            or directory.startswith("/dbfs/"):
        return
    if len({_machine(h) for h in hosts}) <= 1:
        return
    raise ConfigurationError(
        f"spark.pystrads.checkpoint.dir={directory!r} is a path without a scheme, which names each host's own "
        f"disk, but this fit runs on {len(hosts)} hosts ({', '.join(sorted(hosts))}): a checkpoint written on "
        "one would be missing on the others when the fit resumes. Use a URI every host reaches (hdfs://..., "
        "s3://..., gs://..., dbfs:/...) or, for a filesystem mounted at the same path on every host, write it "
        "as file:///that/path (the scheme says it is shared)")


def _too_few_slots(U: int, slots: int, name: str = "num_workers") -> ConfigurationError:
    return ConfigurationError(
        f"{name}={U} needs {U} task slots running at once (barrier mode) but the cluster "
        f"offers {slots}; lower {name} to {max(1, slots)} (or leave it unset: one worker per executor) or give "
        f"Spark more executor cores (spark.executor.cores / spark.executor.instances, or local[N] with N >= {name})")
