"""Driver side: the Spark driver is the scheduler.

:class:`Engine` runs a :class:`~pystrads.engine.program.Program` over an RDD:
pre-flight checks, shard start (first use), table creation, one long-running
barrier job whose tasks are the workers (:mod:`pystrads.engine.resident`),
an init step, then steps -- ``schedule`` on the driver, the step's command
posted to the shards, the workers' rounds, metrics, ``after_step`` -- until
the program stops.  Each step is atomic: shards undo its writes unless the
driver commits it.  Data and state stay in the workers' tasks; after each
step a worker leaves a snapshot of its state on a shard, from which a
restarted task resumes.  ``runtime.mode=steps`` keeps the first runtime (one
barrier job per step, state carried in cached RDDs) for comparison.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import pickle
import os
import re
import secrets
import shutil
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional

import numpy as np

from ..config import Config
from ..errors import ConfigurationError, PystradsError, ScheduleError, ShardUnavailableError, StepFailedError
from ..ps import launcher, storage
from ..ps.partition import TableLayout, range_bounds
from ..ps.protocol import check_dtype
from .program import Program, Schedule, ScheduleContext, StepMetrics
from .fingerprint import _data_fingerprint, _hash_value
from .progress import ProgressReporter
from .resident import ResidentSpec, program_hash, run_resident, run_resident_arrow, states_prefix
from .spark import handle_of, is_dataframe, slots_from_master
from .worker import StepSpec, run_init, run_load, run_rounds

log = logging.getLogger(__name__)

#: Fits of one application step one at a time: the shards hold one open step
#: (its fence, round clocks and undo log), and every fit's barrier stages
#: already take all the task slots they use.  Concurrent fits (CrossValidator
#: with ``parallelism`` > 1, threads in a notebook) queue here instead of
#: colliding; their tables live side by side under their own namespaces.
_STEPPING = threading.Lock()

#: after this long without every worker's task running, the driver checks for (and warns about)
#: a barrier job waiting for task slots
SLOT_WAIT_WARN_SECONDS = 30.0


class TrainingSummary:
    """Per-step history of a fit (objective, throughput, time split).

    ``rows`` is a list of dicts, one per step; :meth:`to_pandas` gives a
    DataFrame.  Time columns are seconds: ``schedule_s`` (driver schedule),
    ``job_s`` (the Spark job), ``compute_s`` / ``sync_s`` (mean per worker:
    program code / waiting on round clocks), ``spark_s`` (job time outside
    the rounds: task launch, state (de)serialisation).
    """

    def __init__(self):
        self.rows: List[Dict[str, Any]] = []
        self.iterations: List[Dict[str, Any]] = []  # rows a program adds with ctx.record_row
        self.shards: List[Dict[str, Any]] = []  # each shard's stats at the end of the fit
        self.fixed: Dict[str, float] = {}

    def to_pandas(self, per: str = "step"):
        """The history as a DataFrame: ``per="step"`` (default) or ``"iteration"``."""
        import pandas as pd

        return pd.DataFrame(self.rows if per == "step" else self.iterations)

    @property
    def total_rounds(self) -> int:
        return int(sum(r["rounds"] for r in self.rows))

    @property
    def total_seconds(self) -> float:
        """Wall time of the whole fit (shard start, init and steps)."""
        return float(self.fixed.get("total_s", 0.0))

    def __repr__(self) -> str:
        return f"TrainingSummary(steps={len(self.rows)}, rounds={self.total_rounds})"


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


def default_num_workers(data, requested: Optional[int] = None) -> int:
    """Workers an :class:`Engine` over ``data`` (an RDD or a DataFrame) uses: ``requested``,
    else its partitions capped by the task slots known without a job."""
    if requested:
        return int(requested)
    h = handle_of(data)
    slots = _slots(h)
    if h.connect:  # a Connect DataFrame's partitions are only known by running a job
        if slots:
            return slots
        raise ConfigurationError(
            "under Spark Connect the number of workers cannot be inferred on this cluster; set num_workers "
            "(numWorkers on the estimators) to at most the task slots the cluster offers")
    parts = (data.rdd if is_dataframe(data) else data).getNumPartitions()
    return min(parts, slots) if slots else parts


def _python_cause(exc: BaseException) -> str:
    """The last Python exception line inside a Py4J error (what the user needs)."""
    text = str(exc)
    lines = [ln.strip() for ln in text.splitlines()
             if re.match(r"^\s*[\w.]+(Error|Exception|Warning)\b.*:", ln)]
    python_lines = [ln for ln in lines if not ln.startswith(("org.apache", "java.", "py4j", "scala."))]
    chosen = (python_lines or lines or [text.splitlines()[0] if text else repr(exc)])[-1]
    return chosen[:2000]


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


def check_cluster(spark, num_workers: int, config: Optional[Mapping[str, Any]] = None) -> None:
    """Pre-flight checks of the cluster for ``num_workers`` barrier tasks (no Spark job):
    dynamic allocation off, enough task slots, executors' Python; each error says what to change."""
    h = handle_of(spark)
    config = config if isinstance(config, Config) else Config.from_spark(h, config)
    U = num_workers
    if (h.conf("spark.dynamicAllocation.enabled", "false") or "false").lower() == "true":
        raise ConfigurationError(
            "spark.dynamicAllocation.enabled=true: pystrads runs barrier stages whose tasks must all "
            "run at once on fixed executors; set spark.dynamicAllocation.enabled=false")
    slots = _slots(h)
    if h.connect:
        # no executor registry and no default parallelism through Connect: the slots known from
        # the master or spark.executor.instances/cores are checked; otherwise Spark's own barrier
        # check refuses a stage larger than the cluster when the fit starts
        if slots is not None and slots < U:
            raise _too_few_slots(U, slots)
        return
    sc = h.sc
    python = getattr(sc, "pythonExec", None) or sys.executable
    resolved = shutil.which(python) or python
    if os.path.realpath(resolved) != os.path.realpath(sys.executable):
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


def check_checkpoint_storage(directory: Optional[str], hosts: Optional[set]) -> None:
    """A bare checkpoint path names each host's own disk: refuse it when the fit spans hosts
    (one host's snapshots would be invisible to the others when the fit resumes)."""
    if not directory or hosts is None or len(hosts) <= 1 or storage.has_scheme(directory) \
            or directory.startswith("/dbfs/"):
        return
    raise ConfigurationError(
        f"spark.pystrads.checkpoint.dir={directory!r} is a path without a scheme, which names each host's own "
        f"disk, but this fit runs on {len(hosts)} hosts ({', '.join(sorted(hosts))}): a checkpoint written on "
        "one would be missing on the others when the fit resumes. Use a URI every host reaches (hdfs://..., "
        "s3://..., gs://..., dbfs:/...) or, for a filesystem mounted at the same path on every host, write it "
        "as file:///that/path (the scheme says it is shared)")


def _too_few_slots(U: int, slots: int) -> ConfigurationError:
    return ConfigurationError(
        f"num_workers={U} needs {U} task slots running at once (barrier mode) but the cluster "
        f"offers {slots}; lower num_workers to {max(1, slots)} or give Spark more executor cores "
        "(spark.executor.cores / spark.executor.instances, or local[N] with N >= num_workers)")


#: Failure causes meaning cached worker states are gone (an executor died), so the
#: step cannot simply be run again from the pre-step states.
_LOST_STATE_MARKERS = ("Checkpoint block", "ExecutorLostFailure", "FetchFailed", "could not be found",
                       "was lost", "not found")


def _program_state(program: Program) -> Dict[str, Any]:
    """The program's attributes that identify the fit and carry its driver-side state."""
    ignore = set(getattr(program, "checkpoint_ignore", ()))
    return {k: v for k, v in vars(program).items() if k not in ignore}


def _program_attributes(program: Program) -> bytes:
    from pyspark import cloudpickle

    return cloudpickle.dumps(_program_state(program))


class Engine:
    """Runs one :class:`Program` over the partitions of an RDD or a DataFrame.

    Parameters
    ----------
    program : Program
        The model-parallel program.
    rdd : pyspark.RDD or pyspark.sql.DataFrame
        Input records; repartitioned to ``num_workers`` partitions if needed
        (each partition is one worker).  An RDD's records are its elements.
        A DataFrame's (classic or Spark Connect) are its rows as tuples of
        Python values in column order (arrays as lists, structs as dicts;
        ML vectors arrive as their struct, so convert them first); it is
        repartitioned to ``num_workers`` unless ``prepartitioned`` (its
        partitions already are the workers', e.g. ``df.repartition(U, key)``).
        A DataFrame runs on the resident runtime only, and the workers'
        states are not kept after the fit (use ``export``).
    num_workers : int, optional
        Workers U (default: the RDD's partitions, capped by the task slots).
    seed : int
        Seed handed to the program (``ctx.seed``, ``ctx.rng()``).
    config : mapping, optional
        ``spark.pystrads.*`` overrides (keys with or without the prefix).
    keep_states : bool, optional
        Hand each worker's (data, state) to Spark's cache when the fit ends, for
        :meth:`map_states` (default: True for an RDD, False for a DataFrame).
    export : callable, optional
        ``fn(worker, data, state)`` run by every worker when the fit ends;
        ``FitResult.exports`` holds the results in worker order.
    prepartitioned : bool
        DataFrame input only: use its partitions as they are (see ``rdd``).
    decode : callable, optional
        DataFrame input only: ``fn(row) -> record`` applied to every row on the
        workers before ``load`` (e.g. to unpickle a binary column).
    """

    def __init__(self, program: Program, rdd, num_workers: Optional[int] = None, seed: int = 0,
                 config: Optional[Mapping[str, Any]] = None, keep_states: Optional[bool] = None,
                 export: Optional[Callable[[int, Any, Any], Any]] = None, prepartitioned: bool = False,
                 decode: Optional[Callable[[Any], Any]] = None):
        if not isinstance(program, Program):
            raise TypeError(f"program must be a pystrads Program, got {type(program).__name__}")
        self.program = program
        self.spark = handle_of(rdd)
        self.frame = rdd if is_dataframe(rdd) else None  # DataFrame input (classic or Spark Connect)
        self.rdd = None if self.frame is not None else rdd
        self.sc = None if self.spark.connect else getattr(self.spark, "sc", None)
        self.prepartitioned = bool(prepartitioned)
        if decode is not None and self.frame is None:
            raise ConfigurationError("decode= applies to DataFrame inputs; map the RDD instead")
        self.decode = decode
        self.config = Config.from_spark(self.spark, config)
        self.seed = int(seed) & 0xFFFFFFFFFFFFFFFF  # numpy seeds must be >= 0 (pyspark's default seeds are not)
        if num_workers is None:
            num_workers = default_num_workers(rdd)
        if not isinstance(num_workers, (int, np.integer)) or num_workers < 1:
            raise ConfigurationError(f"num_workers={num_workers!r} must be a positive integer")
        self.num_workers = int(num_workers)
        staleness = getattr(program, "staleness", 0)
        if not isinstance(staleness, (int, np.integer)) or staleness < 0:
            raise ConfigurationError(f"{type(program).__name__}.staleness={staleness!r} must be an integer >= 0")
        if staleness and program.has_apply():
            raise ConfigurationError(
                f"{type(program).__name__} defines apply(), which needs each round committed before "
                f"the next: staleness must be 0, got {staleness}")
        self.summary = TrainingSummary()
        self.manager = None
        self.group = None
        self.layouts: Dict[str, TableLayout] = {}
        self.namespace = "fit-" + secrets.token_hex(6)
        self._data_rdd = None
        self._state_rdd = None
        self._old_rdds: List[Any] = []
        self._step = 0
        self._rounds_done = 0
        self._checkpoint_dir: Optional[str] = None  # this fit's directory under checkpoint.dir
        self._program_initial: Optional[bytes] = None  # the program's attributes before the first step
        self._recoveries = 0
        # ctx.rounds_hint for the next step: checkpointed and restored with the rest, so a fit
        # that resumes sizes its steps as the uninterrupted fit would have
        self._rounds_hint = self.num_workers
        self._data_fingerprints: Optional[List[str]] = None  # per worker, of its immutable data
        # resident runtime (runtime.mode=resident): the fit's one barrier job and what it posted
        self.resident = self.config["runtime.mode"] == "resident"
        if self.frame is not None and not self.resident:
            raise ConfigurationError(
                "spark.pystrads.runtime.mode=steps runs on RDDs only; a DataFrame input runs on the resident "
                "runtime (the default): unset runtime.mode, or pass an RDD (df.rdd, classic sessions only)")
        if keep_states is None:
            keep_states = self.frame is None
        if keep_states and self.frame is not None:
            raise ConfigurationError(
                "keep_states=True needs an RDD input (the states are cached as an RDD); with a DataFrame "
                "input hand the workers' results over with export=fn(worker, data, state) instead")
        self._job: Optional[_ResidentJob] = None
        self._result_rdd = None  # the finished job's (data, state) per worker, cached
        self._posted_program: Optional[str] = None  # hash of the program bytes the job's tasks have
        self._counters: Optional[Dict[str, int]] = None  # shards' traffic counters after the last step
        # hand each worker's (data, state) to Spark's cache when the fit ends, for map_states (a
        # caller that never reads worker states saves pickling and caching them)
        self.keep_states = bool(keep_states)
        # fn(worker, data, state) run by each worker when the fit ends; FitResult.exports has the
        # results in worker order (no second Spark job, nothing cached)
        self.export = export
        self.exports: Optional[List[Any]] = None
        self.job_groups: List[str] = []  # Spark job groups of the fit's resident jobs (one unless relaunched)

    # ------------------------------------------------------------------ checks
    def preflight(self) -> None:
        """Checks that must pass before any Spark job; each says what to change."""
        check_cluster(self.spark, self.num_workers, self.config)
        tables = list(self.program.tables())
        names = [t.name for t in tables]
        if len(set(names)) != len(names):
            raise ConfigurationError(f"{type(self.program).__name__} declares duplicate tables: {names}")
        for t in tables:
            check_dtype(t.dtype)
            if t.num_rows < 0 or t.width < 1:
                raise ConfigurationError(f"table {t.name!r}: bad shape {t.num_rows} x {t.width}")

    # ------------------------------------------------------------------ setup
    def _expected_executors(self) -> int:
        return expected_executors(self.spark)

    def _start(self) -> None:
        from pyspark import cloudpickle

        t0 = time.perf_counter()
        for key, manager in list(launcher._MANAGERS.items()):
            if not manager.spark.alive():  # its SparkContext or session was stopped
                manager.shutdown()
                launcher._MANAGERS.pop(key, None)
        try:
            self.manager = launcher.get_shards(self.spark, self.config, self._expected_executors())
        except PystradsError:
            raise
        except Exception as exc:
            cause = _python_cause(exc)
            if "No module named" in cause:
                raise ConfigurationError(
                    f"executors could not import pystrads ({cause}); install it on every executor or set "
                    f"PYSPARK_PYTHON={sys.executable} so executors use the driver's environment") from exc
            raise
        self.group = self.manager.group
        self.summary.fixed["shard_start_s"] = time.perf_counter() - t0
        self._create_tables()

    def _create_tables(self) -> None:
        """Create (or re-create, with initial values) the program's tables on the shards."""
        from pyspark import cloudpickle

        t0 = time.perf_counter()
        num_shards = len(self.group.shards)
        for t in self.program.tables():
            if t.single_shard:
                bounds, owners = [0, t.num_rows], [hash(t.name) % num_shards]
            else:
                if t.partitioner is not None:
                    bounds = np.asarray(t.partitioner(t.num_rows, num_shards), dtype=np.int64)
                else:
                    bounds = range_bounds(t.num_rows, num_shards, t.weights)
                owners = list(range(num_shards))
                if len(bounds) != num_shards + 1 or bounds[0] != 0 or bounds[-1] != t.num_rows \
                        or np.any(np.diff(bounds) < 0):
                    raise ConfigurationError(
                        f"table {t.name!r}: partitioner returned bounds {list(bounds)[:10]}; need "
                        f"{num_shards + 1} non-decreasing values from 0 to {t.num_rows}")
            layout = TableLayout(f"{self.namespace}/{t.name}", int(t.num_rows), int(t.width), t.dtype,
                                 tuple(int(b) for b in bounds), tuple(owners),
                                 int(t.contrib_width or t.width))
            init = (base64.b64encode(cloudpickle.dumps(t.initializer)).decode()
                    if t.initializer is not None else None)
            for shard, lo, hi in layout.ranges():
                self.group.client(shard).action(
                    "create_table", name=layout.name, row_start=lo, row_stop=hi, width=layout.width,
                    dtype=layout.dtype, fill=t.fill, initializer=init, contrib_width=layout.contrib_width)
            self.layouts[t.name] = layout
        payload = base64.b64encode(cloudpickle.dumps(self.program)).decode()
        self.group.broadcast("register_program", namespace=self.namespace, payload=payload)
        self.summary.fixed["table_create_s"] = time.perf_counter() - t0

    def table(self, name: str):
        """Driver-side handle of a table (reads; writes only between steps)."""
        try:
            return self.group.table(self.layouts[name])
        except KeyError:
            raise KeyError(f"no table {name!r}; the program declares {sorted(self.layouts)}") from None

    def _spec(self, step: int, schedule: Optional[Schedule]) -> StepSpec:
        return StepSpec(self.program, self.group, dict(self.layouts), step, self.num_workers,
                        self._rounds_done, self.seed, int(getattr(self.program, "staleness", 0)),
                        self.config["round.timeoutSeconds"], schedule)

    # ------------------------------------------------------------------ steps
    def _run_job(self, step: int, work):
        """Run one step atomically: ``work`` is the resident job's command (resident
        runtime) or the step's barrier RDD (step runtime)."""
        if self.resident:
            return self._run_resident_step(step, work)
        return self._run_step_job(step, work)

    def _run_step_job(self, step: int, rdd) -> None:
        from pyspark import StorageLevel

        self.group.broadcast("begin_step", step=step, num_workers=self.num_workers, namespace=self.namespace,
                             round_offset=self._rounds_done)
        try:
            # Local checkpoints cut the lineage at every step: a barrier stage may not
            # depend on two barrier RDDs (data and state), and a lost block must never
            # be recomputed by re-running a step against the shards.
            rdd.persist(StorageLevel.MEMORY_AND_DISK)
            rdd.localCheckpoint()
            self._materialize(rdd)
        except BaseException as exc:
            try:
                self.group.broadcast("abort_step", step=step)
            except PystradsError as abort_exc:  # a shard is gone: recovery (or the caller) deals with it
                log.warning("step %d: could not roll back every shard: %s", step, abort_exc)
            rdd.unpersist()
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise StepFailedError(
                f"step {step} failed on every attempt Spark allowed; the model tables were rolled back "
                f"to their state before the step. Cause: {_python_cause(exc)}") from exc
        self.group.broadcast("commit_step", step=step)

    def _materialize(self, rdd) -> None:
        """Compute and cache a barrier RDD in a job Spark can retry.

        Spark retries a failed barrier stage only when it is a shuffle-map stage
        (a failed barrier *result* stage aborts the job), so the barrier stage
        ends in a tiny shuffle: a count per partition, read as raw bytes (the
        cached state is never unpickled again for this).
        """
        from pyspark import RDD
        from pyspark.serializers import NoOpSerializer

        raw = RDD(rdd._jrdd, self.sc, NoOpSerializer())
        counted = raw.mapPartitions(lambda it: [(0, sum(1 for _ in it))]).reduceByKey(
            lambda a, b: a + b, numPartitions=1).collect()
        if not counted:
            raise StepFailedError("a step produced no worker state")

    def _zip(self, data_rdd, state_rdd):
        """(data, state) pairs without re-serialising either side (one element per partition)."""
        from pyspark import RDD
        from pyspark.serializers import PairDeserializer

        jpairs = data_rdd._jrdd.zip(state_rdd._jrdd)
        return RDD(jpairs, self.sc, PairDeserializer(data_rdd._jrdd_deserializer, state_rdd._jrdd_deserializer))

    def _stats(self) -> Dict[str, int]:
        total = {"bytes_in": 0, "bytes_out": 0, "requests": 0}
        for s in self.group.broadcast("stats"):
            for k in total:
                total[k] += s[k]
        return total

    def _collect_metrics(self) -> StepMetrics:
        """Per-round metrics: workers' reports (on shard 0) plus every shard's own."""
        merged: Dict[int, Dict[str, float]] = {}
        shards = range(len(self.group.shards)) if getattr(self.program, "shard_metrics_every", 0) else [0]
        for i in shards:
            for key, values in self.group.client(i).action("metrics").get("rounds", {}).items():
                bucket = merged.setdefault(int(key), {})
                for name, value in values.items():
                    bucket[name] = bucket.get(name, 0.0) + value
        n = max(merged, default=-1) + 1
        return StepMetrics([merged.get(i, {}) for i in range(n)])

    def _load_data(self) -> None:
        """Load each worker's immutable data (plain cached job; the init step or a resume
        then builds the mutable state).

        Keeping ``data`` out of every barrier lineage matters beyond speed: Spark
        refuses a barrier stage that depends on two barrier RDDs, and a step reads
        both ``data`` and the previous step's state.
        """
        from pyspark import StorageLevel

        t0 = time.perf_counter()
        rdd = self.rdd
        if rdd.getNumPartitions() != self.num_workers:
            rdd = rdd.repartition(self.num_workers)
        spec = self._spec(0, None)
        self._data_rdd = rdd.mapPartitionsWithIndex(lambda index, it: run_load(spec, index, it))
        self._data_rdd.persist(StorageLevel.MEMORY_AND_DISK)
        self._data_rdd._jrdd.count()
        self.summary.fixed["load_s"] = time.perf_counter() - t0

    def _init_state(self) -> None:
        """The init step (barrier, atomic): each worker's mutable state; may write initial
        table values."""
        if self.resident:
            return self._resident_init()
        t0 = time.perf_counter()
        self._step, self._rounds_done, self._rounds_hint = 0, 0, self.num_workers
        spec = self._spec(0, None)
        state = self._data_rdd.barrier().mapPartitions(lambda it: run_init(spec, it))
        self._run_job(0, state)
        metrics = self._collect_metrics()
        for old in self._old_rdds:
            old.unpersist()
        self._state_rdd = state
        self._old_rdds = [state]
        self.summary.fixed["init_s"] = time.perf_counter() - t0
        self.summary.fixed["init_compute_s"] = metrics.total("_compute_s") / self.num_workers
        self._step = 1

    def fit(self, max_steps: Optional[int] = None) -> "FitResult":
        """Run the program until ``schedule`` returns ``None``, ``ctx.stop`` is called or
        ``max_steps`` steps ran."""
        if not _STEPPING.acquire(blocking=False):
            log.info("fit %s waits for another fit of this application to finish its steps (the shards run "
                     "one fit's steps at a time; each fit already uses every task slot)", self.namespace)
            _STEPPING.acquire()
        try:
            return self._fit(max_steps)
        finally:
            _STEPPING.release()

    def _fit(self, max_steps: Optional[int]) -> "FitResult":
        t_fit = time.perf_counter()
        self.preflight()
        log.info("fit %s: program %r, %d workers, seed %d, settings %s", self.namespace, self.program,
                 self.num_workers, self.seed, dict(self.config))
        self._checkpoint_dir = self._resolve_checkpoint_dir()
        if self._checkpoint_dir:
            check_checkpoint_storage(self._checkpoint_dir, self.spark.hosts())
        self._program_initial = _program_attributes(self.program)
        self._start()
        if self._checkpoint_dir and self.spark.connect:  # the hosts are known once the shards run
            check_checkpoint_storage(self._checkpoint_dir, {s.host for s in self.group.shards})
        try:
            if self.resident:
                self._launch_job()
            else:
                self._load_data()
            if not (self._checkpoint_dir and self._resume()):
                self._init_state()
            self.progress = ProgressReporter(f"{type(self.program).__name__} {self.namespace}",
                                             self.config["progress"])
            ctx = ScheduleContext(self)
            ctx.rounds_hint = self._rounds_hint
            steps = 0
            retry: Optional[Schedule] = None  # a step to run again as it was (resident job relaunched)
            while max_steps is None or steps < max_steps:
                ctx.step, ctx.rounds_done, ctx._records = self._step, self._rounds_done, {}
                t0 = time.perf_counter()
                schedule, retry = (self.program.schedule(ctx) if retry is None else retry), None
                t_sched = time.perf_counter() - t0
                if schedule is None or ctx.stopped:
                    break
                if not isinstance(schedule, Schedule):
                    raise ScheduleError(f"{type(self.program).__name__}.schedule returned "
                                        f"{type(schedule).__name__}; return a Schedule or None")
                if len(schedule) == 0:
                    raise ScheduleError("schedule returned no rounds; return None to end the fit")
                schedule.validate(self.num_workers, self.config["step.maxRounds"])
                try:
                    self._run_step(ctx, schedule, t_sched)
                    steps += 1
                    self._size_next_step(len(schedule))
                    if self._checkpoint_dir and not ctx.stopped and \
                            (self._step - 1) % self.config["checkpoint.interval"] == 0:
                        self._try_checkpoint()
                except (StepFailedError, ShardUnavailableError) as exc:
                    if self._recover(exc):
                        retry = schedule
                    ctx._stop_reason = None
                    ctx.rounds_hint = self._rounds_hint
                    continue
                if ctx.stopped:
                    break
                ctx.rounds_hint = self._rounds_hint
            if self.resident:
                self._resident_finish()
            elif self.export is not None:
                self.exports = self.map_states(self.export)
            self.progress.finish(ctx.stopped or "done")
            self.summary.fixed["total_s"] = time.perf_counter() - t_fit
            self.summary.shards = self.group.broadcast("stats")  # memory and traffic per shard
            return FitResult(self, ctx.stopped)
        except BaseException:
            self.release()
            raise

    def _size_next_step(self, rounds: int) -> None:
        """Rounds the next step should run (``ctx.rounds_hint``): as many as fill
        ``step.targetSeconds`` at the last step's time per round, at most ``step.maxRounds``."""
        per_round = self.summary.rows[-1]["round_s"] / max(1, rounds)
        target = self.config["step.targetSeconds"]
        self._rounds_hint = int(max(1, min(self.config["step.maxRounds"], target / max(per_round, 1e-6))))

    def _run_step(self, ctx: ScheduleContext, schedule: Schedule, t_sched: float) -> None:
        step = self._step
        spec = None if self.resident else self._spec(step, schedule)
        t0 = time.perf_counter()
        if self.resident:
            answer = self._run_job(step, self._command(step, schedule))
            t_job = time.perf_counter() - t0
            metrics = self._resident_metrics(answer)
            traffic = self._traffic()
        else:
            stats0 = self._stats()
            new_state = self._zip(self._data_rdd, self._state_rdd).barrier().mapPartitions(
                lambda it: run_rounds(spec, it))
            self._run_job(step, new_state)
            t_job = time.perf_counter() - t0
            metrics = self._collect_metrics()
            stats1 = self._stats()
            traffic = {k: stats1[k] - stats0[k] for k in stats0}
            for old in self._old_rdds:
                old.unpersist()
            self._old_rdds = [new_state]
            self._state_rdd = new_state
        U = self.num_workers
        compute = metrics.total("_compute_s") / U
        sync = metrics.total("_sync_s") / U
        row = {
            "step": step, "rounds": len(schedule), "seconds": t_sched + t_job, "schedule_s": t_sched,
            "job_s": t_job, "compute_s": compute, "sync_s": sync, "round_s": compute + sync,
            "spark_s": max(0.0, t_job - compute - sync), "rounds_per_s": len(schedule) / t_job,
            "bytes_in": traffic["bytes_in"], "bytes_out": traffic["bytes_out"], "requests": traffic["requests"],
            "snapshot_s": metrics.total("_snapshot_s") / U, "snapshot_bytes": metrics.total("_snapshot_bytes"),
        }
        self._rounds_done += len(schedule)
        self._step += 1
        self.program.after_step(ctx, metrics)
        row.update(ctx._records)
        self.summary.rows.append(row)
        if ctx._progress is not None:
            done, total, unit, shown = ctx._progress
            self.progress.update(done, total, unit, **shown)
            ctx._progress = None
        extra = " ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in ctx._records.items())
        log.info("step %d: %d rounds in %.3f s (%.0f rounds/s; compute %.3f s, sync %.3f s, spark %.3f s) %s",
                 step, len(schedule), t_job, row["rounds_per_s"], compute, sync, row["spark_s"], extra)

    # ------------------------------------------------------------------ checkpoints, recovery
    def _resolve_checkpoint_dir(self) -> Optional[str]:
        """``<checkpoint.dir>/pystrads-<fingerprint>`` or None (no checkpoints).  The
        fingerprint covers the program's parameters and data summaries, the number of
        workers and the seed, so only the same fit resumes from it."""
        if self.config["checkpoint.interval"] <= 0:
            return None
        root = self.config["checkpoint.dir"]
        if not root:
            try:  # (none through Spark Connect: set spark.pystrads.checkpoint.dir)
                opt = self.sc._jsc.sc().getCheckpointDir()
                # Spark appends a random per-application directory to the one given to
                # setCheckpointDir; a resumed fit is another application: use the given one
                root = opt.get().rstrip("/").rsplit("/", 1)[0] if opt.isDefined() else ""
            except Exception:  # no JVM view (tests with stand-in contexts)
                root = ""
        if not root:
            log.info("no checkpoints: neither spark.pystrads.checkpoint.dir nor SparkContext.setCheckpointDir "
                     "is set")
            return None
        return storage.join(root, "pystrads-" + self._fingerprint())

    def _fingerprint(self) -> str:
        h = hashlib.sha256(type(self.program).__module__.encode() + type(self.program).__qualname__.encode())
        for key, value in sorted(_program_state(self.program).items()):
            h.update(key.encode())
            _hash_value(h, value)
        h.update(f"workers={self.num_workers};seed={self.seed}".encode())
        return h.hexdigest()[:20]

    def _try_checkpoint(self) -> None:
        """A checkpoint that fails (a lost shard, a failed job) leaves the previous one
        in place; training goes on, and a lost shard shows in the next step."""
        try:
            self._checkpoint()
        except Exception as exc:  # noqa: BLE001 -- the fit must not die for a checkpoint
            self.summary.fixed["checkpoint_failures"] = self.summary.fixed.get("checkpoint_failures", 0) + 1
            log.warning("checkpoint after step %d failed (the previous one stays the latest): %s", self._step - 1,
                        _python_cause(exc) if not isinstance(exc, PystradsError) else exc)

    def _checkpoint(self) -> None:
        """Tables (written by the shards, where the rows are), worker states (by the
        workers) and the driver's state, then ``LATEST`` -- atomically, last."""
        from pyspark import cloudpickle

        t0 = time.perf_counter()
        root = self._checkpoint_dir
        name = f"step-{self._step - 1:08d}"
        target = storage.join(root, name)
        if self.resident:
            written = self._resident_checkpoint(target)
        else:
            written = self._save_states(target)
        driver = {"step": self._step, "rounds_done": self._rounds_done, "rounds_hint": self._rounds_hint,
                  "rows": self.summary.rows,
                  "data_fingerprints": self._data_fingerprints,
                  "iterations": self.summary.iterations, "program": _program_state(self.program),
                  "num_workers": self.num_workers}
        storage.write_bytes(storage.join(target, "driver.pkl"), cloudpickle.dumps(driver))
        storage.write_atomic(storage.join(root, "LATEST"), json.dumps(
            {"dir": name, "step": self._step - 1, "rounds_done": self._rounds_done, "time": time.time()}).encode())
        for old in storage.list_names(root):
            if old.startswith("step-") and old != name:
                storage.delete_dir(storage.join(root, old))
        elapsed = time.perf_counter() - t0
        self.summary.fixed["checkpoint_s"] = self.summary.fixed.get("checkpoint_s", 0.0) + elapsed
        self.summary.fixed["checkpoints"] = self.summary.fixed.get("checkpoints", 0) + 1
        log.info("checkpoint after step %d: %s (%.1f MiB in %.2f s)", self._step - 1, target, written / 2 ** 20,
                 elapsed)

    def _save_states(self, target: str) -> int:
        """Step runtime: shards write their tables, a job writes the cached worker states."""
        from pyspark import cloudpickle

        written = sum(r["bytes"] for r in self.group.broadcast(
            "snapshot", prefix=self.namespace + "/", dir=storage.join(target, "tables")))

        need_fingerprints = self._data_fingerprints is None

        def save(index, pairs):
            for data, state in pairs:
                blob = cloudpickle.dumps(state)
                storage.write_bytes(storage.join(target, f"state-{index:05d}.pkl"), blob)
                yield index, len(blob), _data_fingerprint(data) if need_fingerprints else None

        saved = sorted(self._zip(self._data_rdd, self._state_rdd).mapPartitionsWithIndex(save).collect())
        if [i for i, _, _ in saved] != list(range(self.num_workers)):
            raise StepFailedError(f"checkpoint {target}: states of workers {[i for i, _, _ in saved]} were "
                                  f"saved, expected 0..{self.num_workers - 1}")
        if need_fingerprints:  # data is immutable: hashed once per fit
            self._data_fingerprints = [fp for _, _, fp in saved]
        return written + sum(n for _, n, _ in saved)

    def _resume(self) -> bool:
        """Restore tables, worker states and driver state from the latest checkpoint of this
        fit, if there is one."""
        from pyspark import StorageLevel

        root = self._checkpoint_dir
        latest = storage.join(root, "LATEST")
        if not storage.exists(latest):
            return False
        t0 = time.perf_counter()
        meta = json.loads(storage.read_bytes(latest).decode())
        source = storage.join(root, meta["dir"])
        driver = pickle.loads(storage.read_bytes(storage.join(source, "driver.pkl")))
        if driver["num_workers"] != self.num_workers:
            raise ConfigurationError(f"checkpoint {source} has {driver['num_workers']} workers, this fit "
                                     f"{self.num_workers}")
        if self.resident:
            current, restore = self._resident_resume(source, meta["step"])
        else:
            current = [fp for _, fp in sorted(self._data_rdd.mapPartitionsWithIndex(
                lambda index, datas: [(index, _data_fingerprint(d)) for d in datas]).collect())]
        if current != driver["data_fingerprints"]:
            differ = [i for i, (a, b) in enumerate(zip(current, driver["data_fingerprints"])) if a != b]
            log.warning("checkpoint %s was made from other input data (workers %s differ); not resuming from it",
                        source, differ)
            return False
        self._data_fingerprints = current
        if self.resident:  # tables and the workers' snapshots go back onto the shards
            restore()
        else:
            self.group.broadcast("restore", prefix=self.namespace + "/", dir=storage.join(source, "tables"))

            def load(index, _data):
                yield pickle.loads(storage.read_bytes(storage.join(source, f"state-{index:05d}.pkl")))

            state = self._data_rdd.mapPartitionsWithIndex(load)
            state.persist(StorageLevel.MEMORY_AND_DISK)
            state.localCheckpoint()
            self._materialize(state)
            for old in self._old_rdds:
                old.unpersist()
            self._state_rdd = state
            self._old_rdds = [state]
        vars(self.program).update(driver["program"])
        self._step, self._rounds_done = driver["step"], driver["rounds_done"]
        self._rounds_hint = int(driver.get("rounds_hint", self.num_workers))
        self.summary.rows[:] = driver["rows"]
        self.summary.iterations[:] = driver["iterations"]
        self.summary.fixed["resumed_from_step"] = meta["step"]
        self.summary.fixed["resume_s"] = time.perf_counter() - t0
        log.info("fit %s resumed from checkpoint %s (step %d, %d rounds done) in %.1f s", self.namespace, source,
                 meta["step"], self._rounds_done, time.perf_counter() - t0)
        return True

    def _recover(self, exc: BaseException) -> bool:
        """After a failed step: when shards died or worker states were lost with an
        executor, restart what is gone and continue from the latest checkpoint (or from
        the start when there is none).  Anything else is re-raised.  Returns True when the
        failed step is to run again as it was (resident runtime: the shards kept every
        worker's state snapshot, so a relaunched job resumes right before that step)."""
        shards_alive = self.manager is not None and self.manager.alive()
        cause = str(exc) + " " + str(exc.__cause__ or "")
        states_lost = any(marker in cause for marker in _LOST_STATE_MARKERS)
        # a DataFrame input's job is a barrier result stage, which Spark never retries: a failed
        # task ends the job, and the driver relaunches it (what Spark does for an RDD input's stage)
        job_failed = self.frame is not None and "barrier ResultStage" in cause
        if shards_alive and not states_lost and not job_failed:
            raise exc
        self._recoveries += 1
        limit = self.config["recovery.maxAttempts"]
        if self._recoveries > limit:
            raise StepFailedError(f"gave up after {limit} recoveries (spark.pystrads.recovery.maxAttempts); last "
                                  f"failure: {cause}") from exc
        t0 = time.perf_counter()
        what = ("shards were lost" if not shards_alive else "worker states were lost with an executor" if states_lost
                else "its barrier job failed (a failed task ends a DataFrame input's job)")
        log.warning("step %d failed and %s; recovering (%d of at most %d) from %s", self._step, what,
                    self._recoveries, limit, "the latest checkpoint" if self._checkpoint_dir else "the start")
        if self.resident:
            self._cancel_job()
            if shards_alive:  # only the job was lost: its tasks restart from the shards' snapshots
                self._launch_job()
                self.summary.fixed["recoveries"] = self._recoveries
                self.summary.fixed["recovery_s"] = self.summary.fixed.get("recovery_s", 0.0) + \
                    time.perf_counter() - t0
                return True
            self._start()
            self._launch_job()
            self._posted_program = None  # new shards: the first command carries the program
        elif not shards_alive:
            self._start()  # new shards with freshly created tables
        if not (self._checkpoint_dir and self._resume()):
            if shards_alive:
                self._create_tables()
            vars(self.program).update(pickle.loads(self._program_initial))
            self.summary.rows.clear()
            self.summary.iterations.clear()
            self._init_state()
        self.summary.fixed["recoveries"] = self._recoveries
        self.summary.fixed["recovery_s"] = self.summary.fixed.get("recovery_s", 0.0) + time.perf_counter() - t0
        return False

    # ------------------------------------------------------------------ resident runtime
    def _launch_job(self) -> None:
        """Start the fit's one barrier job (in a driver thread): every worker's task loads its
        partition, says hello on shard 0 and then carries out the posted commands."""
        from pyspark import StorageLevel, cloudpickle

        t0 = time.perf_counter()
        self._cancel_job()
        blob = cloudpickle.dumps(self.program)
        digest = program_hash(blob)
        spec = ResidentSpec(blob, digest, self.group, dict(self.layouts), self.num_workers, self.seed,
                            self.config["round.timeoutSeconds"], self.namespace, bool(self._checkpoint_dir),
                            self.keep_states, self.export)
        if self.frame is not None:
            frame = self.frame
            if not self.prepartitioned and not (self.sc is not None  # classic: partitions known without a job
                                                and frame.rdd.getNumPartitions() == self.num_workers):
                frame = frame.repartition(self.num_workers)
            # a barrier result stage: Spark does not retry it, the driver relaunches the job (from
            # the snapshots) as it does for any failed resident job
            decode = self.decode
            out = frame.mapInArrow(lambda batches: run_resident_arrow(spec, batches, decode), "unused binary",
                                   barrier=True)
        else:
            rdd = self.rdd
            if rdd.getNumPartitions() != self.num_workers:
                rdd = rdd.repartition(self.num_workers)
            out = rdd.barrier().mapPartitions(lambda it: run_resident(spec, it))
            if self.keep_states:  # the finished tasks' (data, state), read by map_states
                out.persist(StorageLevel.MEMORY_AND_DISK)
        self._posted_program = digest
        self._job = _ResidentJob(self, out)
        self.job_groups.append(self._job.group_id)
        self._job.start()
        self.summary.fixed["launch_s"] = self.summary.fixed.get("launch_s", 0.0) + time.perf_counter() - t0

    def _cancel_job(self) -> None:
        job, self._job = self._job, None
        if job is not None:
            job.cancel()


    def _job_error(self) -> Optional[BaseException]:
        """Why the fit's job cannot go on (it ended, or its tasks never got task slots), or None."""
        job = self._job
        if job is None:
            return StepFailedError("the fit's barrier job is not running")
        if not job.thread.is_alive():
            return job.error
        return self._slot_wait_error(job)

    def _slot_wait_error(self, job: "_ResidentJob") -> Optional[BaseException]:
        """A barrier job runs only when all its tasks get slots at once; while another job holds
        them it waits.  Warn every 30 s, and fail after ``round.timeoutSeconds`` instead of waiting
        for ever."""
        if job.started:
            return None
        waited = time.monotonic() - job.t_launch
        if waited < SLOT_WAIT_WARN_SECONDS:
            return None
        running = job.running_tasks()
        if running >= self.num_workers:
            job.started = True
            return None
        message = (f"the fit's barrier job has waited {waited:.0f} s for task slots: {running} of its "
                   f"{self.num_workers} tasks run (a barrier stage starts only when every task has a slot). "
                   f"Another Spark job holds them (a concurrent fit or job of this application?); free them, "
                   f"give the application at least {self.num_workers} task slots, or lower numWorkers")
        if waited > self.config["round.timeoutSeconds"]:
            self._cancel_job()
            return StepFailedError(message + " (gave up after spark.pystrads.round.timeoutSeconds)")
        if waited - job.warned >= SLOT_WAIT_WARN_SECONDS:
            job.warned = waited
            log.warning("fit %s: %s", self.namespace, message)
        return None

    def _hellos(self) -> Dict[int, Dict[str, Any]]:
        """Wait until every worker's task said hello (data loaded); their hellos by worker."""
        while True:
            answer = self.group.client(0).action("wait_hellos", namespace=self.namespace,
                                                 num_workers=self.num_workers, timeout=1.0)
            if answer["complete"]:
                return {int(w): h for w, h in answer["hellos"].items()}
            error = self._job_error()
            if error is not None:
                raise StepFailedError(f"the fit's barrier job ended before every worker loaded its data. "
                                      f"Cause: {_python_cause(error)}") from error

    def _command(self, step: int, schedule: Optional[Schedule]) -> Dict[str, Any]:
        from pyspark import cloudpickle

        blob = cloudpickle.dumps(self.program)
        digest = program_hash(blob)
        command: Dict[str, Any] = {"kind": "step", "step": step, "round_offset": self._rounds_done,
                                   "staleness": int(getattr(self.program, "staleness", 0)),
                                   "program_hash": digest}
        if digest != self._posted_program:
            command["program"] = base64.b64encode(blob).decode()
        if schedule is None:
            command["init"] = True
        else:
            command["schedule"] = base64.b64encode(cloudpickle.dumps(schedule)).decode()
        return command

    def _run_resident_step(self, step: int, command: Dict[str, Any]) -> Dict[str, Any]:
        """Open the step on every shard (shard 0 last, with the command), wait until every
        worker finished it, then commit (or, on failure, roll back and raise)."""
        group = self.group
        body = dict(step=step, num_workers=self.num_workers, namespace=self.namespace, round_offset=self._rounds_done)
        try:
            from ..ps.client import fan_out

            fan_out([lambda i=i: group.client(i).action("begin_step", **body) for i in range(1, len(group.shards))])
            group.client(0).action("begin_step", command=command, **body)
            if "program" in command:
                self._posted_program = command["program_hash"]
            while True:
                answer = group.client(0).action("wait_step", step=step, timeout=1.0)
                if answer["done"]:
                    break
                if answer.get("error"):
                    raise StepFailedError(answer["error"])
                error = self._job_error()
                if error is not None:
                    raise error
        except BaseException as exc:
            try:
                group.broadcast("abort_step", step=step)
            except PystradsError as abort_exc:
                log.warning("step %d: could not roll back every shard: %s", step, abort_exc)
            if isinstance(exc, KeyboardInterrupt):
                self._cancel_job()
                raise
            raise StepFailedError(
                f"step {step} failed; the model tables were rolled back to their state before the step. "
                f"Cause: {exc if isinstance(exc, PystradsError) else _python_cause(exc)}") from exc
        counters = group.broadcast("commit_step", step=step)
        self._last_counters = counters
        return answer

    def _resident_metrics(self, answer: Dict[str, Any]) -> StepMetrics:
        if getattr(self.program, "shard_metrics_every", 0):
            return self._collect_metrics()
        merged = {int(k): v for k, v in answer.get("rounds", {}).items()}
        n = max(merged, default=-1) + 1
        return StepMetrics([merged.get(i, {}) for i in range(n)])

    def _traffic(self) -> Dict[str, int]:
        """Shards' traffic since the previous call (from the counters commit_step returned)."""
        total = {"bytes_in": 0, "bytes_out": 0, "requests": 0}
        for c in getattr(self, "_last_counters", None) or []:
            for k in total:
                total[k] += c.get(k, 0)
        before, self._counters = self._counters or total, total
        return {k: total[k] - before[k] for k in total}

    def _resident_init(self) -> None:
        t0 = time.perf_counter()
        self._step, self._rounds_done, self._rounds_hint = 0, 0, self.num_workers
        answer = self._run_job(0, self._command(0, None))
        metrics = self._resident_metrics(answer)
        self._traffic()
        loads = [h.get("load_s") or 0.0 for h in self._hellos().values()]
        self.summary.fixed["load_s"] = float(max(loads, default=0.0))  # inside the job, before the init step
        self.summary.fixed["init_s"] = time.perf_counter() - t0
        self.summary.fixed["init_compute_s"] = metrics.total("_compute_s") / self.num_workers
        self._step = 1

    def _resident_finish(self) -> None:
        """Tell the tasks the fit is over; they hand their (data, state) to Spark's cache
        (for :meth:`map_states`) and the job ends."""
        t0 = time.perf_counter()
        self.group.client(0).action("post", namespace=self.namespace,
                                    command={"kind": "finish", "step": self._step - 1})
        job = self._job
        if self.export is not None:
            self.exports = self._collect_exports(job)
        if not self.keep_states:
            # nothing to hand over: the tasks end on their own (~0.3 s of Spark's job teardown the
            # fit need not wait for; a failure then is only logged)
            job.detached = True
            self._job = None
            self.summary.fixed["finish_s"] = time.perf_counter() - t0
            return
        job.thread.join()
        if job.error is not None:
            raise StepFailedError(f"the fit's barrier job failed while finishing: {_python_cause(job.error)}") \
                from job.error
        self._result_rdd = job.rdd
        self._job = None
        self.summary.fixed["finish_s"] = time.perf_counter() - t0

    def _collect_exports(self, job) -> List[Any]:
        """Each worker's ``export`` result, read from the shard it left it on."""
        from ..ps.client import fan_out
        from .resident import export_key

        S = len(self.group.shards)
        keys = {w: export_key(self.namespace, w) for w in range(self.num_workers)}
        while True:
            missing = sum((self.group.client(i).action(
                "wait_blobs", keys=[k for w, k in keys.items() if w % S == i], timeout=1.0)["missing"]
                for i in range(S)), [])
            if not missing:
                break
            if not job.thread.is_alive():
                raise StepFailedError(f"the fit's job ended before every worker exported its results (missing "
                                      f"{missing}): {_python_cause(job.error) if job.error else 'no error'}")
        blobs = fan_out([lambda w=w: self.group.client(w % S).get_blob(keys[w]) for w in range(self.num_workers)])
        return [pickle.loads(b) for b in blobs]

    def _resident_checkpoint(self, target: str) -> int:
        """Shards write their tables and the workers' state snapshots of the last step."""
        answers = self.group.broadcast("snapshot", prefix=self.namespace + "/", dir=storage.join(target, "tables"),
                                       states_prefix=states_prefix(self.namespace), states_step=self._step - 1,
                                       states_dir=target)
        saved = sorted(w for a in answers for w in a.get("states", []))
        if saved != list(range(self.num_workers)):
            raise StepFailedError(f"checkpoint {target}: states of workers {saved} were saved, expected "
                                  f"0..{self.num_workers - 1}")
        if self._data_fingerprints is None:
            hellos = self._hellos()
            self._data_fingerprints = [hellos[w]["fingerprint"] for w in range(self.num_workers)]
        return sum(a["bytes"] for a in answers)

    def _resident_resume(self, source: str, step: int) -> bool:
        from ..ps.client import fan_out

        hellos = self._hellos()
        current = [hellos[w]["fingerprint"] for w in range(self.num_workers)]
        return current, (lambda: fan_out([
            lambda i=i: self.group.client(i).action(
                "restore", prefix=self.namespace + "/", dir=storage.join(source, "tables"),
                states_prefix=states_prefix(self.namespace), states_step=step, states_dir=source,
                states_workers=[w for w in range(self.num_workers) if w % len(self.group.shards) == i])
            for i in range(len(self.group.shards))]))

    # ------------------------------------------------------------------ results
    def map_states(self, fn: Callable[[int, Any, Any], Any]) -> List[Any]:
        """``fn(worker, data, state)`` on every worker's current state; results in worker order."""
        if self.resident and not self.keep_states:
            raise PystradsError("map_states: this Engine was made with keep_states=False, so the workers' states "
                                "were not kept after the fit; make it with keep_states=True to read them")
        pairs = self._result_rdd if self.resident else self._zip(self._data_rdd, self._state_rdd)

        def run(index, it):
            for data, state in it:
                yield index, fn(index, data, state)

        return [v for _, v in sorted(pairs.mapPartitionsWithIndex(run).collect(), key=lambda kv: kv[0])]

    def release(self) -> None:
        """Drop the fit's tables from the shards and unpersist its RDDs."""
        self._cancel_job()
        for rdd in self._old_rdds + [self._data_rdd, self._result_rdd]:  # noqa: B007
            if rdd is not None:
                try:
                    rdd.unpersist()
                except Exception:  # the SparkContext may be gone
                    pass
        self._old_rdds = []
        if self.group is not None:
            try:
                self.group.broadcast("drop_tables", prefix=self.namespace + "/")
            except PystradsError:
                pass


class _ResidentJob:
    """The fit's barrier job, collected in a driver thread (its own Spark job group, or job
    tag under Spark Connect, so that it can be cancelled).  ``rdd``: the job's RDD or DataFrame."""

    def __init__(self, engine: "Engine", rdd):
        self.engine = engine
        self.rdd = rdd
        self.group_id = f"pystrads-{engine.namespace}-{secrets.token_hex(3)}"
        self.error: Optional[BaseException] = None
        self.thread = None
        self.detached = False  # the fit is over and no longer waits for this job
        self.t_launch = time.monotonic()
        self.started = False  # every task was seen running (checked only while a wait lasts)
        self.warned = 0.0

    def running_tasks(self) -> int:
        """The most tasks running at once in any stage of this job (its barrier stage's, once it runs)."""
        engine = self.engine
        if engine.sc is None:  # Spark Connect: no status tracker; nothing to warn about
            return engine.num_workers
        try:
            tracker = engine.sc.statusTracker()
            most = 0
            for job_id in tracker.getJobIdsForGroup(self.group_id):
                info = tracker.getJobInfo(job_id)
                for stage_id in (info.stageIds if info else []):
                    stage = tracker.getStageInfo(stage_id)
                    if stage is not None:
                        most = max(most, stage.numActiveTasks)
            return most
        except Exception:  # noqa: BLE001 -- no status (the SparkContext is gone): do not fail on that
            return engine.num_workers

    def start(self) -> None:
        engine = self.engine
        connect = engine.sc is None

        def run():
            try:
                if connect:  # job tags are per thread and session; interruptTag cancels the job
                    engine.spark.spark.addTag(self.group_id)
                else:
                    engine.sc.setJobGroup(self.group_id, f"pystrads fit {engine.namespace}: resident workers",
                                          interruptOnCancel=True)
                if engine.frame is not None:
                    self.rdd.collect()  # a DataFrame whose tasks return no rows
                else:
                    engine._materialize(self.rdd)
            except BaseException as exc:  # noqa: BLE001 -- reported to the driver's loop
                self.error = exc
                if self.detached:
                    log.warning("fit %s: its job failed after the fit had finished: %s", engine.namespace,
                                _python_cause(exc))
            finally:
                if connect:
                    try:
                        engine.spark.spark.removeTag(self.group_id)
                    except Exception:  # noqa: BLE001 -- the session may be gone
                        pass

        if connect:
            self.thread = threading.Thread(target=run, name=f"pystrads-job-{engine.namespace}", daemon=True)
        else:
            from pyspark import InheritableThread

            self.thread = InheritableThread(target=run, name=f"pystrads-job-{engine.namespace}", daemon=True)
        self.thread.start()

    def cancel(self) -> None:
        engine = self.engine
        if self.thread is not None and self.thread.is_alive():
            try:
                if engine.sc is None:
                    engine.spark.spark.interruptTag(self.group_id)
                else:
                    engine.sc.cancelJobGroup(self.group_id)
            except Exception:  # noqa: BLE001 -- the SparkContext may be gone
                pass
            self.thread.join(timeout=60)
        if engine.frame is None:
            try:
                self.rdd.unpersist()
            except Exception:  # noqa: BLE001
                pass


class FitResult:
    """The outcome of :meth:`Engine.fit`: summary, tables and worker states.

    Call :meth:`release` (or use it as a context manager) to free the shard
    memory and cached RDDs once the results are read.
    """

    def __init__(self, engine: Engine, stop_reason: Optional[str]):
        self.engine = engine
        self.summary = engine.summary
        self.stop_reason = stop_reason

    def table(self, name: str):
        return self.engine.table(name)

    def read_table(self, name: str) -> np.ndarray:
        """The whole table on the driver (mind memory for big models)."""
        return self.engine.table(name).read_all()

    def map_states(self, fn: Callable[[int, Any, Any], Any]) -> List[Any]:
        return self.engine.map_states(fn)

    @property
    def exports(self) -> List[Any]:
        """The ``export(worker, data, state)`` results of the Engine's workers, in worker order."""
        if self.engine.exports is None:
            raise PystradsError("no exports: make the Engine with export=fn(worker, data, state) (resident runtime)")
        return self.engine.exports

    def release(self) -> None:
        self.engine.release()

    def __enter__(self) -> "FitResult":
        return self

    def __exit__(self, *exc) -> None:
        self.release()
