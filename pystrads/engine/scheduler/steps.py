"""The step protocol of a fit, whoever schedules it: the driver, or the coordinator in the job.

:class:`WorkerJob` speaks it to the shards for the step loop: it waits for every worker's hello
on shard 0, runs each step -- opens it on every shard, posts its command, waits for the
workers, lets the loop reach the step's commit point, commits or rolls back --, and at the end
tells the workers to finish and gathers their exports (left on the shards, fetched only when
asked for).  It also reads and restores the workers' state snapshots for the checkpoints.  How
the job is launched, watched and cancelled is its subclasses' part: the driver's
(:class:`~pystrads.engine.driver.launch.BarrierJob`) and the in-job coordinator's
(:class:`~pystrads.engine.executor.coordinator.InJobWorkerJob`).  The blob keys the workers and
the scheduler agree on (exports, state snapshots, data summaries) are named here.

:data:`STEP_HOOKS` is the one seam the fault-injection suite strikes through
(:func:`pystrads.testing.around_steps`).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import logging
import pickle
import time
from typing import Any, Callable, Dict, List, Optional

from ...errors import (ConfigurationError, PayloadAuthenticationError, ProgramError, PystradsError, StepFailedError,
                       python_cause)
from ...ps import storage
from ...ps.client import ShardGroup, fan_out
from ...ps.protocol import Action
from ..program.api import Program, Schedule, StepMetrics
from .sealing import DRIVER, WORKER, Seals

log = logging.getLogger(__name__)

#: Wrappers around every step's run on the shards, ``hook(job, step, run) -> answer``, each
#: calling ``run()`` (the next hook, the last one the step itself).  Empty unless a test injects
#: faults through :func:`pystrads.testing.around_steps`.
STEP_HOOKS: List[Callable[["WorkerJob", int, Callable[[], Dict[str, Any]]], Dict[str, Any]]] = []


def export_key(namespace: str, worker: int) -> str:
    """Blob key of a worker's ``export`` result (on its home shard)."""
    return f"{namespace}/export/{worker}"


def state_key(namespace: str, worker: int, step: Optional[int] = None) -> str:
    """Blob key of a worker's state snapshot after ``step`` (without ``step``: the series' prefix)."""
    prefix = f"{states_prefix(namespace)}{worker}/"
    return prefix if step is None else prefix + str(int(step))


def states_prefix(namespace: str) -> str:
    """Prefix of every worker's state snapshots of a fit (``<prefix><worker>/<step>``)."""
    return f"{namespace}/state/"


def summary_key(namespace: str, worker: int) -> str:
    """Blob key of a worker's ``data_summary`` (on its home shard)."""
    return f"{namespace}/summary/{worker}"


def program_hash(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()[:24]


class WorkerJob:
    """The step protocol of a fit's workers (see the module docstring); subclasses say whether
    the job can go on (:meth:`error`), :meth:`cancel` it and :meth:`finish` it.

    Parameters
    ----------
    num_workers, seed, namespace, timeout
        The fit's workers, seed, shard namespace and ``round.timeoutSeconds``.
    export : callable, optional
        ``fn(worker, data, state)`` every worker runs when the fit ends.
    threads : int
        Threads each worker computes with (:attr:`WorkerContext.threads`).
    epoch : int
        The step loop's epoch, sent with every step action (see :mod:`pystrads.ps.steps`).
    """

    def __init__(self, num_workers: int, seed: int, namespace: str, timeout: float,
                 export: Optional[Callable[[int, Any, Any], Any]], threads: int = 1, epoch: int = 1):
        self.num_workers, self.seed = num_workers, seed
        self.namespace, self.timeout = namespace, timeout
        self.export = export
        self.threads = int(threads)
        self.epoch = int(epoch)
        # the job's launches so far: every launch's tasks say it with their hello and their polls,
        # and the commands carry it, so a task of an earlier launch (Spark kills it only after a
        # while) neither counts as a hello nor takes a step
        self.launches = 0
        self.group: Optional[ShardGroup] = None  # the shards the running job's tasks talk to
        self._posted_program: Optional[str] = None  # hash of the program bytes the tasks have
        self._counters: Dict[str, int] = {}  # the shards' traffic counters, summed, at the last traffic()
        self._traffic_at_commit: List[Dict[str, int]] = []  # every shard's counters as commit_step returned them
        self._exports: Optional[List[Any]] = None
        self._fingerprints: Optional[List[str]] = None
        self.seals = Seals.new()  # the fit's own keys: what its processes hand each other through the shards
        # (step, wrapped key) once the workers' states of ``step`` came back from a checkpoint
        # sealed with another fit's worker key (restore_states)
        self._restored: Optional[Dict[str, Any]] = None

    # ------------------------------------------------------------------ the job, as the subclass runs it
    def error(self) -> Optional[BaseException]:
        """Why the job cannot go on, or None."""
        raise NotImplementedError

    def cancel(self) -> None:
        """Cancel the running job, if this side can (its tasks end; the shards keep their state)."""
        raise NotImplementedError

    def finish(self, last_step: int) -> None:
        """Tell the tasks the fit is over and wait for what the fit keeps of them."""
        raise NotImplementedError

    def _every_task_ran(self) -> None:
        """Every worker said hello, so every task had its slot."""

    def _export_wait_error(self, missing: List[str]) -> Optional[BaseException]:
        """Why the exports ``missing`` will never come (the job ended), or None to keep waiting."""
        return self.error()

    # ------------------------------------------------------------------ hellos
    def hellos(self) -> Dict[int, Dict[str, Any]]:
        """Wait until every worker's task said hello (data loaded); their hellos by worker."""
        while True:
            answer = self.group.client(0).action(Action.WAIT_HELLOS, namespace=self.namespace,
                                                 num_workers=self.num_workers, launch=self.launches, timeout=1.0)
            if answer.get("program_error"):
                raise ProgramError(answer["program_error"])
            if answer["complete"]:
                self._every_task_ran()
                return {int(w): h for w, h in answer["hellos"].items()}
            error = self.error()
            if error is not None:
                self._raise_program_error()
                if isinstance(error, ConfigurationError):
                    raise error
                raise StepFailedError(f"the fit's barrier job ended before every worker loaded its data. "
                                      f"Cause: {python_cause(error)}") from error

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
        the states it brought back (wrapped: see :mod:`~pystrads.engine.scheduler.sealing`)."""
        command["launch"] = self.launches
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
                 before_commit: Callable[[Dict[str, Any]], Optional[int]] = lambda answer: None) -> Dict[str, Any]:
        """Run the open step ``step`` (:meth:`open_step`): post its command, wait until every worker
        finished it, call ``before_commit(answer)`` (the loop's ``after_step`` and journal entry,
        the step's commit point), then commit it on every shard -- or, when the workers fail, roll
        it back and raise :class:`~pystrads.errors.StepFailedError`.  What ``before_commit``
        raises is raised as it is (the loop settles the step); what it returns, when not None,
        is the round offset of the next step, which the commit then opens on every shard in the
        same call (:meth:`commit_step`).  Returns shard 0's answer (the rounds' metrics)."""
        run = functools.partial(self._run_step, step, round_offset, command, before_commit)
        for hook in STEP_HOOKS:
            run = functools.partial(hook, self, step, run)
        return run()

    def _run_step(self, step: int, round_offset: int, command: Dict[str, Any],
                  before_commit: Callable[[Dict[str, Any]], Optional[int]] = lambda answer: None) -> Dict[str, Any]:
        group = self.group
        try:
            if "program" in command:  # the shards run the program's pull and shard_metrics: the same program
                group.broadcast(Action.REGISTER_PROGRAM, namespace=self.namespace, payload=command["program"])
            # the post waits for the step like wait_step does: one call for a step that ends within it
            answer = group.client(0).action(Action.POST, namespace=self.namespace, command=command, epoch=self.epoch,
                                            wait_step=step, timeout=1.0)
            if "program" in command:
                self._posted_program = command["program_hash"]
            stall = _StallWatch(self.timeout, self.num_workers)
            while True:
                if answer is None:
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
                answer = None
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
                f"Cause: {exc if isinstance(exc, PystradsError) else python_cause(exc)}") from exc
        next_offset = before_commit(answer)
        self.commit_step(step, next_offset)
        return answer

    def commit_step(self, step: int, next_offset: Optional[int] = None) -> None:
        """Close step ``step`` on every shard, keeping its writes (a no-op where it is closed);
        with ``next_offset``, then open step ``step + 1`` (its first round's index) in the same
        call, as :meth:`open_step` would: a step's commit and the next one's opening cost one
        round trip.  A failure may leave step ``step + 1`` open on some shards: the loop's
        settling closes it there."""
        extra = {} if next_offset is None else {
            "open_next": {"step": step + 1, "num_workers": self.num_workers, "round_offset": int(next_offset)}}
        self._traffic_at_commit = self.group.broadcast(Action.COMMIT_STEP, step=step, namespace=self.namespace,
                                                       epoch=self.epoch, **extra)

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
    def _wait_exports(self) -> None:
        """Wait until every worker has left its ``export`` result on its shard."""
        S = len(self.group.shards)
        keys = {w: export_key(self.namespace, w) for w in range(self.num_workers)}
        while True:
            missing = sum((self.group.client(i).action(
                Action.WAIT_BLOBS, keys=[k for w, k in keys.items() if w % S == i], timeout=1.0)["missing"]
                for i in range(S)), [])
            if not missing:
                break
            error = self._export_wait_error(missing)
            if error is not None:
                self._raise_program_error()
                raise error

    def fetch_exports(self, relay: Any = None) -> List[Any]:
        """Each worker's ``export`` result on the driver, read once from the shards (by a Spark
        task of ``relay``, a SparkHandle, when this process cannot reach them)."""
        if self.export is None:
            raise PystradsError("no exports: make the Engine with export=fn(worker, data, state)")
        if self._exports is None:
            if self.group is None:
                raise PystradsError("the workers' exports are gone from the shards (was the fit released?)")
            if relay is not None:
                from ...ps.relay import through_spark

                blobs = through_spark(relay, self.group, _export_blobs, self.namespace, self.num_workers)
            else:
                blobs = _export_blobs(self.group, self.namespace, self.num_workers)
            if any(b is None for b in blobs):
                raise PystradsError("the workers' exports are gone from the shards (was the fit released?)")
            self._exports = [pickle.loads(self.seals.open(WORKER, export_key(self.namespace, w), b))
                             for w, b in enumerate(blobs)]
        return self._exports

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
        their own key (see :mod:`~pystrads.engine.scheduler.sealing`)."""
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


