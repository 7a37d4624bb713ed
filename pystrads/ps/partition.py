"""Range partitioning of model tables over shards.

A table's rows are cut into contiguous ranges, one per shard by default
(ps-lite / glint style).  :func:`range_bounds` cuts by *cost*: given a weight
per row (e.g. the token mass of each word for LDA), the ranges hold about
equal total weight, so shards balance.  A program may pass its own
partitioner -- any callable ``(num_rows, num_shards) -> bounds``.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence, Tuple

import numpy as np

Partitioner = Callable[[int, int], Sequence[int]]


def range_bounds(num_rows: int, num_parts: int, weights: Optional[np.ndarray] = None) -> np.ndarray:
    """Cut ``[0, num_rows)`` into ``num_parts`` contiguous ranges.

    Parameters
    ----------
    num_rows : int
        Number of rows.
    num_parts : int
        Number of ranges (at least 1).
    weights : array of shape (num_rows,), optional
        Non-negative cost of each row; ranges get about equal total cost.
        Without weights the ranges have about equal row counts.

    Returns
    -------
    bounds : int64 array of shape (num_parts + 1,)
        ``bounds[0] = 0``, ``bounds[-1] = num_rows``, non-decreasing.
    """
    if num_parts < 1:
        raise ValueError(f"num_parts must be >= 1, got {num_parts}")
    if weights is None:
        return np.linspace(0, num_rows, num_parts + 1).round().astype(np.int64)
    weights = np.asarray(weights, dtype=np.float64)
    if weights.shape != (num_rows,):
        raise ValueError(f"weights must have shape ({num_rows},), got {weights.shape}")
    if np.any(weights < 0) or not np.all(np.isfinite(weights)):
        raise ValueError("weights must be finite and non-negative")
    cum = np.cumsum(weights)
    total = cum[-1] if num_rows else 0.0
    if total <= 0:
        return range_bounds(num_rows, num_parts)
    targets = total * np.arange(1, num_parts) / num_parts
    inner = np.searchsorted(cum, targets, side="left") + 1
    bounds = np.concatenate([[0], np.clip(inner, 0, num_rows), [num_rows]]).astype(np.int64)
    return np.maximum.accumulate(bounds)


@dataclasses.dataclass(frozen=True)
class TableLayout:
    """Where each row range of a table lives.

    Rows ``[bounds[i], bounds[i+1])`` are on shard ``shards[i]``.
    """

    name: str  # namespaced: "<fit id>/<table>"
    num_rows: int
    width: int
    dtype: str
    bounds: Tuple[int, ...]
    shards: Tuple[int, ...]
    contrib_width: int

    @property
    def short_name(self) -> str:
        return self.name.partition("/")[2] or self.name

    def ranges(self):
        """(shard index, row_start, row_stop) of every range, empty ones included."""
        for i, shard in enumerate(self.shards):
            yield shard, self.bounds[i], self.bounds[i + 1]
