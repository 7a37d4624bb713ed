"""Reading the linear estimators' input: one pass over the data that refuses bad rows before any
training (naming the column, the value and the row), counts rows, non-zeros and labels, draws the
row sample for the correlation check, and builds the workers' row blocks -- from Arrow batches
(``mapInArrow``), or row by row where Arrow cannot carry the vectors.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any, Dict, List, Optional

import numpy as np
from pyspark.ml.linalg import SparseVector
from pyspark.sql import functions as F

from ..errors import InputError
from ..engine.spark import handle_of
from ..programs.lasso import RowBlock

log = logging.getLogger("pystrads.ml._linear")


def _vector_parts(v):
    if isinstance(v, SparseVector):
        return v.size, np.asarray(v.indices, dtype=np.int64), np.asarray(v.values, dtype=np.float64)
    arr = np.asarray(v.toArray(), dtype=np.float64)
    nz = np.flatnonzero(arr)
    return len(arr), nz.astype(np.int64), arr[nz]


def _scan_rows(dataset, fcol: str, lcol: str, wcol: Optional[str], sample_rows: int, binary_labels: bool):
    """The row-by-row scan (Python ``Row`` objects): the fallback when Spark cannot hand
    the vector column to Python as Arrow."""
    weight = F.col(wcol).cast("double") if wcol else F.lit(1.0)
    rows = dataset.select(F.col(lcol).cast("double").alias("y"), weight.alias("w"), F.col(fcol).alias("x")).rdd
    parts = max(1, rows.getNumPartitions())
    per_part = max(1, int(math.ceil(sample_rows / parts)))

    def to_record(row):
        size, idx, val = _vector_parts(row.x) if row.x is not None else (-1, None, None)
        return (row.y, row.w, idx, val, size)

    records = rows.map(to_record)

    def check(index, it):
        rng = np.random.default_rng(index)
        n = nnz = 0
        wsum = 0.0
        sizes = set()
        error = None
        reservoir: List[Any] = []
        for y, w, idx, val, size in it:
            n += 1
            if error is None:
                error = _row_error(y, w, val, size, fcol, lcol, wcol, binary_labels)
            sizes.add(size)
            if w is not None and math.isfinite(w):
                wsum += w
            nnz += len(idx) if idx is not None else 0
            if idx is not None:
                if len(reservoir) < per_part:
                    reservoir.append((idx, val))
                else:
                    k = int(rng.integers(0, n))
                    if k < per_part:
                        reservoir[k] = (idx, val)
        yield {"rows": n, "nnz": nnz, "wsum": wsum, "sizes": sizes, "error": error, "sample": reservoir}

    return records.map(lambda r: r[:4]), _merge_stats(records.mapPartitionsWithIndex(check).collect())


def _row_error(y, w, val, size, fcol, lcol, wcol, binary_labels):
    """``(what, fix)`` for the first problem of one row, or None (checks in a fixed order)."""
    if size < 0:
        return (f"featuresCol {fcol!r} is null in a row", "drop or fill the rows with null features")
    if y is None or not math.isfinite(y):
        return (f"labelCol {lcol!r} has value {y!r}", "drop the rows or fill the missing labels")
    if binary_labels and y not in (0.0, 1.0):
        return (f"labelCol {lcol!r} has value {y!r}; binary logistic regression needs labels 0 and 1",
                "recode the labels (e.g. with StringIndexer) to 0.0 / 1.0")
    if w is None or not math.isfinite(w) or w < 0:
        return (f"weightCol {wcol!r} has value {w!r}", "weights must be finite and >= 0")
    if len(val) and not np.all(np.isfinite(val)):
        bad = val[~np.isfinite(val)][0]
        return (f"featuresCol {fcol!r} has a value {float(bad)!r}",
                "drop the rows or impute the values (e.g. pyspark.ml.feature.Imputer)")
    return None


def _merge_stats(parts) -> Dict[str, Any]:
    stats: Dict[str, Any] = {"rows": 0, "nnz": 0, "wsum": 0.0, "sizes": set(), "error": None, "sample": []}
    for part in parts:
        stats["rows"] += part["rows"]
        stats["nnz"] += part["nnz"]
        stats["wsum"] += part["wsum"]
        stats["sizes"] |= part["sizes"]
        stats["error"] = stats["error"] or part["error"]
        stats["sample"].extend(part["sample"])
    return stats


def _arrow_block(batch) -> Dict[str, np.ndarray]:
    """One Arrow batch of ``(y double, w double, x vector)`` -> numpy CSR arrays.

    The vector column arrives as VectorUDT's SQL struct ``(type, size, indices,
    values)``: type 0 sparse, 1 dense (dense rows keep their non-zeros).  Nulls:
    ``y_null``/``w_null`` masks, ``size`` -1 for a null vector."""
    n = batch.num_rows
    y_col, w_col, x = batch.column(0), batch.column(1), batch.column(2)
    y = np.asarray(y_col.to_numpy(zero_copy_only=False), dtype=np.float64)
    w = np.asarray(w_col.to_numpy(zero_copy_only=False), dtype=np.float64)
    y_null = np.asarray(y_col.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    w_null = np.asarray(w_col.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    x_null = np.asarray(x.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    fields = dict(zip([f.name for f in x.type], x.flatten()))  # children with the struct's nulls merged
    kind = np.asarray(fields["type"].fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
    dense = (kind == 1) & ~x_null
    values = fields["values"]
    lens = np.asarray(values.value_lengths().fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
    flat_v = np.asarray(values.flatten().to_numpy(zero_copy_only=False), dtype=np.float64)
    flat_i = np.asarray(fields["indices"].flatten().to_numpy(zero_copy_only=False), dtype=np.int64)
    size = np.asarray(fields["size"].fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)
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
    return {"y": y, "w": w, "y_null": y_null, "w_null": w_null, "size": size, "row_ptr": row_ptr,
            "col_idx": cols, "vals": flat_v}


BLOCK_NONZEROS = 1 << 17  # per block (~1.5 MB): one binary value each, which the JVM copies a few times


def _split_block(b: Dict[str, np.ndarray], max_nnz: int):
    """Cut a block into blocks of at most ``max_nnz`` non-zeros (at least one row each)."""
    ptr = b["row_ptr"]
    n = len(b["y"])
    if ptr[-1] <= max_nnz:
        yield b
        return
    start = 0
    while start < n:
        stop = int(np.searchsorted(ptr, ptr[start] + max_nnz, side="right")) - 1
        stop = min(max(stop, start + 1), n)
        lo, hi = ptr[start], ptr[stop]
        part = {key: b[key][start:stop] for key in ("y", "w", "y_null", "w_null", "size")}
        part.update(row_ptr=ptr[start:stop + 1] - lo, col_idx=b["col_idx"][lo:hi], vals=b["vals"][lo:hi])
        yield part
        start = stop


def _arrow_blocks(sel):
    """DataFrame of pickled :func:`_arrow_block` dicts (column ``block``), one or more per Arrow
    batch (``mapInArrow``), and the function that unpickles a row of it."""
    import pickle

    def blocks(batches):
        import pyarrow as pa

        schema = pa.schema([("block", pa.binary())])
        for batch in batches:
            if batch.num_rows:
                for part in _split_block(_arrow_block(batch), BLOCK_NONZEROS):
                    payload = pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL)
                    yield pa.RecordBatch.from_arrays([pa.array([payload], type=pa.binary())], schema=schema)

    return sel.mapInArrow(blocks, "block binary")


def _block_of(row):
    """A worker's record from a row of :func:`_arrow_blocks`."""
    import pickle

    b = pickle.loads(row[0])
    return RowBlock(b["y"], b["w"], b["row_ptr"], b["col_idx"], b["vals"])


def _block_error(b, fcol, lcol, wcol, binary_labels):
    """The first bad row of a block, as :func:`_row_error` words it (None if all good)."""
    y, w, size = b["y"], b["w"], b["size"]
    bad_y = b["y_null"] | ~np.isfinite(y)
    if binary_labels:
        bad_y |= ~np.isin(y, (0.0, 1.0))
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
                      b["vals"][lo:hi], int(size[i]), fcol, lcol, wcol, binary_labels)


def _scan_arrow(dataset, fcol: str, lcol: str, wcol: Optional[str], sample_rows: int, binary_labels: bool,
                num_workers: int):
    weight = F.col(wcol).cast("double") if wcol else F.lit(1.0)
    sel = dataset.select(F.col(lcol).cast("double").alias("y"), weight.alias("w"), F.col(fcol).alias("x"))
    # row-wise, in the JVM (blocks would balance badly); under Spark Connect the partitions are
    # unknown without a job, so always
    if handle_of(dataset).connect or sel.rdd.getNumPartitions() != num_workers:
        sel = sel.repartition(num_workers)
    blocks = _arrow_blocks(sel)
    per_part = max(1, int(math.ceil(sample_rows / max(1, num_workers))))

    def check(batches):
        import pickle

        from ._arrow import partition_id

        rng = np.random.default_rng(partition_id())
        it = (pickle.loads(b) for batch in batches for b in batch.column(0).to_pylist())
        n = nnz = 0
        wsum = 0.0
        sizes: set = set()
        error = None
        pool_keys = np.zeros(0)
        pool: List[Any] = []
        for b in it:
            m = len(b["y"])
            n += m
            if error is None:
                error = _block_error(b, fcol, lcol, wcol, binary_labels)
            sizes.update(np.unique(b["size"]).tolist())
            ok_w = ~b["w_null"] & np.isfinite(b["w"])
            wsum += float(b["w"][ok_w].sum())
            nnz += int(b["row_ptr"][-1])
            # bottom-k of random keys: a uniform row sample without replacement
            keys = rng.random(m)
            keys[b["size"] < 0] = np.inf
            cand = np.concatenate([pool_keys, keys])
            take = np.argsort(cand, kind="stable")[:per_part]
            take = take[np.isfinite(cand[take])]
            ptr = b["row_ptr"]
            pool = [pool[t] if t < len(pool_keys) else
                    (b["col_idx"][ptr[t - len(pool_keys)]:ptr[t - len(pool_keys) + 1]].copy(),
                     b["vals"][ptr[t - len(pool_keys)]:ptr[t - len(pool_keys) + 1]].copy()) for t in take]
            pool_keys = cand[take]
        return {"rows": n, "nnz": nnz, "wsum": wsum, "sizes": sizes, "error": error, "sample": pool}

    from ._arrow import collect_per_partition

    stats = _merge_stats(collect_per_partition(blocks, check))
    return blocks, stats


def scan_input(dataset, fcol: str, lcol: str, wcol: Optional[str], sample_rows: int, binary_labels: bool,
               num_workers: int = 0):
    """One pass over the input: records for the engine, counts, the first bad row, a row sample.

    Returns ``(records, stats)``; ``stats`` has ``rows``, ``nnz``, ``sizes``
    (distinct vector sizes), ``error`` (first problem found, or None) and
    ``sample`` (list of ``(indices, values)``).  The records are a DataFrame
    of pickled row blocks, one partition per worker (read through Arrow with
    ``mapInArrow``: vectors arrive as numpy arrays, ~4x faster than Python
    ``Row`` objects; the workers turn each into a :class:`RowBlock` with
    :func:`_block_of`); where Spark cannot give the vector column to Arrow
    (classic sessions only), an RDD of ``(label, weight, indices, values)``
    tuples, one per row.
    """
    if num_workers > 0 and _arrow_scan_ok:
        try:
            return _scan_arrow(dataset, fcol, lcol, wcol, sample_rows, binary_labels, num_workers)
        except Exception as exc:  # noqa: BLE001 - e.g. a Spark without Arrow support for UDT columns
            if isinstance(exc, (KeyboardInterrupt, InputError)):
                raise
            text = str(exc)
            log.warning("reading %r through Arrow failed (%s); reading rows instead", fcol,
                        text.splitlines()[0][:300] if text else type(exc).__name__)
            if "UserDefinedType" in text or "nsupported" in text:  # this Spark cannot: do not try again
                _disable_arrow_scan()
    return _scan_rows(dataset, fcol, lcol, wcol, sample_rows, binary_labels)


_arrow_scan_ok = os.environ.get("PYSTRADS_ARROW_INPUT", "1") != "0"


def _disable_arrow_scan() -> None:
    global _arrow_scan_ok
    _arrow_scan_ok = False
