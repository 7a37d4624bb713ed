"""DataFrame plumbing the estimators share, through ``mapInArrow`` only, so that the same code
runs on a classic session and on Spark Connect (which has no RDDs, broadcasts or SparkContext).

ML vectors cross Arrow as their SQL struct ``{type, size, indices, values}`` (type 0 sparse,
1 dense); :func:`vectors` reads them, :func:`dense_vectors` writes dense ones.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable, Iterator, List, Optional, Tuple

import numpy as np


def vectors(column) -> Iterator[Optional[Tuple[int, np.ndarray, np.ndarray]]]:
    """Per row of an Arrow vector column: ``(size, indices int64, values float64)`` (a dense
    vector's non-zeros), or None for a null."""
    for v in column.to_pylist():
        if v is None:
            yield None
        elif v["type"] == 0:
            yield int(v["size"]), np.asarray(v["indices"], dtype=np.int64), np.asarray(v["values"], dtype=np.float64)
        else:
            arr = np.asarray(v["values"], dtype=np.float64)
            idx = np.flatnonzero(arr)
            yield len(arr), idx.astype(np.int64), arr[idx]


def dense_vectors(rows, arrow_type):
    """An Arrow vector column (of ``arrow_type``, the VectorUDT struct) of dense vectors."""
    import pyarrow as pa

    return pa.array([{"type": 1, "size": None, "indices": None, "values": [float(x) for x in r]} for r in rows],
                    type=arrow_type)


def partition_id() -> int:
    from pyspark import TaskContext

    return TaskContext.get().partitionId()


def collect_per_partition(frame, fn: Callable[[Iterator[Any]], Any]) -> List[Any]:
    """``fn(batches)`` once per partition of ``frame`` (one Spark job); its results, pickled
    through a binary column, in partition order."""
    import pyarrow as pa

    def run(batches):
        out = pickle.dumps((partition_id(), fn(batches)), protocol=pickle.HIGHEST_PROTOCOL)
        yield pa.RecordBatch.from_arrays([pa.array([out], pa.binary())], ["result"])

    rows = frame.mapInArrow(run, "result binary").collect()
    return [r for _, r in sorted((pickle.loads(row.result) for row in rows), key=lambda pr: pr[0])]
