"""A shard's steps: step state, write fences, round clocks and the commit of rounds.

:class:`_StepState` is the open step (its workers, their task ids and round
clocks, the pending contributions and the per-round metrics);
:class:`StepFences` runs the steps of a shard's fits (composed by
:class:`~pystrads.ps.server.ShardServer`, on its :class:`~pystrads.ps.state.ShardState`):
the fence that admits only the workers' current tasks (a newer attempt rolls
the step back), the commit of a round's contributions through the program's
``pull``, the opening of a step (the server's ``begin_step``, which also posts
the step's command), and the actions ``claim``, ``enter``, ``tick``,
``step_done``, ``wait_step``, ``commit_step``, ``abort_step``, ``metrics``,
``worker_error`` and ``fit_error``.

Loop epochs fence the step loop's incarnations: every request of a fit's loop (the driver, or
the coordinator in the fit's job) carries its ``epoch``; a shard remembers the newest epoch it
saw per fit (``claim`` announces one) and refuses a step action, a post or a write of an older
one, so a loop that lost its job can no longer change the fit once its successor started.
The loop's own writes (``schedule`` and ``after_step`` reading and writing tables) carry the
open step and the epoch instead of a worker's task: they belong to the step and are rolled
back with it.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import numpy as np
import pyarrow.flight as flight

from .request import _Request
from .state import in_fit

if TYPE_CHECKING:
    from .state import ShardState

log = logging.getLogger("pystrads.ps.server")

#: how many ended fits a shard remembers, so that their late workers end instead of waiting
CLOSED_FITS_KEPT = 4096


class _StepState:
    def __init__(self, step: int = -1, num_workers: int = 0, namespace: str = "", round_offset: int = 0):
        self.step = step
        self.round_offset = round_offset  # global index of the step's round 0
        self.epoch = 0
        self.registered: Dict[int, int] = {}  # worker -> task attempt id of the current epoch
        self.retired = -1  # task ids up to this one belong to failed attempts
        self.open = step >= 0
        self.num_workers = num_workers
        self.namespace = namespace
        self.clocks = np.full(max(num_workers, 0), -1, dtype=np.int64)
        self.committed = -1  # highest round whose contributions are applied
        self.contrib: Dict[Tuple[str, int], List[Tuple[np.ndarray, np.ndarray]]] = {}
        self.metrics: Dict[int, Dict[str, float]] = {}
        self.error: Optional[str] = None
        self.program_error = False  # the error came from the program's own code (never retried)
        self.done: Dict[int, int] = {}  # workers that finished the step -> their task id
        self.kept = False  # the step was committed (closed by commit_step, not abort_step)


def namespace_of(name: str) -> str:
    """The fit namespace of a table name or blob key (``<namespace>/<rest>``; "" for a name
    without one)."""
    return name.partition("/")[0] if "/" in name else ""


def _own(rows: np.ndarray, index: Any) -> np.ndarray:
    """``rows`` read at ``index`` as an array of their own: a slice's view is copied, a
    gather's fresh array is kept."""
    return rows if not isinstance(index, slice) and rows.flags.owndata else np.array(rows)


class StepFences:
    """The steps and rounds of a shard's fits, on the shard's :class:`~pystrads.ps.state.ShardState`.

    Each fit (namespace) has a step state of its own, so fits of one application step at
    the same time: a request names its fit (``namespace``: the workers' fences and the
    driver's step actions carry it; a write's table or a blob's key names it too); a
    request that names none belongs to the one open step.

    Besides the step states it keeps, per fit, the newest step loop's epoch, the first
    program error its workers reported, the newest task id seen per worker (older ids are
    zombies of a failed attempt, refused from then on), and which fits have ended (newest
    last, bounded: their late workers are told to end instead of waiting).  Its methods named
    ``action_<name>`` serve the shard's actions of that name; the others are called with the
    state's ``cond`` held."""

    def __init__(self, state: "ShardState"):
        self.state = state
        self.steps: Dict[str, _StepState] = {}  # per fit namespace: its open (or last) step
        self.loop_epochs: Dict[str, int] = {}  # per fit namespace: the newest step loop's epoch
        self.fit_errors: Dict[str, str] = {}  # per fit namespace: the first program error its workers reported
        self.newest_task: Dict[Tuple[str, int], int] = {}  # per (fit namespace, worker)
        # fits that ended (their tables were dropped) -> their program error, if any
        self.closed: "collections.OrderedDict[str, Optional[str]]" = collections.OrderedDict()

    def is_closed(self, namespace: str) -> bool:
        return namespace in self.closed

    def forget_fit(self, fit: str) -> None:
        """The fit ``fit`` ended (its tables are dropped): its step states, epochs and task ids
        go; it is remembered as ended, with its program error."""
        for ns in [n for n in self.steps if n and in_fit(n, fit)]:
            del self.steps[ns]
        for ns in [n for n in self.loop_epochs if in_fit(n, fit)]:
            del self.loop_epochs[ns]
        errors = [self.fit_errors.pop(ns) for ns in [n for n in self.fit_errors if in_fit(n, fit)]]
        self.closed[fit] = errors[0] if errors else None  # its program error, read after the end
        while len(self.closed) > CLOSED_FITS_KEPT:
            self.closed.popitem(last=False)

    def step_of(self, namespace: str = "") -> _StepState:
        """The step state of fit ``namespace`` (a closed one if it has none); without a
        namespace, the one open step (or, with none open, the step begun last)."""
        if namespace:
            st = self.steps.get(namespace)
            return st if st is not None else _StepState(namespace=namespace)
        open_steps = [st for st in self.steps.values() if st.open]
        if len(open_steps) == 1:
            return open_steps[0]
        if open_steps:
            raise flight.FlightServerError(
                f"shard {self.state.shard_id}: {len(open_steps)} fits have a step open; the request must name its "
                "namespace")
        return next(reversed(self.steps.values())) if self.steps else _StepState()

    def check_epoch(self, namespace: str, epoch: Any, what: str) -> None:
        """Called with ``self.state.cond`` held: refuse a request of a step loop older than the newest
        that claimed fit ``namespace`` (``epoch`` None: a request from outside any loop)."""
        if epoch is None:
            return
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise flight.FlightServerError(f"malformed request: epoch={epoch!r} must be an integer >= 0")
        newest = self.loop_epochs.get(namespace, 0)
        if epoch < newest:
            raise flight.FlightServerError(
                f"shard {self.state.shard_id}: {what} of fit {namespace!r} from loop epoch {epoch} refused: epoch "
                f"{newest} has taken the fit over (a coordinator or driver that lost its job)")
        if epoch > newest:
            self.loop_epochs[namespace] = epoch

    def action_claim(self, req):
        """A step loop of fit ``namespace`` starts with ``epoch``: from now on requests of
        older epochs are refused (an older or equal epoch claiming again is refused / a no-op)."""
        namespace = req.str("namespace")
        with self.state.cond:
            self.check_epoch(namespace, req.int("epoch"), "a claim")
            st = self.steps.get(namespace)
            return {"epoch": self.loop_epochs.get(namespace, 0),
                    "step": st.step if st is not None else -1, "open": bool(st is not None and st.open),
                    "kept": bool(st is not None and st.kept)}

    def check_fence(self, header: Dict[str, Any], entering: bool = False, namespace: str = "") -> _StepState:
        """Writes during a step must come from the worker's current task.

        Python tasks cannot see Spark's stage attempt number, so attempts are
        told apart by task attempt ids (unique and increasing in an
        application): when a worker enters again with a newer task id, the
        stage was retried -- roll back to the pre-step state and start a new
        epoch; tasks of older epochs (zombies) are refused from then on.
        Returns the fit's step state (``namespace``: the fit a write's table or
        key belongs to, when the header names none).  A worker's task enters on
        shard 0 as ``next`` hands it the step, and on another shard with its first
        request there, which says ``enter``: no call of its own.
        """
        entering = entering or header.get("enter") is True
        st = self.step_of(header.get("namespace") or namespace)
        step = header.get("step")
        if "epoch" in header and "worker" not in header:  # the step loop's own write
            self.check_epoch(st.namespace or namespace, header.get("epoch"), "a write")
            if step is not None and (not st.open or step != st.step):
                raise flight.FlightServerError(
                    f"shard {self.state.shard_id}: the step loop wrote for step {step} but the open step is "
                    f"{st.step if st.open else 'none'}")
            if step is None and st.open:
                raise flight.FlightServerError(
                    f"shard {self.state.shard_id}: unfenced write while step {st.step} is open")
            return st
        if step is None:
            if st.open:
                raise flight.FlightServerError(
                    f"shard {self.state.shard_id}: unfenced write while step {st.step} is open")
            return st
        if not st.open or step != st.step:
            raise flight.FlightServerError(
                f"shard {self.state.shard_id}: request for step {step} but the open step is "
                f"{st.step if st.open else 'none'} (a task from a finished step?)")
        worker, task = header.int("worker", -1), header.int("task", -1)
        if not 0 <= worker < st.num_workers:
            raise flight.FlightServerError(f"worker {worker} out of range [0, {st.num_workers})")
        current = st.registered.get(worker)
        if current == task:
            return st
        newest = self.newest_task.get((st.namespace, worker), -1)
        if task <= st.retired or (current is not None and task < current) or task < newest:
            raise flight.FlightServerError(
                f"shard {self.state.shard_id}: task {task} of worker {worker} belongs to a failed attempt of "
                f"step {step}; refusing a zombie task's request")
        if not entering:
            raise flight.FlightServerError(
                f"shard {self.state.shard_id}: task {task} of worker {worker} did not enter step {step}")
        if current is not None:  # the same worker again with a newer task: the stage was retried
            self._new_epoch(st)
        st.registered[worker] = task
        self.newest_task[(st.namespace, worker)] = task
        return st

    def _new_epoch(self, st: _StepState) -> None:
        """Called with ``self.state.cond`` held: roll the fit's tables back to the pre-step state."""
        restored = 0
        for table in self.state.fit_tables(st.namespace):
            with table.lock:
                restored += table.rollback()
        log.warning("shard %s: step %d was retried (epoch %d); rolled back %d rows",
                    self.state.shard_id, st.step, st.epoch + 1, restored)
        st.retired = max([st.retired] + list(st.registered.values()))
        st.registered = {}
        st.epoch += 1
        st.clocks[:] = -1
        st.committed = -1
        st.contrib.clear()
        st.metrics.clear()
        st.done.clear()
        st.error = None
        st.program_error = False
        self.state.cond.notify_all()

    def _commit_rounds(self, st: _StepState, upto: int) -> None:
        """With ``self.state.cond`` held: apply the contributions of rounds up to ``upto``."""
        while st.committed < upto:
            rnd = st.committed + 1
            for (name, r) in sorted(k for k in st.contrib if k[1] == rnd):
                parts = st.contrib.pop((name, r))
                try:
                    self.apply_pull(name, parts, st)
                except Exception as exc:  # the program's pull failed: fail the round for all
                    st.error = f"pull of table {name!r} in round {rnd} failed: {exc!r}"
                    st.program_error = True
                    log.exception("shard %s: %s", self.state.shard_id, st.error)
            self._shard_metrics(st, rnd)
            st.committed = rnd

    def _shard_metrics(self, st: _StepState, rnd: int) -> None:
        """The program's ``shard_metrics`` over this shard's rows, at the rounds its
        ``shard_metrics_due`` names: a consistent snapshot, since no worker
        passes the round's clock until this returns."""
        program = self.state.programs.get(st.namespace)
        if program is None or not getattr(program, "shard_metrics_every", 0):
            return
        due = getattr(program, "shard_metrics_due", None)  # (a Program subclass always has it)
        if not (due(st.round_offset + rnd) if due is not None else (st.round_offset + rnd + 1) %
                program.shard_metrics_every == 0):
            return
        bucket = st.metrics.setdefault(rnd, {})
        prefix = st.namespace + "/"
        for name, table in list(self.state.tables.items()):
            if not name.startswith(prefix) or table.row_stop == table.row_start:
                continue
            try:
                with table.lock:
                    values = program.shard_metrics(name[len(prefix):], table.metrics_view(), table.row_start) or {}
            except Exception as exc:
                st.error = f"shard_metrics of table {name!r} in round {rnd} failed: {exc!r}"
                st.program_error = True
                log.exception("shard %s: %s", self.state.shard_id, st.error)
                return
            for key, value in values.items():
                bucket[key] = bucket.get(key, 0.0) + float(value)

    def apply_pull(self, name: str, parts: List[Tuple[np.ndarray, np.ndarray]],
                    st: Optional[_StepState] = None) -> None:
        """The program's ``pull`` of a round's summed contributions to table ``name`` (``st``: its
        fit's step, whose undo log keeps the rows' pre-step values; by default the table's fit's)."""
        st = st if st is not None else self.step_of(namespace_of(name))
        table = self.state.table(name)
        parts = [(k, v) for k, v in parts if len(k)]
        if not parts:
            return
        first = parts[0][0]
        lo, hi = min(int(k.min()) for k, _ in parts), max(int(k.max()) for k, _ in parts)
        span, count = hi - lo + 1, sum(len(k) for k, _ in parts)
        if bool(np.all(first[1:] > first[:-1])) and all(np.array_equal(k, first) for k, _ in parts[1:]):
            # every worker sent the same sorted keys (a round's coordinates): sums part after part
            uniq, sums = first, np.array(parts[0][1], dtype=np.float64)
            for _, v in parts[1:]:
                sums += v
        elif span <= 4 * count:  # dense key range (e.g. one factor column): O(n), part after part
            sums, present = np.zeros((span, parts[0][1].shape[1])), np.zeros(span, dtype=bool)
            for k, v in parts:  # in arrival order, as the sparse branch adds them
                offsets = k - lo
                if bool(np.all(k[1:] > k[:-1])):  # a client's part: sorted, each key once
                    sums[offsets] += v
                else:
                    np.add.at(sums, offsets, v)
                present[offsets] = True
            uniq = lo + np.flatnonzero(present)
            sums = sums[uniq - lo]
        else:
            keys = np.concatenate([k for k, _ in parts])
            vals = np.concatenate([v for _, v in parts])
            order = np.argsort(keys, kind="stable")
            keys, vals = keys[order], vals[order]
            starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
            uniq = keys[starts]
            sums = np.add.reduceat(vals, starts, axis=0)
        namespace, _, short = name.partition("/")
        program = self.state.programs.get(namespace)
        if program is None:
            raise RuntimeError(f"no program registered for {namespace!r}")
        with table.lock:
            index = table.local(uniq)
            current = _own(table.read(index), index)
            new = np.asarray(program.pull(short, uniq, sums, current))
            if new.shape != current.shape:
                raise ValueError(f"pull returned shape {new.shape}, expected {current.shape}")
            if st.open:
                table.remember(index)
            table.write(index, new)

    def begin_step(self, req):
        """Open a step: clocks reset, writes from now on are undoable (the server's
        ``begin_step`` action, which also posts the step's command to the fit's mailbox)."""
        namespace = req.str("namespace", "")
        with self.state.cond:
            self.check_epoch(namespace, req.get("epoch"), f"begin_step {req.get('step')}")
            current = self.steps.get(namespace, _StepState())
            if current.open:
                raise flight.FlightServerError(
                    f"step {current.step} of fit {namespace!r} is still open; commit or abort it first")
            for table in self.state.fit_tables(namespace):
                table.forget()
            num_workers = req.int("num_workers")
            if not 1 <= num_workers <= 1 << 20:
                raise flight.FlightServerError(f"malformed request: num_workers={num_workers} out of range")
            self.steps.pop(namespace, None)  # re-inserted: the dict's last step is the one begun last
            self.steps[namespace] = _StepState(req.int("step"), num_workers, namespace, req.int("round_offset", 0))
        return {}

    def action_enter(self, req):
        """A worker task starts an attempt of the open step (a newer attempt rolls back)."""
        with self.state.cond:
            st = self.check_fence(req, entering=True)
        return {"epoch": st.epoch}

    def action_tick(self, req):
        """Advance a worker's round clock, then wait until every worker reached ``wait_for``."""
        worker, rnd = req.int("worker"), req.int("round")
        wait_for = req.int("wait_for", rnd)
        timeout = req.num("timeout", 600.0)
        deadline = time.monotonic() + timeout
        with self.state.cond:
            st = self.check_fence(req)
            epoch = st.epoch
            if rnd > st.clocks[worker]:
                st.clocks[worker] = rnd
            for key, value in req.dict("metrics", {}).items():
                bucket = st.metrics.setdefault(rnd, {})
                bucket[key] = bucket.get(key, 0.0) + float(value)
            if req.get("late"):  # reported after the previous round's tick (by apply)
                bucket = st.metrics.setdefault(req.int("late_round"), {})
                for key, value in req.dict("late").items():
                    bucket[key] = bucket.get(key, 0.0) + float(value)
            low = int(st.clocks.min())
            if low > st.committed:
                self._commit_rounds(st, low)
                self.state.cond.notify_all()
            while True:
                if st is not self.steps.get(st.namespace) or st.epoch != epoch or not st.open:
                    raise flight.FlightServerError(
                        f"step {st.step} was retried or closed while worker {worker} waited")
                if st.error:
                    raise flight.FlightServerError(st.error)
                if st.committed >= wait_for:
                    return {"committed": st.committed}
                left = deadline - time.monotonic()
                if left <= 0:
                    lagging = np.flatnonzero(st.clocks < wait_for).tolist()
                    raise flight.FlightTimedOutError(
                        f"round timeout: worker {worker} waited {timeout:.0f} s for round {wait_for}; "
                        f"workers {lagging} did not finish it. Raise spark.pystrads.round.timeoutSeconds "
                        "if rounds are legitimately this slow")
                self.state.cond.wait(min(left, 1.0))

    def action_step_done(self, req):
        """A worker finished its part of the open step (fenced; ``late``: metrics of
        its last round reported after that round's tick)."""
        worker = req.int("worker")
        with self.state.cond:
            st = self.check_fence(req)
            if req.get("late"):
                bucket = st.metrics.setdefault(req.int("late_round"), {})
                for key, value in req.dict("late").items():
                    bucket[key] = bucket.get(key, 0.0) + float(value)
            st.done[worker] = req.int("task")
            self.state.cond.notify_all()
        return {}

    def action_wait_step(self, req):
        """The driver waits (up to ``timeout``) until every worker finished the open step;
        the answer carries the step's per-round metrics when it did."""
        step = req.int("step")
        deadline = time.monotonic() + req.num("timeout", 1.0)
        with self.state.cond:
            while True:
                st = self.step_of(req.str("namespace", ""))
                if not st.open or st.step != step:
                    raise flight.FlightServerError(
                        f"shard {self.state.shard_id}: step {step} is not open (open: {st.step if st.open else 'none'})")
                if st.error:
                    return {"done": False, "error": st.error, "program_error": st.program_error, "epoch": st.epoch}
                if self.fit_errors.get(st.namespace):
                    return {"done": False, "error": self.fit_errors[st.namespace], "program_error": True,
                            "epoch": st.epoch}
                if len(st.done) >= st.num_workers:
                    return {"done": True, "epoch": st.epoch,
                            "rounds": {str(k): v for k, v in sorted(st.metrics.items())}}
                left = deadline - time.monotonic()
                if left <= 0:
                    return {"done": False, "epoch": st.epoch, "finished": sorted(st.done),
                            "clocks": st.clocks.tolist(), "entered": len(st.registered)}
                self.state.cond.wait(min(left, 1.0))

    def action_commit_step(self, req):
        """Close the step and keep its writes; ``open_next`` (``step``, ``num_workers``,
        ``round_offset``): then open the loop's next step, in the same call (:meth:`begin_step`)."""
        with self.state.cond:
            self.check_epoch(req.str("namespace", ""), req.get("epoch"), f"commit_step {req.get('step')}")
            st = self.step_of(req.str("namespace", ""))
            if st.open and st.step == req.int("step"):
                for table in self.state.fit_tables(st.namespace):
                    with table.lock:
                        table.forget()
                        table.settle()
                st.open = False
                st.kept = True
                self.state.cond.notify_all()
            following = req.dict("open_next", None)
            if following is not None:
                self.begin_step(_Request(following, namespace=req.str("namespace", ""), epoch=req.get("epoch")))
        return self.state.counters()

    def action_abort_step(self, req):
        """Close the step and roll back every write it made."""
        restored = 0
        with self.state.cond:
            self.check_epoch(req.str("namespace", ""), req.get("epoch"), f"abort_step {req.get('step')}")
            st = self.step_of(req.str("namespace", ""))
            if st.open and st.step == req.int("step"):
                for table in self.state.fit_tables(st.namespace):
                    with table.lock:
                        restored += table.rollback()
                st.open = False  # fences out any straggler
                self.state.cond.notify_all()
        return {"restored_rows": restored}

    def action_worker_error(self, req):
        """A worker's program code raised (``error``: the hook, the worker and the traceback): the
        fit ends with it -- the open step fails for every worker, and the driver's waits report it
        as the program's error, not as a lost task."""
        namespace, worker = req.str("namespace"), req.int("worker")
        with self.state.cond:
            if req.int("task") < self.newest_task.get((namespace, worker), -1):
                return {}  # a zombie's: its attempt was already replaced
            text = req.str("error")[:20000]
            self.fit_errors.setdefault(namespace, text)
            st = self.steps.get(namespace)
            if st is not None and st.open and not st.error:
                st.error, st.program_error = text, True
            self.state.cond.notify_all()
        return {}

    def action_fit_error(self, req):
        """The program error a worker of fit ``namespace`` reported, if any (``error``: None)."""
        namespace = req.str("namespace")
        with self.state.cond:
            return {"error": self.fit_errors.get(namespace) or self.closed.get(namespace)}

    def action_metrics(self, req):
        """Per-round metric sums reported by the workers of the current step."""
        with self.state.cond:
            st = self.step_of(req.str("namespace", ""))
            return {"step": st.step, "open": st.open, "kept": st.kept, "epoch": st.epoch,
                    "rounds": {str(k): v for k, v in sorted(st.metrics.items())},
                    "clocks": st.clocks.tolist()}
