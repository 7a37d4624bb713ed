"""The fit's barrier job as the driver launches it: one barrier job whose tasks are the workers.

:class:`BarrierJob` is the :class:`~pystrads.engine.scheduler.steps.WorkerJob` of a fit
scheduled from the driver (or launched by it for the coordinator in the job): it launches the
job (collected in a driver thread, its own Spark job group or Connect job tag), watches for a
job that waits for task slots, cancels and relaunches it, and at the end keeps the states the
tasks hand over for ``map_states``.  :class:`WorkerInput` is what the workers load.
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import secrets
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional

from ...errors import ConfigurationError, StepFailedError, python_cause
from ...ps.client import ShardGroup
from ...ps.protocol import Action
from ..executor.worker import WorkerSpec, run_worker, run_worker_arrow
from ..program.api import Program
from ..scheduler.steps import WorkerJob, program_hash
from .preflight import frame_to_workers, to_workers

log = logging.getLogger(__name__)

#: a job's resource profile before its first launch builds it
_UNBUILT = object()

#: after this long without every worker's task running, the driver checks for (and warns about)
#: a barrier job waiting for task slots
SLOT_WAIT_WARN_SECONDS = 30.0


@dataclasses.dataclass
class WorkerInput:
    """The records the workers load and how they reach them: an RDD, or a DataFrame (classic or
    Spark Connect) read with ``mapInArrow``; ``decode`` / ``decode_batch`` (DataFrames only)
    turn its rows or Arrow batches into the program's records."""

    rdd: Any = None
    frame: Any = None
    prepartitioned: bool = False
    decode: Optional[Callable[[Any], Any]] = None
    decode_batch: Optional[Callable[[Any], Iterable[Any]]] = None  # pyarrow.RecordBatch -> records


class BarrierJob(WorkerJob):
    """The fit's barrier job, launched from this process (see the module docstring).

    Parameters
    ----------
    spark : SparkHandle
        The application.
    data : WorkerInput
        What the workers load.
    num_workers, seed, namespace, timeout, export, threads, epoch
        As :class:`~pystrads.engine.scheduler.steps.WorkerJob` takes them.
    keep_states : bool
        The tasks hand their ``(data, state)`` to Spark's cache when the fit ends (RDD input).
    task_cpus : int, optional
        Cores each task asks for through a stage-level task resource profile (None: the
        application's ``spark.task.cpus``).
    """

    def __init__(self, spark, data: WorkerInput, num_workers: int, seed: int, namespace: str, timeout: float,
                 keep_states: bool, export: Optional[Callable[[int, Any, Any], Any]], threads: int = 1,
                 epoch: int = 1, task_cpus: Optional[int] = None):
        super().__init__(num_workers, seed, namespace, timeout, export, threads, epoch)
        self.spark = spark
        self.sc = None if spark is None or spark.connect else getattr(spark, "sc", None)
        self.data = data
        self.keep_states = keep_states
        self.task_cpus = task_cpus
        self._resource_profile: Any = _UNBUILT  # built on the first launch, reused by relaunches
        self.job_groups: List[str] = []  # Spark job groups (tags) of every launch, in order
        self.result_rdd = None  # the finished job's (data, state) per worker, cached (keep_states)
        self._run: Optional[_JobRun] = None  # the running launch

    def launch(self, program: Program, group: ShardGroup, layouts: Dict[str, Any], fingerprint: bool,
               new_shards: bool = False, coordinator: Any = None) -> float:
        """Start the job (cancelling a running one): every worker's task loads its partition, says
        hello on shard 0 and then carries out the posted commands.  ``new_shards``: the shards were
        restarted, so the next command carries the program for their mailbox (a task Spark
        restarts asks it for the program).  ``coordinator``: a
        :class:`~pystrads.engine.executor.coordinator.CoordinatorSpec`, the first task then runs the fit's
        loop too and the job's rows are its result (:meth:`coordinator_result`).  Returns the
        seconds it took."""
        from pyspark import StorageLevel, cloudpickle

        t0 = time.perf_counter()
        self.cancel()
        self.group = group
        self.launches += 1
        blob = cloudpickle.dumps(program)
        digest = program_hash(blob)
        spec = WorkerSpec(blob, digest, group, dict(layouts), self.num_workers, self.seed, self.timeout,
                          self.namespace, fingerprint, self.keep_states, self.export, self.threads, coordinator,
                          self.seals, self.launches)
        data = self.data
        if data.frame is not None:
            frame = data.frame
            if not data.prepartitioned:
                frame = frame_to_workers(frame, self.num_workers, classic=self.sc is not None)
            # a barrier result stage: Spark does not retry it, the driver relaunches the job (from
            # the snapshots) as it does for any failed worker job
            decode, decode_batch = data.decode, data.decode_batch
            profile = self._profile()
            profile = {"profile": profile} if profile is not None else {}
            out = frame.mapInArrow(lambda batches: run_worker_arrow(spec, batches, decode, decode_batch),
                                   "result binary", barrier=True, **profile)
        else:
            out = to_workers(data.rdd, self.num_workers).barrier().mapPartitions(lambda it: run_worker(spec, it))
            profile = self._profile()
            if profile is not None:
                out = out.withResources(profile)
            if self.keep_states:  # the finished tasks' (data, state), read by map_states
                out.persist(StorageLevel.MEMORY_AND_DISK)
        self._posted_program = None if new_shards else digest
        self._fingerprints = None
        self._run = _JobRun(self, out)
        self.job_groups.append(self._run.group_id)
        self._run.start()
        return time.perf_counter() - t0

    def _profile(self):
        """The stage-level resource profile whose tasks each ask for ``task_cpus`` cores (None
        without ``task_cpus``, or where this Spark refuses to build one: the job then runs on
        the application's slots, its workers' threads sharing them, logged).  Built once per fit:
        a relaunch reuses it rather than registering another profile with Spark."""
        if self._resource_profile is not _UNBUILT:
            return self._resource_profile
        self._resource_profile = None
        if self.task_cpus:
            from pyspark.resource import ResourceProfileBuilder, TaskResourceRequests

            try:
                self._resource_profile = ResourceProfileBuilder().require(
                    TaskResourceRequests().cpus(int(self.task_cpus))).build
            except Exception as exc:  # noqa: BLE001 -- e.g. a Connect server without stage-level scheduling
                log.warning("the fit's barrier job runs without a task resource profile (%s): each worker's %d "
                            "threads share one task slot; set spark.task.cpus=%d to reserve them", exc,
                            self.threads, self.task_cpus)
        return self._resource_profile

    def cancel(self) -> None:
        """Cancel the running launch, if any (its tasks end; the shards keep their state)."""
        run, self._run = self._run, None
        if run is not None:
            run.cancel()

    def error(self) -> Optional[BaseException]:
        """Why the job cannot go on (it ended, or its tasks never got task slots), or None."""
        run = self._run
        if run is None:
            return StepFailedError("the fit's barrier job is not running")
        if not run.thread.is_alive():
            return run.error
        return self._slot_wait_error(run)

    def _slot_wait_error(self, run: "_JobRun") -> Optional[BaseException]:
        """A barrier job runs only when all its tasks get slots at once; while another job holds
        them it waits.  Warn every 30 s, and fail after ``round.timeoutSeconds`` instead of waiting
        for ever."""
        if run.started:
            return None
        waited = time.monotonic() - run.t_launch
        if waited < SLOT_WAIT_WARN_SECONDS:
            return None
        running = run.running_tasks()
        if running >= self.num_workers:
            run.started = True
            return None
        message = (f"the fit's barrier job has waited {waited:.0f} s for task slots: {running} of its "
                   f"{self.num_workers} tasks run (a barrier stage starts only when every task has a slot). "
                   f"Another Spark job holds them (a concurrent fit or job of this application?); free them, "
                   f"give the application at least {self.num_workers} task slots, or lower numWorkers")
        if waited > self.timeout:
            self.cancel()  # not a lost task: relaunching would wait again
            return ConfigurationError(message + " (gave up after spark.pystrads.round.timeoutSeconds)")
        if waited - run.warned >= SLOT_WAIT_WARN_SECONDS:
            run.warned = waited
            log.warning("fit %s: %s", self.namespace, message)
        return None

    def coordinator_result(self) -> Dict[str, Any]:
        """Wait for a job launched with a coordinator to end; the coordinator's result (a
        KeyboardInterrupt here cancels the job)."""
        run = self._run
        try:
            while run.thread.is_alive():
                run.thread.join(0.5)
        except KeyboardInterrupt:
            self.cancel()
            raise
        self._run = None
        if run.error is not None:
            raise StepFailedError(f"the fit's job failed: {python_cause(run.error)}") from run.error
        blob = b"".join(run.rows or [])
        if not blob:
            raise StepFailedError("the fit's job ended without its coordinator's result")
        return pickle.loads(blob)

    def _every_task_ran(self) -> None:
        if self._run is not None:
            self._run.started = True  # every task ran: the job had its slots

    def _export_wait_error(self, missing: List[str]) -> Optional[BaseException]:
        run = self._run
        if run is None:
            return self.error()
        if run.thread.is_alive():
            return None
        return StepFailedError(f"the fit's job ended before every worker exported its results (missing "
                               f"{missing}): {python_cause(run.error) if run.error else 'no error'}")

    def finish(self, last_step: int) -> None:
        """Tell the tasks the fit is over; they leave their exports on the shards and hand their
        (data, state) to Spark's cache (for ``map_states``), and the job ends."""
        self.group.client(0).action(Action.POST, namespace=self.namespace, command=self.finish_command(last_step),
                                    epoch=self.epoch)
        run = self._run
        if self.export is not None:  # left on the shards until asked for (fetch_exports, driver.frames)
            self._wait_exports()
        if not self.keep_states:
            # nothing to hand over: the tasks end on their own (~0.3 s of Spark's job teardown the
            # fit need not wait for; a failure then is only logged)
            run.detached = True
            self._run = None
            return
        run.thread.join()
        if run.error is not None:
            raise StepFailedError(f"the fit's barrier job failed while finishing: {python_cause(run.error)}") \
                from run.error
        self.result_rdd = run.rdd
        self._run = None

    def release(self) -> None:
        """Cancel the job and unpersist the states it handed over."""
        self.cancel()
        if self.result_rdd is not None:
            try:
                self.result_rdd.unpersist()
            except Exception:  # noqa: BLE001 -- the SparkContext may be gone
                pass
            self.result_rdd = None


class _JobRun:
    """One launch of the job, collected in a driver thread (its own Spark job group, or job tag
    under Spark Connect, so that it can be cancelled).  ``rdd``: the job's RDD or DataFrame."""

    def __init__(self, job: BarrierJob, rdd):
        self.job = job
        self.rdd = rdd
        self.group_id = f"pystrads-{job.namespace}-{secrets.token_hex(3)}"
        self.error: Optional[BaseException] = None
        self.rows: Optional[List[bytes]] = None  # what the job's tasks returned (a coordinator's result)
        self.thread: Optional[threading.Thread] = None
        self.detached = False  # the fit is over and no longer waits for this job
        self.t_launch = time.monotonic()
        self.started = False  # every task was seen running (checked only while a wait lasts)
        self.warned = 0.0

    def running_tasks(self) -> int:
        """The most tasks running at once in any stage of this job (its barrier stage's, once it runs)."""
        sc = self.job.sc
        if sc is None:  # Spark Connect: no status tracker; nothing to warn about
            return self.job.num_workers
        try:
            tracker = sc.statusTracker()
            most = 0
            for job_id in tracker.getJobIdsForGroup(self.group_id):
                info = tracker.getJobInfo(job_id)
                for stage_id in (info.stageIds if info else []):
                    stage = tracker.getStageInfo(stage_id)
                    if stage is not None:
                        most = max(most, stage.numActiveTasks)
            return most
        except Exception:  # noqa: BLE001 -- no status (the SparkContext is gone): do not fail on that
            return self.job.num_workers

    def start(self) -> None:
        job = self.job
        sc, session, frame = job.sc, job.spark.spark if job.sc is None else None, job.data.frame is not None

        def run():
            try:
                if sc is None:  # job tags are per thread and session; interruptTag cancels the job
                    session.addTag(self.group_id)
                else:
                    sc.setJobGroup(self.group_id, f"pystrads fit {job.namespace}: workers", interruptOnCancel=True)
                if frame:  # rows only from a coordinator's task: its result
                    self.rows = [bytes(r[0]) for r in self.rdd.collect()]
                else:
                    _materialize(self.rdd, sc)
            except BaseException as exc:  # noqa: BLE001 -- reported to the driver's loop
                self.error = exc
                if self.detached:
                    log.warning("fit %s: its job failed after the fit had finished: %s", job.namespace,
                                python_cause(exc))
            finally:
                if sc is None:
                    try:
                        session.removeTag(self.group_id)
                    except Exception:  # noqa: BLE001 -- the session may be gone
                        pass

        if sc is None:
            self.thread = threading.Thread(target=run, name=f"pystrads-job-{job.namespace}", daemon=True)
        else:
            from pyspark import InheritableThread

            self.thread = InheritableThread(target=run, name=f"pystrads-job-{job.namespace}", daemon=True)
        self.thread.start()

    def cancel(self) -> None:
        job = self.job
        if self.thread is not None and self.thread.is_alive():
            try:
                if job.sc is None:
                    job.spark.spark.interruptTag(self.group_id)
                else:
                    job.sc.cancelJobGroup(self.group_id)
            except Exception:  # noqa: BLE001 -- the SparkContext may be gone
                pass
            self.thread.join(timeout=60)
        if job.data.frame is None:
            try:
                self.rdd.unpersist()
            except Exception:  # noqa: BLE001
                pass


def _materialize(rdd, sc) -> None:
    """Run an RDD input's barrier job (caching what it yields) in a job Spark can retry.

    Spark retries a failed barrier stage only when it is a shuffle-map stage (a failed barrier
    *result* stage aborts the job), so the barrier stage ends in a tiny shuffle: a count per
    partition, read as raw bytes (the cached states are never unpickled for this).
    """
    from pyspark import RDD
    from pyspark.serializers import NoOpSerializer

    raw = RDD(rdd._jrdd, sc, NoOpSerializer())
    counted = raw.mapPartitions(lambda it: [(0, sum(1 for _ in it))]).reduceByKey(
        lambda a, b: a + b, numPartitions=1).collect()
    if not counted:
        raise StepFailedError("the fit's job produced no worker state")
