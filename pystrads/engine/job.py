"""The fit's worker job: one barrier job whose tasks are the workers, seen from the driver.

:class:`WorkerJob` owns that job for the :class:`~pystrads.engine.driver.Engine`: it launches
it (collected in a driver thread, its own Spark job group or Connect job tag), waits for every
worker's hello on shard 0, runs each step -- opens it on every shard, posts its command, waits
for the workers, lets the loop reach the step's commit point, commits or rolls back --,
watches for a job that waits for task slots, and at the end tells the workers to finish and
gathers their exports (left on the shards, fetched only when asked for) and the states kept
for ``map_states``.  It also reads and restores the
workers' state snapshots for the checkpoints.

:data:`STEP_HOOKS` is the one seam the fault-injection suite strikes through
(:func:`pystrads.testing.around_steps`).
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
import logging
import pickle
import secrets
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional

from ..errors import ConfigurationError, PayloadAuthenticationError, ProgramError, PystradsError, StepFailedError
from ..ps import storage
from ..ps.client import ShardGroup, fan_out
from ..ps.protocol import Action
from .preflight import _python_cause, frame_to_workers, to_workers
from .program import Program, Schedule, StepMetrics
from .sealing import DRIVER, WORKER, Seals
from .worker import WorkerSpec, export_key, program_hash, run_worker, run_worker_arrow, states_prefix, summary_key

log = logging.getLogger(__name__)

#: a job's resource profile before its first launch builds it
_UNBUILT = object()

#: after this long without every worker's task running, the driver checks for (and warns about)
#: a barrier job waiting for task slots
SLOT_WAIT_WARN_SECONDS = 30.0

#: Wrappers around every step's run on the shards, ``hook(job, step, run) -> answer``, each
#: calling ``run()`` (the next hook, the last one the step itself).  Empty unless a test injects
#: faults through :func:`pystrads.testing.around_steps`.
STEP_HOOKS: List[Callable[["WorkerJob", int, Callable[[], Dict[str, Any]]], Dict[str, Any]]] = []


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


class WorkerJob:
    """The fit's barrier job (see the module docstring).

    Parameters
    ----------
    spark : SparkHandle
        The application.
    data : WorkerInput
        What the workers load.
    num_workers, seed, namespace, timeout
        The fit's workers, seed, shard namespace and ``round.timeoutSeconds``.
    keep_states : bool
        The tasks hand their ``(data, state)`` to Spark's cache when the fit ends (RDD input).
    export : callable, optional
        ``fn(worker, data, state)`` every worker runs when the fit ends.
    threads : int
        Threads each worker computes with (:attr:`WorkerContext.threads`).
    task_cpus : int, optional
        Cores each task asks for through a stage-level task resource profile (None: the
        application's ``spark.task.cpus``).
    epoch : int
        The step loop's epoch, sent with every step action (see :mod:`pystrads.ps.steps`).
    """

    def __init__(self, spark, data: WorkerInput, num_workers: int, seed: int, namespace: str, timeout: float,
                 keep_states: bool, export: Optional[Callable[[int, Any, Any], Any]], threads: int = 1,
                 epoch: int = 1, task_cpus: Optional[int] = None):
        self.spark = spark
        self.sc = None if spark is None or spark.connect else getattr(spark, "sc", None)
        self.data, self.num_workers, self.seed = data, num_workers, seed
        self.namespace, self.timeout = namespace, timeout
        self.keep_states, self.export = keep_states, export
        self.threads = int(threads)
        self.task_cpus = task_cpus
        self._resource_profile: Any = _UNBUILT  # built on the first launch, reused by relaunches
        self.epoch = int(epoch)
        self.group: Optional[ShardGroup] = None  # the shards the running job's tasks talk to
        self.job_groups: List[str] = []  # Spark job groups (tags) of every launch, in order
        self.result_rdd = None  # the finished job's (data, state) per worker, cached (keep_states)
        self._run: Optional[_JobRun] = None  # the running launch
        self._posted_program: Optional[str] = None  # hash of the program bytes the tasks have
        self._counters: Dict[str, int] = {}  # the shards' traffic counters, summed, at the last traffic()
        self._traffic_at_commit: List[Dict[str, int]] = []  # every shard's counters as commit_step returned them
        self._exports: Optional[List[Any]] = None
        self._fingerprints: Optional[List[str]] = None
        self.seals = Seals.new()  # the fit's own keys: what its processes hand each other through the shards
        # (step, wrapped key) once the workers' states of ``step`` came back from a checkpoint
        # sealed with another fit's worker key (restore_states)
        self._restored: Optional[Dict[str, Any]] = None

    # ------------------------------------------------------------------ launch and watch
    def launch(self, program: Program, group: ShardGroup, layouts: Dict[str, Any], fingerprint: bool,
               new_shards: bool = False, coordinator: Any = None) -> float:
        """Start the job (cancelling a running one): every worker's task loads its partition, says
        hello on shard 0 and then carries out the posted commands.  ``new_shards``: the shards were
        restarted, so the next command carries the program for their mailbox (a task Spark
        restarts asks it for the program).  ``coordinator``: a
        :class:`~pystrads.engine.coordinator.CoordinatorSpec`, the first task then runs the fit's
        loop too and the job's rows are its result (:meth:`coordinator_result`).  Returns the
        seconds it took."""
        from pyspark import StorageLevel, cloudpickle

        t0 = time.perf_counter()
        self.cancel()
        self.group = group
        blob = cloudpickle.dumps(program)
        digest = program_hash(blob)
        spec = WorkerSpec(blob, digest, group, dict(layouts), self.num_workers, self.seed, self.timeout,
                          self.namespace, fingerprint, self.keep_states, self.export, self.threads, coordinator,
                          self.seals)
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
            raise StepFailedError(f"the fit's job failed: {_python_cause(run.error)}") from run.error
        blob = b"".join(run.rows or [])
        if not blob:
            raise StepFailedError("the fit's job ended without its coordinator's result")
        return pickle.loads(blob)

    def hellos(self) -> Dict[int, Dict[str, Any]]:
        """Wait until every worker's task said hello (data loaded); their hellos by worker."""
        while True:
            answer = self.group.client(0).action(Action.WAIT_HELLOS, namespace=self.namespace,
                                                 num_workers=self.num_workers, timeout=1.0)
            if answer.get("program_error"):
                raise ProgramError(answer["program_error"])
            if answer["complete"]:
                if self._run is not None:
                    self._run.started = True  # every task ran: the job had its slots
                return {int(w): h for w, h in answer["hellos"].items()}
            error = self.error()
            if error is not None:
                self._raise_program_error()
                if isinstance(error, ConfigurationError):
                    raise error
                raise StepFailedError(f"the fit's barrier job ended before every worker loaded its data. "
                                      f"Cause: {_python_cause(error)}") from error

    def _raise_program_error(self) -> None:
        """Raise the program error a worker reported before its task failed, if one did (the job's
        failure is then the program's, not a lost task's)."""
        try:
            reported = self.group.client(0).action(Action.FIT_ERROR, namespace=self.namespace).get("error")
        except PystradsError:
            return
        if reported:
            raise ProgramError(reported)

    def load_seconds(self) -> float:
        """The slowest worker's ``load`` (measured in its task, before its hello)."""
        return float(max((h.get("load_s") or 0.0 for h in self.hellos().values()), default=0.0))

    def data_summaries(self) -> List[Any]:
        """Every worker's ``data_summary``, once every worker said hello, in worker order."""
        self.hellos()
        shards = len(self.group.shards)
        blobs = fan_out([lambda w=w: self.group.client(w % shards).get_blob(summary_key(self.namespace, w))
                         for w in range(self.num_workers)])
        if any(b is None for b in blobs):
            raise StepFailedError(f"workers {[w for w, b in enumerate(blobs) if b is None]} said hello without "
                                  "leaving their data summary on the shards (was a shard restarted?)")
        return [pickle.loads(self.seals.open(WORKER, summary_key(self.namespace, w), b))
                for w, b in enumerate(blobs)]

    def fingerprints(self) -> List[str]:
        """Each worker's fingerprint of its loaded data (the job was launched with ``fingerprint``)."""
        if self._fingerprints is None:
            hellos = self.hellos()
            self._fingerprints = [hellos[w]["fingerprint"] for w in range(self.num_workers)]
        return self._fingerprints

    # ------------------------------------------------------------------ steps
    def command(self, program: Program, step: int, round_offset: int,
                schedule: Optional[Schedule]) -> Dict[str, Any]:
        """The command that runs ``schedule`` (None: the init step) as step ``step``; it carries the
        program when it changed since the tasks last got it."""
        from pyspark import cloudpickle

        blob = cloudpickle.dumps(program)
        digest = program_hash(blob)
        command: Dict[str, Any] = {"kind": "step", "step": step, "round_offset": round_offset,
                                   "staleness": int(getattr(program, "staleness", 0)), "program_hash": digest}
        if digest != self._posted_program:
            command["program"] = base64.b64encode(blob).decode()
            command["program_seal"] = self.seals.field(DRIVER, f"{self.namespace}/program/{digest}", command["program"])
        if schedule is None:
            command["init"] = True
        else:
            command["schedule"] = base64.b64encode(cloudpickle.dumps(schedule)).decode()
            command["schedule_seal"] = self.seals.field(DRIVER, f"{self.namespace}/schedule/{step}",
                                                        command["schedule"])
        return self._with_restored(command)

    def _with_restored(self, command: Dict[str, Any]) -> Dict[str, Any]:
        """``command`` telling the workers, after a resume from a checkpoint, the key that sealed
        the states it brought back (wrapped: see :mod:`~pystrads.engine.sealing`)."""
        if self._restored is not None:
            command["restored"] = dict(self._restored)
            command["restored_seal"] = self.seals.field(DRIVER, f"{self.namespace}/restored/{command['step']}",
                                                        json.dumps(self._restored, sort_keys=True))
        return command

    def finish_command(self, last_step: int) -> Dict[str, Any]:
        """The command that ends the fit after step ``last_step``."""
        return self._with_restored({"kind": "finish", "step": last_step})

    def open_step(self, step: int, round_offset: int) -> None:
        """Open step ``step`` on every shard (no command yet): from here on, the step loop's own
        writes (``schedule``, ``after_step``) and the workers' belong to the step and are rolled
        back with it."""
        self.group.broadcast(Action.BEGIN_STEP, step=step, num_workers=self.num_workers, namespace=self.namespace,
                             round_offset=round_offset, epoch=self.epoch)

    def run_step(self, step: int, round_offset: int, command: Dict[str, Any],
                 before_commit: Callable[[Dict[str, Any]], None] = lambda answer: None) -> Dict[str, Any]:
        """Run the open step ``step`` (:meth:`open_step`): post its command, wait until every worker
        finished it, call ``before_commit(answer)`` (the loop's ``after_step`` and journal entry,
        the step's commit point), then commit it on every shard -- or, when the workers fail, roll
        it back and raise :class:`~pystrads.errors.StepFailedError`.  What ``before_commit``
        raises is raised as it is (the loop settles the step).  Returns shard 0's answer (the
        rounds' metrics)."""
        run = functools.partial(self._run_step, step, round_offset, command, before_commit)
        for hook in STEP_HOOKS:
            run = functools.partial(hook, self, step, run)
        return run()

    def _run_step(self, step: int, round_offset: int, command: Dict[str, Any],
                  before_commit: Callable[[Dict[str, Any]], None] = lambda answer: None) -> Dict[str, Any]:
        group = self.group
        try:
            if "program" in command:  # the shards run the program's pull and shard_metrics: the same program
                group.broadcast(Action.REGISTER_PROGRAM, namespace=self.namespace, payload=command["program"])
            group.client(0).action(Action.POST, namespace=self.namespace, command=command, epoch=self.epoch)
            if "program" in command:
                self._posted_program = command["program_hash"]
            stall = _StallWatch(self.timeout, self.num_workers)
            while True:
                answer = group.client(0).action(Action.WAIT_STEP, step=step, namespace=self.namespace, timeout=1.0)
                if answer["done"]:
                    break
                if answer.get("error"):
                    raise (ProgramError if answer.get("program_error") else StepFailedError)(answer["error"])
                error = self.error()
                if error is not None:
                    self._raise_program_error()
                    raise error
                stall.check(step, answer)
        except (ProgramError, ConfigurationError):  # the program's, or the cluster's: not a lost task
            self.abort_step(step)
            raise
        except BaseException as exc:
            self.abort_step(step)
            if isinstance(exc, KeyboardInterrupt):
                self.cancel()
                raise
            raise StepFailedError(
                f"step {step} failed; the model tables were rolled back to their state before the step. "
                f"Cause: {exc if isinstance(exc, PystradsError) else _python_cause(exc)}") from exc
        before_commit(answer)
        self.commit_step(step)
        return answer

    def commit_step(self, step: int) -> None:
        """Close step ``step`` on every shard, keeping its writes (a no-op where it is closed)."""
        self._traffic_at_commit = self.group.broadcast(Action.COMMIT_STEP, step=step, namespace=self.namespace,
                                                       epoch=self.epoch)

    def abort_step(self, step: int) -> None:
        """Roll step ``step`` back on every shard that can be reached (a no-op where it is closed)."""
        try:
            self.group.broadcast(Action.ABORT_STEP, step=step, namespace=self.namespace, epoch=self.epoch)
        except PystradsError as abort_exc:
            log.warning("step %d: could not roll back every shard: %s", step, abort_exc)

    def metrics(self, answer: Dict[str, Any], program: Program) -> StepMetrics:
        """The step's per-round metrics: the workers' reports in ``answer``, plus every shard's own
        when the program asks for them (``shard_metrics_every``)."""
        merged: Dict[int, Dict[str, float]] = {}
        if getattr(program, "shard_metrics_every", 0):
            for i in range(len(self.group.shards)):
                for key, values in self.group.client(i).action(Action.METRICS, namespace=self.namespace).get("rounds", {}).items():
                    bucket = merged.setdefault(int(key), {})
                    for name, value in values.items():
                        bucket[name] = bucket.get(name, 0.0) + value
        else:
            merged = {int(k): v for k, v in answer.get("rounds", {}).items()}
        n = max(merged, default=-1) + 1
        return StepMetrics([merged.get(i, {}) for i in range(n)])

    def traffic(self) -> Dict[str, int]:
        """The shards' traffic (bytes in and out, requests) between the last two commits."""
        total = {"bytes_in": 0, "bytes_out": 0, "requests": 0}
        for c in self._traffic_at_commit:
            for k in total:
                total[k] += c.get(k, 0)
        before, self._counters = self._counters or total, total
        return {k: total[k] - before[k] for k in total}

    # ------------------------------------------------------------------ the end
    def finish(self, last_step: int) -> None:
        """Tell the tasks the fit is over; they leave their exports on the shards and hand their
        (data, state) to Spark's cache (for ``map_states``), and the job ends."""
        self.group.client(0).action(Action.POST, namespace=self.namespace, command=self.finish_command(last_step),
                                    epoch=self.epoch)
        run = self._run
        if self.export is not None:  # left on the shards until asked for (fetch_exports, engine.frames)
            self._wait_exports(run)
        if not self.keep_states:
            # nothing to hand over: the tasks end on their own (~0.3 s of Spark's job teardown the
            # fit need not wait for; a failure then is only logged)
            run.detached = True
            self._run = None
            return
        run.thread.join()
        if run.error is not None:
            raise StepFailedError(f"the fit's barrier job failed while finishing: {_python_cause(run.error)}") \
                from run.error
        self.result_rdd = run.rdd
        self._run = None

    def _wait_exports(self, run: Optional["_JobRun"]) -> None:
        """Wait until every worker has left its ``export`` result on its shard (``run``: the job
        launched from here; None inside the job, where :meth:`error` says it is lost)."""
        S = len(self.group.shards)
        keys = {w: export_key(self.namespace, w) for w in range(self.num_workers)}
        while True:
            missing = sum((self.group.client(i).action(
                Action.WAIT_BLOBS, keys=[k for w, k in keys.items() if w % S == i], timeout=1.0)["missing"]
                for i in range(S)), [])
            if not missing:
                break
            if run is None:
                error = self.error()
                if error is not None:
                    self._raise_program_error()
                    raise error
            elif not run.thread.is_alive():
                self._raise_program_error()
                raise StepFailedError(f"the fit's job ended before every worker exported its results (missing "
                                      f"{missing}): {_python_cause(run.error) if run.error else 'no error'}")

    def fetch_exports(self, relay: Any = None) -> List[Any]:
        """Each worker's ``export`` result on the driver, read once from the shards (by a Spark
        task of ``relay``, a SparkHandle, when this process cannot reach them)."""
        if self.export is None:
            raise PystradsError("no exports: make the Engine with export=fn(worker, data, state)")
        if self._exports is None:
            if self.group is None:
                raise PystradsError("the workers' exports are gone from the shards (was the fit released?)")
            if relay is not None:
                from ..ps.relay import through_spark

                blobs = through_spark(relay, self.group, _export_blobs, self.namespace, self.num_workers)
            else:
                blobs = _export_blobs(self.group, self.namespace, self.num_workers)
            if any(b is None for b in blobs):
                raise PystradsError("the workers' exports are gone from the shards (was the fit released?)")
            self._exports = [pickle.loads(self.seals.open(WORKER, export_key(self.namespace, w), b))
                             for w, b in enumerate(blobs)]
        return self._exports

    def release(self) -> None:
        """Cancel the job and unpersist the states it handed over."""
        self.cancel()
        if self.result_rdd is not None:
            try:
                self.result_rdd.unpersist()
            except Exception:  # noqa: BLE001 -- the SparkContext may be gone
                pass
            self.result_rdd = None

    # ------------------------------------------------------------------ checkpoints
    def save_states(self, target: str, step: int) -> Dict[str, Any]:
        """The shards write the fit's tables and the workers' state snapshots of ``step`` under
        ``target``; returns ``{"bytes": written, "files": the table files, the manifest}``."""
        answers = self.group.broadcast(Action.SNAPSHOT, prefix=self.namespace + "/", dir=storage.join(target, "tables"),
                                       states_prefix=states_prefix(self.namespace), states_step=step,
                                       states_dir=target)
        saved = sorted(w for a in answers for w in a.get("states", []))
        if saved != list(range(self.num_workers)):
            raise StepFailedError(f"checkpoint {target}: states of workers {saved} were saved, expected "
                                  f"0..{self.num_workers - 1}")
        return {"bytes": sum(a["bytes"] for a in answers), "files": sorted(f for a in answers for f in a["files"]),
                "states_key": self.seals.worker}

    def restore_states(self, source: str, step: int, files: Optional[List[str]] = None,
                       states_key: Optional[bytes] = None) -> None:
        """The shards read the fit's tables (only ``files``, the checkpoint's manifest, when given)
        and the workers' snapshots of ``step`` back from ``source``; ``states_key``: the worker
        key they were sealed with (the fit that saved them), told to the workers wrapped in
        their own key (see :mod:`~pystrads.engine.sealing`)."""
        if states_key is None:
            raise PayloadAuthenticationError(
                f"checkpoint {source} does not say which key sealed its workers' states (made by an older "
                "pystrads?); remove it to start the fit afresh")
        self._restored = {"step": int(step), "key": self.seals.wrap(states_key, f"{self.namespace}/restored/{step}")}
        S = len(self.group.shards)
        extra = {} if files is None else {"files": list(files)}
        fan_out([lambda i=i: self.group.client(i).action(
            Action.RESTORE, prefix=self.namespace + "/", dir=storage.join(source, "tables"),
            states_prefix=states_prefix(self.namespace), states_step=step, states_dir=source,
            states_workers=[w for w in range(self.num_workers) if w % S == i], **extra)
            for i in range(S)])


class _StallWatch:
    """A running step whose workers all entered it but whose round clocks (as shard 0 sees them)
    have not moved for ``limit`` seconds (``round.timeoutSeconds``) has stalled: a worker or a shard stopped answering without failing (a paused host, a frozen
    process), and nothing else would end the wait."""

    def __init__(self, limit: float, num_workers: int):
        self.limit, self.num_workers = limit, num_workers
        self.seen: Any = None
        self.since = time.monotonic()

    def check(self, step: int, answer: Dict[str, Any]) -> None:
        now = time.monotonic()
        progress = (answer.get("entered"), tuple(answer.get("clocks") or ()), tuple(answer.get("finished") or ()))
        if progress != self.seen or (answer.get("entered") or 0) < self.num_workers:
            self.seen, self.since = progress, now  # loading or restoring: not yet a round's wait
            return
        if now - self.since > self.limit:
            behind = [w for w, c in enumerate(progress[1]) if c == min(progress[1])] if progress[1] else []
            raise StepFailedError(
                f"step {step} stalled: no round clock moved for {now - self.since:.0f} s (workers {behind} are "
                f"behind, clocks {list(progress[1])}); a worker or a shard stopped answering. Raise "
                "spark.pystrads.round.timeoutSeconds if rounds are legitimately this slow")


def _export_blobs(group: ShardGroup, namespace: str, num_workers: int) -> List[Optional[bytes]]:
    S = len(group.shards)
    return fan_out([lambda w=w: group.client(w % S).get_blob(export_key(namespace, w)) for w in range(num_workers)])


class _JobRun:
    """One launch of the job, collected in a driver thread (its own Spark job group, or job tag
    under Spark Connect, so that it can be cancelled).  ``rdd``: the job's RDD or DataFrame."""

    def __init__(self, job: WorkerJob, rdd):
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
                                _python_cause(exc))
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
