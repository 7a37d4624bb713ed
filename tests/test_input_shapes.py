"""A fit whatever the plan that made its input: Spark runs a fit's barrier job only over an input
whose narrow lineage keeps one partition count (a ``coalesce``, a ``union`` or a ``limit`` break
that), so such an input is shuffled to the workers first -- and one that a barrier stage can run
over as it is, is not shuffled again."""

import numpy as np
import pytest

from pystrads.engine.driver.preflight import barrier_ready, frame_to_workers, to_workers
from pystrads.ml import StradsLasso, StradsLDA, StradsLogisticRegression, StradsMF
from pystrads.testing import _linear_data, _ratings_data

SHAPES = {
    "coalesce(1)": lambda df: df.coalesce(1),
    "coalesce to the workers": lambda df: df.repartition(4).coalesce(2),  # 2 partitions, not barrier-safe
    "union": lambda df: df.filter("id % 2 = 0").coalesce(1).union(df.filter("id % 2 = 1").coalesce(1)),
    "limit": lambda df: df.limit(10 ** 6),
    "1 partition": lambda df: df.repartition(1),
    "64 partitions": lambda df: df.repartition(64),
}


def _linear_result(model):
    return np.r_[model.coefficients.toArray(), model.intercept]


ESTIMATORS = {
    "StradsMF": (lambda: StradsMF(rank=2, maxIter=4, seed=1, numWorkers=2, userCol="userId", itemCol="movieId"),
                 _ratings_data, lambda m: np.r_[
                     np.concatenate([np.asarray(r.features) for r in m.userFactors.orderBy("id").collect()]),
                     np.concatenate([np.asarray(r.features) for r in m.itemFactors.orderBy("id").collect()])]),
    "StradsLasso": (lambda: StradsLasso(regParam=0.01, maxIter=50, numWorkers=2),
                    lambda s: _linear_data(s, False), _linear_result),
    "StradsLogisticRegression": (
        lambda: StradsLogisticRegression(regParam=0.01, elasticNetParam=1.0, maxIter=50, numWorkers=2),
        lambda s: _linear_data(s, True), _linear_result),
}


@pytest.mark.slow  # the input plans themselves are the LDA test's below
@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_a_fit_over_any_input_plan_equals_the_fit_over_two_partitions(spark, name):
    make, data, result = ESTIMATORS[name]
    df = data(spark)
    expected = result(make().fit(df.repartition(2)))
    for shape, reshape in SHAPES.items():
        got = result(make().fit(reshape(df)))
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-9, err_msg=f"{name} over {shape}")


def _two_theme_corpus(spark, docs=400, length=40):
    from pyspark.ml.linalg import Vectors

    rng = np.random.default_rng(0)
    rows = []
    for i in range(docs):
        lo = 0 if i % 2 == 0 else 10
        idx, cnt = np.unique(rng.integers(lo, lo + 10, size=length), return_counts=True)
        rows.append((i, Vectors.sparse(20, idx.tolist(), cnt.astype(float).tolist())))
    return spark.createDataFrame(rows, ["id", "features"]).repartition(2)


@pytest.mark.slow  # every input plan, ~16 s
def test_lda_over_any_input_plan_keeps_the_counts_and_the_likelihood(spark):
    df = _two_theme_corpus(spark)  # 16,000 tokens: the chains' log-likelihoods agree to well under 1 %
    tokens = sum(float(v.values.sum()) for (v,) in df.select("features").collect())

    def fit(frame):
        model = StradsLDA(k=2, maxIter=20, seed=1, numWorkers=2, optimizeDocConcentration=False).fit(frame)
        assert model.topicsMatrix().toArray().sum() == tokens
        return model.summary.logLikelihoodHistory[-1]

    expected = fit(df.repartition(2))
    for shape, reshape in SHAPES.items():
        assert fit(reshape(df)) == pytest.approx(expected, rel=0.01), shape


def test_an_input_the_barrier_stage_can_run_over_is_not_shuffled_again(spark, sc):
    df = spark.range(100).repartition(2).selectExpr("id", "id * 2 AS twice")
    assert frame_to_workers(df, 2, classic=True) is df
    for unsafe in (df.coalesce(1), spark.range(100).repartition(4).coalesce(2), df.union(df)):
        n = unsafe.rdd.getNumPartitions()
        assert not barrier_ready(unsafe._jdf.queryExecution().toRdd(), n)
        shaped = frame_to_workers(unsafe, n, classic=True)
        assert shaped is not unsafe and shaped.rdd.getNumPartitions() == n
        assert barrier_ready(shaped._jdf.queryExecution().toRdd(), n)
    assert frame_to_workers(df, 2, classic=False) is not df  # Spark Connect: the plan is out of reach

    rdd = sc.parallelize(range(100), 4).map(lambda x: (x, x))
    assert to_workers(rdd, 4) is rdd
    merged = to_workers(rdd.coalesce(2), 2)  # partitions kept whole: records together stay together
    assert merged.getNumPartitions() == 2 and barrier_ready(merged._jrdd.rdd(), 2)
    assert sorted(map(sorted, merged.glom().collect())) == sorted(map(sorted, rdd.coalesce(2).glom().collect()))
