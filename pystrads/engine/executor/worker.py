"""Executor side of a fit: one long-running barrier task per worker.

The task loads its partition once, says ``hello`` to shard 0, then carries out
the commands the driver posts to the fit's mailbox on shard 0 -- the init step,
each step's rounds, ``finish`` -- until the fit ends.  Data and state stay in
the task's memory for the whole fit; after each step the task leaves a pickled
snapshot of its state on a shard, from which a restarted task (a retried
barrier stage, a job the driver relaunched) resumes.  Rounds are synchronised
by the shards' round clocks (one ``tick`` per shard per round, which also
carries the round's contributions), never through Spark jobs or
``BarrierTaskContext.barrier()``; every write carries ``(step, worker, task)``
so that shards roll back a failed attempt and refuse writes from its zombie
tasks.
"""

from __future__ import annotations

import base64
import dataclasses
import itertools
import json
import pickle
import time
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import numpy as np

from ...errors import RoundTimeoutError, ShardUnavailableError, StepFailedError
from ...ps import protocol
from ...ps.client import RidingWrites
from ...ps.protocol import Action
from ..program.api import Program, Schedule, WorkerContext
from ..scheduler.sealing import DRIVER, WORKER, Seals
from ..scheduler.steps import export_key, program_hash, state_key, summary_key

#: State snapshots up to this size (sealed) ride the worker's next poll to shard 0 (one call
#: fewer a step); larger ones are stored on the worker's home shard by a call of their own.
SNAPSHOT_RIDES_BYTES = 64 << 10

#: Seconds a ``next`` call waits on the shard before asking again (short enough that a
#: task notices a lost shard promptly, long enough to cost nothing while it waits).
NEXT_POLL_SECONDS = 5.0


@dataclasses.dataclass
class WorkerSpec:
    """What every worker's task needs; pickled into the job's closure once per launch."""

    program: bytes  # cloudpickled Program as of the job's launch
    program_hash: str
    group: Any  # ShardGroup
    layouts: Dict[str, Any]  # short name -> TableLayout
    num_workers: int
    seed: int
    timeout: float
    namespace: str
    fingerprint: bool  # hash the loaded data (checkpoints compare it on resume)
    keep_states: bool = True  # yield (data, state) at finish, for FitResult.map_states
    export: Any = None  # fn(worker, data, state) run at finish; its result goes to the driver via the shards
    threads: int = 1  # threads the worker computes with (WorkerContext.threads)
    coordinator: Any = None  # a CoordinatorSpec: the first task also runs the fit's loop (coordinator.py)
    seals: Any = None  # the fit's Seals (sealing.py): what the workers write and read through the shards
    launch: int = 1  # the job's launch (WorkerJob.launches): said with the hello and every poll for a command


def run_schedule(program: Program, ctx: WorkerContext, data: Any, state: Any, schedule: Schedule,
                 staleness: int, tick: Callable[..., None]):
    """The rounds of ``schedule`` on one worker: ``push``, then ``tick(round, wait_for,
    metrics, late)`` on the round clocks, then ``apply``.  Returns ``(state, late, last)``: the
    final state, the last round's metrics reported after its tick (by ``apply``), and the last
    round's index."""
    has_apply = program.has_apply()
    last = len(schedule) - 1
    ctx.rounds_in_step = len(schedule)
    late: Dict[str, float] = {}  # what apply() of the previous round reported
    for rnd in range(len(schedule)):
        ctx._begin_round(rnd)
        work = schedule.work(rnd, ctx.worker)
        t0 = time.perf_counter()
        new = _holding_writes(ctx, program.push, ctx, data, state, work)
        state = state if new is None else new
        t1 = time.perf_counter()
        metrics = ctx._take_metrics()
        metrics["_compute_s"] = t1 - t0
        wait_for = rnd if (has_apply or rnd == last) else rnd - staleness
        tick(rnd, wait_for, metrics, late or None)
        t2 = time.perf_counter()
        late = {"_sync_s": t2 - t1}
        if has_apply:
            ctx._applying = True
            try:
                new = program.apply(ctx, data, state, work)
            finally:
                ctx._applying = False
            state = state if new is None else new
            late.update(ctx._take_metrics())
            late["_compute_s"] = time.perf_counter() - t2
    return state, late, last


def _holding_writes(ctx: WorkerContext, hook: Callable[..., Any], *args: Any) -> Any:
    """``hook(*args)`` (``push`` or ``init_state``) with its small writes held back for the
    round's tick (:class:`~pystrads.ps.client.RidingWrites`); on failure, no background write
    outlives it and nothing held is sent."""
    riding = ctx._riding
    if riding is not None:
        riding.hold(True)
    try:
        return hook(*args)
    except BaseException:
        ctx._settle(quiet=True)
        if riding is not None:
            riding.discard()
        raise
    finally:
        if riding is not None:
            riding.hold(False)


def use_threads(threads: int) -> None:
    """Let numba's parallel kernels use ``threads`` threads in this task (numba otherwise takes
    every core of the machine, whatever Spark gave the task)."""
    import numba

    numba.set_num_threads(max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS)))


def _task_identity():
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.partitionId(), ctx.taskAttemptId(), ctx.attemptNumber()


class _SourceFailed(Exception):
    """Reading the worker's input failed (Spark could not deliver the partition: a lost executor
    or shuffle block): not the program's fault, so never reported as a program error."""


def _source(records: Iterator[Any]) -> Iterator[Any]:
    """``records``, with a failure to produce the next one raised as :class:`_SourceFailed`."""
    it = iter(records)
    while True:
        try:
            record = next(it)
        except StopIteration:
            return
        except BaseException as exc:  # noqa: BLE001 -- re-raised, marked
            raise _SourceFailed(f"reading the worker's input failed: {exc!r}") from exc
        yield record


#: what the runtime raises when a task, a shard or the network fails: never the program's fault
_INFRASTRUCTURE = (ShardUnavailableError, RoundTimeoutError, StepFailedError, ConnectionError, TimeoutError,
                   KeyboardInterrupt, SystemExit, _SourceFailed)


def _is_program_error(exc: BaseException) -> bool:
    if isinstance(exc, _INFRASTRUCTURE):
        return False
    try:
        import pyarrow.flight as flight

        return not isinstance(exc, flight.FlightError)
    except ImportError:  # pragma: no cover
        return True


class _Worker:
    def __init__(self, spec: WorkerSpec, worker: int, task: int, attempt: int):
        self.spec = spec
        self.worker, self.task, self.attempt = worker, task, attempt
        self.group = spec.group
        self.shards = range(len(spec.group.shards))
        self.home = worker % len(spec.group.shards)  # the shard keeping this worker's snapshots
        self.program = pickle.loads(spec.program)
        self.program_hash = spec.program_hash
        self.check: Optional[Callable[[], None]] = None  # raises when this task must fail (its coordinator did)
        self.poll_seconds = NEXT_POLL_SECONDS
        self.seals = spec.seals
        # (step, Seals) for the states of ``step`` that came back from a checkpoint sealed with
        # the worker key of the fit that saved them
        self.restored: Optional[Tuple[int, Any]] = None

    # -- commands
    def guarded(self, hook: str, step: int, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, the program's ``hook``; what it raises of its own (not a lost shard or
        task) is reported to shard 0 first, so the fit ends with it at once instead of being
        retried as a lost task."""
        try:
            return fn(*args)
        except _SourceFailed as exc:
            raise exc.__cause__ or exc
        except BaseException as exc:
            if _is_program_error(exc):
                import traceback

                text = (f"{type(self.program).__name__}.{hook} raised in worker {self.worker} (task {self.task}, "
                        f"step {step}): {exc!r}\n" + "".join(traceback.format_exception(exc)).rstrip())
                try:
                    self.group.client(0).action(Action.WORKER_ERROR, namespace=self.spec.namespace, worker=self.worker,
                                                task=self.task, error=text[-20000:])
                except Exception:  # noqa: BLE001 -- the task's own failure still ends the job
                    pass
            raise

    def next_command(self, done_step: int, done: Optional[Dict[str, Any]] = None,
                     snapshot: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """The next command for this worker; ``done``: the ``step_done`` of the step it just
        finished, which the first poll carries (one call where there were two), with
        ``snapshot``, that step's state snapshot when it is small (:meth:`snapshot`)."""
        while True:
            extra = {} if done is None else {"done": done}
            if snapshot is not None:
                extra["snapshot"] = snapshot
            done = snapshot = None
            cmd = self.group.client(0).poll(
                Action.NEXT, namespace=self.spec.namespace, worker=self.worker, task=self.task, launch=self.spec.launch,
                done_step=done_step,
                program_hash=self.program_hash, timeout=self.poll_seconds, **extra)
            if cmd.get("kind") == "wait":
                if self.check is not None:
                    self.check()
                continue
            ns = self.spec.namespace
            if cmd.get("program") is not None:
                from pyspark import cloudpickle  # noqa: F401 -- cloudpickled classes may need it

                self.seals.check_field(DRIVER, f"{ns}/program/{cmd['program_hash']}", cmd["program"],
                                       cmd.get("program_seal"))
                self.program = pickle.loads(base64.b64decode(cmd["program"]))
                self.program_hash = cmd["program_hash"]
            if cmd.get("restored") is not None:
                restored, step = cmd["restored"], int(cmd["step"])
                self.seals.check_field(DRIVER, f"{ns}/restored/{step}", json.dumps(restored, sort_keys=True),
                                       cmd.get("restored_seal"))
                key = self.seals.unwrap(restored["key"], f"{ns}/restored/{int(restored['step'])}")
                self.restored = (int(restored["step"]), Seals(self.seals.driver, key))
            return cmd

    def restore(self, step: int) -> Any:
        """The state snapshot of ``step``: on the home shard (a large one, or one a checkpoint
        brought back), else on shard 0 (a small one, which rode the worker's poll)."""
        key = state_key(self.spec.namespace, self.worker, step)
        where = self.home
        blob = self.group.client(where).get_blob(key)
        if blob is None and where != 0:
            where = 0
            blob = self.group.client(where).get_blob(key)
        if blob is None:
            raise RuntimeError(
                f"worker {self.worker}: no state snapshot of step {step} on shard "
                f"{self.group.shards[self.home].uri} or shard 0; the fit cannot resume this worker "
                "(was the shard restarted?)")
        seals = self.restored[1] if self.restored is not None and self.restored[0] == step else self.seals
        # sealed as "state/<worker>/<step>": a checkpoint brings it back under another fit's namespace
        return pickle.loads(seals.open(WORKER, f"state/{self.worker}/{step}", blob,
                                       f"{key!r} on {self.group.shards[where].uri}"))

    def snapshot(self, step: int, state: Any, fence: Dict[str, int]) -> Tuple[int, Optional[Dict[str, Any]]]:
        """Seal the state after ``step`` and keep it on a shard: ``(its size, None)`` once a
        large one is stored on the home shard; ``(its size, fields)`` for a small one, which the
        fields carry to shard 0 with the poll that says the step is done (:meth:`next_command`)."""
        from pyspark import cloudpickle

        blob = cloudpickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
        key = state_key(self.spec.namespace, self.worker, step)
        sealed = self.seals.seal(WORKER, f"state/{self.worker}/{step}", blob)
        series = dict(drop_prefix=state_key(self.spec.namespace, self.worker), keep_after=step - 1)
        if sum(len(memoryview(p).cast("B")) for p in sealed) <= SNAPSHOT_RIDES_BYTES:
            text = base64.b64encode(b"".join(bytes(memoryview(p).cast("B")) for p in sealed)).decode()
            return len(blob), dict(series, key=key, blob=text)
        self.group.client(self.home).put_blob(key, sealed, dict(fence, **series))
        return len(blob), None

    # -- a step
    def open(self, cmd: Dict[str, Any]):
        spec = self.spec
        # ``next`` entered this task in the step on shard 0; its first request to another shard does
        # (``enter``: a newer task rolls the step back there first, an older one is refused)
        fence = {"step": int(cmd["step"]), "worker": self.worker, "task": self.task, "namespace": spec.namespace,
                 "enter": True}
        riding = RidingWrites()
        handles = {name: self.group.table(layout).fenced(riding=riding, **fence)
                   for name, layout in spec.layouts.items()}
        ctx = WorkerContext(self.worker, spec.num_workers, int(cmd["step"]), self.attempt, handles,
                            int(cmd["round_offset"]), spec.seed, spec.threads)
        ctx._riding = riding
        return ctx, fence

    def tick(self, fence, rnd: int, wait_for: int, metrics, late=None, ctx: Optional[WorkerContext] = None) -> None:
        """Advance this worker's round clock on every shard (metrics go to shard 0), sending
        the round's contributions (``ctx``'s outbox) and the small writes its push held back
        with the tick: one exchange per shard that receives any, which also brings back the
        rows ``ctx.pulled`` will give."""
        timeout = self.spec.timeout
        heads = {i: dict(fence, round=rnd, wait_for=wait_for, timeout=timeout) for i in self.shards}
        if 0 in heads:
            heads[0].update(metrics=metrics, late=late, late_round=rnd - 1)
        contributions = [(ctx.table(c.table), c.keys, c.partials, c.read_back, c.columns)
                         for c in (ctx._take_outbox() if ctx is not None else [])]
        writes = ctx._riding.take() if ctx is not None and ctx._riding is not None else None
        pieces_back = self.group.exchange_round(heads, contributions, writes)
        if ctx is not None and ctx._read_back:
            got: Dict[str, list] = {}
            for name, k, rows in pieces_back:
                got.setdefault(name, []).append((k, rows))
            for name, pieces in got.items():
                pieces.sort(key=lambda p: int(p[0][0]) if len(p[0]) else -1)
                keys = np.concatenate([p[0] for p in pieces])
                rows = np.concatenate([p[1] for p in pieces])
                asked = np.asarray(ctx._read_back[name], dtype=np.int64)
                ctx._pulled[name] = np.take(rows, np.searchsorted(keys, asked), axis=0)

    def run_init(self, cmd, data) -> Any:
        ctx, fence = self.open(cmd)
        t0 = time.perf_counter()
        state = self.guarded("init_state", int(cmd["step"]), _holding_writes, ctx, self.program.init_state, ctx, data)
        metrics = ctx._take_metrics()
        metrics["_compute_s"] = time.perf_counter() - t0
        self.tick(fence, 0, 0, metrics, ctx=ctx)
        return state, fence, {}, 0

    def run_step(self, cmd, data, state) -> Any:
        self.seals.check_field(DRIVER, f"{self.spec.namespace}/schedule/{int(cmd['step'])}", cmd["schedule"],
                               cmd.get("schedule_seal"))
        schedule = pickle.loads(base64.b64decode(cmd["schedule"]))
        ctx, fence = self.open(cmd)
        state, late, last = self.guarded("push", int(cmd["step"]), run_schedule,
            self.program, ctx, data, state, schedule, int(cmd.get("staleness", 0)),
            lambda rnd, wait_for, metrics, late_: self.tick(fence, rnd, wait_for, metrics, late_, ctx=ctx))
        return state, fence, late, last


def run_worker(spec: WorkerSpec, records: Iterator[Any], check: Optional[Callable[[], None]] = None) -> Iterator[Any]:
    """The whole fit on one worker; yields ``(data, state)`` once the driver says ``finish``.
    ``check``: called while the worker waits for a command; it raises to fail the task (the
    first task's coordinator failed)."""
    worker, task, attempt = _task_identity()
    w = _Worker(spec, worker, task, attempt)
    if check is not None:
        w.check, w.poll_seconds = check, 1.0
    t0 = time.perf_counter()
    use_threads(spec.threads)
    load_ctx = WorkerContext(worker, spec.num_workers, 0, 0, {}, 0, spec.seed, spec.threads)
    data = w.guarded("load", -1, w.program.load, load_ctx, _source(records))
    load_s = time.perf_counter() - t0
    if w.program.checks_data():  # before the hello: the driver reads it once every worker said hello
        summary = w.guarded("data_summary", -1, w.program.data_summary, load_ctx, data)
        w.group.client(w.home).put_blob(summary_key(spec.namespace, worker), w.seals.seal(
            WORKER, summary_key(spec.namespace, worker), pickle.dumps(summary, protocol=pickle.HIGHEST_PROTOCOL)))
    fingerprint = None
    if spec.fingerprint:
        from ..scheduler.fingerprint import _data_fingerprint

        fingerprint = _data_fingerprint(data)
    w.group.client(0).action(Action.HELLO, namespace=spec.namespace, worker=worker, task=task, launch=spec.launch,
                             fingerprint=fingerprint, load_s=load_s)
    state, have = None, None  # ``have``: the step whose resulting state this task holds
    done_step, done = -1, None  # ``done``: the finished step's step_done, sent with the next poll
    riding = None  # a small snapshot of that step, sent with it
    w.group.stream_rounds(True)  # the fit's rounds travel on one stream per shard, kept across steps
    try:
        cmd = w.next_command(done_step, done, riding)
        while cmd["kind"] not in ("closed", "finish"):
            step = int(cmd["step"])
            if cmd.get("init"):
                state, fence, late, last = w.run_init(cmd, data)
            else:
                if have != step - 1:
                    state = w.restore(step - 1)
                state, fence, late, last = w.run_step(cmd, data, state)
            t_snap = time.perf_counter()
            size, riding = w.snapshot(step, state, fence)
            late = dict(late or {}, _snapshot_s=time.perf_counter() - t_snap, _snapshot_bytes=float(size))
            done = dict(fence, late=late, late_round=last)  # its snapshot is stored (or rides with it): it is done
            have = done_step = step
            cmd = w.next_command(done_step, done, riding)
    finally:
        w.group.stream_rounds(False)  # no stream outlives the task's rounds (it would hold a shard's shutdown up)
    if cmd["kind"] == "finish":  # (else "closed": the driver released the fit before this task read ``finish``)
        step = int(cmd["step"])
        if have != step and (spec.keep_states or spec.export is not None):
            state = w.restore(step)
        if spec.export is not None:
            from pyspark import cloudpickle

            # the state snapshot before the last step's is no longer needed: dropped before
            # the export arrives (the last step's, and small ones on shard 0, stay until the fit is released)
            exported = cloudpickle.dumps(w.guarded("export", step, spec.export, worker, data, state))
            w.group.client(w.home).put_blob(export_key(spec.namespace, worker),
                                            w.seals.seal(WORKER, export_key(spec.namespace, worker), exported),
                                            dict(drop_prefix=state_key(spec.namespace, worker), keep_after=step))
        if spec.keep_states:
            yield data, state


def arrow_records(batches) -> Iterator[tuple]:
    """A DataFrame partition's rows as tuples of Python values, in column order."""
    for batch in batches:
        columns = [column.to_pylist() for column in batch.columns]
        yield from zip(*columns)


def run_worker_arrow(spec: WorkerSpec, batches, decode=None, decode_batch=None) -> Iterator[Any]:
    """:func:`run_worker` over a DataFrame partition (``mapInArrow(..., barrier=True)``): the
    records are the rows (:func:`arrow_records`), through ``decode`` when given, or whatever
    ``decode_batch`` makes of each Arrow batch (columnar: no Python object per row); the task
    returns no rows."""
    if decode_batch is not None:
        records = itertools.chain.from_iterable(map(decode_batch, batches))
    else:
        records = arrow_records(batches)
        if decode is not None:
            records = map(decode, records)
    coordinator = None
    if spec.coordinator is not None and _task_identity()[0] == 0:
        coordinator = spec.coordinator.start(spec)  # a CoordinatorSpec (engine/executor/coordinator.py)
    try:
        for _ in run_worker(spec, records, coordinator.check if coordinator is not None else None):
            pass  # a DataFrame input keeps no states (nothing to hand to Spark's cache)
    except BaseException:
        if coordinator is not None:
            coordinator.abandon()
        raise
    if coordinator is not None:  # the job's rows: the coordinator's result
        import pyarrow as pa

        for chunk in coordinator.result_rows():
            yield pa.RecordBatch.from_arrays([protocol.binary_array([chunk])], ["result"])
