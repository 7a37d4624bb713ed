"""Executor side of a step: one barrier task runs all the rounds of a step.

Rounds are synchronised through the shards' round clocks (one ``tick`` per
shard per round), never through Spark jobs or ``BarrierTaskContext.barrier()``.
Every write carries ``(step, attempt, worker)`` so that shards roll back a
failed attempt and refuse writes from its zombie tasks.
"""

from __future__ import annotations

import dataclasses
import pickle
import time
from typing import Any, Callable, Dict, Iterator, Optional

from .program import Program, Schedule, WorkerContext


@dataclasses.dataclass
class StepSpec:
    """Everything a step's tasks need; pickled into the job's closure."""

    program: Program
    group: Any  # ShardGroup
    layouts: Dict[str, Any]  # short name -> TableLayout
    step: int
    num_workers: int
    round_offset: int
    seed: int
    staleness: int
    timeout: float
    schedule: Optional[Schedule] = None  # None: the init step


def _task_identity():
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.partitionId(), ctx.taskAttemptId(), ctx.attemptNumber()


def _open(spec: StepSpec):
    worker, task, attempt = _task_identity()
    fence = {"step": spec.step, "worker": worker, "task": task}
    for i in range(len(spec.group.shards)):
        spec.group.client(i).action("enter", **fence)
    handles = {name: spec.group.table(layout).fenced(**fence) for name, layout in spec.layouts.items()}
    ctx = WorkerContext(worker, spec.num_workers, spec.step, attempt, handles, spec.round_offset, spec.seed)
    return ctx, fence


def _tick(spec: StepSpec, fence: Dict[str, int], rnd: int, wait_for: int,
          metrics: Optional[Dict[str, float]], late: Optional[Dict[str, float]] = None) -> None:
    """Advance this worker's clock on every shard; metrics go to shard 0 (``late``:
    metrics of the previous round, reported by ``apply`` after that round's tick)."""
    for i in range(len(spec.group.shards)):
        extra = {"metrics": metrics, "late": late, "late_round": rnd - 1} if i == 0 else {}
        spec.group.client(i).action("tick", **fence, round=rnd, wait_for=wait_for, timeout=spec.timeout,
                                    **extra)


def run_load(spec: StepSpec, index: int, records: Iterator[Any]) -> Iterator[Any]:
    """Plain (non-barrier) task: the worker's immutable data from its input records."""
    ctx = WorkerContext(index, spec.num_workers, 0, 0, {}, 0, spec.seed)
    yield spec.program.load(ctx, records)


def run_summary(spec: StepSpec, index: int, datas: Iterator[Any]) -> Iterator[bytes]:
    """The worker's pickled ``data_summary`` of its loaded data (``check_data``'s input)."""
    ctx = WorkerContext(index, spec.num_workers, 0, 0, {}, 0, spec.seed)
    for data in datas:
        yield pickle.dumps(spec.program.data_summary(ctx, data), protocol=pickle.HIGHEST_PROTOCOL)


def run_init(spec: StepSpec, datas: Iterator[Any]) -> Iterator[Any]:
    """The init step (barrier, atomic): each worker's initial mutable state."""
    data, = list(datas)
    ctx, fence = _open(spec)
    t0 = time.perf_counter()
    state = spec.program.init_state(ctx, data)
    metrics = ctx._take_metrics()
    metrics["_compute_s"] = time.perf_counter() - t0
    _tick(spec, fence, 0, 0, metrics)
    yield state


def run_schedule(program: Program, ctx: WorkerContext, data: Any, state: Any, schedule: Schedule,
                 staleness: int, tick: Callable[..., None]):
    """The rounds of ``schedule`` on one worker (both runtimes): ``push``, then
    ``tick(round, wait_for, metrics, late)`` on the round clocks, then ``apply``.  Returns
    ``(state, late, last)``: the final state, the last round's metrics reported after its
    tick (by ``apply``), and the last round's index."""
    has_apply = program.has_apply()
    last = len(schedule) - 1
    ctx.rounds_in_step = len(schedule)
    late: Dict[str, float] = {}  # what apply() of the previous round reported
    for rnd in range(len(schedule)):
        ctx._begin_round(rnd)
        work = schedule.work(rnd, ctx.worker)
        t0 = time.perf_counter()
        try:
            new = program.push(ctx, data, state, work)
        except BaseException:
            ctx._settle(quiet=True)  # no background write outlives the failed push
            raise
        state = state if new is None else new
        t1 = time.perf_counter()
        metrics = ctx._take_metrics()
        metrics["_compute_s"] = t1 - t0
        wait_for = rnd if (has_apply or rnd == last) else rnd - staleness
        tick(rnd, wait_for, metrics, late or None)
        t2 = time.perf_counter()
        late = {"_sync_s": t2 - t1}
        if has_apply:
            new = program.apply(ctx, data, state, work)
            state = state if new is None else new
            late.update(ctx._take_metrics())
            ctx._flush_outbox()
            late["_compute_s"] = time.perf_counter() - t2
    return state, late, last


def run_rounds(spec: StepSpec, pairs: Iterator[Any]) -> Iterator[Any]:
    """A regular step: all rounds of ``spec.schedule`` on this worker."""
    (data, state), = list(pairs)
    ctx, fence = _open(spec)
    state, late, last = run_schedule(
        spec.program, ctx, data, state, spec.schedule, spec.staleness,
        lambda rnd, wait_for, metrics, late_: _tick(spec, fence, rnd, wait_for, metrics, late_))
    if late:  # the last round's late metrics: one more tick of the same round on shard 0
        spec.group.client(0).action("tick", **fence, round=last, wait_for=last, timeout=spec.timeout,
                                    late=late, late_round=last)
    yield state
