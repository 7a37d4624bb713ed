"""Reading the linear estimators' input: one pass over the data that refuses bad rows before any
training (naming the column, the value and the row) and counts rows, non-zeros and labels -- from
Arrow batches (``mapInArrow``), or row by row where Arrow cannot carry the vectors -- and turns each
Arrow batch into a worker's row block at the load.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Dict, Optional

import numpy as np
from pyspark.sql import functions as F

from ..errors import InputError
from ..spark import handle_of
from ..programs._rows import RowBlock
from ..ps.protocol import numpy_filled, numpy_of

log = logging.getLogger("pystrads.ml._linear")


def _vector_parts(v):
    from pyspark.ml.linalg import SparseVector  # here: workers import this module, not pyspark.ml

    if isinstance(v, SparseVector):
        return v.size, np.asarray(v.indices, dtype=np.int64), np.asarray(v.values, dtype=np.float64)
    arr = np.asarray(v.toArray(), dtype=np.float64)
    nz = np.flatnonzero(arr)
    return len(arr), nz.astype(np.int64), arr[nz]


def _selected(dataset, fcol: str, lcol: str, wcol: Optional[str], vcol: Optional[str]):
    """The input as columns ``y``, ``w``, ``x`` (and ``v``: the validation flag, null counting as
    training, when ``vcol`` names the validation indicator)."""
    weight = F.col(wcol).cast("double") if wcol else F.lit(1.0)
    columns = [F.col(lcol).cast("double").alias("y"), weight.alias("w"), F.col(fcol).alias("x")]
    if vcol:
        columns.append(F.coalesce(F.col(vcol), F.lit(False)).alias("v"))
    return dataset.select(*columns)


def _scan_rows(dataset, fcol: str, lcol: str, wcol: Optional[str], class_labels: bool, vcol: Optional[str] = None):
    """The row-by-row scan (Python ``Row`` objects): the fallback when Spark cannot hand
    the vector column to Python as Arrow."""
    rows = _selected(dataset, fcol, lcol, wcol, vcol).rdd
    held_out = bool(vcol)

    def to_record(row):
        size, idx, val = _vector_parts(row.x) if row.x is not None else (-1, None, None)
        return (row.y, row.w, idx, val, bool(row.v) if held_out else False, size)

    records = rows.map(to_record)

    def check(it):
        stats = _empty_stats()
        for y, w, idx, val, held, size in it:
            if stats["error"] is None:
                stats["error"] = _row_error(y, w, val, size, fcol, lcol, wcol, class_labels)
            stats["sizes"].add(size)
            if y is not None and math.isfinite(y):
                stats["max_label"] = max(stats["max_label"], y)
            if held:
                stats["validation_rows"] += 1
                continue
            stats["rows"] += 1
            if w is not None and math.isfinite(w):
                stats["wsum"] += w
            stats["nnz"] += len(idx) if idx is not None else 0
        yield stats

    return records.map(lambda r: r[:5] if held_out else r[:4]), _merge_stats(records.mapPartitions(check).collect())


def _row_error(y, w, val, size, fcol, lcol, wcol, class_labels):
    """``(what, fix)`` for the first problem of one row, or None (checks in a fixed order)."""
    if size < 0:
        return (f"featuresCol {fcol!r} is null in a row", "drop or fill the rows with null features")
    if y is None or not math.isfinite(y):
        return (f"labelCol {lcol!r} has value {y!r}", "drop the rows or fill the missing labels")
    if class_labels and not (y >= 0 and y == int(y)):
        return (f"labelCol {lcol!r} has value {y!r}; logistic regression needs class indices 0, 1, 2, ... "
                "(0 and 1 for two classes)", "recode the labels (e.g. with StringIndexer)")
    if w is None or not math.isfinite(w) or w < 0:
        return (f"weightCol {wcol!r} has value {w!r}", "weights must be finite and >= 0")
    if len(val) and not np.all(np.isfinite(val)):
        bad = val[~np.isfinite(val)][0]
        return (f"featuresCol {fcol!r} has a value {float(bad)!r}",
                "drop the rows or impute the values (e.g. pyspark.ml.feature.Imputer)")
    return None


def _empty_stats() -> Dict[str, Any]:
    """A scan's figures: training ``rows``, their ``nnz`` and weight sum ``wsum``; ``validation_rows``;
    the vector ``sizes`` and the first ``error`` of any row."""
    return {"rows": 0, "nnz": 0, "wsum": 0.0, "validation_rows": 0, "sizes": set(), "error": None,
            "max_label": -1.0}


def _merge_stats(parts) -> Dict[str, Any]:
    stats = _empty_stats()
    for part in parts:
        for key in ("rows", "nnz", "wsum", "validation_rows"):
            stats[key] += part[key]
        stats["sizes"] |= part["sizes"]
        stats["max_label"] = max(stats["max_label"], part["max_label"])
        stats["error"] = stats["error"] or part["error"]
    return stats


def _arrow_block(batch) -> Dict[str, np.ndarray]:
    """One Arrow batch of ``(y double, w double, x vector)`` -> numpy CSR arrays.

    The vector column arrives as VectorUDT's SQL struct ``(type, size, indices,
    values)``: type 0 sparse, 1 dense (dense rows keep their non-zeros).  Nulls:
    ``y_null``/``w_null`` masks, ``size`` -1 for a null vector."""
    n = batch.num_rows
    y_col, w_col, x = batch.column(0), batch.column(1), batch.column(2)
    y = np.asarray(numpy_of(y_col), dtype=np.float64)
    w = np.asarray(numpy_of(w_col), dtype=np.float64)
    y_null = numpy_of(y_col.is_null())
    w_null = numpy_of(w_col.is_null())
    x_null = numpy_of(x.is_null())
    fields = dict(zip([f.name for f in x.type], x.flatten()))  # children with the struct's nulls merged
    kind = numpy_filled(fields["type"], 0).astype(np.int64)
    dense = (kind == 1) & ~x_null
    values = fields["values"]
    lens = numpy_filled(values.value_lengths(), 0).astype(np.int64)
    flat_v = np.asarray(numpy_of(values.flatten()), dtype=np.float64)
    flat_i = np.asarray(numpy_of(fields["indices"].flatten()), dtype=np.int64)
    size = numpy_filled(fields["size"], -1).astype(np.int64)
    size = np.where(dense, lens, np.where(x_null, -1, size))
    row_of = np.repeat(np.arange(n, dtype=np.int64), lens)
    dense_elem = dense[row_of]
    cols = np.empty(len(flat_v), dtype=np.int64)
    cols[~dense_elem] = flat_i
    if dense_elem.any():
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
        pos = np.arange(len(flat_v), dtype=np.int64) - starts[row_of]
        cols[dense_elem] = pos[dense_elem]
        keep = ~dense_elem | (flat_v != 0)
        cols, flat_v, row_of = cols[keep], flat_v[keep], row_of[keep]
    row_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(row_of, minlength=n), out=row_ptr[1:])
    held = numpy_of(batch.column(3)).astype(bool) if batch.num_columns > 3 \
        else np.zeros(n, dtype=bool)
    return {"y": y, "w": w, "y_null": y_null, "w_null": w_null, "size": size, "row_ptr": row_ptr,
            "col_idx": cols, "vals": flat_v, "held": held}


def batch_blocks(batch):
    """A worker's records from one Arrow batch of the input (``Engine(decode_batch=...)``):
    one :class:`RowBlock`, built from the batch's buffers (no Python object per row).  The
    scan has refused null vectors and bad values before the load runs."""
    b = _arrow_block(batch)
    held = b["held"] if batch.num_columns > 3 else None
    return [RowBlock(b["y"], b["w"], b["row_ptr"], b["col_idx"], b["vals"], held)] if len(b["y"]) else []


def _block_error(b, fcol, lcol, wcol, class_labels):
    """The first bad row of a block, as :func:`_row_error` words it (None if all good)."""
    y, w, size = b["y"], b["w"], b["size"]
    bad_y = b["y_null"] | ~np.isfinite(y)
    if class_labels:
        bad_y |= ~((y >= 0) & (y == np.floor(y)))
    bad_w = b["w_null"] | ~np.isfinite(w) | (w < 0)
    bad_elem = ~np.isfinite(b["vals"])
    bad_x = np.zeros(len(y), dtype=bool)
    if bad_elem.any():
        bad_x = np.add.reduceat(bad_elem.astype(np.int64), b["row_ptr"][:-1]) > 0 if len(bad_elem) else bad_x
        bad_x &= np.diff(b["row_ptr"]) > 0
    bad = (size < 0) | bad_y | bad_w | bad_x
    if not bad.any():
        return None
    i = int(np.argmax(bad))
    lo, hi = b["row_ptr"][i], b["row_ptr"][i + 1]
    return _row_error(None if b["y_null"][i] else float(y[i]), None if b["w_null"][i] else float(w[i]),
                      b["vals"][lo:hi], int(size[i]), fcol, lcol, wcol, class_labels)


def _scan_arrow(dataset, fcol: str, lcol: str, wcol: Optional[str], class_labels: bool, num_workers: int,
                vcol: Optional[str], connect: bool):
    from ..engine.driver.preflight import frame_to_workers  # the driver's side (this module is the workers' too)

    sel = _selected(dataset, fcol, lcol, wcol, vcol)

    def check(batches):
        stats = _empty_stats()
        for b in (_arrow_block(batch) for batch in batches if batch.num_rows):
            train = ~b["held"]
            stats["rows"] += int(train.sum())
            stats["validation_rows"] += int(b["held"].sum())
            if stats["error"] is None:
                stats["error"] = _block_error(b, fcol, lcol, wcol, class_labels)
            stats["sizes"].update(np.unique(b["size"]).tolist())
            labels = b["y"][~b["y_null"] & np.isfinite(b["y"])]
            if len(labels):
                stats["max_label"] = max(stats["max_label"], float(labels.max()))
            ok_w = ~b["w_null"] & np.isfinite(b["w"]) & train
            stats["wsum"] += float(b["w"][ok_w].sum())
            stats["nnz"] += int(np.diff(b["row_ptr"])[train].sum())
        return stats

    from ._arrow import collect_per_partition

    # the check reads the input as it is (one job, no shuffle, the refusal before any other); the
    # workers' records are shuffled row-wise in the JVM (blocks would balance badly) as the fit's
    # barrier job reads them, unless that job can run over the input as it is
    stats = _merge_stats(collect_per_partition(sel, check))
    return frame_to_workers(sel, num_workers, classic=not connect), stats


def scan_input(dataset, fcol: str, lcol: str, wcol: Optional[str], class_labels: bool, num_workers: int = 0,
               vcol: Optional[str] = None, connect: Optional[bool] = None):
    """One pass over the input: records for the engine, counts, the first bad row.

    Returns ``(records, stats)``; ``stats`` has ``rows``, ``nnz`` and ``wsum`` of the training
    rows, ``validation_rows`` (the rows ``vcol`` marks true), ``sizes`` (distinct vector sizes)
    ``error`` (first problem found in any row, or None) and ``max_label`` (the largest label of
    any row, -1 without one: the class count of a classifier).
    (The correlation check's row sample is drawn by the workers as they load:
    ``LassoProgram.data_summary``.)  The records are the input's
    ``(y, w, x)`` columns as a DataFrame, one partition per worker, read
    through Arrow (``mapInArrow``: vectors arrive as numpy arrays, ~4x faster
    than Python ``Row`` objects; the workers turn each Arrow batch into a
    :class:`RowBlock` with :func:`batch_blocks`, without pickling the
    blocks between two jobs); where Spark cannot give the vector column to
    Arrow (classic sessions only), an RDD of ``(label, weight, indices,
    values[, validation])`` tuples, one per row.
    """
    if num_workers > 0 and _arrow_scan_ok:
        try:
            return _scan_arrow(dataset, fcol, lcol, wcol, class_labels, num_workers, vcol,
                               handle_of(dataset).connect if connect is None else connect)
        except Exception as exc:  # noqa: BLE001 - e.g. a Spark without Arrow support for UDT columns
            if isinstance(exc, (KeyboardInterrupt, InputError)):
                raise
            text = str(exc)
            log.warning("reading %r through Arrow failed (%s); reading rows instead", fcol,
                        text.splitlines()[0][:300] if text else type(exc).__name__)
            if "UserDefinedType" in text or "nsupported" in text:  # this Spark cannot: do not try again
                _disable_arrow_scan()
    return _scan_rows(dataset, fcol, lcol, wcol, class_labels, vcol)


_arrow_scan_ok = True  # False once this Spark has shown it cannot give a vector column to Arrow


def _disable_arrow_scan() -> None:
    global _arrow_scan_ok
    _arrow_scan_ok = False
