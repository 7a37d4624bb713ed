"""Row structures of the linear programs (:mod:`pystrads.programs.lasso`, :mod:`pystrads.programs.logistic`).

* :class:`RowBlock` -- a block of rows in CSR form, as the estimators' Arrow
  scan hands them to the engine;
* :func:`rows_to_arrays` -- records (rows or blocks) to CSR arrays, labels and
  weights;
* :func:`canonical_order` -- the rows in an order fixed by their content, so a
  recomputed partition resumes onto the same per-row state;
* :class:`ColumnSample` -- unit-norm columns of a row sample, for the
  schedule's correlation check.
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterable, NamedTuple, Tuple

import numpy as np

from ..kernels import cd as K

class RowBlock(NamedTuple):
    """A block of rows in CSR form (what the estimators' Arrow scan hands the engine:
    one record per Arrow batch instead of one Python object per row)."""

    label: np.ndarray  # float64 (n,)
    weight: np.ndarray  # float64 (n,)
    row_ptr: np.ndarray  # int64 (n + 1,)
    col_idx: np.ndarray  # int64 (nnz,)
    vals: np.ndarray  # float64 (nnz,)


def rows_to_arrays(records: Iterable[Any], num_features: int):
    """Records -> CSR arrays plus labels and weights (rows of weight 0 dropped: they do
    not enter the objective).  A record is a ``(label, weight, indices, values)`` row
    or a :class:`RowBlock`."""
    labels, weights, lengths, idx_parts, val_parts = [], [], [], [], []
    for rec in records:
        if isinstance(rec, RowBlock):
            keep = rec.weight != 0
            labels.append(np.asarray(rec.label, dtype=np.float64)[keep])
            weights.append(np.asarray(rec.weight, dtype=np.float64)[keep])
            ptr = np.asarray(rec.row_ptr, dtype=np.int64)
            lens = np.diff(ptr)
            lengths.append(lens[keep])
            elem = np.repeat(keep, lens)
            idx_parts.append(np.asarray(rec.col_idx, dtype=np.int64)[elem])
            val_parts.append(np.asarray(rec.vals, dtype=np.float64)[elem])
            continue
        label, weight, indices, values = rec
        if weight == 0:
            continue
        labels.append([label])
        weights.append([weight])
        idx = np.asarray(indices, dtype=np.int64)
        lengths.append([len(idx)])
        idx_parts.append(idx)
        val_parts.append(np.asarray(values, dtype=np.float64))
    lens = np.concatenate(lengths).astype(np.int64) if lengths else np.zeros(0, dtype=np.int64)
    row_ptr = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=row_ptr[1:])
    col_idx = np.concatenate(idx_parts) if idx_parts else np.zeros(0, dtype=np.int64)
    vals = np.concatenate(val_parts) if val_parts else np.zeros(0, dtype=np.float64)
    if len(col_idx) and (col_idx.min() < 0 or col_idx.max() >= num_features):
        raise ValueError(f"feature index {int(col_idx.max())} outside [0, {num_features})")
    y = np.concatenate(labels).astype(np.float64) if labels else np.zeros(0)
    w = np.concatenate(weights).astype(np.float64) if weights else np.zeros(0)
    return row_ptr, col_idx, vals, y, w


def _row_digest(label, weight, indices, values) -> bytes:
    return hashlib.blake2b(np.float64(label).tobytes() + np.float64(weight).tobytes()
                           + np.asarray(indices, dtype=np.int64).tobytes()
                           + np.asarray(values, dtype=np.float64).tobytes(), digest_size=12).digest()


def canonical_order(row_ptr, col_idx, vals, y, w):
    """The CSR arrays with their rows in an order that depends only on their content
    (rows carry no id): a partition recomputed after an executor loss may deliver them
    in another order, and a checkpoint's per-row state only resumes onto the same.
    Equal digests mean equal rows (up to 2^-96): any order among them will do."""
    digests = [_row_digest(y[i], w[i], col_idx[row_ptr[i]:row_ptr[i + 1]], vals[row_ptr[i]:row_ptr[i + 1]])
               for i in range(len(y))]
    order = np.array(sorted(range(len(y)), key=digests.__getitem__), dtype=np.int64)
    lens = np.diff(row_ptr)[order]
    new_ptr = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(lens, out=new_ptr[1:])
    gather = np.repeat(row_ptr[:-1][order] - new_ptr[:-1], lens) + np.arange(new_ptr[-1], dtype=np.int64)
    return new_ptr, col_idx[gather], vals[gather], y[order], w[order]


class ColumnSample:
    """Columns of a row sample, scaled to unit norm, for the correlation check."""

    def __init__(self, records: Iterable[Tuple[Any, Any]], num_features: int):
        row_ptr, col_idx, vals, _, _ = rows_to_arrays(((0.0, 1.0, i, v) for i, v in records), num_features)
        self.num_rows = len(row_ptr) - 1
        ptr, rows, vals = K.rows_to_csc(row_ptr, col_idx, vals, num_features)
        norms = np.sqrt(np.add.reduceat(vals * vals, ptr[:-1]) if len(vals) else np.zeros(num_features))
        norms[np.diff(ptr) == 0] = 1.0
        self.ptr, self.rows = ptr, rows
        self.vals = vals / np.repeat(np.where(norms > 0, norms, 1.0), np.diff(ptr))

    @classmethod
    def empty(cls, num_features: int) -> "ColumnSample":
        return cls([], num_features)
