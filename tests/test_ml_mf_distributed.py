"""StradsMFModel keeps its factors off the driver, as ALSModel does: the factors are
DataFrames made by the executors from the shards, ``transform`` joins, ``recommendFor*`` is a
blocked distributed top-k, save / load go through Parquet -- and the results are those of a
brute-force computation over the factors.  The ratings are synthetic in MovieLens latest-small's
shape (610 users, 9,000 items, ~99 k ratings)."""

import os

import numpy as np
import pytest
from pyspark.sql import functions as F

from pystrads.ml import StradsMF, StradsMFModel



@pytest.fixture(scope="module", autouse=True)
def distributed_path():
    """This module checks the executors' path, which models above spark.pystrads.mf.localModelBytes
    take: set to 0 here, so that every model, however small, takes it."""
    from pystrads import config

    before = config.DEFAULTS["mf.localModelBytes"]
    config.DEFAULTS["mf.localModelBytes"] = 0
    yield
    config.DEFAULTS["mf.localModelBytes"] = before


@pytest.fixture(scope="module")
def movielens(spark):
    from pystrads.datasets.synthetic import low_rank_ratings

    ratings = low_rank_ratings(610, 9000, rank=8, density=0.018, noise=0.8)  # MovieLens latest-small's shape
    return spark.createDataFrame(ratings).repartition(2).cache()


@pytest.fixture(scope="module")
def model(movielens):
    return StradsMF(userCol="userId", itemCol="movieId", rank=10, maxIter=3, regParam=0.1, seed=1).fit(movielens)


def _factors(frame):
    rows = sorted((r.id, r.features) for r in frame.collect())
    return np.array([r[0] for r in rows]), np.array([r[1] for r in rows], dtype=np.float32)


def _brute_top(src, dst, num):
    """{source id: (ids, scores)}: every destination by a float32 dot product, best first (ties
    by id); ``num`` is not used here but kept for symmetry with the call sites."""
    (src_ids, s), (dst_ids, d) = src, dst
    scores = s @ d.T
    out = {}
    for k, sid in enumerate(src_ids):
        order = np.lexsort((dst_ids, -scores[k]))
        out[int(sid)] = (dst_ids[order], scores[k, order])
    return out


def _check_top(recs, brute, col, num, tol=1e-4):
    """Every source's recommendations are a true top-num list, ties aside: ``num`` distinct
    destinations whose reported ratings are their brute-force scores, best first, equal to the
    brute-force top-num scores, holding every destination that scores clearly (``tol``) above
    the num-th.  Returns how many lists have no tie and equal the brute-force list item for item."""
    assert set(recs) == set(brute)
    exact = 0
    for sid, rec in recs.items():
        ids, scores = brute[sid]
        true = dict(zip(ids.tolist(), scores.tolist()))
        got_ids = [x[col] for x in rec]
        got = np.array([x.rating for x in rec])
        n = min(num, len(ids))
        assert len(got_ids) == n == len(set(got_ids)), f"source {sid}: {got_ids}"
        np.testing.assert_allclose(got, [true[i] for i in got_ids], rtol=1e-5, atol=1e-5, err_msg=f"source {sid}")
        np.testing.assert_allclose(got, scores[:n], rtol=1e-5, atol=1e-5, err_msg=f"source {sid}")
        assert np.all(np.diff(got) <= 1e-6), f"source {sid}: not best first"
        must = set(ids[:n][scores[:n] > scores[n - 1] + tol].tolist())
        assert must <= set(got_ids), f"source {sid}: misses {must - set(got_ids)}"
        if np.all(-np.diff(scores[:n + 1]) > tol):
            assert got_ids == ids[:n].tolist(), f"source {sid}: {got_ids} != {ids[:n]}"
            exact += 1
    return exact


def test_recommend_for_all_users_is_the_brute_force_top_10(model):
    users, items = _factors(model.userFactors), _factors(model.itemFactors)
    brute = _brute_top(users, items, 10)
    recs = {r.userId: r.recommendations for r in model.recommendForAllUsers(10).collect()}
    assert _check_top(recs, brute, "movieId", 10) > 0  # some lists have no ties: those are equal item for item


@pytest.mark.slow  # several seconds; the README's command keeps a faster test of the same kind
def test_small_blocks_merge_the_same_top_lists(model):
    """blockSize 100: many source and destination blocks, so every list is merged from several
    block pairs; recommendForAllItems too."""
    users, items = _factors(model.userFactors), _factors(model.itemFactors)
    small = model.copy().setBlockSize(100)
    recs = {r.userId: r.recommendations for r in small.recommendForAllUsers(10).collect()}
    _check_top(recs, _brute_top(users, items, 10), "movieId", 10)
    recs = {r.movieId: r.recommendations for r in small.recommendForAllItems(3).collect()}
    _check_top(recs, _brute_top(items, users, 3), "userId", 3)


def test_subsets_recommend_for_their_known_ids_only(model, spark):
    users, items = _factors(model.userFactors), _factors(model.itemFactors)
    picked = [int(users[0][0]), int(users[0][5]), int(users[0][5]), 999999]  # a duplicate, an unknown id
    subset = spark.createDataFrame([(u, 1) for u in picked], ["userId", "other"])
    recs = {r.userId: r.recommendations for r in model.recommendForUserSubset(subset, 4).collect()}
    assert sorted(recs) == sorted(set(picked) - {999999})
    brute = _brute_top(users, items, 4)
    _check_top(recs, {u: brute[u] for u in recs}, "movieId", 4)
    picked = [int(items[0][3]), int(items[0][-1])]
    subset = spark.createDataFrame([(float(i),) for i in picked], ["movieId"])  # ids as doubles: cast, as ALS
    recs = {r.movieId: r.recommendations for r in model.recommendForItemSubset(subset, 2).collect()}
    brute = _brute_top(items, users, 2)
    _check_top(recs, {i: brute[i] for i in picked}, "userId", 2)


def test_transform_predicts_the_factor_dot_products_with_cold_starts(model, movielens, spark):
    users, items = _factors(model.userFactors), _factors(model.itemFactors)
    w = dict(zip(users[0].tolist(), users[1]))
    h = dict(zip(items[0].tolist(), items[1]))
    sample = movielens.limit(500).union(spark.createDataFrame([(999999, 1, 3.0), (1, 999999, 3.0)],
                                                              movielens.schema))
    rows = model.transform(sample).collect()
    assert len(rows) == 502
    for r in rows:
        expected = float(np.dot(w[r.userId], h[r.movieId])) if r.userId in w and r.movieId in h else np.nan
        np.testing.assert_allclose(r.prediction, expected, rtol=1e-5, atol=1e-6)
    assert sum(np.isnan(r.prediction) for r in rows) == 2
    assert model.copy({model.coldStartStrategy: "drop"}).transform(sample).count() == 500


def test_save_load_round_trip_keeps_factors_predictions_and_recommendations(model, movielens, tmp_path):
    path = str(tmp_path / "mf")
    model.write().overwrite().save(path)
    loaded = StradsMFModel.load(path)
    assert loaded.rank == 10 and loaded.getUserCol() == "userId"
    for a, b in ((model.userFactors, loaded.userFactors), (model.itemFactors, loaded.itemFactors)):
        (ia, fa), (ib, fb) = _factors(a), _factors(b)
        assert np.array_equal(ia, ib) and np.array_equal(fa, fb)  # float32 -> double -> float32 is exact
    assert loaded.userFactors.schema.simpleString() == "struct<id:int,features:array<float>>"
    sample = movielens.limit(200)
    key = ["userId", "movieId"]
    assert model.transform(sample).orderBy(key).collect() == loaded.transform(sample).orderBy(key).collect()
    assert model.recommendForAllUsers(5).orderBy("userId").collect() == \
        loaded.recommendForAllUsers(5).orderBy("userId").collect()


def test_the_factors_never_reach_the_driver(spark, monkeypatch):
    """The fit reads neither the item table nor the workers' user factors on the driver; the
    model holds DataFrames made by executor tasks (no driver-made LocalRelation) and no arrays."""
    from pystrads.engine.scheduler import steps as job
    from pystrads.ps import client

    reads = []
    read, fetch = client.TableHandle.read, job.WorkerJob.fetch_exports

    def spy_read(self, *a, **k):
        reads.append(self.layout.short_name)
        return read(self, *a, **k)

    def spy_fetch(self):
        reads.append("exports")
        return fetch(self)

    monkeypatch.setattr(client.TableHandle, "read", spy_read)
    monkeypatch.setattr(job.WorkerJob, "fetch_exports", spy_fetch)
    ratings = spark.range(0, 20000).select((F.col("id") % 4000).alias("user"), (F.col("id") % 97).alias("item"),
                                          (F.col("id") % 5 + 1).cast("double").alias("rating"))
    fitted = StradsMF(rank=4, maxIter=1, seed=1, numWorkers=2).fit(ratings)
    assert "item_factors" not in reads and "exports" not in reads, reads
    assert not [k for k, v in vars(fitted).items() if isinstance(v, np.ndarray)]
    for frame in (fitted.userFactors, fitted.itemFactors):
        plan = frame._jdf.queryExecution().analyzed().toString()
        assert "LocalRelation" not in plan, plan
    assert fitted.userFactors.count() == 4000 and fitted.itemFactors.count() == 97


def test_model_dir_keeps_the_factors_as_parquet(spark, tmp_path, monkeypatch):
    """spark.pystrads.model.dir: the factors are written there by the executors and read back
    (they outlive the executors' local checkpoints)."""
    from pystrads.spark import ClassicHandle

    ratings = spark.createDataFrame([(u, i, float((u * i) % 5 + 1)) for u in range(30) for i in range(20)],
                                    ["user", "item", "rating"])
    conf_items = ClassicHandle.conf_items  # as if set with --conf when the application started
    monkeypatch.setattr(ClassicHandle, "conf_items", lambda self, prefix: dict(
        conf_items(self, prefix), **{"spark.pystrads.model.dir": str(tmp_path)}))
    fitted = StradsMF(rank=3, maxIter=2, seed=1, numWorkers=2).fit(ratings)
    written = [os.path.join(d, f) for d, _, files in os.walk(tmp_path) for f in files if f.endswith(".parquet")]
    assert {os.path.basename(os.path.dirname(p)) for p in written} == {"userFactors", "itemFactors"}
    assert fitted.userFactors.count() == 30 and fitted.itemFactors.count() == 20
    assert fitted.transform(ratings).where(F.isnan("prediction")).count() == 0


def test_the_driver_memory_does_not_grow_with_the_factors(spark):
    """The Python driver's traced peak during a fit of 50,000 users x rank 64 (W alone: 24 MiB
    as float64) stays under a quarter of W: what the driver holds grows with the ids (8 bytes
    per user and item), not with users x rank (gathering W onto the driver, as before issue
    17, peaked above twice W)."""
    import tracemalloc

    users, rank = 50000, 64
    ratings = spark.range(0, 4 * users).select((F.col("id") % users).alias("user"),
                                               (F.col("id") * 7919 % 500).alias("item"),
                                               (F.col("id") % 5 + 1).cast("double").alias("rating"))
    tracemalloc.start()
    try:
        fitted = StradsMF(rank=rank, maxIter=1, seed=1, numWorkers=2).fit(ratings)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    w_bytes = users * rank * 8
    assert peak < w_bytes / 4, f"driver peak {peak / 2**20:.1f} MiB for a W of {w_bytes / 2**20:.1f} MiB"
    assert fitted.userFactors.count() == users


def test_a_small_model_is_read_once_onto_the_driver_with_the_same_factors(spark, monkeypatch):
    """At most spark.pystrads.mf.localModelBytes, the factors are read onto the driver when the
    fit ends (no Spark job) and become local DataFrames: the same factors, schema and predictions
    as the executors' path."""
    from pystrads import config

    ratings = spark.createDataFrame([(u, i, float((u * i) % 5 + 1)) for u in range(40) for i in range(25)
                                     if (u + i) % 3], ["user", "item", "rating"])
    distributed = StradsMF(rank=3, maxIter=3, seed=1, numWorkers=2).fit(ratings)  # this module: limit 0
    monkeypatch.setitem(config.DEFAULTS, "mf.localModelBytes", (40 + 25) * 3 * 8)  # exactly this model's size
    local = StradsMF(rank=3, maxIter=3, seed=1, numWorkers=2).fit(ratings)
    for frame in (local.userFactors, local.itemFactors):
        assert "LocalRelation" in frame._jdf.queryExecution().analyzed().toString()
    for frame in (distributed.userFactors, distributed.itemFactors):
        assert "LocalRelation" not in frame._jdf.queryExecution().analyzed().toString()
    for a, b in ((local.userFactors, distributed.userFactors), (local.itemFactors, distributed.itemFactors)):
        assert a.schema == b.schema
        ids_a, f_a = _factors(a)
        ids_b, f_b = _factors(b)
        assert np.array_equal(ids_a, ids_b) and np.array_equal(f_a, f_b)
    p_a = local.transform(ratings).orderBy("user", "item").select("prediction").toPandas()["prediction"]
    p_b = distributed.transform(ratings).orderBy("user", "item").select("prediction").toPandas()["prediction"]
    assert np.array_equal(p_a.to_numpy(), p_b.to_numpy())


def test_recommendations_stay_exact_when_the_cross_join_is_a_cartesian_product(spark):
    """Without a broadcast (large factor frames), the cross join of the blocks is a cartesian
    product, which computes each source block once per destination partition: candidates must
    meet by source id (as ALS's top-k aggregation), not by a block id taken from the task."""
    from pystrads.ml._mf_data import _local_frame, recommendations

    rng = np.random.default_rng(0)
    users, items = rng.random((50, 3)).astype(np.float32), rng.random((30, 3)).astype(np.float32)
    src = _local_frame(spark, np.arange(50), users).repartition(2)
    dst = _local_frame(spark, np.arange(100, 130), items).repartition(3)
    before = spark.conf.get("spark.sql.autoBroadcastJoinThreshold")
    spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")
    try:
        recs = {r.user: [x.item for x in r.recommendations]
                for r in recommendations(src, dst, 5, "user", "item", 10).collect()}
    finally:
        spark.conf.set("spark.sql.autoBroadcastJoinThreshold", before)
    scores = users @ items.T
    assert len(recs) == 50
    for u in range(50):
        assert recs[u] == [100 + j for j in np.lexsort((np.arange(30), -scores[u]))[:5]], u


def test_ids_past_the_per_partition_limit_come_from_spark_with_the_same_values(spark, monkeypatch):
    """Millions of users spread over every partition: the partitions send no ids and Spark's
    distinct / group-by make them -- the same sorted ids and item counts as the merged path."""
    from pystrads.ml import _mf_data

    ratings = spark.range(0, 3000, 1, 4).select(
        (F.col("id") % 701 - 300).cast("double").alias("u"), (F.col("id") * 7919 % 97).cast("double").alias("i"),
        (F.col("id") % 5 - 1).cast("double").alias("r"))
    merged = _mf_data.ids_and_item_counts(ratings)
    monkeypatch.setattr(_mf_data, "IDS_PER_PARTITION", 10)
    spilled = _mf_data.ids_and_item_counts(ratings)
    rows = ratings.toPandas()
    assert np.array_equal(merged[0], np.unique(rows["u"].to_numpy()).astype(np.int32))
    counts = rows.groupby("i")["r"].agg(["size", lambda r: int((r > 0).sum())])
    assert np.array_equal(merged[1], counts.index.to_numpy().astype(np.int32))
    assert np.array_equal(merged[2], counts.iloc[:, 0].to_numpy()) and np.array_equal(merged[3], counts.iloc[:, 1])
    for a, b in zip(merged, spilled):
        assert a.dtype == b.dtype and np.array_equal(a, b)
