"""The Program API: how a model-parallel algorithm is written for pystrads.

A :class:`Program` declares its model :class:`Table` s and implements

* ``load(ctx, records) -> data`` -- once per data partition (worker), on the
  executor: the worker's immutable ``data`` built from its input records
  (kept cached; a pure function of the records -- no table access).  Make it
  independent of the records' order (sort them by an id): a partition
  recomputed after an executor loss may deliver them in another order, and a
  checkpoint's states only resume onto identical data;
* ``data_summary(ctx, data)`` and ``check_data(summaries)`` (optional) -- a
  small picklable summary of each worker's loaded data (e.g. a row sample),
  handed in worker order to ``check_data`` on the **driver** before the init
  step: it may keep what ``schedule`` needs (never sent to the workers if
  kept out of the pickled program) or raise to end the fit before any table
  is written;
* ``init_state(ctx, data) -> state`` -- in the (atomic) init step: the
  worker's mutable ``state``, carried from step to step; may write initial
  values into tables (e.g. LDA's initial counts);
* ``schedule(ctx) -> Schedule | None`` -- on the **driver**: which work each
  worker does in each of the next rounds (``None`` ends the fit).  It may
  read current parameter values through ``ctx.table(name)`` (dynamic
  schedules) and should size the step with ``ctx.rounds_hint``;
* ``push(ctx, data, state, work) -> state`` -- on each worker, once per
  round: read the rows it needs (``ctx.table(name).read``), compute on local
  data, and write (``add`` / ``write``) or send partial sums (``contribute``);
* ``pull(table, keys, partials, current) -> new_rows`` -- on the **shards**,
  where the rows live: turns the summed contributions of every worker for
  a round into the table's new rows (server-side aggregation);
* ``apply(ctx, data, state, work) -> state`` (optional) -- on each worker
  after the round's ``pull`` is committed everywhere, e.g. to update a
  local residual with the new parameter values;
* ``after_step(ctx, metrics)`` (optional) -- on the driver after each step,
  with the per-round sums of what workers ``ctx.report``-ed; record an
  objective with ``ctx.record(...)`` and stop with ``ctx.stop(reason)``;
* ``serial_rounds(work)`` (optional) -- serial mode
  (``spark.pystrads.debug.serial``: one worker, every round's work in schedule
  order): the rounds one round's work runs as, one after another (default:
  the work whole; a coordinate round: one coordinate per round).

The four shapes of STRADS / Petuum programs map onto it directly (see
:mod:`pystrads.programs.examples` for one worked example of each):

=====================  ==========================================================
static rotation        ``Schedule.per_worker``: round r gives worker p block
                       (p + r) mod U (LDA word rotation)
alternating / k-part.  ``Schedule.shared``: every worker works on the same block;
                       ``contribute`` + ``pull`` aggregate (MF's W-then-H)
dynamic, pipelined     ``schedule`` reads ``ctx.table(...)`` and ships ``s``
                       rounds per step (Lasso)
data-parallel          ``Schedule.data_parallel(n)`` with ``staleness > 0`` (SSP)
=====================  ==========================================================

Programs should be light objects (parameters, not data): they are pickled
to the workers (again whenever the driver's copy changes, e.g. in
``after_step``) and onto the shards for ``pull``.  A worker keeps its copy
from step to step, so changes ``push`` makes to ``self`` persist on that
worker until the driver's copy changes; keep worker-side state in ``state``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from ...errors import ScheduleError
from ...ps.table import RowEntries  # part of the Program API: a sparse table's rows in shard_metrics


@dataclasses.dataclass
class Table:
    """A model table: ``num_rows`` rows of ``width`` values, range-partitioned over shards.

    Parameters
    ----------
    name : str
        Name used by the program (``ctx.table(name)``).
    num_rows, width : int
        Shape.
    dtype : {"float64", "float32", "int64", "int32"}
        Element type.
    fill : number
        Initial value of every cell (ignored with ``initializer``).
    initializer : callable ``(row_start, row_stop) -> array``, optional
        Runs on the shard to create its rows (so large tables never pass
        through the driver); must depend only on the row indices to give the
        same table for any number of shards.
    weights : array of shape (num_rows,), optional
        Cost of each row; shards get contiguous ranges of about equal cost.
    partitioner : callable ``(num_rows, num_shards) -> bounds``, optional
        Custom range cut (``num_shards + 1`` non-decreasing bounds).
    contrib_width : int, optional
        Width of the partial sums ``contribute`` sends for this table
        (default: ``width``).
    single_shard : bool
        Keep the whole table on one shard (for a ``pull`` that needs all of
        a round's keys together, or a tiny table read every round).
    storage : {"dense", "sparse"}
        How the shards store the rows.  ``"dense"``: one array, ``num_rows x
        width`` values whatever they hold.  ``"sparse"``: each row as its
        (column, value) pairs while few of its values are non-zero, dense
        above ``spark.pystrads.table.sparseRowMaxFill`` of its width, so a
        shard's memory follows the non-zeros (a table that starts empty:
        ``fill`` must be 0).  Reads, writes, ``pull``, checkpoints and the
        undo log work the same on both; ``shard_metrics`` gets a sparse
        table's rows as :class:`~pystrads.ps.table.RowEntries` (their
        non-zero entries) instead of a dense block.
    """

    name: str
    num_rows: int
    width: int = 1
    dtype: str = "float64"
    fill: float = 0
    initializer: Optional[Callable[[int, int], np.ndarray]] = None
    weights: Optional[np.ndarray] = None
    partitioner: Optional[Callable[[int, int], Sequence[int]]] = None
    contrib_width: Optional[int] = None
    single_shard: bool = False
    storage: str = "dense"

    def __post_init__(self):
        if self.storage not in ("dense", "sparse"):
            raise ValueError(f"table {self.name!r}: storage={self.storage!r}; use 'dense' or 'sparse'")
        if self.storage == "sparse" and self.fill != 0 and self.initializer is None:
            raise ValueError(f"table {self.name!r}: a sparse table starts empty; fill={self.fill!r} must be 0 "
                             "(or give an initializer)")


class Schedule:
    """The work of the rounds of one step.

    Use the constructors:

    * :meth:`per_worker` -- ``rounds[r][p]`` is worker p's work in round r;
    * :meth:`shared` -- ``rounds[r]`` is every worker's work in round r;
    * :meth:`data_parallel` -- ``n`` rounds with no work item (``None``).
    """

    PER_WORKER, SHARED, NONE = "per_worker", "shared", "none"

    def __init__(self, rounds: Sequence[Any], mode: str):
        if mode not in (self.PER_WORKER, self.SHARED, self.NONE):
            raise ScheduleError(f"unknown schedule mode {mode!r}")
        self.rounds = list(rounds)
        self.mode = mode

    @classmethod
    def per_worker(cls, rounds: Iterable[Sequence[Any]]) -> "Schedule":
        return cls(list(rounds), cls.PER_WORKER)

    @classmethod
    def shared(cls, rounds: Iterable[Any]) -> "Schedule":
        return cls(list(rounds), cls.SHARED)

    @classmethod
    def data_parallel(cls, num_rounds: int) -> "Schedule":
        return cls([None] * int(num_rounds), cls.NONE)

    def __len__(self) -> int:
        return len(self.rounds)

    def work(self, round_index: int, worker: int) -> Any:
        if self.mode == self.PER_WORKER:
            return self.rounds[round_index][worker]
        if self.mode == self.SHARED:
            return self.rounds[round_index]
        return None

    def validate(self, num_workers: int, max_rounds: int) -> None:
        if len(self.rounds) > max_rounds:
            raise ScheduleError(
                f"schedule has {len(self.rounds)} rounds, more than spark.pystrads.step.maxRounds="
                f"{max_rounds}; return fewer rounds per step (see ctx.rounds_hint)")
        if self.mode == self.PER_WORKER:
            for r, work in enumerate(self.rounds):
                if len(work) != num_workers:
                    raise ScheduleError(
                        f"round {r} of a per-worker schedule has {len(work)} work items for "
                        f"{num_workers} workers; give exactly one per worker")


def serial_schedule(program: "Program", schedule: Schedule) -> Schedule:
    """Serial mode: ``schedule`` (of one worker) with each round replaced by the program's
    :meth:`Program.serial_rounds` of its work."""
    if schedule.mode == Schedule.PER_WORKER:
        return Schedule.per_worker([[part] for items in schedule.rounds for item in items
                                    for part in program.serial_rounds(item)])
    if schedule.mode == Schedule.SHARED:
        return Schedule.shared([part for work in schedule.rounds for part in program.serial_rounds(work)])
    return schedule


class Program:
    """Base class of model-parallel programs; see the module docstring."""

    #: Rounds a worker may run ahead of the slowest one (0 = BSP; > 0 = SSP).
    staleness: int = 0

    #: Call :meth:`shard_metrics` on every shard after every this many rounds
    #: (counted over the fit; 0 = never; :meth:`shard_metrics_due` decides each round).
    shard_metrics_every: int = 0

    #: Attributes that neither identify the fit nor belong to its state (e.g. a wall-clock
    #: origin): left out of the checkpoint fingerprint and not restored on resume.  Every
    #: other attribute is both: it must depend only on the params and the data, and the
    #: driver-side hooks may keep state in it (saved with each checkpoint).
    checkpoint_ignore: Sequence[str] = ()

    def tables(self) -> Sequence[Table]:
        return []

    def load(self, ctx: "WorkerContext", records: Iterable[Any]) -> Any:
        raise NotImplementedError

    def data_summary(self, ctx: "WorkerContext", data: Any) -> Any:
        """On each worker, once its data is loaded: what :meth:`check_data` receives."""
        return None

    def check_data(self, summaries: List[Any]) -> None:
        """On the driver, before the init step: every worker's :meth:`data_summary`."""
        return None

    def init_state(self, ctx: "WorkerContext", data: Any) -> Any:
        return None

    def schedule(self, ctx: "ScheduleContext") -> Optional[Schedule]:
        raise NotImplementedError

    def push(self, ctx: "WorkerContext", data: Any, state: Any, work: Any) -> Any:
        raise NotImplementedError

    def pull(self, table: str, keys: np.ndarray, partials: np.ndarray, current: np.ndarray) -> np.ndarray:
        raise NotImplementedError(
            f"{type(self).__name__} contributes to table {table!r} but defines no pull()")

    def apply(self, ctx: "WorkerContext", data: Any, state: Any, work: Any) -> Any:
        return state

    def shard_metrics(self, table: str, rows: np.ndarray, row_start: int) -> Dict[str, float]:
        """On each shard, every ``shard_metrics_every`` rounds, once the round is
        committed and before any worker starts the next: numbers computed from
        the shard's rows ``row_start, ...`` of ``table`` (read only), summed over
        shards into that round's metrics (e.g. LDA's word log-likelihood).  A
        sparse table's rows come as :class:`RowEntries` (their non-zero entries)."""
        return {}

    def shard_metrics_due(self, round_index: int) -> bool:
        """Whether the shards compute :meth:`shard_metrics` once round ``round_index``
        (counted over the fit) is committed: every ``shard_metrics_every`` rounds by
        default; a program may add rounds (LDA: the fit's last iteration)."""
        every = int(self.shard_metrics_every or 0)
        return bool(every) and (round_index + 1) % every == 0

    def after_step(self, ctx: "ScheduleContext", metrics: "StepMetrics") -> None:
        return None

    def plans_ahead(self, ctx: "ScheduleContext") -> bool:
        """Whether the scheduler may plan the step after ``ctx.step`` while ``ctx.step`` runs
        (pipelined schedules, ``spark.pystrads.scheduler.planAhead``).  Asked once the step's
        schedule is made.  If so, ``schedule`` for step ``s + 1`` runs in a thread during step
        ``s``, before ``after_step`` of step ``s``: it sees the state ``after_step(s - 1)`` left,
        and tables that step ``s`` is writing (read none, or none the rounds write).  A program that allows it must keep what
        ``schedule`` hands to ``after_step`` per step (keyed by ``ctx.step``), and must
        tolerate a schedule one step stale: the default (no) suits programs whose schedule
        depends on the step just run (e.g. a schedule that applies a change ``after_step``
        made).  A planned schedule is dropped when ``after_step`` stops the fit or the step
        fails, so ``schedule`` may run twice for one step: it must depend only on the state."""
        return False

    def serial_rounds(self, work: Any) -> Sequence[Any]:
        """Serial mode (``spark.pystrads.debug.serial``): the rounds that run one round's ``work``
        one part after another on the one worker, each committed before the next starts.  The
        default runs it whole (one worker doing a round's work is serial for a rotation or a
        block of independent rows); a program whose round updates coordinates together splits
        it into one coordinate (or one group that must move together) per round."""
        return [work]

    # -- helpers used by the engine
    def has_apply(self) -> bool:
        return type(self).apply is not Program.apply

    def checks_data(self) -> bool:
        return type(self).check_data is not Program.check_data


_POOL: Optional["concurrent.futures.ThreadPoolExecutor"] = None
_POOL_LOCK = threading.Lock()


def _background_pool() -> "concurrent.futures.ThreadPoolExecutor":
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="pystrads-background")
    return _POOL


_COMPUTE: Optional["concurrent.futures.ThreadPoolExecutor"] = None


def _compute_pool(threads: int) -> "concurrent.futures.ThreadPoolExecutor":
    """The task's compute threads (:meth:`WorkerContext.parallel`), apart from the background
    pool so that a compute item never waits behind table I/O.  Each runs numba's parallel
    kernels on one thread: the items are the parallelism (numba's thread count is per thread,
    and a new thread would otherwise take every core)."""
    global _COMPUTE
    with _POOL_LOCK:
        if _COMPUTE is None or _COMPUTE._max_workers != threads:
            if _COMPUTE is not None:
                _COMPUTE.shutdown(wait=False)
            _COMPUTE = concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="pystrads-compute",
                                                             initializer=_one_numba_thread)
    return _COMPUTE


def _one_numba_thread() -> None:
    import numba

    numba.set_num_threads(1)


def split_ranges(sizes, parts: int) -> List[range]:
    """See :meth:`WorkerContext.split`."""
    if isinstance(sizes, (int, np.integer)):
        n, cum = int(sizes), None
    else:
        cum = np.asarray(sizes, dtype=np.int64)
        n = len(cum) - 1
    parts = max(1, min(int(parts), n)) if n > 0 else 1
    if cum is None or cum[-1] == cum[0]:
        cuts = [n * i // parts for i in range(parts + 1)]
    else:
        targets = cum[0] + (cum[-1] - cum[0]) * np.arange(1, parts) / parts
        right = np.searchsorted(cum, targets, side="left").clip(1, n)
        nearer = np.where(targets - cum[right - 1] < cum[right] - targets, right - 1, right)  # the closer cut
        cuts = [0, *np.maximum.accumulate(nearer).tolist(), n]
    return [range(lo, hi) for lo, hi in zip(cuts[:-1], cuts[1:]) if hi > lo]


@dataclasses.dataclass
class Contribution:
    """Partial sums a worker made for one table's ``pull`` in one round
    (:meth:`WorkerContext.contribute`): at ``keys``, an integer array or a ``range`` of rows;
    ``read_back``: the round's tick brings the pulled rows of ``keys`` back
    (:meth:`WorkerContext.pulled`); ``columns``: only those columns of them (None: all)."""

    table: str
    keys: Any
    partials: Any
    read_back: bool = False
    columns: Optional[Tuple[int, ...]] = None


class WorkerContext:
    """What a worker sees in ``load`` / ``init_state`` / ``push`` / ``apply``
    (``load`` sees no tables)."""

    def __init__(self, worker: int, num_workers: int, step: int, attempt: int,
                 handles: Dict[str, Any], round_offset: int, seed: int, threads: int = 1):
        self.worker = worker
        #: threads this worker computes with (``spark.pystrads.worker.threads``, by default
        #: ``spark.task.cpus``): :meth:`parallel` runs work items on that many threads
        self.threads = max(1, int(threads))
        self.num_workers = num_workers
        self.step = step
        self.attempt = attempt
        self.round_offset = round_offset
        self.local_round = 0
        #: rounds in the step being run (None outside a step: ``load``, ``init_state``)
        self.rounds_in_step: Optional[int] = None
        self.seed = seed
        self._handles = handles
        self._metrics: Dict[str, float] = {}
        self._pending: List[Any] = []
        #: the round's contributions wait here and travel with its clock tick, one request per shard
        self._outbox: List[Contribution] = []
        self._read_back: Dict[str, Any] = {}  # table -> keys asked with read_back=True this round
        self._read_columns: Dict[str, Optional[Tuple[int, ...]]] = {}  # table -> the columns read back (None: all)
        self._pulled: Dict[str, np.ndarray] = {}  # table -> those rows, once the round's tick returned
        self._applying = False  # apply runs: the round's pull is committed, contributions are refused
        self._riding: Any = None  # the step's small writes held for the round's tick (ps.client.RidingWrites)

    @property
    def round(self) -> int:
        """Global index of the current round (counted over the whole fit)."""
        return self.round_offset + self.local_round

    @property
    def last_round(self) -> bool:
        """Whether this is the step's last round: the driver reads the tables (``after_step``)
        and the state is snapshotted after it, so a worker that holds back writes between
        rounds must have sent them by then."""
        return self.rounds_in_step is not None and self.local_round == self.rounds_in_step - 1

    def table(self, name: str):
        """The :class:`~pystrads.ps.client.TableHandle` of table ``name``."""
        try:
            return self._handles[name]
        except KeyError:
            raise KeyError(f"no table {name!r}; the program declares {sorted(self._handles)}") from None

    def contribute(self, name: str, keys, partials, read_back: Any = False) -> None:
        """Partial sums for this round's ``pull`` of table ``name`` at ``keys``: an integer array
        (any order; repeated keys add up) or a ``range`` of rows (e.g. ``range(0, n)`` for a
        partial gradient over a whole table, sent without a key column).

        ``read_back=True``: ``apply`` of this round will read the rows of ``keys`` as the
        pull left them (:meth:`pulled`); the runtime then brings them back with the round's
        clock tick instead of a separate ``get``.  A sequence of column indexes instead of
        True brings back only those columns, in that order (fewer bytes when ``apply`` needs
        a few columns of wide rows).  At most one ``read_back`` contribution per table and
        round.

        Contributions are made in ``push`` (or ``init_state``): they travel with the round's clock
        tick, and the shard sums them once every worker's arrived.  In ``apply`` the round's
        ``pull`` has already run, so a contribution there is refused."""
        if self._applying:
            raise RuntimeError(
                f"contribute({name!r}, ...) in apply: round {self.local_round}'s pull has already run once every "
                "worker's contributions arrived, so there is no round left to add it to. Contribute in push "
                "(the contributions travel with the round's clock tick and apply reads the result with "
                "ctx.pulled), or write the table directly with ctx.table(name).add")
        columns = None
        if read_back is not False and read_back is not True and read_back is not None:
            width = self.table(name).layout.width
            columns = tuple(int(c) for c in read_back)
            if not columns or any(not 0 <= c < width for c in columns):
                raise ValueError(f"table {name!r}: read_back columns {list(read_back)} must be a non-empty "
                                 f"list of column indexes in [0, {width})")
        if read_back:
            if name in self._read_back:
                raise ValueError(f"table {name!r}: a second contribute(..., read_back=True) in round "
                                 f"{self.local_round}; one per table and round")
            self._read_back[name] = np.asarray(keys)
            self._read_columns[name] = columns
        self._outbox.append(Contribution(name, keys, partials, bool(read_back), columns))

    def pulled(self, name: str) -> np.ndarray:
        """In ``apply``: the rows of table ``name`` at the keys this round's
        ``contribute(name, keys, ..., read_back=True)`` named (in that order), as the round's
        ``pull`` left them -- the same rows a ``get(keys)`` would read then, without its
        request (only the columns ``read_back`` named, when it named some)."""
        if name not in self._read_back:
            raise KeyError(f"table {name!r}: no contribute(..., read_back=True) in round {self.local_round}")
        if name not in self._pulled:  # the runtime did not bring them with the tick
            rows = self.table(name).read(self._read_back[name])
            columns = self._read_columns.get(name)
            self._pulled[name] = rows if columns is None else np.ascontiguousarray(rows[:, list(columns)])
        return self._pulled[name]

    def _begin_round(self, local_round: int) -> None:
        self.local_round = local_round
        self._read_back.clear()
        self._read_columns.clear()
        self._pulled.clear()

    def _take_outbox(self) -> List["Contribution"]:
        out, self._outbox = self._outbox, []
        return out

    def report(self, **values: float) -> None:
        """Add numbers to this round's metrics (summed over workers)."""
        for key, value in values.items():
            self._metrics[key] = self._metrics.get(key, 0.0) + float(value)

    def background(self, fn: Callable[..., Any], *args: Any) -> "concurrent.futures.Future":
        """Run ``fn(*args)`` on a worker thread and return its future, so that table reads
        and writes (Flight calls, which release the GIL) overlap compute that releases it
        too (numba ``nogil`` kernels).  Every call's future is waited for before the
        ``push`` / ``apply`` / ``init_state`` that started it counts as done (its error, if
        any, is raised then): nothing outlives the round's clock tick."""
        future = _background_pool().submit(fn, *args)
        self._pending.append(future)
        return future

    def _settle(self, quiet: bool = False) -> None:
        """Wait for every :meth:`background` call; raise the first error (``quiet``: do not,
        the caller is failing already)."""
        pending, self._pending = self._pending, []
        error = None
        for future in pending:
            try:
                future.result()
            except BaseException as exc:  # noqa: BLE001 -- re-raised below, after all are done
                error = error or exc
        if error is not None and not quiet:
            raise error

    def parallel(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> List[Any]:
        """``[fn(item) for item in items]`` on the worker's :attr:`threads` threads, in item order;
        the first error is raised once every item has finished.  ``fn`` should spend its time in
        code that releases the GIL (numba ``nogil`` kernels) on disjoint parts of shared arrays
        (each item its own rows, its own output buffer): threads run truly in parallel only
        there.  With one thread (or one item) the items run on the calling thread."""
        items = list(items)
        if self.threads == 1 or len(items) < 2:
            return [fn(item) for item in items]
        futures = [_compute_pool(self.threads).submit(fn, item) for item in items]
        concurrent.futures.wait(futures)
        return [f.result() for f in futures]

    def split(self, sizes, parts: Optional[int] = None) -> List[range]:
        """Cut ``n`` consecutive items into ``parts`` (default :attr:`threads`) ranges for
        :meth:`parallel`: ``sizes`` is ``n`` (equal counts) or a CSR pointer array of ``n + 1``
        offsets (about equal mass ``ptr[hi] - ptr[lo]`` per range, e.g. ratings per user).  Empty
        ranges are dropped."""
        return split_ranges(sizes, self.threads if parts is None else parts)

    def rng(self, salt: int = 0) -> np.random.Generator:
        """A generator seeded by (fit seed, worker, round, salt): reproducible."""
        return np.random.default_rng([self.seed, self.worker, self.round, salt])

    def _take_metrics(self) -> Dict[str, float]:
        """The metrics of the call that just returned, once its :meth:`background` work is done."""
        self._settle()
        out, self._metrics = self._metrics, {}
        return out


class StepMetrics:
    """Per-round sums of the metrics workers reported in one step."""

    def __init__(self, rounds: List[Dict[str, float]]):
        self.rounds = rounds

    def total(self, key: str, default: float = 0.0) -> float:
        return float(sum(r.get(key, 0.0) for r in self.rounds)) if self.rounds else default

    def last(self, key: str, default: float = float("nan")) -> float:
        for r in reversed(self.rounds):
            if key in r:
                return float(r[key])
        return default

    def series(self, key: str) -> List[float]:
        return [float(r[key]) for r in self.rounds if key in r]


class ScheduleContext:
    """What the driver-side hooks (``schedule``, ``after_step``) see."""

    def __init__(self, engine: Any):
        self._engine = engine
        self.step = 0
        self.rounds_done = 0
        self.rounds_hint = 1
        self.num_workers = engine.num_workers
        self.seed = engine.seed
        self._stop_reason: Optional[str] = None
        self._records: Dict[str, Any] = {}
        self._progress: Optional[tuple] = None

    def rounds_this_step(self, total: int, per: int = 1) -> int:
        """How many rounds the next step of a program that runs ``total`` rounds in all, in whole
        groups of ``per`` (an iteration, a sweep), should run: whole groups as close to
        ``rounds_hint`` as they come, at least one group, never past ``total``; 0 when all ran."""
        left = int(total) - self.rounds_done
        if left <= 0:
            return 0
        return int(min(left, max(per, self.rounds_hint // per * per)))

    def table(self, name: str):
        """Handle of table ``name`` on the driver (dynamic schedules read it; ``schedule`` and
        ``after_step`` may write it: the writes belong to the step being run, committed or rolled
        back with it)."""
        loop_table = getattr(self._engine, "loop_table", None)
        return loop_table(name) if loop_table is not None else self._engine.table(name)

    def record(self, **values: Any) -> None:
        """Store values (objective, iteration, ...) in this step's summary row."""
        self._records.update(values)

    def record_row(self, **values: Any) -> None:
        """Append a row to the finer-grained history ``summary.iterations``
        (e.g. one per iteration when a step runs several)."""
        self._engine.summary.iterations.append(dict(values))

    def progress(self, done: float, total: Optional[float] = None, unit: str = "iterations", **shown: Any) -> None:
        """Report where the fit stands (e.g. iteration ``done`` of ``total``, plus values to
        show such as the objective); shown after the step in the log and the notebook bar,
        with the elapsed time and an ETA."""
        self._progress = (done, total, unit, shown)

    def stop(self, reason: str = "converged") -> None:
        """End the fit after this step."""
        self._stop_reason = reason

    @property
    def stopped(self) -> Optional[str]:
        return self._stop_reason

    @property
    def history(self):
        """The summary rows of the steps so far (list of dicts)."""
        return self._engine.summary.rows
