"""engine.frames: a fit's tables and exports as DataFrames made by executor tasks,
on a program that is not MF (the engine knows no algorithm)."""

import numpy as np
import pytest

from pystrads.engine import Engine
from pystrads.engine.driver.frames import keep_frame, keep_frames, row_ranges, shard_frame
from pystrads.programs import examples as ex


def test_row_ranges_cut_rows_into_contiguous_non_empty_tasks():
    assert row_ranges(10, 3) == [(0, 3), (3, 7), (7, 10)]
    assert row_ranges(2, 5) == [(0, 1), (1, 2)]
    assert row_ranges(0, 4) == []
    assert len(row_ranges(1_000_000)) == 4  # ROWS_PER_TASK rows each by default


def _readers():
    """Task functions for the executors (made here so cloudpickle ships them by value: the
    executors cannot import this test module)."""

    def batch(keys, values):
        import pyarrow as pa

        return pa.RecordBatch.from_arrays([pa.array(keys, pa.int64()), pa.array(values, pa.float64())],
                                          ["key", "value"])

    def read_sums(reader, task):
        lo, hi = task
        yield batch(np.arange(lo, hi), reader.table("sums").read(range(lo, hi))[:, 0])

    def read_export(reader, worker):
        yield batch([worker], [reader.export(worker)])

    return read_sums, read_export


def test_tables_and_exports_become_frames_that_outlive_the_fit(spark):
    rng = np.random.default_rng(5)
    keys, vals = rng.integers(0, 300, 4000), rng.random(4000)
    df = spark.createDataFrame(list(zip(keys.tolist(), vals.tolist())), "key long, value double")
    engine = Engine(ex.RotationSum(300, iterations=3), df, seed=1,
                    export=lambda worker, data, state: float(data["local"].sum()))
    read_sums, read_export = _readers()
    with engine.fit() as res:
        sums = shard_frame(spark, res, row_ranges(300, 3), read_sums, "key long, value double")
        exports = shard_frame(spark, res, range(engine.num_workers), read_export, "key long, value double")
        lazy = shard_frame(spark, res, range(engine.num_workers), read_export, "key long, value double")
        kept = keep_frames(res, {"sums": sums, "exports": exports})
        assert sums.rdd.getNumPartitions() == 3
    # released: the shards dropped the fit, the kept frames still hold it
    got = sorted(kept["sums"].collect())
    assert [r.key for r in got] == list(range(300))
    np.testing.assert_allclose([r.value for r in got], 3 * np.bincount(keys, vals, 300), atol=1e-9)
    assert sorted(r.key for r in kept["exports"].collect()) == list(range(engine.num_workers))
    assert sum(r.value for r in kept["exports"].collect()) == pytest.approx(vals.sum())
    # a frame nobody kept cannot be read any more, and the error says why
    with pytest.raises(Exception, match="released before this frame was materialised"):
        lazy.collect()


def test_keep_frame_writes_parquet_under_model_dir(spark, tmp_path):
    engine = Engine(ex.RotationSum(50, iterations=1), spark.createDataFrame([(k, 1.0) for k in range(50)],
                                                                             "key long, value double"),
                    seed=1, config={"model.dir": str(tmp_path)})
    read = _readers()[0]
    with engine.fit() as res:
        frame = keep_frame(shard_frame(spark, res, row_ranges(50, 2), read, "key long, value double"), res, "sums")
    assert sorted(r.value for r in frame.collect()) == [1.0] * 50
    assert list(tmp_path.glob(f"{engine.namespace}/sums/*.parquet"))
