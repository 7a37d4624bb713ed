"""The step loop of a fit, whoever holds it.

:class:`StepLoop` is what runs a fit once its workers' job runs: the data check, the init step
(or a resume from a checkpoint), then steps -- ``schedule``, the step's command posted to the
shards, the workers' rounds, the step's metrics and summary row, ``after_step``, the journal
entry, the commit, the next step's size, checkpoints -- until the program stops, then the end.
It is an object its owner holds: the :class:`~pystrads.engine.driver.engine.Engine` in the process
that calls ``fit`` (the classic path), or the coordinator in the fit's own job
(:mod:`~pystrads.engine.executor.coordinator`).  The owner (a :class:`LoopOwner`) supplies the shards
(``group``, ``layouts``, which change when shards are restarted), what to do after a lost task
or shard (``recover``) and the progress display; the loop is given the job (a
:class:`~pystrads.engine.scheduler.steps.WorkerJob`), the journal and the checkpoints.  Without Spark, a job
of threads and shards in the process run it as they are (the tests do).  Also here: the fit's
:class:`TrainingSummary` and :func:`make_tables`, which both owners use.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import logging
import threading
import time
from typing import Any, Dict, List, Optional, Protocol

import numpy as np

from ...errors import ConfigurationError, PystradsError, ScheduleError, ShardUnavailableError, StepFailedError
from ...ps.protocol import Action
from .checkpoints import Position, program_state
from .journal import JournalEntry, settle
from ..program.api import Program, Schedule, ScheduleContext, serial_schedule
from .progress import ProgressReporter

log = logging.getLogger(__name__)


class TrainingSummary:
    """Per-step history of a fit (objective, throughput, time split).

    ``rows`` is a list of dicts, one per step; :meth:`to_pandas` gives a DataFrame.  Time
    columns are seconds: ``schedule_s`` (the program's ``schedule``), ``schedule_wait_s`` (the
    part of it the workers waited for: all of it, or with a schedule planned while the step
    before ran -- ``planned_ahead`` -- what was left of it when that step ended), ``step_s``
    (the step on the workers, from posting its command to its commit), ``compute_s`` /
    ``sync_s`` (mean per worker: program code / waiting on round clocks), ``outside_rounds_s``
    (``step_s`` outside the rounds: the command reaching the workers, their state snapshots,
    the commit).  ``fixed`` holds the one-off costs (``shard_start_s``, ``launch_s``,
    ``load_s``, ``init_s``, ...) and the fit's totals of ``schedule_s`` and ``schedule_wait_s``.
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

    def add_time(self, key: str, seconds: float) -> None:
        self.fixed[key] = self.fixed.get(key, 0.0) + seconds

    def __repr__(self) -> str:
        return f"TrainingSummary(steps={len(self.rows)}, rounds={self.total_rounds})"


def plan_tables(program: Program, namespace: str, num_shards: int, max_fill: float) -> tuple:
    """The program's tables laid out over ``num_shards`` shards: ``(layouts by the program's
    names, [(shard, create_table arguments)])`` (``max_fill``: ``table.sparseRowMaxFill``)."""
    from pyspark import cloudpickle

    from ...ps.partition import TableLayout, range_bounds

    layouts: Dict[str, Any] = {}
    creations: List[tuple] = []
    for t in program.tables():
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
        layout = TableLayout(f"{namespace}/{t.name}", int(t.num_rows), int(t.width), t.dtype,
                             tuple(int(b) for b in bounds), tuple(owners), int(t.contrib_width or t.width))
        init = base64.b64encode(cloudpickle.dumps(t.initializer)).decode() if t.initializer is not None else None
        for shard, lo, hi in layout.ranges():
            creations.append((shard, dict(
                name=layout.name, row_start=lo, row_stop=hi, width=layout.width, dtype=layout.dtype,
                fill=t.fill, initializer=init, contrib_width=layout.contrib_width, storage=t.storage,
                max_fill=max_fill)))
        layouts[t.name] = layout
    return layouts, creations


def make_tables(group, creations: List[tuple], namespace: str, program: Program) -> None:
    """Create a fit's tables on its shards (``(shard, create_table arguments)``, as
    :meth:`Engine._plan_tables` makes them) and install its program there (its ``pull`` and
    ``shard_metrics`` run on the shards)."""
    from pyspark import cloudpickle

    for shard, kwargs in creations:
        group.client(shard).action(Action.CREATE_TABLE, **kwargs)
    group.broadcast(Action.REGISTER_PROGRAM, namespace=namespace,
                    payload=base64.b64encode(cloudpickle.dumps(program)).decode())

class LoopOwner(Protocol):
    """What a :class:`StepLoop` asks of its owner."""

    group: Any  # the fit's ShardGroup (a new one once shards were restarted)
    layouts: Dict[str, Any]  # the tables' TableLayouts, by the program's names

    def recover(self, exc: BaseException) -> None:
        """After a lost task, job, executor or shard (the open step settled): restart what was
        lost -- clearing the journal when the shards went with it -- or re-raise ``exc``."""

    def progress_reporter(self) -> ProgressReporter:
        """Where the fit's progress shows."""


class StepLoop:
    """The step loop of one fit (see the module docstring).

    Parameters
    ----------
    owner : LoopOwner
        Holds the loop: the shards, recovery, the progress display.
    program, config, num_workers, seed, namespace
        The fit's program, settings, workers, seed and shard namespace.
    job : WorkerJob
        The fit's workers (``open_step``, ``run_step``, ``commit_step`` ...).
    journal : Journal
        Where each step's commit point is written.
    summary : TrainingSummary
        Filled as the fit goes (the owner's, which it reads afterwards).
    checkpoints : Checkpointer, optional
        The fit's checkpoints.

    A step is one unit (see :mod:`~pystrads.engine.scheduler.journal`): the loop opens it on the shards
    before ``schedule``, so what ``schedule`` and ``after_step`` write belongs to it; it runs
    ``after_step`` before the commit and writes the journal entry -- the step's commit point --
    then commits on the shards.  After a failure the shards roll back whatever the journal does
    not hold, and the loop takes the journal's state: no step is applied twice or in part."""

    def __init__(self, owner: LoopOwner, program: Program, config, num_workers: int, seed: int, namespace: str,
                 job, journal, summary: "TrainingSummary", checkpoints=None):
        self.owner = owner
        self.program, self.config = program, config
        self.num_workers, self.seed, self.namespace = num_workers, seed, namespace
        self.job, self.journal, self.summary, self.checkpoints = job, journal, summary, checkpoints
        self.position = Position(0, 0, num_workers)
        self.progress: Optional[ProgressReporter] = None
        self._open_step: Optional[int] = None  # the step open on the shards while the loop's hooks run
        self._opened: Optional[int] = None  # the next step, opened on the shards with the last commit
        self._planned: Optional[_Planned] = None  # the next step's schedule, planned while a step ran
        self._ended: Optional[tuple] = None  # (why,) when the journal entry a resume took says the fit ended
        self._first_step: Optional[int] = None  # the first step this fit ran (max_steps counts from it)

    @property
    def group(self):
        return self.owner.group

    @property
    def layouts(self) -> Dict[str, Any]:
        return self.owner.layouts

    def loop_table(self, name: str):
        """``ctx.table(name)``: the table's handle whose writes belong to the open step (and to
        this loop's epoch), so they are rolled back with it."""
        try:
            handle = self.group.table(self.layouts[name])
        except KeyError:
            raise KeyError(f"no table {name!r}; the program declares {sorted(self.layouts)}") from None
        if self._open_step is not None:
            handle = handle.fenced(step=self._open_step, epoch=self.job.epoch, namespace=self.namespace)
        return handle

    def drive(self, max_steps: Optional[int]) -> Optional[str]:
        """The fit once its job runs, whoever owns the loop (this process, or the coordinator in
        the job): the data check, the init step (or a resume), the steps, the end; returns why it
        stopped.  A lost task, job or shard in any of these phases is recovered (``_recover``),
        and the loop goes on from the journal's last entry (a relaunch finds it too)."""
        self.progress = self.owner.progress_reporter()
        if self.checkpoints is not None:  # the root is this fit's while it runs
            self.checkpoints.claim(self.namespace)
        try:
            while True:
                try:
                    if not self._restore_last():
                        self._check_data()
                        if not self._resume():
                            self._init_state()
                    stopped = self._ended[0] if self._ended is not None else self._step_loop(max_steps)
                    break
                except (StepFailedError, ShardUnavailableError) as exc:
                    if self._open_step is not None:
                        self._settle(self._open_step)
                    self.owner.recover(exc)
        finally:
            if self.checkpoints is not None:
                self.checkpoints.release()
        t0 = time.perf_counter()
        self.job.finish(self.position.step - 1)
        self.summary.fixed["finish_s"] = time.perf_counter() - t0
        self.progress.finish(stopped or "done")
        self._record_parts()
        return stopped

    # ------------------------------------------------------------------ the journal
    def _journal_entry(self, step: int, ended: bool = False, stopped: Optional[str] = None) -> JournalEntry:
        s = self.summary
        return JournalEntry(step, dataclasses.asdict(self.position), program_state(self.program),
                            {"rows": s.rows, "iterations": s.iterations, "fixed": s.fixed}, self._planned, ended,
                            stopped, self.checkpoints)

    def _restore_last(self) -> bool:
        """Put the loop back at the journal's last entry, if it has one (a relaunched coordinator,
        or a loop that recovered from a lost job)."""
        entry = self.journal.read()
        if entry is None:
            return False
        self._restore(entry)
        self.summary.fixed["resumed_at_step"] = self.position.step
        return True

    def _restore(self, entry: JournalEntry) -> None:
        """Put the loop, the program and the summary back as ``entry`` has them (``_ended``: the
        fit ended there)."""
        self.position = Position(**entry.position)
        current = program_state(self.program)
        for key in [k for k in current if k not in entry.program]:  # made after the entry
            delattr(self.program, key)
        vars(self.program).update(entry.program)
        self.summary.rows[:] = entry.summary["rows"]
        self.summary.iterations[:] = entry.summary["iterations"]
        for key, value in entry.summary["fixed"].items():  # what this loop counted since (recoveries) stays
            self.summary.fixed.setdefault(key, value)
        if entry.checkpoints is not None and self.checkpoints is not None:
            for counter in ("saved", "failures", "seconds"):
                setattr(self.checkpoints, counter, getattr(entry.checkpoints, counter))
        self._planned = entry.planned
        self._open_step = None
        self._ended = (entry.stopped,) if entry.ended else None

    def _settle(self, step: int) -> None:
        """Close step ``step`` (and the next one, where a failed commit opened it) after a failure,
        as the journal decides, shard by shard (:func:`~pystrads.engine.scheduler.journal.settle`;
        best effort: an unreachable shard is recovered next)."""
        try:
            log.info("step %d: %s", step, settle(self.job.group, self.namespace, self.job.epoch, self.journal.read()))
        except PystradsError as exc:
            log.warning("step %d: could not close it on every shard: %s", step, exc)
        self._open_step = self._opened = None

    # ------------------------------------------------------------------ steps
    def _step_loop(self, max_steps: Optional[int]) -> Optional[str]:
        """Schedule and run steps until the program stops; returns why it stopped (None: max_steps).

        With ``scheduler.planAhead`` and a program whose :meth:`~Program.plans_ahead` allows it,
        the next step's schedule is planned in a thread while the step runs (:class:`_PlanAhead`);
        the step's row then holds the part of that planning the workers waited for
        (``schedule_wait_s``), which is all of ``schedule_s`` otherwise."""
        ctx = ScheduleContext(self)
        if self._first_step is None:
            self._first_step = self.position.step
        while max_steps is None or self.position.step - self._first_step < max_steps:
            position = self.position
            step = position.step
            steps = step - self._first_step
            ctx.step, ctx._records, ctx._stop_reason, ctx._progress = step, {}, None, None
            ctx.rounds_done = position.rounds_done - position.serial_extra  # the program's rounds
            ctx.rounds_hint = position.rounds_hint
            ahead: Optional[_PlanAhead] = None
            try:
                if self._opened != step:
                    self.job.open_step(step, position.rounds_done)
                self._open_step, self._opened = step, None
                planned, self._planned = self._planned, None
                if planned is not None:
                    schedule, times = planned.schedule, planned.times
                    ctx._records.update(planned.records)
                    ctx._stop_reason = planned.stop_reason
                else:
                    t0 = time.perf_counter()
                    schedule = self.program.schedule(ctx)
                    times = (time.perf_counter() - t0,) * 2 + (False,)
                if schedule is None or ctx.stopped:
                    # the fit ends here; the step keeps what this last schedule wrote
                    stopped = ctx.stopped
                    self.journal.write(self._journal_entry(step, True, stopped), step)
                    self.job.commit_step(step)
                    self._open_step = None
                    return stopped
                if not isinstance(schedule, Schedule):
                    raise ScheduleError(f"{type(self.program).__name__}.schedule returned "
                                        f"{type(schedule).__name__}; return a Schedule or None")
                if len(schedule) == 0:
                    raise ScheduleError("schedule returned no rounds; return None to end the fit")
                schedule.validate(self.num_workers, self.config["step.maxRounds"])
                run = serial_schedule(self.program, schedule) if self.config["debug.serial"] else schedule
                if self.config["scheduler.planAhead"] and self.program.plans_ahead(ctx) and \
                        (max_steps is None or steps + 1 < max_steps):
                    ahead = _PlanAhead(self.program, ctx, len(schedule))
                goes_on = max_steps is None or steps + 1 < max_steps
                self._run_step(ctx, run, times, len(schedule), ahead, goes_on)
                self._open_step = self._opened  # the next step when the commit opened it
            except (StepFailedError, ShardUnavailableError):
                if ahead is not None:  # planned from a step that did not happen
                    ahead.join()
                raise  # drive settles the step and recovers
            except BaseException:
                if ahead is not None:
                    ahead.join()
                if self._open_step is not None:
                    self._settle(step)
                raise
            if not ctx.stopped and self._checkpoint_due():
                self.checkpoints.try_save(self.job, self.program, self.position, self.summary)
            if ctx.stopped:
                return ctx.stopped
        return None

    def _checkpoint_due(self) -> bool:
        """A checkpoint is due after the step just accounted for (``position.step - 1``)."""
        return self.checkpoints is not None and (self.position.step - 1) % self.config["checkpoint.interval"] == 0

    def _check_data(self) -> None:
        """Hand every worker's ``data_summary`` to the program's ``check_data`` (driver side,
        before the init step), once every worker said hello."""
        if not self.program.checks_data():
            return
        t0 = time.perf_counter()
        self.program.check_data(self.job.data_summaries())
        self.summary.fixed["check_data_s"] = time.perf_counter() - t0  # the workers' loads included

    def _init_state(self) -> None:
        """The init step (atomic, journalled like any step): each worker's mutable state; may write
        initial table values."""
        t0 = time.perf_counter()
        self.position = Position(0, 0, self.num_workers)
        self._planned = None

        def close(answer: Dict[str, Any]) -> None:
            metrics = self.job.metrics(answer, self.program)
            self.summary.fixed["load_s"] = self.job.load_seconds()  # inside the job, before the init step
            self.summary.fixed["init_s"] = time.perf_counter() - t0
            self.summary.fixed["init_compute_s"] = metrics.total("_compute_s") / self.num_workers
            self.position = Position(1, 0, self.num_workers)
            self.journal.write(self._journal_entry(0), 0)

        self.job.open_step(0, 0)
        self._open_step = 0
        try:
            self.job.run_step(0, 0, self.job.command(self.program, 0, 0, None), close)
        except BaseException:
            self._settle(0)
            raise
        self._open_step = None
        self.job.traffic()

    def _resume(self) -> bool:
        """Continue from the latest checkpoint of this fit, if there is one."""
        if self.checkpoints is None:
            return False
        t0 = time.perf_counter()
        resumed = self.checkpoints.resume(self.job, self.program)
        if resumed is None:
            return False
        self.position = resumed.position
        self._planned = None
        self.summary.rows[:] = resumed.rows
        self.summary.iterations[:] = resumed.iterations
        self.summary.fixed["resumed_from_step"] = resumed.step
        self.summary.fixed["resume_s"] = time.perf_counter() - t0
        self.journal.write(self._journal_entry(resumed.step), None)
        return True

    def _size_next_step(self, rounds: int) -> None:
        """Rounds the next step should run (``ctx.rounds_hint``): as many as fill
        ``step.targetSeconds`` at the last step's time per round, at most ``step.maxRounds``."""
        per_round = self.summary.rows[-1]["round_s"] / max(1, rounds)
        target = self.config["step.targetSeconds"]
        self.position.rounds_hint = int(max(1, min(self.config["step.maxRounds"], target / max(per_round, 1e-6))))

    def _run_step(self, ctx: ScheduleContext, schedule: Schedule, t_sched: tuple, program_rounds: int,
                  ahead: Optional["_PlanAhead"] = None, goes_on: bool = False) -> None:
        """Run ``schedule`` (``program_rounds`` of the program's rounds: fewer than its own in
        serial mode) as the open step, account for it (``t_sched``: its schedule's time, the part
        of it the workers waited for, whether it was planned ahead), write its journal entry and
        commit it; ``ahead`` plans the next step meanwhile.  When the loop ``goes_on`` after it
        (the program did not stop, no checkpoint is due), the commit opens the next step too
        (``self._opened``): one round trip between two steps instead of two."""
        position = self.position
        step = position.step
        t0 = time.perf_counter()
        command = self.job.command(self.program, step, position.rounds_done, schedule)
        if ahead is not None:
            ahead.start()  # after the command is made: it may carry the program, pickled

        def close(answer: Dict[str, Any]) -> Optional[int]:  # the step's commit point
            t_step = time.perf_counter() - t0
            if ahead is not None:
                ahead.join()  # after_step (in _account) and the next step's schedule must not overlap
            self._account(ctx, schedule, program_rounds, t_sched, answer, t_step)
            if ahead is not None and not ctx.stopped:
                self._planned = ahead.result()
            self.journal.write(self._journal_entry(step, ctx.stopped is not None, ctx.stopped), step)
            if goes_on and not ctx.stopped and not self._checkpoint_due():
                self._opened = step + 1
                return self.position.rounds_done
            return None

        self.job.run_step(step, position.rounds_done, command, close)
        row = self.summary.rows[-1]
        row.update(self.job.traffic())  # the shards' counters came with the commit

    def _account(self, ctx: ScheduleContext, schedule: Schedule, program_rounds: int, t_sched: tuple,
                 answer: Dict[str, Any], t_step: float) -> None:
        """A finished step's metrics, summary row, position, ``after_step``, progress and the next
        step's size (``t_sched``: as :meth:`_run_step` has it)."""
        position = self.position
        step = position.step
        metrics = self.job.metrics(answer, self.program)
        U = self.num_workers
        compute = metrics.total("_compute_s") / U
        sync = metrics.total("_sync_s") / U
        t_sched, t_wait, planned_ahead = t_sched
        self.summary.add_time("schedule_s", t_sched)
        self.summary.add_time("schedule_wait_s", t_wait)
        row = {
            "step": step, "rounds": len(schedule), "seconds": t_wait + t_step, "schedule_s": t_sched,
            "schedule_wait_s": t_wait, "planned_ahead": planned_ahead, "step_s": t_step, "compute_s": compute,
            "sync_s": sync, "round_s": compute + sync,
            "outside_rounds_s": max(0.0, t_step - compute - sync), "rounds_per_s": len(schedule) / t_step,
            "bytes_in": 0, "bytes_out": 0, "requests": 0,
            "snapshot_s": metrics.total("_snapshot_s") / U, "snapshot_bytes": metrics.total("_snapshot_bytes"),
        }
        position.rounds_done += len(schedule)
        position.step += 1
        self.program.after_step(ctx, metrics)
        row.update(ctx._records)
        self.summary.rows.append(row)
        if ctx._progress is not None:
            done, total, unit, shown = ctx._progress
            self.progress.update(done, total, unit, **shown)
            ctx._progress = None
        extra = " ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in ctx._records.items())
        log.info("step %d: %d rounds in %.3f s (%.0f rounds/s; compute %.3f s, sync %.3f s, outside rounds %.3f s) "
                 "%s", step, len(schedule), t_step, row["rounds_per_s"], compute, sync, row["outside_rounds_s"], extra)
        position.serial_extra += len(schedule) - program_rounds
        self._size_next_step(program_rounds)

    def _record_parts(self) -> None:
        """The checkpoints' figures in the summary."""
        if self.checkpoints is not None:
            if self.checkpoints.saved:
                self.summary.fixed["checkpoints"] = self.checkpoints.saved
                self.summary.fixed["checkpoint_s"] = self.checkpoints.seconds
            if self.checkpoints.failures:
                self.summary.fixed["checkpoint_failures"] = self.checkpoints.failures


class _PlanAhead:
    """The next step's schedule, planned in a thread while the step runs (pipelined schedules).

    It plans with a context of its own (the next step's number and rounds done, this step's round
    hint); :meth:`result` hands the schedule and what the program recorded or stopped there to
    the next step's context.  The loop joins it before ``after_step`` of the running step, so the
    program's hooks never run at once: ``schedule(s + 1)`` sees the state ``after_step(s - 1)``
    left, and the tables as they stand while step ``s`` writes them."""

    def __init__(self, program: Program, ctx: ScheduleContext, rounds: int):
        self.program = program
        self.ctx = copy.copy(ctx)
        self.ctx.step = ctx.step + 1
        self.ctx.rounds_done = ctx.rounds_done + rounds
        self.ctx._records, self.ctx._progress, self.ctx._stop_reason = {}, None, None
        self.schedule: Optional[Schedule] = None
        self.error: Optional[BaseException] = None
        self.seconds = 0.0  # the planning's own time
        self.waited = 0.0  # the part of it the loop waited for, once the step had ended
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._plan, name="pystrads-plan-ahead", daemon=True)
        self._thread.start()

    def _plan(self) -> None:
        t0 = time.perf_counter()
        try:
            self.schedule = self.program.schedule(self.ctx)
        except BaseException as exc:  # raised by take(), in the loop's thread
            self.error = exc
        self.seconds = time.perf_counter() - t0

    def join(self) -> None:
        """Wait for the planning (the wait counts in ``waited``)."""
        t0 = time.perf_counter()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.waited += time.perf_counter() - t0

    def result(self) -> "_Planned":
        """The planned schedule with its planning time, the part of it the workers waited for, and
        what the program recorded or stopped while planning (for the next step's context)."""
        self.join()
        if self.error is not None:
            raise self.error
        return _Planned(self.schedule, (self.seconds, self.waited, True), dict(self.ctx._records),
                        self.ctx._stop_reason)


@dataclasses.dataclass
class _Planned:
    """A step's schedule planned while the step before it ran (kept in the journal entry of that
    step: planning changed the program's state, so a replay must not plan it again)."""

    schedule: Optional[Schedule]
    times: tuple
    records: Dict[str, Any]
    stop_reason: Optional[str]
