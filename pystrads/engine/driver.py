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

This module holds the Engine's core (setup, the step loop, results); its
pre-flight checks are in :mod:`~pystrads.engine.preflight`, checkpoints and
recovery in :mod:`~pystrads.engine.checkpoints`, the resident runtime's
driver side in :mod:`~pystrads.engine.resident_driver`.
"""

from __future__ import annotations

import base64
import logging
import secrets
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional

import numpy as np

from ..config import Config
from ..errors import ConfigurationError, PystradsError, ScheduleError, ShardUnavailableError, StepFailedError
from ..ps import launcher
from ..ps.partition import TableLayout, range_bounds
from ..ps.protocol import check_dtype
from .checkpoints import CheckpointMixin, _program_attributes
from .preflight import (_python_cause, check_checkpoint_storage, check_cluster, default_num_workers,
                        expected_executors, to_workers)
from .program import Program, Schedule, ScheduleContext, StepMetrics
from .progress import ProgressReporter
from .resident_driver import ResidentMixin, _ResidentJob
from .spark import handle_of, is_dataframe
from .worker import StepSpec, run_init, run_load, run_rounds

log = logging.getLogger(__name__)

#: Fits of one application step one at a time: the shards hold one open step
#: (its fence, round clocks and undo log), and every fit's barrier stages
#: already take all the task slots they use.  Concurrent fits (CrossValidator
#: with ``parallelism`` > 1, threads in a notebook) queue here instead of
#: colliding; their tables live side by side under their own namespaces.
_STEPPING = threading.Lock()



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


class Engine(CheckpointMixin, ResidentMixin):
    """Runs one :class:`Program` over the partitions of an RDD or a DataFrame.

    Parameters
    ----------
    program : Program
        The model-parallel program.
    rdd : pyspark.RDD or pyspark.sql.DataFrame
        Input records, each partition one worker's; brought to ``num_workers``
        partitions if needed (more are merged whole, so records partitioned by a
        key stay together; fewer are repartitioned).  An RDD's records are its elements.
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
    decode_batch : callable, optional
        DataFrame input only, instead of ``decode``: ``fn(pyarrow.RecordBatch) -> records``, in
        order (columnar: a ``load`` taking blocks of numpy arrays skips the ~10 µs tuple per row).
    """

    def __init__(self, program: Program, rdd, num_workers: Optional[int] = None, seed: int = 0,
                 config: Optional[Mapping[str, Any]] = None, keep_states: Optional[bool] = None,
                 export: Optional[Callable[[int, Any, Any], Any]] = None, prepartitioned: bool = False,
                 decode: Optional[Callable[[Any], Any]] = None, decode_batch: Optional[Callable] = None):
        if not isinstance(program, Program):
            raise TypeError(f"program must be a pystrads Program, got {type(program).__name__}")
        self.program = program
        self.spark = handle_of(rdd)
        self.frame = rdd if is_dataframe(rdd) else None  # DataFrame input (classic or Spark Connect)
        self.rdd = None if self.frame is not None else rdd
        self.sc = None if self.spark.connect else getattr(self.spark, "sc", None)
        self.prepartitioned = bool(prepartitioned)
        for name, fn in (("decode", decode), ("decode_batch", decode_batch)):
            if fn is not None and self.frame is None:
                raise ConfigurationError(f"{name}= applies to DataFrame inputs; map the RDD instead")
        if decode is not None and decode_batch is not None:
            raise ConfigurationError("give decode= (per row) or decode_batch= (per Arrow batch), not both")
        self.decode, self.decode_batch = decode, decode_batch
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
        rdd = to_workers(self.rdd, self.num_workers)
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
            self._launch_job() if self.resident else self._load_data()
            self._check_data()
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
        """The ``export(worker, data, state)`` results of the Engine's workers, in worker order, on
        the driver (:func:`pystrads.engine.frames.shard_frame` reads them on the executors instead)."""
        return self.engine.fetch_exports()

    def release(self) -> None:
        self.engine.release()

    def __enter__(self) -> "FitResult":
        return self

    def __exit__(self, *exc) -> None:
        self.release()
