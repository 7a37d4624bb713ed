"""A fit's results as Spark DataFrames made on the executors, never through the driver.

:func:`shard_frame` builds a DataFrame whose partitions are executor tasks that read from the
fit's shards through the Flight client (a :class:`~pystrads.engine.executor.reads.ShardReader`): a model table's rows (:meth:`ShardReader.table`, a
:class:`~pystrads.ps.client.TableHandle`) and what each worker left there when the fit ended
(:meth:`ShardReader.export`, the ``export(worker, data, state)`` results of the workers,
kept on the shards until the driver asks for them).  The caller says what each task
reads and how it becomes Arrow record batches; this module knows no algorithm.

The shards drop a fit's tables and exports when the fit is released, so a frame read from them
must be materialised first: :func:`keep_frame` writes it as Parquet under
``spark.pystrads.model.dir`` when that is set (it then survives anything but the files'
deletion), else it local-checkpoints it (Spark keeps the blocks on the executors, memory and
disk; losing an executor after the fit loses its blocks, and Spark then fails the next job
that needs them, naming the lost checkpoint block); :func:`keep_frames` materialises several
at once, and :func:`release_frame` frees what they kept (a model's ``close()``).  :func:`row_ranges` cuts rows into tasks.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, List, Sequence, Tuple

import numpy as np

from ...errors import PystradsError
from ...ps import storage
from ...ps.protocol import numpy_of
from ..executor.reads import ShardReader

#: rows a table-reading task aims for when the caller gives no task count: big enough that
#: Spark's per-task cost is small beside the read, small enough to keep tasks' memory modest
ROWS_PER_TASK = 1 << 18


def reader_of(result) -> ShardReader:
    """The :class:`ShardReader` of a :class:`~pystrads.engine.driver.engine.FitResult` not yet released."""
    engine = result.engine
    if engine.group is None or not engine.layouts:
        raise PystradsError("this fit has no shards to read from (not started, or released)")
    return ShardReader(engine.group, engine.layouts, engine.namespace, engine.num_workers, engine.job.seals)


def row_ranges(num_rows: int, num_tasks: int = 0) -> List[Tuple[int, int]]:
    """``[lo, hi)`` ranges cutting ``num_rows`` rows into ``num_tasks`` (0: about
    :data:`ROWS_PER_TASK` rows each) nearly equal non-empty pieces."""
    if num_rows <= 0:
        return []
    num_tasks = num_tasks or -(-num_rows // ROWS_PER_TASK)
    cuts = np.linspace(0, num_rows, min(num_tasks, num_rows) + 1).round().astype(np.int64)
    return [(int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:])]


def shard_frame(spark, result, tasks: Sequence[Any], read: Callable[[ShardReader, Any], Iterator[Any]], schema):
    """A DataFrame of ``schema`` with one partition per entry of ``tasks``: the executor task
    of partition ``t`` yields the Arrow record batches of ``read(reader, tasks[t])``, where
    ``reader`` is the fit's :class:`ShardReader`.  Lazy: materialise it (:func:`keep_frame`)
    before the fit is released.  ``tasks`` travel in the closure: keep them small (ranges,
    worker numbers, id slices)."""
    reader = reader_of(result)
    tasks = list(tasks)

    def run(batches):
        for batch in batches:
            for t in numpy_of(batch.column(0)):
                yield from read(reader, tasks[int(t)])

    return spark.range(0, len(tasks), 1, max(len(tasks), 1)).mapInArrow(run, schema)


def keep_frames(result, frames: dict) -> dict:
    """:func:`keep_frame` of every ``{name: frame}``, as concurrent Spark jobs (each job of a
    small frame costs mostly its fixed overhead, which overlaps)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, len(frames))) as pool:
        futures = {name: pool.submit(keep_frame, frame, result, name) for name, frame in frames.items()}
        return {name: future.result() for name, future in futures.items()}


def keep_frame(frame, result, name: str):
    """``frame`` materialised so that it outlives the fit's shards (see the module docstring):
    Parquet under ``<model.dir>/<fit namespace>/<name>`` when ``spark.pystrads.model.dir`` is
    set, else an eager local checkpoint.  One Spark job either way."""
    root = result.engine.config["model.dir"]
    if root:
        path = storage.join(root, result.engine.namespace, name)
        frame.write.parquet(path)
        kept = frame.sparkSession.read.schema(frame.schema).parquet(path)
    else:
        path = None
        kept = frame.localCheckpoint(eager=True)
    vars(kept)["_pystrads_kept"] = path or "checkpoint"  # what release_frame frees
    return kept


def release_frame(frame) -> bool:
    """Free what :func:`keep_frame` kept for ``frame`` (a frame it returned; any other is left
    alone): the local checkpoint's blocks on the executors (on a classic session at once; under
    Spark Connect the server drops the cached relation when the last reference to ``frame`` goes),
    or the Parquet files it wrote under ``spark.pystrads.model.dir``.  Returns whether it freed
    anything; a frame released once is not released again."""
    import logging

    from ...spark import handle_of

    kept = vars(frame).get("_pystrads_kept")  # not getattr: a Connect DataFrame makes a Column of any name
    if kept is None:
        return False
    vars(frame).update(_pystrads_kept=None, _pystrads_released=True)
    if kept != "checkpoint":
        try:
            storage.delete_dir(kept)
        except Exception as exc:  # noqa: BLE001 - the files stay; the model is freed all the same
            logging.getLogger(__name__).warning("could not delete the model files %s (%s); delete them by hand",
                                                kept, exc)
        return True
    if not handle_of(frame).connect:
        plan = frame._jdf.queryExecution().analyzed()
        if plan.getClass().getSimpleName() == "LogicalRDD":  # what Dataset.localCheckpoint makes
            plan.rdd().unpersist(True)
    return True
