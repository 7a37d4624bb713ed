"""A shard's slice of one table: :class:`ShardTable`, its rows as a numpy array with an undo log.

The rows ``[row_start, row_stop)`` of a model table; global keys map to local
rows (:meth:`ShardTable.local`), and during a step the first write to a row
saves its old value (:meth:`ShardTable.remember`) so that a failed step rolls
back exactly (:meth:`ShardTable.rollback`) and a committed one forgets
(:meth:`ShardTable.forget`).
"""

from __future__ import annotations

import threading
from typing import Any, List, Tuple

import numpy as np
import pyarrow.flight as flight

from ..kernels.sets import unique


class ShardTable:
    """The rows ``[row_start, row_stop)`` of one table, with an undo log."""

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
        self._undo: List[Tuple[Any, np.ndarray]] = []

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

    def remember(self, index: Any) -> None:
        """Save the pre-step value of rows about to change (first touch only)."""
        if isinstance(index, slice):
            index = np.arange(index.start, index.stop)
        fresh = index[~self._saved[index]]
        if fresh.size:
            fresh = unique(fresh)
            self._undo.append((fresh, self.values[fresh].copy()))
            self._saved[fresh] = True

    def add(self, index: Any, rows: np.ndarray) -> None:
        """``values[index] += rows``, a key given more than once adding each time: a slice or
        a strictly increasing index (what a client sends: its keys sorted, each once) takes
        numpy's fancy ``+=``; only other indexes pay ``np.add.at`` (5-7x slower for row blocks,
        LDA's whole-block writes spent most of a shard's time there)."""
        if isinstance(index, slice) or len(index) < 2 or bool(np.all(index[1:] > index[:-1])):
            self.values[index] += rows
        else:
            np.add.at(self.values, index, rows)

    def add_entries(self, index: Any, offsets: np.ndarray, cols: np.ndarray, vals: np.ndarray,
                    replace: bool = False) -> None:
        """A sparse write (CSR entries of the rows at ``index``): ``values[index[r], cols[k]] +=
        vals[k]`` (``replace``: the rows become the entries, a put); repeated rows add up."""
        from ..kernels.rows import csr_add

        rows = np.arange(index.start, index.stop) if isinstance(index, slice) else index
        csr_add(self.values, rows, offsets, cols, vals, replace)

    def rollback(self) -> int:
        restored = 0
        for index, rows in reversed(self._undo):
            self.values[index] = rows
            restored += len(index)
        self.forget()
        return restored

    def forget(self) -> None:
        for index, _ in self._undo:
            self._saved[index] = False
        self._undo = []
