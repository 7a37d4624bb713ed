"""A shard's slice of one table, with an undo log: :class:`ShardTable` (dense rows, one numpy
array) and :class:`SparseShardTable` (each row as (column, value) pairs or dense, by how full it
is: memory follows the non-zeros).

The rows ``[row_start, row_stop)`` of a model table; global keys map to local
rows (:meth:`ShardTable.local`), and during a step the first write to a row
saves its old value (:meth:`ShardTable.remember`) so that a failed step rolls
back exactly (:meth:`ShardTable.rollback`) and a committed one forgets
(:meth:`ShardTable.forget`).  The server reads and writes both kinds through the
same methods (:meth:`~ShardTable.read`, :meth:`~ShardTable.read_entries`,
:meth:`~ShardTable.write`, :meth:`~ShardTable.add`, :meth:`~ShardTable.add_entries`, ...),
and checkpoints them through :meth:`~ShardTable.save` / :meth:`~ShardTable.restore_part`.
"""

from __future__ import annotations

import threading
from typing import Any, List, NamedTuple, Optional, Tuple

import numpy as np
import pyarrow.flight as flight

from ..kernels.sets import unique

#: table kinds a Program may declare (``Table(storage=...)``)
KINDS = ("dense", "sparse")
#: a sparse table's row is dense once more than this fraction of its width is non-zero
#: (``spark.pystrads.table.sparseRowMaxFill``; LightLDA's K / 4)
SPARSE_ROW_MAX_FILL = 0.25


class RowEntries(NamedTuple):
    """Rows as their non-zero entries (CSR): row ``r`` holds ``cols[offsets[r]:offsets[r + 1]]``
    (ascending) with ``vals`` of the same range; ``keys``: the rows' keys where they came from or
    go to a table (:meth:`TableHandle.read_entries <pystrads.ps.client.TableHandle.read_entries>`).
    What a sparse table hands a program's ``shard_metrics`` instead of a dense block: sums over
    entries equal sums over the rows whenever zeros add nothing."""

    offsets: np.ndarray
    cols: np.ndarray
    vals: np.ndarray
    width: int
    keys: Optional[np.ndarray] = None

    @classmethod
    def from_rows(cls, rows: np.ndarray, keys: Optional[np.ndarray] = None) -> "RowEntries":
        """The non-zero entries of a dense ``(n, width)`` block."""
        from ..kernels.rows import to_csr

        rows = np.ascontiguousarray(rows)
        return cls(*to_csr(rows), rows.shape[1], None if keys is None else np.asarray(keys, dtype=np.int64))

    @property
    def shape(self) -> Tuple[int, int]:
        return len(self.offsets) - 1, self.width

    @property
    def csr(self) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(offsets, cols, vals)``: what the CSR kernels take."""
        return self.offsets, self.cols, self.vals

    def toarray(self) -> np.ndarray:
        from ..kernels.rows import csr_into

        out = np.empty(self.shape, dtype=self.vals.dtype)
        csr_into(self.offsets, self.cols, self.vals, out, 0)
        return out


def take_rows(values: np.ndarray, index: Any) -> np.ndarray:
    """``values[index]`` for a row index: a slice's view, else a gather by ``np.take`` (for row
    blocks ~4x faster than fancy indexing, which copies element by element)."""
    return values[index] if isinstance(index, slice) else np.take(values, index, axis=0)


def put_rows(values: np.ndarray, index: Any, rows: Any) -> None:
    """``values[index] = rows`` for a row index (a key given twice: its last row), whole rows
    at a time: the C-contiguous block's rows viewed as single opaque items (~3x faster than
    fancy assignment for row blocks)."""
    if isinstance(index, slice) or values.ndim != 2 or not values.flags.c_contiguous or values.shape[1] == 0:
        values[index] = rows
        return
    rows = np.ascontiguousarray(np.broadcast_to(rows, (len(index), values.shape[1])), dtype=values.dtype)
    item = np.dtype((np.void, values.shape[1] * values.itemsize))
    np.put(values.view(item).reshape(-1), index, rows.view(item).reshape(-1))


def _as_rows(index: Any) -> np.ndarray:
    return np.arange(index.start, index.stop, dtype=np.int64) if isinstance(index, slice) \
        else np.asarray(index, dtype=np.int64)


class ShardTable:
    """The rows ``[row_start, row_stop)`` of one table as one dense array, with an undo log."""

    kind = "dense"

    def __init__(self, name: str, row_start: int, row_stop: int, width: int, dtype: str,
                 values: np.ndarray, contrib_width: int):
        self.name = name
        self.row_start = row_start
        self.row_stop = row_stop
        self.width = width
        self.dtype = dtype
        self.values = values
        self.contrib_width = contrib_width
        self.lock = threading.Lock()
        self._saved = np.zeros(row_stop - row_start, dtype=bool)
        self._undo: List[Tuple[Any, Any]] = []

    def local(self, keys: Any) -> Any:
        """Global keys (or a slice of them) -> local row index (a slice when they are
        one contiguous run)."""
        if isinstance(keys, slice):
            if not self.row_start <= keys.start <= keys.stop <= self.row_stop:
                raise flight.FlightServerError(
                    f"table {self.name!r}: rows [{keys.start}, {keys.stop}) are outside this shard's rows "
                    f"[{self.row_start}, {self.row_stop}); the client's table layout is stale")
            return slice(keys.start - self.row_start, keys.stop - self.row_start)
        n = len(keys)
        if n == 0:
            return slice(0, 0)
        lo, hi = int(keys[0]), int(keys[-1])
        if lo < self.row_start or hi >= self.row_stop or (n > 1 and (keys.min() < self.row_start
                                                                    or keys.max() >= self.row_stop)):
            bad = keys[(keys < self.row_start) | (keys >= self.row_stop)][:5]
            raise flight.FlightServerError(
                f"table {self.name!r}: keys {bad.tolist()} are outside this shard's rows "
                f"[{self.row_start}, {self.row_stop}); the client's table layout is stale")
        if hi - lo + 1 == n and (n == 1 or bool(np.all(np.diff(keys) == 1))):
            return slice(lo - self.row_start, hi - self.row_start + 1)
        return keys - self.row_start

    # ------------------------------------------------------------------ reads
    def read(self, index: Any) -> np.ndarray:
        """The rows at a local index as a dense block (a view for a slice of a dense table:
        copy it before the lock is released if it must not change)."""
        return take_rows(self.values, index)

    def read_entries(self, index: Any) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(offsets, cols, vals)``: the non-zero entries of the rows at a local index."""
        from ..kernels.rows import to_csr

        return to_csr(np.ascontiguousarray(self.values[index]))

    def nonzero_rows(self, lo: int, hi: int) -> np.ndarray:
        """Local indexes of the rows of ``[lo, hi)`` (local) holding a non-zero value."""
        return lo + np.flatnonzero(np.any(self.values[lo:hi] != 0, axis=1))

    def metrics_view(self) -> Any:
        """What the program's ``shard_metrics`` gets: the rows as a dense block."""
        return self.values

    @property
    def nbytes(self) -> int:
        return int(self.values.nbytes)

    def nonzeros(self) -> int:
        return int(np.count_nonzero(self.values))

    # ------------------------------------------------------------------ writes
    def remember(self, index: Any) -> None:
        """Save the pre-step value of rows about to change (first touch only)."""
        if isinstance(index, slice):
            index = np.arange(index.start, index.stop)
        fresh = index[~self._saved[index]]
        if fresh.size:
            if fresh.size > 1 and not bool(np.all(fresh[1:] > fresh[:-1])):  # a pull's keys come sorted, once each
                fresh = unique(fresh)
            self._undo.append((fresh, self._copy_rows(fresh)))
            self._saved[fresh] = True

    def _copy_rows(self, rows: np.ndarray) -> Any:
        return take_rows(self.values, rows).copy() if isinstance(rows, slice) else take_rows(self.values, rows)

    def _restore_rows(self, rows: np.ndarray, saved: Any) -> None:
        put_rows(self.values, rows, saved)

    def write(self, index: Any, rows: np.ndarray) -> None:
        """``values[index] = rows`` (a put)."""
        put_rows(self.values, index, rows)

    def add(self, index: Any, rows: np.ndarray) -> None:
        """``values[index] += rows``, a key given more than once adding each time: a slice or
        a strictly increasing index (what a client sends: its keys sorted, each once) takes
        numpy's fancy ``+=``; only other indexes pay ``np.add.at`` (5-7x slower for row blocks,
        LDA's whole-block writes spent most of a shard's time there)."""
        if isinstance(index, slice):
            self.values[index] += rows
        elif len(index) < 2 or bool(np.all(index[1:] > index[:-1])):
            put_rows(self.values, index, take_rows(self.values, index) + rows)
        else:
            np.add.at(self.values, index, rows)

    def add_entries(self, index: Any, offsets: np.ndarray, cols: np.ndarray, vals: np.ndarray,
                    replace: bool = False) -> None:
        """A sparse write (CSR entries of the rows at ``index``): ``values[index[r], cols[k]] +=
        vals[k]`` (``replace``: the rows become the entries, a put); repeated rows add up."""
        from ..kernels.rows import csr_add

        csr_add(self.values, _as_rows(index), offsets, cols, vals, replace)

    def rollback(self) -> int:
        restored = 0
        for index, saved in reversed(self._undo):
            self._restore_rows(index, saved)
            restored += len(index)
        self.forget()
        return restored

    def forget(self) -> None:
        for index, _ in self._undo:
            self._saved[index] = False
        self._undo = []

    def settle(self) -> None:
        """Between steps: give back memory the rows no longer need (nothing, for dense rows)."""


class SparseShardTable(ShardTable):
    """The rows ``[row_start, row_stop)`` of one table, each kept as its (column, value) pairs
    while at most ``max_fill`` of its width is non-zero and dense above
    (:mod:`pystrads.kernels.sparse_rows`): memory follows the non-zeros.  Reads and writes as
    :class:`ShardTable`'s; its undo log keeps the touched rows' entries."""

    kind = "sparse"

    def __init__(self, name: str, row_start: int, row_stop: int, width: int, dtype: str,
                 contrib_width: int, max_fill: float = SPARSE_ROW_MAX_FILL):
        from . import protocol

        n = row_stop - row_start
        super().__init__(name, row_start, row_stop, width, dtype, None, contrib_width)
        self.np_dtype = np.dtype(protocol.DTYPES[dtype][0])
        self.max_pairs = int(max(0, min(width, int(width * max_fill))))
        # a dense row goes back to pairs (at a compaction) only well under the threshold
        self.min_pairs = self.max_pairs // 2
        self.slot = np.full(n, -1, dtype=np.int32)
        self.pos = np.zeros(n, dtype=np.int64)
        self.cap = np.zeros(n, dtype=np.int32)
        self.nnz = np.zeros(n, dtype=np.int32)
        self.pcols = np.empty(0, dtype=np.int32)
        self.pvals = np.empty(0, dtype=self.np_dtype)
        self.dense = np.empty((0, width), dtype=self.np_dtype)
        self.meta = np.zeros(3, dtype=np.int64)  # pool used, pool garbage, dense rows used
        self.compactions = 0

    # ------------------------------------------------------------------ reads
    def read(self, index: Any) -> np.ndarray:
        from ..kernels.sparse_rows import read_dense

        rows = _as_rows(index)
        out = np.empty((len(rows), self.width), dtype=self.np_dtype)
        read_dense(self.slot, self.pos, self.nnz, self.pcols, self.pvals, self.dense, rows, out)
        return out

    def read_entries(self, index: Any) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        from ..kernels.sparse_rows import read_csr

        return read_csr(self.slot, self.pos, self.nnz, self.pcols, self.pvals, self.dense, _as_rows(index))

    def nonzero_rows(self, lo: int, hi: int) -> np.ndarray:
        from ..kernels.sparse_rows import rows_with_entries

        return rows_with_entries(self.nnz, lo, hi)

    def metrics_view(self) -> RowEntries:
        """The rows as :class:`RowEntries` (their non-zero entries), not a dense block."""
        offsets, cols, vals = self.read_entries(slice(0, self.row_stop - self.row_start))
        return RowEntries(offsets, cols, vals, self.width)

    @property
    def nbytes(self) -> int:
        """Bytes held: the per-row index, the pair pool and the dense rows (all allocated)."""
        return int(self.slot.nbytes + self.pos.nbytes + self.cap.nbytes + self.nnz.nbytes
                   + self.pcols.nbytes + self.pvals.nbytes + self.dense.nbytes)

    def nonzeros(self) -> int:
        return int(self.nnz.sum(dtype=np.int64))

    def storage(self) -> dict:
        """How the rows are stored (for the shard's stats)."""
        used, garbage, dense_used = (int(x) for x in self.meta)
        return {"pair_entries": used - garbage, "pool_entries": int(len(self.pcols)),
                "dense_rows": dense_used, "dense_capacity": int(len(self.dense)),
                "nonzeros": self.nonzeros(), "compactions": self.compactions}

    # ------------------------------------------------------------------ writes
    def _copy_rows(self, rows: np.ndarray) -> Any:
        return self.read_entries(rows)

    def _restore_rows(self, rows: np.ndarray, saved: Any) -> None:
        self.add_entries(rows, *saved, replace=True)

    def write(self, index: Any, rows: np.ndarray) -> None:
        from ..kernels.rows import to_csr

        self.add_entries(index, *to_csr(np.ascontiguousarray(rows, dtype=self.np_dtype)), replace=True)

    def add(self, index: Any, rows: np.ndarray) -> None:
        from ..kernels.rows import to_csr

        self.add_entries(index, *to_csr(np.ascontiguousarray(rows, dtype=self.np_dtype)))

    def add_entries(self, index: Any, offsets: np.ndarray, cols: np.ndarray, vals: np.ndarray,
                    replace: bool = False) -> None:
        from ..kernels.sparse_rows import csr_is_canonical, merge_rows, room_needed

        rows = _as_rows(index)
        offsets = np.asarray(offsets, dtype=np.int64)
        cols = np.asarray(cols, dtype=np.int32)
        vals = np.asarray(vals, dtype=self.np_dtype)
        if (len(rows) > 1 and not bool(np.all(rows[1:] > rows[:-1]))) or not csr_is_canonical(offsets, cols):
            rows, offsets, cols, vals = _canonical(rows, offsets, cols, vals)
        if not len(rows):
            return
        pool, dense = room_needed(self.slot, self.nnz, self.cap, rows, offsets, replace, self.max_pairs)
        self._make_room(int(pool), int(dense))
        merge_rows(self.slot, self.pos, self.cap, self.nnz, self.pcols, self.pvals, self.dense, self.meta,
                   rows, offsets, cols, vals, replace, self.max_pairs)

    def _make_room(self, pool: int, dense: int) -> None:
        """Free room for ``pool`` more pair entries and ``dense`` more dense rows: compact when
        garbage is at least half the pool, else grow by half (amortised O(1) per entry)."""
        used, garbage, dense_used = (int(x) for x in self.meta)
        pool_ok = used + pool <= len(self.pcols)
        dense_ok = dense_used + dense <= len(self.dense)
        if pool_ok and dense_ok:
            return
        if not pool_ok and garbage * 2 >= used:  # rebuild: drops the garbage and rows dense no longer
            self.compact(pool, dense)
            return
        if not pool_ok:
            size = used + pool + (used + pool) // 2 + 64
            self.pcols = _grown_copy(self.pcols, size, used)
            self.pvals = _grown_copy(self.pvals, size, used)
        if not dense_ok:
            self.dense = _grown_copy(self.dense, dense_used + dense + (dense_used + dense) // 2 + 1, dense_used)

    def compact(self, pool: int = 0, dense: int = 0) -> None:
        """Rebuild the pool and the dense rows with only the live entries (a dense row with at
        most half the pairs' limit becomes pairs again), with room for ``pool`` more entries and
        ``dense`` more dense rows plus half again."""
        from ..kernels.sparse_rows import compact, live_room

        live_pool, live_dense = (int(x) for x in live_room(self.slot, self.nnz, self.min_pairs))
        self.pcols, self.pvals, self.dense, used, dense_used = compact(
            self.slot, self.pos, self.cap, self.nnz, self.pcols, self.pvals, self.dense,
            live_pool + pool + (live_pool + pool) // 2 + 64, live_dense + dense + (live_dense + dense) // 2 + 1,
            self.min_pairs)
        self.meta[:] = (used, 0, dense_used)
        self.compactions += 1

    def settle(self) -> None:
        """Between steps: compact when the live rows would need at most half the bytes held
        (garbage, or dense rows that emptied as the model converged)."""
        from ..kernels.sparse_rows import live_room

        live_pool, live_dense = (int(x) for x in live_room(self.slot, self.nnz, self.min_pairs))
        entry = 4 + self.np_dtype.itemsize
        held = len(self.pcols) * entry + self.dense.nbytes
        live = live_pool * entry + live_dense * self.width * self.np_dtype.itemsize
        if held > 2 * live + (1 << 20):
            self.compact()


def _grown_copy(array: np.ndarray, size: int, used: int) -> np.ndarray:
    out = np.empty((size,) + array.shape[1:], dtype=array.dtype)
    out[:used] = array[:used]
    return out


def _canonical(rows, offsets, cols, vals):
    """A write's entries with each row once (ascending) and each row's columns ascending and
    distinct, repeated ones summed (a put whose row comes twice: the rows add up, as for a
    dense table)."""
    counts = np.diff(offsets)
    entry_row = np.repeat(rows, counts)
    order = np.lexsort((cols, entry_row))
    entry_row, cols, vals = entry_row[order], cols[order], vals[order]
    if len(entry_row):
        first = np.r_[True, (entry_row[1:] != entry_row[:-1]) | (cols[1:] != cols[:-1])]
        starts = np.flatnonzero(first)
        vals = np.add.reduceat(vals, starts)
        entry_row, cols = entry_row[starts], cols[starts]
    # every row of the write stays (a put of an empty row still clears it)
    uniq = unique(rows)
    offsets = np.searchsorted(entry_row, uniq, side="left")
    offsets = np.r_[offsets, len(entry_row)].astype(np.int64)
    return uniq, offsets, cols, vals
