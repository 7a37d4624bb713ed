"""Driver side: the Spark driver is the scheduler.

:class:`Engine` runs a :class:`~pystrads.engine.program.api.Program` over an RDD or a DataFrame:
pre-flight checks, shard start (first use), table creation, the fit's one barrier job whose
tasks are the workers, an init step, then steps -- ``schedule`` on the driver, the step's
command posted to the shards, the workers' rounds, metrics, ``after_step`` -- until the program
stops.  Each step is atomic: shards undo its writes unless the driver commits it.  Data and
state stay in the workers' tasks; after each step a worker leaves a snapshot of its state on a
shard, from which a restarted task resumes.

The Engine holds the step loop (:class:`~pystrads.engine.scheduler.loop.StepLoop`) and owns the recovery after a
failed step and the summary; its parts are objects of their own: the pre-flight step
(:mod:`~pystrads.engine.driver.preflight`, run once), the worker job
(:class:`~pystrads.engine.driver.launch.BarrierJob`) and the checkpoints
(:class:`~pystrads.engine.scheduler.checkpoints.Checkpointer`).  With the scheduler in the job
(``scheduler.location``) the loop's owner is the coordinator there
(:mod:`~pystrads.engine.executor.coordinator`), and the Engine starts the shards, launches, relaunches
and reads the job.
"""

from __future__ import annotations

import logging
import pickle
import secrets
import sys
import time
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional

import numpy as np

from ...errors import (ConfigurationError, ProgramError, PystradsError, ShardUnavailableError, StepFailedError,
                       python_cause)
from ...ps import launcher
from ...ps.partition import TableLayout
from ...ps.protocol import Action, check_dtype
from ...spark import is_dataframe
from ..scheduler.checkpoints import Checkpointer, Position, program_attributes
from .launch import BarrierJob, WorkerInput
from ..scheduler.journal import Journal, MemoryStore
from ..scheduler.loop import StepLoop, TrainingSummary, make_tables, plan_tables  # noqa: F401 -- TrainingSummary: this API
from .preflight import (FitSetup, check_checkpoint_storage, check_cluster, expected_executors,
                        preflight)
from ..program.api import Program
from ..scheduler.progress import ProgressReporter

log = logging.getLogger(__name__)


def _cancelled(cause: str) -> bool:
    """Whether a job's failure says it was cancelled (by the user, or with its SparkContext):
    such a job is not relaunched."""
    import re

    return "OPERATION_CANCELED" in cause or re.search(r"Job \d+ cancell?ed", cause) is not None


class Engine:
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
        With a DataFrame the workers' states are not kept after the fit (use ``export``).
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
    setup : FitSetup, optional
        The result of :func:`~pystrads.engine.driver.preflight.preflight` when the caller already ran it
        (the estimators do, before their input scan); then ``num_workers`` and ``config`` are
        its, and its checks do not run again.
    """

    def __init__(self, program: Program, rdd, num_workers: Optional[int] = None, seed: int = 0,
                 config: Optional[Mapping[str, Any]] = None, keep_states: Optional[bool] = None,
                 export: Optional[Callable[[int, Any, Any], Any]] = None, prepartitioned: bool = False,
                 decode: Optional[Callable[[Any], Any]] = None,
                 decode_batch: Optional[Callable[[Any], Iterable[Any]]] = None,
                 setup: Optional[FitSetup] = None):
        if not isinstance(program, Program):
            raise TypeError(f"program must be a pystrads Program, got {type(program).__name__}")
        frame = rdd if is_dataframe(rdd) else None
        for name, fn in (("decode", decode), ("decode_batch", decode_batch)):
            if fn is not None and frame is None:
                raise ConfigurationError(f"{name}= applies to DataFrame inputs; map the RDD instead")
        if decode is not None and decode_batch is not None:
            raise ConfigurationError("give decode= (per row) or decode_batch= (per Arrow batch), not both")
        if setup is None:
            setup = preflight(rdd, num_workers, config, check=False)
        self.setup = setup
        self.program = program
        self.spark = setup.spark
        self.sc = None if self.spark.connect else getattr(self.spark, "sc", None)
        self.config = setup.config
        self.num_workers = setup.num_workers
        self.seed = int(seed) & 0xFFFFFFFFFFFFFFFF  # numpy seeds must be >= 0 (pyspark's default seeds are not)
        staleness = getattr(program, "staleness", 0)
        if not isinstance(staleness, (int, np.integer)) or staleness < 0:
            raise ConfigurationError(f"{type(program).__name__}.staleness={staleness!r} must be an integer >= 0")
        if staleness and program.has_apply():
            raise ConfigurationError(
                f"{type(program).__name__} defines apply(), which needs each round committed before "
                f"the next: staleness must be 0, got {staleness}")
        location = self.config["scheduler.location"]
        self.in_job = location == "job" or (location == "auto" and self.spark.connect)
        if self.in_job and frame is None:
            raise ConfigurationError(
                "the scheduler runs in the fit's job (spark.pystrads.scheduler.location="
                f"{location}{', under Spark Connect' if self.spark.connect else ''}), which reads a DataFrame "
                "input; give the Engine a DataFrame, or set spark.pystrads.scheduler.location=driver")
        if keep_states is None:
            keep_states = frame is None
        if keep_states and frame is not None:
            raise ConfigurationError(
                "keep_states=True needs an RDD input (the states are cached as an RDD); with a DataFrame "
                "input hand the workers' results over with export=fn(worker, data, state) instead")
        self.summary = TrainingSummary()
        self.manager = None
        self.group = None
        self.layouts: Dict[str, TableLayout] = {}
        self.namespace = "fit-" + secrets.token_hex(6)
        data = WorkerInput(rdd=None if frame is not None else rdd, frame=frame, prepartitioned=bool(prepartitioned),
                           decode=decode, decode_batch=decode_batch)
        self.threads = setup.threads
        self.job = BarrierJob(self.spark, data, self.num_workers, self.seed, self.namespace,
                             self.config["round.timeoutSeconds"], bool(keep_states), export, self.threads,
                             task_cpus=setup.task_cpus)
        self.checkpoints: Optional[Checkpointer] = None
        self.loop: Optional[StepLoop] = None  # the step loop of a fit whose scheduler is this process
        self.progress: Optional[ProgressReporter] = None
        self._position = Position(0, 0, self.num_workers)
        self._program_initial: Optional[bytes] = None  # the program's attributes before the first step
        self._recoveries = 0

    @property
    def job_groups(self) -> List[str]:
        """Spark job groups (tags) of the fit's worker job: one, or one per relaunch."""
        return self.job.job_groups

    # ------------------------------------------------------------------ setup
    def _check_tables(self) -> None:
        tables = list(self.program.tables())
        names = [t.name for t in tables]
        if len(set(names)) != len(names):
            raise ConfigurationError(f"{type(self.program).__name__} declares duplicate tables: {names}")
        for t in tables:
            check_dtype(t.dtype)
            if t.num_rows < 0 or t.width < 1:
                raise ConfigurationError(f"table {t.name!r}: bad shape {t.num_rows} x {t.width}")

    def _start_shards(self) -> None:
        t0 = time.perf_counter()
        launcher.drop_stopped()
        if self.manager is not None:  # its shards were found gone: let go of them first
            launcher.release_shards(self.manager, self)
            self.manager = None
        try:
            self.manager = launcher.get_shards(self.spark, self.config, expected_executors(self.spark), holder=self)
        except PystradsError:
            raise
        except Exception as exc:
            cause = python_cause(exc)
            if "No module named" in cause:
                raise ConfigurationError(
                    f"executors could not import pystrads ({cause}); install it on every executor or set "
                    f"PYSPARK_PYTHON={sys.executable} so executors use the driver's environment") from exc
            raise
        self.group = self.manager.group
        self.summary.add_time("shard_start_s", time.perf_counter() - t0)
        self._create_tables()

    def _create_tables(self) -> None:
        """Create (or re-create, with initial values) the program's tables on the shards."""
        t0 = time.perf_counter()
        make_tables(self.group, self._plan_tables(), self.namespace, self.program)
        self.summary.add_time("table_create_s", time.perf_counter() - t0)

    def _plan_tables(self) -> List[tuple]:
        """The program's tables laid out over the shards (``self.layouts``); returns the
        ``(shard, create_table arguments)`` that make them."""
        layouts, creations = plan_tables(self.program, self.namespace, len(self.group.shards),
                                         self.config["table.sparseRowMaxFill"])
        self.layouts.update(layouts)
        return creations

    def _launch(self, new_shards: bool = False) -> None:
        seconds = self.job.launch(self.program, self.group, self.layouts, fingerprint=self.checkpoints is not None,
                                  new_shards=new_shards)
        self.summary.add_time("launch_s", seconds)

    def table(self, name: str):
        """Driver-side handle of a table (reads; writes only between steps).  With the scheduler in
        the job, a handle that reads through a Spark task (:class:`RelayedTable`)."""
        try:
            layout = self.layouts[name]
        except KeyError:
            raise KeyError(f"no table {name!r}; the program declares {sorted(self.layouts)}") from None
        if self.in_job and self.manager is not None:
            from .relay import RelayedTable

            return RelayedTable(self.spark, self.group, layout)
        return self.group.table(layout)

    # ------------------------------------------------------------------ the fit
    def fit(self, max_steps: Optional[int] = None) -> "FitResult":
        """Run the program until ``schedule`` returns ``None``, ``ctx.stop`` is called or
        ``max_steps`` steps ran."""
        return self._fit(max_steps)  # fits of one application step at once: the shards keep a step per fit

    def _fit(self, max_steps: Optional[int]) -> "FitResult":
        t_fit = time.perf_counter()
        if not self.setup.checked:
            check_cluster(self.spark, self.num_workers, self.config)
        self._check_tables()
        log.info("fit %s: program %r, %d workers x %d threads, seed %d, settings %s", self.namespace,
                 self.program, self.num_workers, self.threads, self.seed, dict(self.config))
        self.summary.fixed["threads"] = self.threads
        self.summary.fixed["workers"] = self.num_workers
        self.checkpoints = Checkpointer.of(self.config, self.sc, self.program, self.num_workers, self.seed)
        if self.checkpoints is not None:
            check_checkpoint_storage(self.checkpoints.root, self.spark.hosts())
        self._program_initial = program_attributes(self.program)
        if self.in_job:
            return self._fit_in_job(max_steps, t_fit)
        self._start_shards()
        if self.checkpoints is not None and self.spark.connect:  # the hosts are known once the shards run
            check_checkpoint_storage(self.checkpoints.root, {s.host for s in self.group.shards})
        try:
            self._launch()
            # the journal stays in this process: a restarted driver resumes from checkpoints
            self.loop = StepLoop(self, self.program, self.config, self.num_workers, self.seed, self.namespace,
                                 self.job, Journal(MemoryStore()), self.summary, self.checkpoints)
            stopped = self.loop.drive(max_steps)
            self._position = self.loop.position
            self.summary.fixed["total_s"] = time.perf_counter() - t_fit
            self.summary.shards = self.group.broadcast(Action.STATS)  # memory and traffic per shard
            return FitResult(self, stopped)
        except BaseException:
            self.release()
            raise

    def _recover_in_job(self, exc: BaseException, spec):
        """After the fit's job failed (a task or an executor lost, or the coordinator stopped on a
        lost shard): the coordinator spec to relaunch it with -- resuming from the coordinator's
        journal on the shards when they live (a new loop epoch), else on new shards from the latest checkpoint or the
        start; re-raises when the job was cancelled or after ``recovery.maxAttempts``."""
        import dataclasses

        cause = str(exc) + " " + str(exc.__cause__ or "")
        if _cancelled(cause):
            raise exc
        from ...ps.relay import through_spark
        from ..executor.coordinator import fit_error

        try:  # a worker's program error fails its task, and so the job: the fit ends with it
            reported = through_spark(self.spark, self.group, fit_error, self.namespace)
        except Exception:  # noqa: BLE001 -- shards gone: a lost shard, recovered below
            reported = None
        if reported:
            raise ProgramError(reported) from exc
        limit = self._count_recovery(exc, cause)
        t0 = time.perf_counter()
        alive = self.manager.alive()  # through a Spark task
        log.warning("fit %s: its job failed (%s); relaunching it (%d of at most %d) %s", self.namespace,
                    python_cause(exc), self._recoveries, limit,
                    "from the coordinator's state on the shards" if alive else "on new shards")
        epoch = spec.epoch + 1  # the relaunched coordinator's: the lost one's requests are refused from now on
        if alive:
            from ..executor.coordinator import settle_for_relaunch

            # the shards wait for the relaunched coordinator as long as its job may wait for slots
            hold = self.config["round.timeoutSeconds"] + self.config["shard.leaseSeconds"]
            log.info("fit %s: %s", self.namespace, through_spark(self.spark, self.group, settle_for_relaunch,
                                                                self.namespace, epoch, self.job.seals, hold))
            spec = dataclasses.replace(spec, resume=True, epoch=epoch)
        else:
            self.manager.shutdown()
            self.manager = launcher.start_for_fit(self.spark, self.config, expected_executors(self.spark))
            self.group = self.manager.group
            self.layouts = {}
            spec = dataclasses.replace(spec, resume=False, tables=self._plan_tables(),
                                       admin_token=self.manager.admin_token, epoch=epoch)
        self.summary.fixed["recoveries"] = self._recoveries
        self.summary.add_time("recovery_s", time.perf_counter() - t0)
        return spec

    def _fit_in_job(self, max_steps: Optional[int], t_fit: float) -> "FitResult":
        """The fit with its scheduler in its job (:mod:`~pystrads.engine.executor.coordinator`): shards of
        its own started through Spark, the job launched with the coordinator in its first task,
        and the coordinator's result read from the job; no connection to an executor from here."""
        from ..executor.coordinator import CoordinatorSpec
        from .relay import ProgressPoll

        t0 = time.perf_counter()
        self.manager = launcher.start_for_fit(self.spark, self.config, expected_executors(self.spark))
        self.group = self.manager.group
        self.summary.add_time("shard_start_s", time.perf_counter() - t0)
        if self.checkpoints is not None:  # the hosts are known once the shards run
            check_checkpoint_storage(self.checkpoints.root, {s.host for s in self.group.shards})
        try:
            spec = CoordinatorSpec(dict(self.config), self._plan_tables(), self.checkpoints, max_steps,
                                   self.manager.admin_token, type(self.program).__name__)
            self.progress = self.progress_reporter()
            while True:
                self.summary.add_time("launch_s", self.job.launch(
                    self.program, self.group, self.layouts, fingerprint=self.checkpoints is not None,
                    coordinator=spec))
                with ProgressPoll(self) as poll:
                    try:
                        result = self.job.coordinator_result()
                    except StepFailedError as exc:
                        result = {"error": exc}
                failure = result.get("error")
                if not isinstance(failure, (StepFailedError, ShardUnavailableError)):
                    break
                spec = self._recover_in_job(failure, spec)
            last = result.get("progress")
            if last is not None and last["seq"] > poll.seen:  # the end, or no poll ran
                self.progress.update(last["done"], last["total"], last["unit"], **last["shown"])
            summary = result.get("summary") or {}
            self.summary.rows[:] = summary.get("rows", [])
            self.summary.iterations[:] = summary.get("iterations", [])
            for key, value in summary.get("fixed", {}).items():  # the coordinator's, beside this process's
                if key.endswith("_s"):
                    self.summary.add_time(key, value)
                else:
                    self.summary.fixed[key] = value
            if "error" in result:
                raise result["error"]
            vars(self.program).update(result["program"])
            self._position = Position(**result["position"])
            self.summary.shards = result["shards"]
            self.summary.fixed["total_s"] = time.perf_counter() - t_fit
            self.progress.finish(result["stopped"] or "done")
            return FitResult(self, result["stopped"])
        except BaseException:
            self.release()
            raise

    def progress_reporter(self) -> ProgressReporter:
        """Where the fit's progress shows: a log line, and a bar in a notebook."""
        return ProgressReporter(f"{type(self.program).__name__} {self.namespace}", self.config["progress"])

    def _count_recovery(self, exc: BaseException, cause: str) -> int:
        """One more recovery; raises once there were more than ``recovery.maxAttempts``, else
        returns that limit."""
        self._recoveries += 1
        limit = self.config["recovery.maxAttempts"]
        if self._recoveries > limit:
            raise StepFailedError(f"gave up after {limit} recoveries (spark.pystrads.recovery.maxAttempts); last "
                                  f"failure: {cause}") from exc
        return limit

    def recover(self, exc: BaseException) -> None:
        """After a failed step (the loop settled it: rolled back, or committed when its journal
        entry was written) -- a lost task, job, executor or shard, never the program's own error
        (:class:`~pystrads.errors.ProgramError` is not caught): restart what is gone and continue,
        from the journal when the shards live (the workers' new tasks restore the shards'
        snapshots of its step), else from the latest checkpoint or from the start (the loop
        decides, :meth:`StepLoop.drive`), at most ``recovery.maxAttempts`` times.  A job the user
        cancelled is not relaunched."""
        cause = str(exc) + " " + str(exc.__cause__ or "")
        if _cancelled(cause):
            raise exc
        shards_alive = self.manager is not None and self.manager.alive()
        limit = self._count_recovery(exc, cause)
        t0 = time.perf_counter()
        what = "shards were lost" if not shards_alive else "its barrier job failed or stalled"
        log.warning("step %d failed and %s; recovering (%d of at most %d) from %s", self.loop.position.step, what,
                    self._recoveries, limit, "the last committed step" if shards_alive else
                    "the latest checkpoint" if self.checkpoints else "the start")
        self.job.cancel()
        if not shards_alive:
            self.loop.journal.clear()
            self._start_shards()  # new shards with freshly created tables
        self._launch(new_shards=not shards_alive)
        if self.loop.journal.read() is None:  # nothing committed is left: the fit starts over (or resumes)
            vars(self.program).update(pickle.loads(self._program_initial))
            self.summary.rows.clear()
            self.summary.iterations.clear()
        self.summary.fixed["recoveries"] = self._recoveries
        self.summary.add_time("recovery_s", time.perf_counter() - t0)

    # ------------------------------------------------------------------ results
    def map_states(self, fn: Callable[[int, Any, Any], Any]) -> List[Any]:
        """``fn(worker, data, state)`` on every worker's final state; results in worker order."""
        if self.job.result_rdd is None:
            raise PystradsError("map_states: this Engine was made with keep_states=False, so the workers' states "
                                "were not kept after the fit; make it with keep_states=True to read them")

        def run(index, it):
            for data, state in it:
                yield index, fn(index, data, state)

        return [v for _, v in sorted(self.job.result_rdd.mapPartitionsWithIndex(run).collect(), key=lambda kv: kv[0])]

    def fetch_exports(self) -> List[Any]:
        """Each worker's ``export`` result on the driver (read once from the shards; with the
        scheduler in the job, by a Spark task)."""
        if self.in_job and self.manager is not None and self.group is not None:
            return self.job.fetch_exports(relay=self.spark)
        return self.job.fetch_exports()

    def release(self) -> None:
        """Drop the fit's tables from the shards and unpersist the states it kept (with the
        scheduler in the job, stop the fit's own shards)."""
        self.job.release()
        if self.in_job:
            if self.manager is not None:
                self.manager.shutdown()
            return
        if self.group is not None:
            try:
                self.group.broadcast(Action.DROP_TABLES, prefix=self.namespace + "/")
            except PystradsError:
                pass
        if self.manager is not None:
            launcher.release_shards(self.manager, self)


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
        return self.engine.table(name).read()

    def map_states(self, fn: Callable[[int, Any, Any], Any]) -> List[Any]:
        return self.engine.map_states(fn)

    @property
    def exports(self) -> List[Any]:
        """The ``export(worker, data, state)`` results of the Engine's workers, in worker order, on
        the driver (:func:`pystrads.engine.driver.frames.shard_frame` reads them on the executors instead)."""
        return self.engine.fetch_exports()

    def release(self) -> None:
        self.engine.release()

    def __enter__(self) -> "FitResult":
        return self

    def __exit__(self, *exc) -> None:
        self.release()
