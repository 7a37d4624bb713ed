"""Row structures of the linear programs (:mod:`pystrads.programs.lasso`, :mod:`pystrads.programs.logistic`).

* :class:`RowBlock` -- a block of rows in CSR form, as the estimators' Arrow
  scan hands them to the engine;
* :func:`rows_to_arrays` -- records (rows or blocks) to CSR arrays, labels and
  weights;
* :func:`canonical_permutation` / :func:`canonical_order` -- the rows in an order fixed
  by their content, so a recomputed partition resumes onto the same per-row state;
* :class:`ColumnSample` -- unit-norm columns of a row sample, for the
  schedule's correlation check.
"""

from __future__ import annotations

from typing import Any, Iterable, NamedTuple, Optional

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
    validation: Optional[np.ndarray] = None  # bool (n,): held out for validation (None: no row is)


def rows_to_arrays(records: Iterable[Any], num_features: int, held_out: bool = False):
    """Records -> CSR arrays plus labels and weights (rows of weight 0 dropped: they do
    not enter the objective).  A record is a ``(label, weight, indices, values[,
    validation])`` row or a :class:`RowBlock`; ``held_out`` picks the validation rows
    instead of the training rows."""
    labels, weights, lengths, idx_parts, val_parts = [], [], [], [], []
    for rec in records:
        if isinstance(rec, RowBlock):
            held = np.zeros(len(rec.label), bool) if rec.validation is None else np.asarray(rec.validation, bool)
            keep = (rec.weight != 0) & (held == held_out)
            if keep.all():  # every row (no copies of the block's non-zeros beyond the concatenation)
                labels.append(np.asarray(rec.label, dtype=np.float64))
                weights.append(np.asarray(rec.weight, dtype=np.float64))
                lengths.append(np.diff(np.asarray(rec.row_ptr, dtype=np.int64)))
                idx_parts.append(np.asarray(rec.col_idx, dtype=np.int64))
                val_parts.append(np.asarray(rec.vals, dtype=np.float64))
                continue
            labels.append(np.asarray(rec.label, dtype=np.float64)[keep])
            weights.append(np.asarray(rec.weight, dtype=np.float64)[keep])
            ptr = np.asarray(rec.row_ptr, dtype=np.int64)
            lens = np.diff(ptr)
            lengths.append(lens[keep])
            elem = np.repeat(keep, lens)
            idx_parts.append(np.asarray(rec.col_idx, dtype=np.int64)[elem])
            val_parts.append(np.asarray(rec.vals, dtype=np.float64)[elem])
            continue
        label, weight, indices, values = rec[:4]
        if weight == 0 or (len(rec) > 4 and bool(rec[4])) != held_out:
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
    col_idx = _joined(idx_parts, np.int64)
    vals = _joined(val_parts, np.float64)
    if len(col_idx) and (col_idx.min() < 0 or col_idx.max() >= num_features):
        raise ValueError(f"feature index {int(col_idx.max())} outside [0, {num_features})")
    y = np.concatenate(labels).astype(np.float64) if labels else np.zeros(0)
    w = np.concatenate(weights).astype(np.float64) if weights else np.zeros(0)
    return row_ptr, col_idx, vals, y, w


def _joined(parts, dtype) -> np.ndarray:
    """``parts`` concatenated (the one part itself when there is one: no copy)."""
    if not parts:
        return np.zeros(0, dtype=dtype)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def canonical_permutation(row_ptr, col_idx, vals, y, w) -> np.ndarray:
    """The rows' order that depends only on their content (rows carry no id): a partition
    recomputed after an executor loss may deliver them in another order, and a checkpoint's
    per-row state only resumes onto the same.  The order is by a 128-bit hash of each row
    (label, weight, indices, values: numba, one pass; a blake2b digest per row in Python cost
    ~12 us a row, 0.12 s per 10 000 rows); equal hashes mean equal rows (up to 2^-128): any
    order among them will do.  Row ``i`` of the canonical order is row ``order[i]``."""
    from ..kernels.rows import row_hashes

    as_bits = lambda a, dtype: np.ascontiguousarray(a, dtype=dtype).view(np.uint64)  # noqa: E731
    h1, h2 = row_hashes(np.ascontiguousarray(row_ptr, dtype=np.int64), as_bits(col_idx, np.int64),
                        as_bits(vals, np.float64), as_bits(y, np.float64), as_bits(w, np.float64))
    return np.lexsort((h2, h1))


def canonical_order(row_ptr, col_idx, vals, y, w):
    """The CSR arrays with their rows in the order of :func:`canonical_permutation`."""
    order = canonical_permutation(row_ptr, col_idx, vals, y, w)
    lens = np.diff(row_ptr)[order]
    new_ptr = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(lens, out=new_ptr[1:])
    gather = np.repeat(row_ptr[:-1][order] - new_ptr[:-1], lens) + np.arange(new_ptr[-1], dtype=np.int64)
    return new_ptr, col_idx[gather], vals[gather], y[order], w[order]


class ColumnSample:
    """Columns of a row sample, scaled to unit norm, for the correlation check."""

    def __init__(self, records: Iterable[Any], num_features: int):
        """``records``: sampled rows as ``(indices, values)`` pairs or :class:`RowBlock` s."""
        row_ptr, col_idx, vals, _, _ = rows_to_arrays(
            (r if isinstance(r, RowBlock) else (0.0, 1.0, r[0], r[1]) for r in records), num_features)
        self._set(len(row_ptr) - 1, *K.rows_to_csc(row_ptr, col_idx, vals, num_features))

    @classmethod
    def from_columns(cls, parts) -> "ColumnSample":
        """The sample made of several workers' samples, each ``(num_rows, col_ptr, rows, vals)``
        (CSC over the same columns, rows numbered within the part): the parts' rows stacked
        in order."""
        parts = list(parts)
        counts = [np.diff(p[1]) for p in parts]
        total = np.sum(counts, axis=0)
        ptr = np.zeros(len(total) + 1, dtype=np.int64)
        np.cumsum(total, out=ptr[1:])
        rows, vals = np.empty(ptr[-1], dtype=np.int64), np.empty(ptr[-1])
        before = ptr[:-1].copy()  # where the next part's entries of each column go
        row_offset = 0
        for (n, p_ptr, p_rows, p_vals), c in zip(parts, counts):
            dest = np.repeat(before - p_ptr[:-1], c) + np.arange(p_ptr[-1], dtype=np.int64)
            rows[dest] = np.asarray(p_rows, dtype=np.int64) + row_offset
            vals[dest] = p_vals
            before += c
            row_offset += int(n)
        sample = cls.__new__(cls)
        sample._set(row_offset, ptr, rows, vals)
        return sample

    def _set(self, num_rows, ptr, rows, vals) -> None:
        self.num_rows = int(num_rows)
        num_features = len(ptr) - 1
        # per column (bincount: reduceat fails on trailing empty columns and misreads empty ones)
        col_of = np.repeat(np.arange(num_features, dtype=np.int64), np.diff(ptr))
        norms = np.sqrt(np.bincount(col_of, weights=vals * vals, minlength=num_features))
        norms[np.diff(ptr) == 0] = 1.0
        self.ptr, self.rows = ptr, rows
        self.vals = vals / np.repeat(np.where(norms > 0, norms, 1.0), np.diff(ptr))

    @classmethod
    def empty(cls, num_features: int) -> "ColumnSample":
        return cls([], num_features)
