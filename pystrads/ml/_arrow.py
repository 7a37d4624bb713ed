"""DataFrame plumbing the estimators share, through ``mapInArrow`` only, so that the same code
runs on a classic session and on Spark Connect (which has no RDDs, broadcasts or SparkContext).

ML vectors cross Arrow as their SQL struct ``{type, size, indices, values}`` (type 0 sparse,
1 dense); :func:`vectors` reads them, :func:`dense_vectors` writes dense ones.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable, Iterator, List, Optional, Tuple

import numpy as np

from ..ps.protocol import binary_array, numbers, numpy_filled, numpy_of, offsets_of


def vectors(column) -> Iterator[Optional[Tuple[int, np.ndarray, np.ndarray]]]:
    """Per row of an Arrow vector column: ``(size, indices int64, values float64)`` (a dense
    vector's non-zeros), or None for a null.  Read from the column's buffers (no Python
    objects per value); the arrays of a sparse row are views into the batch."""
    if hasattr(column, "chunks"):  # a ChunkedArray
        for chunk in column.chunks:
            yield from vectors(chunk)
        return
    fields = dict(zip((f.name for f in column.type), column.flatten()))  # flatten: slices applied
    valid = numpy_of(column.is_valid())
    kind = numpy_filled(fields["type"], 1)
    size = numpy_filled(fields["size"], -1)
    ind, val = fields["indices"], fields["values"]
    ind_off, val_off = offsets_of(ind), offsets_of(val)
    ind_all = numpy_of(ind.values).astype(np.int64)
    val_all = numpy_of(val.values).astype(np.float64, copy=False)
    for r in range(len(column)):
        if not valid[r]:
            yield None
        elif kind[r] == 0:
            yield int(size[r]), ind_all[ind_off[r]:ind_off[r + 1]], val_all[val_off[r]:val_off[r + 1]]
        else:
            arr = val_all[val_off[r]:val_off[r + 1]]
            idx = np.flatnonzero(arr)
            yield len(arr), idx.astype(np.int64), arr[idx]


def dense_vectors(rows, arrow_type, valid: Optional[np.ndarray] = None):
    """An Arrow vector column (of ``arrow_type``, the VectorUDT struct) of dense vectors: the rows
    of ``rows`` (a 2-D array, or a list of equal-length 1-D arrays), null where ``valid`` is
    False.  Built from buffers (no Python object per value)."""
    import pyarrow as pa

    values = np.asarray(rows, dtype=np.float64)
    n = len(values)
    values = values.reshape(n, -1)
    width = values.shape[1]
    mask = None if valid is None else numbers(~np.asarray(valid, dtype=bool))
    fields = {f.name: f for f in arrow_type}
    children = {
        "type": numbers(np.ones(n, dtype=np.int8), fields["type"].type),
        "size": pa.nulls(n, type=fields["size"].type),
        "indices": pa.nulls(n, type=fields["indices"].type),
        "values": pa.ListArray.from_arrays(numbers(np.arange(n + 1, dtype=np.int32) * width),
                                           numbers(values.ravel()), type=fields["values"].type),
    }
    return pa.StructArray.from_arrays([children[f.name] for f in arrow_type], fields=list(arrow_type), mask=mask)


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The concatenation of ``arange(s, s + l)`` for every (s, l), without a Python loop."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    before = np.cumsum(lengths) - lengths
    return np.arange(total, dtype=np.int64) + np.repeat(starts - before, lengths)


def row_entries(column, num_features: int, name: str = "features"):
    """The non-zero entries of an Arrow vector column (one chunk): ``(valid, of_row, cols,
    values)`` -- whether each row is not null, and each entry's row, column and value -- in a
    few numpy calls, sparse and dense rows alike.  A vector whose size is not ``num_features``
    raises ValueError naming the column ``name``."""
    fields = dict(zip((f.name for f in column.type), column.flatten()))
    valid = numpy_of(column.is_valid())
    kind = numpy_filled(fields["type"], 1)
    size = numpy_filled(fields["size"], -1).astype(np.int64)
    ind, val = fields["indices"], fields["values"]
    ind_off, val_off = offsets_of(ind).astype(np.int64), offsets_of(val).astype(np.int64)
    ind_all = numpy_of(ind.values)
    val_all = numpy_of(val.values).astype(np.float64, copy=False)
    rows = np.flatnonzero(valid)
    lengths = val_off[rows + 1] - val_off[rows]
    sparse = kind[rows] == 0
    dims = np.where(sparse, size[rows], lengths)
    bad = np.flatnonzero(dims != num_features)
    if len(bad):
        raise ValueError(f"column {name!r} has a vector of size {int(dims[bad[0]])} where the model has "
                         f"{num_features} features: score vectors of the size the model was fitted on")
    cols = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    # (a dense row's element: its position in the row)
    srows = rows[sparse]
    cols[np.repeat(sparse, lengths)] = ind_all[_ranges(ind_off[srows], ind_off[srows + 1] - ind_off[srows])]
    return valid, np.repeat(rows, lengths), cols, val_all[_ranges(val_off[rows], lengths)]


def row_dots(column, coef: np.ndarray, name: str = "features") -> Tuple[np.ndarray, np.ndarray]:
    """Per row of an Arrow vector column, ``x . coef`` and whether the row is not null: the whole
    batch in a few numpy calls (sparse and dense rows alike).  ``coef`` of shape ``(features, K)``
    gives ``(rows, K)`` dots.  A vector whose size is not ``len(coef)`` raises ValueError naming
    the column ``name``."""
    if hasattr(column, "chunks"):  # a ChunkedArray
        parts = [row_dots(chunk, coef, name) for chunk in column.chunks]
        if not parts:
            return np.zeros((0,) + coef.shape[1:]), np.zeros(0, dtype=bool)
        return np.concatenate([d for d, _ in parts]), np.concatenate([v for _, v in parts])
    n = len(column)
    valid, of_row, cols, values = row_entries(column, len(coef), name)
    if coef.ndim == 1:
        return np.bincount(of_row, weights=values * coef[cols], minlength=n)[:n], valid
    out = np.empty((n, coef.shape[1]))
    for k in range(coef.shape[1]):
        out[:, k] = np.bincount(of_row, weights=values * coef[cols, k], minlength=n)[:n]
    return out, valid


def partition_id() -> int:
    from pyspark import TaskContext

    return TaskContext.get().partitionId()


def collect_per_partition(frame, fn: Callable[[Iterator[Any]], Any]) -> List[Any]:
    """``fn(batches)`` once per partition of ``frame`` (one Spark job); its results, pickled
    through a binary column, in partition order."""
    import pyarrow as pa

    def run(batches):
        out = pickle.dumps((partition_id(), fn(batches)), protocol=pickle.HIGHEST_PROTOCOL)
        yield pa.RecordBatch.from_arrays([binary_array([out])], ["result"])

    results = collect_binary(frame.mapInArrow(run, "result binary"), "result")
    parts = sorted((pickle.loads(b) for b in results), key=lambda pr: pr[0])
    ids = [pid for pid, _ in parts]
    if ids != list(range(len(ids))):
        raise RuntimeError(f"a per-partition job returned results for partitions {ids[:10]}... instead of one per "
                           "partition; a task's result was lost (see the Spark driver's log)")
    return [r for _, r in parts]


def collect_arrow(frame):
    """A DataFrame's rows as one ``pyarrow.Table``, through Arrow where the session offers it
    (``toArrow``: pyspark >= 4, classic and Connect; ``_collect_as_arrow``: classic 3.5)."""
    import pyarrow as pa

    if hasattr(frame, "toArrow"):
        return frame.toArrow()
    if hasattr(frame, "_collect_as_arrow"):
        batches = frame._collect_as_arrow()
        if batches:
            return pa.Table.from_batches(batches)
    rows = frame.collect()
    return pa.table({name: [row[name] for row in rows] for name in frame.columns})


def collect_binary(frame, column: str) -> List[bytes]:
    """A binary column's values, through Arrow: ``toArrow`` (pyspark >= 4, classic and Connect)
    or ``_collect_as_arrow`` (classic 3.5) streams each partition's batches to Python as they
    come, where ``collect()`` first gathers every row as a JVM object in the driver's heap (a
    1 GiB driver failed so on 2 M users' ids)."""
    if hasattr(frame, "toArrow"):
        return frame.toArrow().column(column).to_pylist()
    if hasattr(frame, "_collect_as_arrow"):
        return [v for batch in frame._collect_as_arrow() for v in batch.column(column).to_pylist()]
    return [row[column] for row in frame.collect()]
