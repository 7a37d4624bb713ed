"""StradsMF as a drop-in for pyspark.ml.recommendation.ALS (explicit ratings and implicit feedback)."""

import os
import tempfile

import numpy as np
import pytest
from pyspark.ml.evaluation import RegressionEvaluator
from pyspark.ml.linalg import Vectors
from pyspark.ml.recommendation import ALS
from pyspark.ml.tuning import CrossValidator, ParamGridBuilder

from pystrads.errors import ConfigurationError, InputError
from pystrads.ml import StradsLDA, StradsMF, StradsMFModel


@pytest.fixture(scope="module")
def ratings(spark):
    rng = np.random.default_rng(3)
    users, items, rank = 60, 40, 3
    truth = rng.random((users, rank)) @ rng.random((rank, items)) + 1.0
    rows = [(int(u) * 7 + 100, int(i) * 3 + 5, float(truth[u, i] + 0.1 * rng.standard_normal()))
            for u in range(users) for i in range(items) if rng.random() < 0.7]
    return spark.createDataFrame(rows, ["userId", "movieId", "rating"]).repartition(2).cache()


def mf(**kw):
    return StradsMF(**dict(dict(userCol="userId", itemCol="movieId", ratingCol="rating", rank=3, maxIter=15,
                                regParam=0.05, seed=1), **kw))


def als(**kw):
    return ALS(**dict(dict(userCol="userId", itemCol="movieId", ratingCol="rating", rank=3, maxIter=15,
                           regParam=0.05, seed=1), **kw))


@pytest.fixture(scope="module")
def fitted(ratings):
    return mf().fit(ratings)


def test_outputs_have_als_schemas(fitted, ratings):
    ref = als().fit(ratings)
    assert fitted.userFactors.schema == ref.userFactors.schema
    assert fitted.itemFactors.schema == ref.itemFactors.schema
    assert fitted.transform(ratings).schema == ref.transform(ratings).schema
    assert fitted.recommendForAllUsers(3).schema == ref.recommendForAllUsers(3).schema
    assert fitted.recommendForAllItems(2).schema == ref.recommendForAllItems(2).schema
    subset = ratings.select("userId").distinct().limit(4)
    assert fitted.recommendForUserSubset(subset, 2).schema == ref.recommendForUserSubset(subset, 2).schema
    assert fitted.recommendForUserSubset(subset, 2).count() == 4
    assert fitted.rank == 3 and fitted.userFactors.count() == ratings.select("userId").distinct().count()


def test_fit_quality_matches_als(fitted, ratings):
    ev = RegressionEvaluator(labelCol="rating")
    ours = ev.evaluate(fitted.transform(ratings))
    theirs = ev.evaluate(als().fit(ratings).transform(ratings))
    assert ours <= theirs + 0.005, (ours, theirs)
    rmse = fitted.summary.trainRmseHistory
    assert len(rmse) == 15 and rmse[-1] == pytest.approx(ours, rel=1e-3)


@pytest.mark.slow  # several seconds; the README's command keeps a faster test of the same kind
def test_block_sizes_reach_the_same_quality(ratings):
    """CCD++ (featureBlockSize 1), blocks of 2 with a padded last block, and whole-row blocks (5 = rank)."""
    ev = RegressionEvaluator(labelCol="rating")
    rmse = {b: ev.evaluate(mf(rank=5, featureBlockSize=b).fit(ratings).transform(ratings)) for b in (1, 2, 5)}
    theirs = ev.evaluate(als(rank=5).fit(ratings).transform(ratings))
    assert max(rmse.values()) - min(rmse.values()) < 0.005, rmse
    assert max(rmse.values()) <= theirs + 0.005, (rmse, theirs)


def test_sgd_block_rotation_fits_close_to_als_and_saves_its_params(ratings, caplog):
    ev = RegressionEvaluator(labelCol="rating")
    est = mf(algorithm="sgd", maxIter=30, featureBlockSize=3)  # a CD param SGD ignores: said in the log
    with caplog.at_level("WARNING", logger="pystrads.ml.recommendation"):
        model = est.fit(ratings)
    assert "StradsMF: featureBlockSize=3 is ignored with algorithm='sgd'" in caplog.text
    assert "innerIterations" not in caplog.text  # not set: nothing to say
    ours = ev.evaluate(model.transform(ratings))
    theirs = ev.evaluate(als().fit(ratings).transform(ratings))
    assert ours <= theirs + 0.03, (ours, theirs)
    history = model.summary.trainRmseHistory
    assert len(history) == 30 and history[-1] < 0.5 * history[0]
    assert list(model.summary.to_pandas()["step_size"][:2]) == pytest.approx([0.05, 0.05 / np.sqrt(2)])
    path = os.path.join(tempfile.mkdtemp(), "est")
    est.save(path)
    again = StradsMF.load(path)
    assert again.getAlgorithm() == "sgd" and again.getStepSize() == 0.05
    assert StradsMF().getAlgorithm() == "cd"


def test_a_step_size_the_algorithm_ignores_is_named_in_a_warning(ratings, caplog):
    """stepSize is SGD's: set with coordinate descent (algorithm='cd', the default, or
    implicitPrefs=True) the fit says it is ignored; with algorithm='sgd' it is used, nothing said."""
    for kw, mode in (({}, "algorithm='cd'"), ({"implicitPrefs": True}, "implicitPrefs=True (exact block solves)")):
        caplog.clear()
        with caplog.at_level("WARNING", logger="pystrads.ml.recommendation"):
            mf(maxIter=1, stepSize=0.02, **kw).fit(ratings)
        assert f"StradsMF: stepSize=0.02 is ignored with {mode}" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="pystrads.ml.recommendation"):
        model = mf(algorithm="sgd", maxIter=1, stepSize=0.02).fit(ratings)
    assert "stepSize" not in caplog.text
    assert list(model.summary.to_pandas()["step_size"]) == pytest.approx([0.02])  # and it was used

def test_als_partitioning_and_storage_params_are_accepted_and_named_in_a_warning(ratings, caplog):
    """A pipeline written for ALS passes numUserBlocks / numItemBlocks / the storage levels: they
    are accepted (constructor, setters, setParams, save and load), checked as ALS checks them, and a
    fit names each one set in a warning (the workers and shards partition and keep the data)."""
    est = mf(maxIter=1, numUserBlocks=4, intermediateStorageLevel="MEMORY_ONLY")
    est.setNumItemBlocks(3).setParams(finalStorageLevel="DISK_ONLY")
    assert (est.getNumUserBlocks(), est.getNumItemBlocks()) == (4, 3)
    assert (est.getIntermediateStorageLevel(), est.getFinalStorageLevel()) == ("MEMORY_ONLY", "DISK_ONLY")
    assert StradsMF().getNumUserBlocks() == 10 == ALS().getNumUserBlocks()
    assert StradsMF().getFinalStorageLevel() == ALS().getFinalStorageLevel()
    with caplog.at_level("WARNING", logger="pystrads.ml.recommendation"):
        est.fit(ratings)
    for text in ("numUserBlocks=4", "numItemBlocks=3", "intermediateStorageLevel='MEMORY_ONLY'",
                 "finalStorageLevel='DISK_ONLY'"):
        assert f"StradsMF: {text} is ignored with pystrads' own partitioning" in caplog.text, text
    path = os.path.join(tempfile.mkdtemp(), "est")
    est.save(path)
    assert StradsMF.load(path).getNumItemBlocks() == 3
    with pytest.raises(ConfigurationError, match="numUserBlocks"):
        mf(numUserBlocks=0).fit(ratings)
    with pytest.raises(ConfigurationError, match="intermediateStorageLevel"):
        mf(intermediateStorageLevel="NONE").fit(ratings)


def test_recommendations_are_the_top_scores(fitted):
    recs = {r.userId: r.recommendations for r in fitted.recommendForAllUsers(3).collect()}
    w = {r.id: np.array(r.features) for r in fitted.userFactors.collect()}
    h = {r.id: np.array(r.features) for r in fitted.itemFactors.collect()}
    user = sorted(recs)[0]
    scores = sorted(((float(w[user] @ h[i]), i) for i in h), reverse=True)[:3]
    assert [r.movieId for r in recs[user]] == [i for _, i in scores]
    assert [r.rating for r in recs[user]] == pytest.approx([s for s, _ in scores], rel=1e-5)


def test_cold_start_nan_and_drop(fitted, spark):
    new = spark.createDataFrame([(100, 5), (999999, 5), (100, 888888)], ["userId", "movieId"])
    preds = [r.prediction for r in fitted.transform(new).collect()]
    assert not np.isnan(preds[0]) and np.isnan(preds[1]) and np.isnan(preds[2])
    fitted_drop = fitted.copy({fitted.coldStartStrategy: "drop"})
    assert fitted_drop.transform(new).count() == 1


@pytest.mark.slow  # several seconds; the README's command keeps a faster test of the same kind
def test_cross_validator_picks_and_the_best_model_saves_loads_and_recommends(ratings):
    est = mf(maxIter=8, coldStartStrategy="drop")
    grid = ParamGridBuilder().addGrid(est.rank, [1, 3]).addGrid(est.regParam, [0.05, 0.5]).build()
    cv = CrossValidator(estimator=est, estimatorParamMaps=grid,
                        evaluator=RegressionEvaluator(labelCol="rating"), numFolds=2, seed=2)
    cv_model = cv.fit(ratings)
    best = cv_model.bestModel
    chosen = cv_model.getEstimatorParamMaps()[int(np.argmin(cv_model.avgMetrics))]
    assert len(set(cv_model.avgMetrics)) == 4, cv_model.avgMetrics  # every grid point was really fitted
    assert isinstance(best, StradsMFModel) and best.rank == 3 == chosen[est.rank]
    assert chosen[est.regParam] == 0.05
    path = os.path.join(tempfile.mkdtemp(), "mf")
    best.save(path)
    loaded = StradsMFModel.load(path)
    assert loaded.rank == 3 and loaded.getUserCol() == "userId"
    a = best.recommendForAllUsers(2).orderBy("userId").collect()
    b = loaded.recommendForAllUsers(2).orderBy("userId").collect()
    assert [[x.movieId for x in r.recommendations] for r in a] == [[x.movieId for x in r.recommendations] for r in b]


def test_bad_input_and_params_are_refused(spark, ratings):
    with pytest.raises(ConfigurationError, match="implicitPrefs=True with algorithm='sgd'"):
        mf(implicitPrefs=True, algorithm="sgd").fit(ratings)
    with pytest.raises(ConfigurationError, match="scaleRegParam=False with algorithm='sgd'.*scaleRegParam=True"):
        mf(scaleRegParam=False, algorithm="sgd").fit(ratings)
    with pytest.raises(ConfigurationError, match="rank=0 must be >= 1"):
        mf(rank=0).fit(ratings)
    with pytest.raises(ConfigurationError, match="featureBlockSize=-1 must be >= 0"):
        mf(featureBlockSize=-1).fit(ratings)
    with pytest.raises(ConfigurationError, match="featureBlockSize=2 with nonnegative=True"):
        mf(featureBlockSize=2, nonnegative=True).fit(ratings)
    with pytest.raises(ConfigurationError, match="algorithm='als' is not one of 'cd'"):
        mf(algorithm="als").fit(ratings)
    with pytest.raises(ConfigurationError, match="stepSize=0.0 must be a finite number > 0"):
        mf(algorithm="sgd", stepSize=0.0).fit(ratings)
    with pytest.raises(ConfigurationError, match="coldStartStrategy='keep'"):
        mf(coldStartStrategy="keep").fit(ratings)
    with pytest.raises(InputError, match="userCol 'user' is not a column"):
        StradsMF().fit(ratings)
    bad_ids = spark.createDataFrame([(1.5, 2, 3.0), (1.0, 2, 4.0)], ["userId", "movieId", "rating"])
    with pytest.raises(InputError, match=r"userId=1.5.*integers within int32"):
        mf().fit(bad_ids)
    huge = spark.createDataFrame([(2 ** 40, 2, 3.0)], ["userId", "movieId", "rating"])
    with pytest.raises(InputError, match="integers within int32"):
        mf().fit(huge)
    nan = spark.createDataFrame([(1, 2, float("nan"))], ["userId", "movieId", "rating"])
    with pytest.raises(InputError, match="rating=nan"):
        mf().fit(nan)


@pytest.fixture(scope="module")
def interactions(spark):
    """Play counts of users with clustered tastes (3 groups of items), a few negative ratings."""
    rng = np.random.default_rng(11)
    rows = []
    for u in range(80):
        group = u % 3
        for i in range(45):
            p = 0.5 if i % 3 == group else 0.05
            if rng.random() < p:
                rows.append((u + 1000, i * 2 + 1, float(rng.integers(1, 6)) * (-1 if rng.random() < 0.05 else 1)))
    return spark.createDataFrame(rows, ["userId", "movieId", "rating"]).repartition(2).cache()


def implicit_objective(model, df, reg, alpha, scale_reg=True):
    """ALS's implicit objective of a model's factors, over the dense user x item matrix (regParam
    scaled by the positive counts, or alone with ``scale_reg=False``)."""
    users = {r.id: np.array(r.features) for r in model.userFactors.collect()}
    items = {r.id: np.array(r.features) for r in model.itemFactors.collect()}
    uid, iid = sorted(users), sorted(items)
    w, h = np.array([users[u] for u in uid]), np.array([items[i] for i in iid])
    conf, pref = np.ones((len(uid), len(iid))), np.zeros((len(uid), len(iid)))
    n_u, n_i = np.zeros(len(uid)), np.zeros(len(iid))
    for r in df.collect():
        u, i = uid.index(r.userId), iid.index(r.movieId)
        conf[u, i], pref[u, i] = 1 + alpha * abs(r.rating), float(r.rating > 0)
        n_u[u] += r.rating > 0
        n_i[i] += r.rating > 0
    if not scale_reg:
        n_u, n_i = np.ones(len(uid)), np.ones(len(iid))
    err = pref - w @ h.T
    return float((conf * err ** 2).sum() + reg * ((n_u[:, None] * w ** 2).sum() + (n_i[:, None] * h ** 2).sum()))


@pytest.mark.slow  # several seconds; the README's command keeps a faster test of the same kind
def test_implicit_feedback_reaches_als_objective_and_its_rankings(interactions):
    """implicitPrefs=True minimises ALS's implicit objective: after ALS's own params, ours is at most
    ALS's (both monotone from different starts), the history never increases and ends at the
    objective recomputed densely from the model; its top items are of the user's taste group as
    often as ALS's are."""
    kw = dict(rank=6, maxIter=15, regParam=0.1, alpha=10.0, implicitPrefs=True)
    ours = mf(**kw).fit(interactions)  # rank 6: one block, ALS's full solves (blocks: the program tests)
    theirs = als(**kw).fit(interactions)
    f_ours, f_als = implicit_objective(ours, interactions, 0.1, 10.0), implicit_objective(theirs, interactions,
                                                                                        0.1, 10.0)
    assert f_ours <= f_als * 1.001, (f_ours, f_als)
    history = ours.summary.objectiveHistory
    assert len(history) == 15 and all(b <= a * (1 + 1e-9) for a, b in zip(history, history[1:])), history
    assert history[-1] == pytest.approx(f_ours, rel=1e-6)
    assert ours.summary.trainRmseHistory == []
    def in_group(model):
        top = {r.userId: [x.movieId for x in r.recommendations] for r in model.recommendForAllUsers(5).collect()}
        return np.mean([(m // 2) % 3 == (u - 1000) % 3 for u in top for m in top[u]])

    assert in_group(ours) >= in_group(theirs) - 0.02 and in_group(ours) >= 0.85, (in_group(ours), in_group(theirs))


def test_unscaled_regularisation_is_the_objective_minimised(interactions, ratings):
    """scaleRegParam=False: regParam alone on every factor row (the implicit library's objective):
    the implicit history ends at that objective recomputed densely, not at the scaled one, and the
    explicit fit's reported user regularisation is regParam times the users' squared norms."""
    kw = dict(rank=4, maxIter=6, regParam=2.0, alpha=10.0, implicitPrefs=True, scaleRegParam=False)
    model = mf(**kw).fit(interactions)
    history = model.summary.objectiveHistory
    assert all(b <= a * (1 + 1e-9) for a, b in zip(history, history[1:])), history
    assert history[-1] == pytest.approx(implicit_objective(model, interactions, 2.0, 10.0, scale_reg=False), rel=1e-6)
    assert history[-1] != pytest.approx(implicit_objective(model, interactions, 2.0, 10.0), rel=1e-3)
    explicit = mf(rank=3, maxIter=3, regParam=0.5, scaleRegParam=False).fit(ratings)
    w = np.array([r.features for r in explicit.userFactors.collect()])
    assert float(explicit.summary.iterations["w_reg"].iloc[-1]) == pytest.approx(0.5 * (w ** 2).sum(), rel=1e-6)


def _kept_rdd_ids(frames):
    """The ids of the local-checkpointed RDDs behind a model's kept DataFrames."""
    return {f._jdf.queryExecution().analyzed().rdd().id() for f in frames}


def _cached_bytes(spark):
    """Spark's storage status: cached RDD id -> bytes in memory and on disk."""
    return {i.id(): i.memSize() + i.diskSize() for i in spark.sparkContext._jsc.sc().getRDDStorageInfo()}


def test_close_frees_the_models_blocks_and_closed_models_say_so(spark, ratings, monkeypatch):
    from pystrads import config
    from pystrads.errors import PystradsError

    monkeypatch.setitem(config.DEFAULTS, "mf.localModelBytes", 0)  # factors kept on the executors
    model = mf(maxIter=2).fit(ratings)
    ids = _kept_rdd_ids([model.userFactors, model.itemFactors])
    assert len(ids) == 2 and all(_cached_bytes(spark).get(i, 0) > 0 for i in ids)
    copy = model.copy()
    assert model.transform(ratings).count() == ratings.count()
    with model as same:
        assert same is model and same.recommendForAllUsers(2).count() == 60
    assert not ids & set(_cached_bytes(spark))  # the blocks are gone
    for m in (model, copy):  # copies share the tables
        with pytest.raises(PystradsError, match="StradsMFModel was closed"):
            m.transform(ratings)
        with pytest.raises(PystradsError, match="was closed"):
            m.recommendForAllItems(1)
    model.close()  # twice: nothing more to do

    docs = spark.createDataFrame([(Vectors.sparse(6, {i % 6: 2.0, (i + 1) % 6: 1.0}),) for i in range(30)],
                                 ["features"])
    monkeypatch.setitem(config.DEFAULTS, "lda.localModelBytes", 0)  # counts kept on the executors
    lda = StradsLDA(k=2, maxIter=3, seed=1).fit(docs)
    (lda_id,) = _kept_rdd_ids(lda._kept_frames())
    assert _cached_bytes(spark).get(lda_id, 0) > 0
    lda.close()
    assert lda_id not in _cached_bytes(spark)
    with pytest.raises(PystradsError, match="StradsLDAModel was closed"):
        lda.describeTopics(3)


@pytest.fixture(scope="module")
def movielens_split(spark):
    """~99 k ratings of 610 users on 9,000 items (MovieLens latest-small's shape: a long tail of
    items with a handful of ratings, so a rank-50 model overfits) with a fixed 20 % of them
    marked for validation."""
    from pystrads.datasets.synthetic import low_rank_ratings

    frame = low_rank_ratings(610, 9000, rank=8, density=0.018, noise=0.8)
    frame["validation"] = np.random.default_rng(0).random(len(frame)) < 0.2
    return spark.createDataFrame(frame[["userId", "movieId", "rating", "validation"]]).repartition(2).cache()


@pytest.mark.parametrize("algorithm", [pytest.param("cd", marks=pytest.mark.slow), "sgd"])
def test_early_stopping_stops_two_iterations_after_the_validation_minimum(movielens_split, algorithm):
    """Rank 50 with a small regParam overfits: the validation RMSE falls to a minimum inside the run
    and rises after it.  With earlyStoppingRounds=2 the fit ends exactly 2 iterations after that
    minimum, on the same path as the full run; the validation ratings are never trained on."""
    from pyspark.sql import functions as F

    from pystrads.engine.program.stopping import EarlyStopping

    est = mf(rank=50, regParam=0.1 if algorithm == "cd" else 0.05, maxIter=20 if algorithm == "cd" else 24,
             algorithm=algorithm, validationIndicatorCol="validation")
    model = est.copy({est.earlyStoppingRounds: 0}).fit(movielens_split)
    full = model.summary
    curve = full.validationHistory
    best = int(np.argmin(curve)) + 1
    assert len(curve) == full.totalIterations and 3 <= best <= len(curve) - 3, curve  # a minimum inside
    assert not full.stoppedEarly and full.bestIteration == best
    # the validation RMSE is that of the model's predictions on the validation ratings
    heldout = movielens_split.filter("validation")
    rmse = RegressionEvaluator(labelCol="rating").evaluate(model.setColdStartStrategy("drop").transform(heldout))
    assert rmse == pytest.approx(curve[-1], rel=1e-5)

    stopped = est.fit(movielens_split).summary
    assert stopped.stoppedEarly and stopped.bestIteration == best
    assert stopped.totalIterations == best + 2
    assert stopped.validationHistory == pytest.approx(curve[:best + 2], rel=1e-9)
    assert stopped.earlyStopping == {"metric": "validation_rmse", "best_iteration": best,
                                     "best_value": pytest.approx(curve[best - 1]), "stopped_at": best + 2}
    # a validation row marked training changes the fit; the flagged rows are left out of training
    training_only = est.copy({est.earlyStoppingRounds: 0, est.maxIter: 3, est.validationIndicatorCol: ""}).fit(
        movielens_split.filter(~F.col("validation"))).summary
    assert training_only.trainRmseHistory == pytest.approx(full.trainRmseHistory[:3], rel=1e-9)
    replay = EarlyStopping("validation_rmse", 2)
    assert next(i for i, v in enumerate(curve, 1) if replay.update(i, v)) == best + 2


def test_validation_params_are_checked_before_any_job(movielens_split, ratings):
    with pytest.raises(InputError, match=r"validationIndicatorCol 'rating' has type double; expected a boolean"):
        mf(validationIndicatorCol="rating").fit(ratings)
    with pytest.raises(InputError, match=r"validationIndicatorCol 'nope' is not a column"):
        mf(validationIndicatorCol="nope").fit(ratings)
    with pytest.raises(ConfigurationError, match=r"earlyStoppingRounds=-1 must be >= 0"):
        mf(validationIndicatorCol="validation", earlyStoppingRounds=-1).fit(movielens_split)
    with pytest.raises(InputError, match=r"no training ratings.*whose 'validation' is false"):
        mf(validationIndicatorCol="validation").fit(movielens_split.filter("validation"))


@pytest.fixture(scope="module")
def interactions_split(spark):
    """Implicit feedback whose *which* follows a rank-4 taste model (a user meets an item with
    probability sigmoid(1.5 u.v - 3), as MovieLens users pick what they watch): 400 users, 600
    items, ~50 k interactions of strength 1 + Poisson(2p), a fixed 20 % held out."""
    import pandas as pd

    rng = np.random.default_rng(11)
    u, v = rng.normal(size=(400, 4)), rng.normal(size=(600, 4))
    p = 1.0 / (1.0 + np.exp(-(1.5 * (u @ v.T) - 3.0)))
    uu, ii = np.nonzero(rng.random(p.shape) < p)
    frame = pd.DataFrame({"userId": uu.astype(np.int32), "movieId": ii.astype(np.int32),
                          "rating": (1 + rng.poisson(2 * p[uu, ii])).astype(float)})
    frame["validation"] = rng.random(len(frame)) < 0.2
    return spark.createDataFrame(frame).repartition(2).cache()


def test_implicit_feedback_stops_on_the_held_out_mean_percentile_rank(interactions_split):
    """Implicit feedback: after every iteration the held-out positives' mean percentile rank (Hu,
    Koren & Volinsky's expected percentile ranking, each user's training items left out of the
    ranking, weighted by r) -- equal to the one recomputed from the model's factors; a stop rule
    that wants the metric to fall by twice its new value (validationTol=2; the second iteration
    falls by ~1.9 times) ends the fit at iteration 2."""
    est = mf(rank=8, maxIter=6, regParam=0.1, alpha=1.0, implicitPrefs=True, validationIndicatorCol="validation",
             earlyStoppingRounds=0)
    model = est.fit(interactions_split)
    curve = model.summary.validationHistory
    assert len(curve) == 6 and 0.0 < curve[-1] < 0.2 < 0.5  # far better than a random order
    frame = interactions_split.toPandas()
    users = {r.id: np.asarray(r.features) for r in model.userFactors.collect()}
    items = {r.id: np.asarray(r.features) for r in model.itemFactors.collect()}
    ids = np.array(sorted(items))
    h = np.stack([items[i] for i in ids]).astype(np.float64)
    train = frame[~frame.validation]
    seen = train.groupby("userId")["movieId"].apply(set)
    total = weight = 0.0
    for row in frame[frame.validation].itertuples():
        if row.userId not in users or row.movieId not in items:
            continue
        scores = h @ users[row.userId].astype(np.float64)
        mask = ~np.isin(ids, list(seen[row.userId]))
        target = scores[np.searchsorted(ids, row.movieId)]
        total += row.rating * (scores[mask] > target).sum() / (mask.sum() - 1)
        weight += row.rating
    assert curve[-1] == pytest.approx(total / weight, rel=1e-3)

    stopped = est.copy({est.earlyStoppingRounds: 1, est.validationTol: 2.0}).fit(interactions_split).summary
    assert stopped.stoppedEarly and stopped.totalIterations == 2 and stopped.bestIteration == 1
    assert stopped.validationHistory == pytest.approx(curve[:2], rel=1e-3)  # sums arrive in any order: near-ties


@pytest.mark.slow
def test_cross_validator_runs_its_fits_at_once_with_the_metrics_of_sequential_fits(ratings):
    """Fits of one application step at the same time (a step per fit on the shards): with
    parallelism 2 and one worker each, two fits run side by side and every metric equals the
    one-after-another run's."""
    import threading

    from pystrads.engine.scheduler.loop import StepLoop

    grid = ParamGridBuilder().addGrid(StradsMF.regParam, [0.01, 0.05, 0.1, 0.3]).build()

    def cv(parallelism):
        # 100 iterations: each fit's step loop lasts long enough (~0.4 s) for a pair's to overlap
        est = mf(numWorkers=1, maxIter=100, coldStartStrategy="drop")
        return CrossValidator(estimator=est, estimatorParamMaps=grid,
                              evaluator=RegressionEvaluator(labelCol="rating"), numFolds=2, parallelism=parallelism,
                              seed=3).fit(ratings)

    running, most = set(), [0]
    lock = threading.Lock()
    original = StepLoop._step_loop

    def watched(self, *args, **kwargs):  # how many fits are in their step loops at once
        with lock:
            running.add(self.namespace)
            most[0] = max(most[0], len(running))
        try:
            return original(self, *args, **kwargs)
        finally:
            with lock:
                running.discard(self.namespace)

    sequential = cv(1)
    StepLoop._step_loop = watched
    try:
        parallel = cv(2)
    finally:
        StepLoop._step_loop = original
    assert most[0] == 2, "the two fits never stepped at the same time"
    assert parallel.avgMetrics == pytest.approx(sequential.avgMetrics, rel=1e-9)
