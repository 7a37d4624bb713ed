"""StradsLasso / StradsLogisticRegression against pyspark.ml's LinearRegression / LogisticRegression."""

import os
import tempfile

import numpy as np
import pyspark
import pytest
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.classification import LogisticRegression
from pyspark.ml.feature import VectorAssembler
from pyspark.ml.linalg import Vectors
from pyspark.ml.regression import LinearRegression

from pystrads.datasets.synthetic import strads_lasso_problem
from pystrads.errors import ConfigurationError, InputError
from pystrads.programs.lasso import auto_width
from pystrads.ml import StradsLasso, StradsLassoModel, StradsLogisticRegression, StradsLogisticRegressionModel


def weighted_problem(spark, p, offset, seeds):
    """A generated problem as (x, y, binary labels, weights, DataFrame): labels ``y + offset``,
    binary labels from a noisy threshold of the true signal, weights uniform in [0.5, 2]."""
    x = p.dense()
    y = p.y + offset
    w = np.random.default_rng(seeds[0]).uniform(0.5, 2.0, len(y))
    m = x @ p.beta_true
    yb = (m + 0.3 * np.random.default_rng(seeds[1]).standard_normal(len(m)) > np.median(m)).astype(float)
    J = x.shape[1]
    rows = [(float(y[i]), float(yb[i]), float(w[i]),
             Vectors.sparse(J, np.flatnonzero(x[i]).tolist(), x[i][x[i] != 0].tolist())) for i in range(len(y))]
    df = spark.createDataFrame(rows, ["label", "clicked", "w", "features"]).repartition(2).cache()
    return x, y, yb, w, df


@pytest.fixture(scope="module")
def problem(spark):
    return weighted_problem(spark, strads_lasso_problem(400, 60, nnz_per_col=40, seed=5), 3.0, (1, 2))


def weighted_std(v, w):
    """MLlib's (weighted, unbiased) standard deviation, per column of ``v``."""
    W = w.sum()
    mu = w @ v / W
    return np.sqrt(w @ (v - mu) ** 2 / (W - w @ w / W))


def penalty(x, w, beta, lam, std, alpha, l2_scale=1.0):
    """MLlib's elastic-net penalty in the original units: ``lam (alpha sum s|b| + (1 - alpha) / (2 l2_scale)
    sum s^2 b^2)``, ``s`` the feature standard deviations with standardization and 1 without."""
    s = weighted_std(x, w) if std else 1.0
    return lam * (alpha * (s * np.abs(beta)).sum() + (1 - alpha) / (2 * l2_scale) * ((s * beta) ** 2).sum())


def squared_objective(x, y, w, beta, b, lam, std, alpha=1.0):
    # MLlib fits the standardised label with regParam / std(y): the factor stays in the L2 part
    r = y - x @ beta - b
    return 0.5 * (w * r) @ r / w.sum() + penalty(x, w, beta, lam, std, alpha, weighted_std(y, w))


def logistic_objective(x, y, w, beta, b, lam, std, alpha=1.0):
    m = x @ beta + b
    return (w * (np.logaddexp(0, m) - y * m)).sum() / w.sum() + penalty(x, w, beta, lam, std, alpha)


@pytest.mark.parametrize("fit_intercept,standardization", [(True, True), (True, False), (False, True), (False, False)])
def test_lasso_objective_equals_mllib(problem, fit_intercept, standardization):
    x, y, _, w, df = problem
    lam = 0.02
    model = StradsLasso(regParam=lam, fitIntercept=fit_intercept, standardization=standardization, weightCol="w",
                        tol=1e-10, seed=1).fit(df)
    ref = LinearRegression(regParam=lam, elasticNetParam=1.0, fitIntercept=fit_intercept,
                           standardization=standardization, weightCol="w", tol=1e-12, maxIter=5000).fit(df)
    ours = squared_objective(x, y, w, model.coefficients.toArray(), model.intercept, lam, standardization)
    theirs = squared_objective(x, y, w, ref.coefficients.toArray(), ref.intercept, lam, standardization)
    assert ours <= theirs * (1 + 1e-9), (ours, theirs)
    assert abs(ours - theirs) <= 1e-6 * theirs, (ours, theirs)
    assert abs(model.summary.objectiveHistory[-1] - ours) <= 1e-9 * ours  # the summary reports the real objective
    assert (model.intercept != 0.0) == fit_intercept
    np.testing.assert_allclose(model.coefficients.toArray(), ref.coefficients.toArray(), atol=2e-3)


@pytest.mark.parametrize("fit_intercept,standardization", [(True, True), (True, False), (False, True), (False, False)])
def test_elastic_net_objective_equals_mllib_and_sklearn(problem, fit_intercept, standardization):
    import sklearn.linear_model as sklearn
    x, y, _, w, df = problem
    lam = 0.05
    scale = mllib_scale(x, w, standardization)
    sigma_y = weighted_std(y, w)
    for alpha in (0.0, 0.3, 0.7):
        model = StradsLasso(regParam=lam, elasticNetParam=alpha, fitIntercept=fit_intercept,
                            standardization=standardization, weightCol="w", tol=1e-10, seed=1).fit(df)
        ref = LinearRegression(regParam=lam, elasticNetParam=alpha, fitIntercept=fit_intercept,
                               standardization=standardization, weightCol="w", tol=1e-12, maxIter=5000).fit(df)
        # scikit-learn's 1/(2W) sum w r^2 + a r |b|_1 + a (1 - r) / 2 |b|^2 on x / scale is MLlib's
        # objective at a r = lam alpha and a (1 - r) = lam (1 - alpha) / sigma_y
        a = lam * alpha + lam * (1 - alpha) / sigma_y
        sk = sklearn.ElasticNet(alpha=a, l1_ratio=lam * alpha / a, fit_intercept=fit_intercept, tol=1e-14,
                                max_iter=1_000_000).fit(x / scale, y, sample_weight=w)
        coef = model.coefficients.toArray()
        ours = squared_objective(x, y, w, coef, model.intercept, lam, standardization, alpha)
        theirs = squared_objective(x, y, w, ref.coefficients.toArray(), ref.intercept, lam, standardization, alpha)
        skl = squared_objective(x, y, w, sk.coef_ / scale, sk.intercept_, lam, standardization, alpha)
        assert ours <= theirs * (1 + 1e-9), (alpha, ours, theirs)
        assert abs(ours - theirs) <= 1e-6 * theirs, (alpha, ours, theirs)
        assert abs(ours - skl) <= 1e-6 * skl, (alpha, ours, skl)
        assert abs(model.summary.objectiveHistory[-1] - ours) <= 1e-9 * ours  # the summary's objective is it
        # (MLlib's own solvers stop earlier: its coefficients agree to its convergence; scikit-learn's
        # coordinate descent runs to 1e-14)
        np.testing.assert_allclose(coef, ref.coefficients.toArray(), atol=1e-2 * np.abs(coef).max())
        np.testing.assert_allclose(coef, sk.coef_ / scale, atol=1e-4 * np.abs(coef).max())
        # the same support as scikit-learn's (ridge keeps every feature)
        np.testing.assert_array_equal(coef != 0, sk.coef_ != 0, err_msg=f"alpha={alpha}")
        if alpha == 0:
            assert np.all(coef != 0)


@pytest.mark.parametrize("fit_intercept,standardization", [  # the slowest two (MLlib's fits) run with the slow ones
    pytest.param(True, True, marks=pytest.mark.slow), (True, False), pytest.param(False, True, marks=pytest.mark.slow),
    (False, False)])
def test_logistic_objective_equals_mllib(problem, fit_intercept, standardization):
    """Lasso, elastic net and ridge: the objective at MLlib's optimum (OWL-QN / L-BFGS, converged
    here within 100 iterations), with weights."""
    x, _, yb, w, df = problem
    lam = 0.02
    for alpha in (0.0, 0.5, 1.0):  # ridge, elastic net, lasso (each pair of fits ~2-10 s)
        model = StradsLogisticRegression(labelCol="clicked", regParam=lam, elasticNetParam=alpha,
                                         fitIntercept=fit_intercept, standardization=standardization, weightCol="w",
                                         tol=1e-10, maxIter=50).fit(df)
        ref = LogisticRegression(labelCol="clicked", regParam=lam, elasticNetParam=alpha, fitIntercept=fit_intercept,
                                 standardization=standardization, weightCol="w", tol=1e-12, maxIter=300).fit(df)
        coef = model.coefficients.toArray()
        ours = logistic_objective(x, yb, w, coef, model.intercept, lam, standardization, alpha)
        theirs = logistic_objective(x, yb, w, ref.coefficients.toArray(), ref.intercept, lam, standardization,
                                    alpha)
        assert ours <= theirs * (1 + 1e-8), (alpha, ours, theirs)
        assert abs(ours - theirs) <= 1e-6 * theirs, (alpha, ours, theirs)
        assert (model.intercept != 0.0) == fit_intercept
        np.testing.assert_allclose(coef, ref.coefficients.toArray(), atol=1e-3 * np.abs(coef).max())


def test_logistic_elastic_net_matches_sklearn(problem):
    import sklearn.linear_model as sklearn
    x, _, yb, w, df = problem
    lam, alpha = 0.02, 0.5
    model = StradsLogisticRegression(labelCol="clicked", regParam=lam, elasticNetParam=alpha, weightCol="w",
                                     tol=1e-10, maxIter=50).fit(df)
    scale = mllib_scale(x, w, True)
    # scikit-learn's sum w log-loss + (r |b|_1 + (1 - r) / 2 |b|^2) / C is W times MLlib's at C = 1 / (lam W)
    sk = sklearn.LogisticRegression(C=1.0 / (lam * w.sum()), l1_ratio=alpha, solver="saga", tol=1e-12,
                                    max_iter=200_000).fit(x / scale, yb, sample_weight=w)
    ours = logistic_objective(x, yb, w, model.coefficients.toArray(), model.intercept, lam, True, alpha)
    theirs = logistic_objective(x, yb, w, sk.coef_[0] / scale, sk.intercept_[0], lam, True, alpha)
    assert abs(ours - theirs) <= 1e-6 * theirs, (ours, theirs)


def test_lasso_model_outputs_summary_and_persistence(problem, spark):
    x, y, _, w, df = problem
    model = StradsLasso(regParam=0.01, seed=3).fit(df)
    s = model.summary
    assert s.stopReason == "converged"
    assert len(s.objectiveHistory) == len(s.updatesHistory) == s.totalIterations + 1
    assert s.objectiveHistory[-1] < s.objectiveHistory[0]
    assert all(b >= a for a, b in zip(s.updatesHistory, s.updatesHistory[1:]))
    assert model.numFeatures == 60
    pred = model.transform(df).select("prediction").toPandas()["prediction"].to_numpy()
    rows = df.select("features").collect()
    expect = np.array([r[0].toArray() @ model.coefficients.toArray() + model.intercept for r in rows])
    np.testing.assert_allclose(np.sort(pred), np.sort(expect), rtol=1e-12, atol=1e-12)
    assert model.predict(rows[0][0]) == pytest.approx(expect[0])
    ev = model.evaluate(df)
    assert 0 < ev.r2 <= 1 and ev.rootMeanSquaredError == pytest.approx(np.sqrt(ev.meanSquaredError))
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "lasso")
        model.write().overwrite().save(path)
        back = StradsLassoModel.load(path)
        np.testing.assert_array_equal(back.coefficients.toArray(), model.coefficients.toArray())
        assert back.intercept == model.intercept and back.getRegParam() == 0.01 and not back.hasSummary
        est_path = os.path.join(d, "est")
        StradsLasso(regParam=0.5, schedule="shotgun").write().save(est_path)
        est = StradsLasso.load(est_path)
        assert est.getRegParam() == 0.5 and est.getSchedule() == "shotgun"


def test_lasso_summaries_have_mllibs_fields_with_mllibs_values(problem):
    """model.summary and model.evaluate(df) carry LinearRegressionTrainingSummary's /
    LinearRegressionSummary's fields; each equals what MLlib's evaluators (or the formulas
    MLlib documents) give on the same predictions, weights included."""
    from pyspark.ml.evaluation import RegressionEvaluator

    x, y, _, w, df = problem
    model = StradsLasso(regParam=0.01, weightCol="w", seed=3).fit(df)
    s, ev = model.summary, model.evaluate(df)
    n, p = len(y), model.numFeatures
    pred = s.predictions.select("label", "prediction", "w").toPandas()
    for name, metric in (("r2", "r2"), ("rootMeanSquaredError", "rmse"), ("meanSquaredError", "mse"),
                         ("meanAbsoluteError", "mae"), ("explainedVariance", "var")):
        theirs = RegressionEvaluator(labelCol="label", weightCol="w", metricName=metric).evaluate(s.predictions)
        assert getattr(s, name) == pytest.approx(theirs, rel=1e-12) == pytest.approx(getattr(ev, name), rel=1e-12)
    assert s.numInstances == ev.numInstances == n
    assert s.degreesOfFreedom == ev.degreesOfFreedom == n - p - 1  # with an intercept
    assert s.r2adj == pytest.approx(1 - (1 - s.r2) * (n - 1) / (n - p - 1), rel=1e-12)
    np.testing.assert_allclose(np.sort(s.residuals.toPandas()["residuals"]),
                               np.sort(pred["label"] - pred["prediction"]), rtol=0, atol=1e-12)
    assert (s.labelCol, s.predictionCol, s.featuresCol) == ("label", "prediction", "features")
    with pytest.raises(Exception, match="No Std. Error of coefficients available"):
        s.coefficientStandardErrors  # as MLlib's for every solver but "normal" without regularisation
    assert len(s.objectiveHistory) == s.totalIterations + 1  # pystrads' history is still there
    # what evaluate gives under Spark Connect (no JVM model there): the same fields from the evaluators
    from pystrads.ml.regression import LassoEvaluation

    connect = LassoEvaluation(model.transform(df), "prediction", "label", "features", "w", True, p)
    for name in ("r2", "rootMeanSquaredError", "meanSquaredError", "meanAbsoluteError", "explainedVariance", "r2adj",
                 "numInstances", "degreesOfFreedom"):
        assert getattr(connect, name) == pytest.approx(getattr(ev, name), rel=1e-12), name
    assert connect.residuals.count() == n
    with pytest.raises(NotImplementedError, match="No Std. Error"):
        connect.tValues


def test_logistic_summaries_have_mllibs_fields_with_mllibs_values(problem):
    """model.summary and model.evaluate(df) carry BinaryLogisticRegressionTrainingSummary's
    fields; the scalar ones equal MLlib's evaluators on the same predictions, the curves run
    from (0, 0) to (1, 1) and their area is areaUnderROC."""
    from pyspark.ml.evaluation import BinaryClassificationEvaluator, MulticlassClassificationEvaluator

    _, _, yb, _, df = problem
    model = StradsLogisticRegression(labelCol="clicked", regParam=0.01, seed=3).fit(df)
    s, ev = model.summary, model.evaluate(df)
    multi = {m: MulticlassClassificationEvaluator(labelCol="clicked", metricName=m).evaluate(s.predictions)
             for m in ("accuracy", "weightedPrecision", "weightedRecall", "weightedTruePositiveRate",
                       "weightedFalsePositiveRate")}
    for name, value in multi.items():
        assert getattr(s, name) == pytest.approx(value, rel=1e-12) == pytest.approx(getattr(ev, name), rel=1e-12)
    assert s.weightedFMeasure() == pytest.approx(MulticlassClassificationEvaluator(
        labelCol="clicked", metricName="weightedFMeasure").evaluate(s.predictions), rel=1e-12)
    assert s.labels == [0.0, 1.0]
    for label in (0, 1):
        for name, metric in (("precisionByLabel", "precisionByLabel"), ("recallByLabel", "recallByLabel"),
                             ("truePositiveRateByLabel", "truePositiveRateByLabel"),
                             ("falsePositiveRateByLabel", "falsePositiveRateByLabel")):
            theirs = MulticlassClassificationEvaluator(labelCol="clicked", metricName=metric,
                                                       metricLabel=float(label)).evaluate(s.predictions)
            assert getattr(s, name)[label] == pytest.approx(theirs, rel=1e-12), (name, label)
    auc = BinaryClassificationEvaluator(labelCol="clicked", numBins=0).evaluate(s.predictions)
    assert s.areaUnderROC == pytest.approx(auc, abs=0.01) and s.areaUnderROC == pytest.approx(ev.areaUnderROC)
    roc = s.roc.toPandas()
    assert (roc["FPR"].iloc[0], roc["TPR"].iloc[0]) == (0.0, 0.0) and (roc["FPR"].iloc[-1], roc["TPR"].iloc[-1]) == (1.0, 1.0)
    fpr, tpr = roc["FPR"].to_numpy(), roc["TPR"].to_numpy()
    assert float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2)) == pytest.approx(s.areaUnderROC, rel=1e-9)
    assert set(s.pr.columns) == {"recall", "precision"} and set(s.fMeasureByThreshold.columns) == {"threshold", "F-Measure"}
    probability = np.array([v[1] for v in s.predictions.select("probability").toPandas()["probability"]])
    features = np.array([v.toArray() for v in s.predictions.select("features").toPandas()["features"]])
    np.testing.assert_allclose(probability, 1 / (1 + np.exp(-(features @ model.coefficients.toArray()
                                                               + model.intercept))), rtol=1e-12)
    assert len(s.objectiveHistory) == s.totalIterations + 1
    # what evaluate gives under Spark Connect (no JVM model there): the same fields from the evaluators
    from pystrads.ml.classification import LogisticEvaluation

    connect = LogisticEvaluation(model.transform(df), "clicked", "prediction", "rawPrediction", "probability")
    for name in ("accuracy", "weightedPrecision", "weightedRecall", "weightedTruePositiveRate",
                 "weightedFalsePositiveRate", "precisionByLabel", "recallByLabel", "truePositiveRateByLabel",
                 "falsePositiveRateByLabel", "labels"):
        assert getattr(connect, name) == pytest.approx(getattr(ev, name), rel=1e-12), name
    assert connect.weightedFMeasure() == pytest.approx(ev.weightedFMeasure(), rel=1e-12)
    assert connect.fMeasureByLabel() == pytest.approx(ev.fMeasureByLabel(), rel=1e-12)
    assert connect.areaUnderROC == pytest.approx(ev.areaUnderROC, abs=0.01)
    with pytest.raises(NotImplementedError, match="classic"):
        connect.roc


def test_lasso_in_a_pipeline_with_a_vector_assembler(spark):
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal(200), rng.standard_normal(200)
    df = spark.createDataFrame([(float(u), float(v), float(3 * u - 2 * v + 1)) for u, v in zip(a, b)], ["a", "b", "y"])
    pipe = Pipeline(stages=[VectorAssembler(inputCols=["a", "b"], outputCol="features"),
                            StradsLasso(labelCol="y", regParam=0.0, tol=1e-10)])
    model = pipe.fit(df)
    lasso = model.stages[-1]
    np.testing.assert_allclose(lasso.coefficients.toArray(), [3.0, -2.0], atol=1e-6)
    assert lasso.intercept == pytest.approx(1.0, abs=1e-6)
    with tempfile.TemporaryDirectory() as d:
        model.write().overwrite().save(os.path.join(d, "pm"))
        back = PipelineModel.load(os.path.join(d, "pm"))
        out = back.transform(df).select("y", "prediction").toPandas()
        np.testing.assert_allclose(out["prediction"], out["y"], atol=1e-5)


@pytest.mark.slow  # several seconds; the README's command keeps a faster test of the same kind
def test_a_working_set_limit_the_multinomial_loss_ignores_is_named_in_a_warning(problem, caplog):
    """workingSetLimit sizes the squared and binary log-loss's working sets: set on a multinomial
    StradsLogisticRegression, whose rounds never use them, the fit says it is ignored; the
    binomial one and StradsLasso use it and say nothing."""
    _, _, _, _, df = problem
    with caplog.at_level("WARNING", logger="pystrads.ml.classification"):
        StradsLogisticRegression(labelCol="clicked", regParam=0.01, maxIter=2, workingSetLimit=64,
                                 family="multinomial").fit(df)
    assert "StradsLogisticRegression: workingSetLimit=64 is ignored with the multinomial loss" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="pystrads.ml.classification"):
        StradsLogisticRegression(labelCol="clicked", regParam=0.01, maxIter=2, workingSetLimit=64).fit(df)
    with caplog.at_level("WARNING", logger="pystrads.ml.regression"):
        StradsLasso(regParam=0.01, maxIter=2, workingSetLimit=64).fit(df)
    assert "workingSetLimit" not in caplog.text


def test_logistic_output_columns_match_mllib(problem):
    _, _, _, _, df = problem
    # the defaults of both: elasticNetParam 0 (ridge), MLlib's
    ours = StradsLogisticRegression(labelCol="clicked", regParam=0.01).fit(df)
    ref = LogisticRegression(labelCol="clicked", regParam=0.01).fit(df)
    assert ours.getElasticNetParam() == ref.getElasticNetParam() == 0.0
    a, b = ours.transform(df), ref.transform(df)
    for col in ("rawPrediction", "probability", "prediction"):
        assert a.schema[col].dataType == b.schema[col].dataType
    agree = np.mean(a.select("prediction").toPandas()["prediction"].to_numpy()
                    == b.select("prediction").toPandas()["prediction"].to_numpy())
    assert agree > 0.97
    from pyspark.ml.evaluation import BinaryClassificationEvaluator

    theirs = BinaryClassificationEvaluator(labelCol="clicked").evaluate(b)
    assert ours.evaluate(df).areaUnderROC == pytest.approx(theirs, abs=0.01)
    # per-class thresholds set on the fitted models: MLlib's rule (largest p_i / t_i)
    base = a.select("prediction").toPandas()["prediction"].to_numpy()
    ours.setThresholds([0.2, 0.8])
    ref.setThresholds([0.2, 0.8])
    assert ours.getThreshold() == pytest.approx(ref.getThreshold()) == pytest.approx(0.8)
    moved = ours.transform(df).select("probability", "prediction").toPandas()
    p1 = np.array([v[1] for v in moved["probability"]])
    np.testing.assert_array_equal(moved["prediction"].to_numpy(), (p1 / 0.8 > (1 - p1) / 0.2).astype(float))
    assert moved["prediction"].sum() < base.sum()  # a stricter cut for class 1
    agree = np.mean(moved["prediction"].to_numpy() == ref.transform(df).toPandas()["prediction"].to_numpy())
    assert agree > 0.97
    ours.setThreshold(0.5)
    assert not ours.isSet(ours.thresholds) and ours.getThreshold() == 0.5
    with pytest.raises(ConfigurationError, match="thresholds"):
        ours.copy().setThresholds([0.0, 0.0]).transform(df)
    with tempfile.TemporaryDirectory() as d:
        ours.write().save(os.path.join(d, "m"))
        back = StradsLogisticRegressionModel.load(os.path.join(d, "m"))
        assert back.transform(df).select("prediction").collect() == a.select("prediction").collect()


@pytest.mark.parametrize("path", ["arrow_udf", pytest.param("mapInArrow", marks=pytest.mark.slow)])
def test_arrow_scoring_equals_mllibs_jvm_scoring(problem, spark, monkeypatch, path):
    """transform without a JVM model (as under Spark Connect) scores in Arrow (an Arrow UDF of the
    features where pyspark has one, else mapInArrow batches of whole rows) and gives
    MLlib's columns and values: sparse, dense and null feature rows, a replaced column, a
    threshold, and a vector of the wrong size refused by name."""
    from pyspark.ml.classification import LogisticRegressionModel
    from pyspark.ml.linalg import VectorUDT
    from pyspark.ml.regression import LinearRegressionModel
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from pyspark.sql import functions

    if path == "arrow_udf" and not hasattr(functions, "arrow_udf"):
        pytest.skip(f"pyspark {pyspark.__version__} has no arrow_udf (4.1+): the mapInArrow case covers it")
    _, _, _, _, df = problem
    lasso = StradsLasso(regParam=0.01).fit(df)
    logistic = StradsLogisticRegression(labelCol="clicked", regParam=0.01, threshold=0.4).fit(df)
    if path == "mapInArrow":
        for model in (lasso, logistic):
            monkeypatch.setattr(model, "_margin_column", lambda dataset: None)
    x = df.toPandas()
    p = len(x["features"][0])
    rows = [(float(i), x["features"][i] if i % 3 else Vectors.dense(x["features"][i].toArray())) for i in range(60)]
    schema = T.StructType([T.StructField("id", T.DoubleType()), T.StructField("features", VectorUDT())])
    mixed = spark.createDataFrame(rows, schema).repartition(3)
    jvm = {m: m._mllib_model(mixed) for m in (lasso, logistic)}
    assert isinstance(jvm[lasso], LinearRegressionModel) and isinstance(jvm[logistic], LogisticRegressionModel)
    for model in (lasso, logistic):
        monkeypatch.setattr(model, "_mllib_model", lambda dataset: None)  # as under Spark Connect
        ours = model.transform(mixed).orderBy("id").toPandas()
        theirs = jvm[model].transform(mixed).orderBy("id").toPandas()
        assert list(ours.columns) == list(theirs.columns)
        for col in ours.columns:
            if col == "features":
                continue
            a, b = ours[col].to_numpy(), theirs[col].to_numpy()
            a, b = (np.array([v.toArray() for v in a]), np.array([v.toArray() for v in b])) \
                if hasattr(a[0], "toArray") else (a.astype(float), b.astype(float))
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14, err_msg=col)
        if model is logistic:
            assert 0 < theirs["prediction"].sum() < 60  # both classes predicted
        null = model.transform(spark.createDataFrame([(61.0, None)], schema)).first()  # MLlib's fails on a null
        assert [null[c] for c in null.asDict() if c not in ("id", "features")] == [None] * (len(null) - 2)
    wrong = spark.createDataFrame([(Vectors.sparse(p + 1, [p], [1.0]),)], ["features"])
    with pytest.raises(Exception, match=f"column 'features' has a vector of size {p + 1} where the model has {p}"):
        lasso.transform(wrong).collect()
    with pytest.raises(InputError, match="column 'prediction' already exists in the input"):
        lasso.transform(mixed.withColumn("prediction", F.lit(-1.0)))  # refused before any job, as MLlib refuses


def test_logistic_matches_sklearn(problem):
    import sklearn.linear_model as sklearn
    x, _, yb, _, df = problem
    lam = 0.01
    model = StradsLogisticRegression(labelCol="clicked", regParam=lam, elasticNetParam=1.0, standardization=False,
                                     tol=1e-8, maxIter=6).fit(df)
    sk = sklearn.LogisticRegression(C=1.0 / (lam * len(yb)), l1_ratio=1.0, solver="saga", tol=1e-12,
                                    max_iter=100000).fit(x, yb)
    w = np.ones(len(yb))
    ours = logistic_objective(x, yb, w, model.coefficients.toArray(), model.intercept, lam, False)
    theirs = logistic_objective(x, yb, w, sk.coef_[0], sk.intercept_[0], lam, False)
    assert abs(ours - theirs) <= 1e-5 * theirs, (ours, theirs)


@pytest.mark.parametrize("params,message", [
    ({"regParam": -1.0}, "regParam=-1.0"),
    ({"elasticNetParam": -0.1}, "elasticNetParam=-0.1"),
    ({"schedule": "random"}, "schedule='random'"),
    ({"maxIter": -1}, "maxIter=-1"),
    ({"tol": 0.0}, "tol=0.0"),
    ({"coordinatesPerRound": 8, "candidatesPerRound": 4}, "candidatesPerRound=4"),
    ({"coordinatesPerRound": 0}, "coordinatesPerRound=0 must be 'auto' or >= 1"),
    ({"correlationThreshold": 0.0}, "correlationThreshold=0.0"),
    ({"featuresCol": "nope"}, "featuresCol 'nope'"),
    ({"labelCol": "name"}, "labelCol 'name' has type string"),
    ({"featuresCol": "label"}, "featuresCol 'label' has type double"),
])
def test_bad_params_and_columns_are_refused_before_training(spark, params, message):
    df = spark.createDataFrame([(1.0, "a", Vectors.dense([1.0, 2.0]))], ["label", "name", "features"])
    with pytest.raises((ConfigurationError, InputError), match=message.replace("(", r"\(")):
        StradsLasso(**params).fit(df)


@pytest.mark.parametrize("rows,message", [
    ([(1.0, Vectors.dense([1.0, float("nan")]))], "featuresCol 'features' has a value nan"),
    ([(float("inf"), Vectors.dense([1.0, 2.0]))], "labelCol 'label' has value inf"),
    ([(1.0, Vectors.dense([1.0, 2.0])), (2.0, Vectors.dense([1.0, 2.0, 3.0]))], "different sizes"),
])
def test_bad_values_are_refused_naming_the_column(spark, rows, message):
    df = spark.createDataFrame(rows, ["label", "features"])
    with pytest.raises(InputError, match=message):
        StradsLasso().fit(df)


def test_empty_input_and_non_binary_labels_are_refused(spark, problem):
    _, _, _, _, df = problem
    with pytest.raises(InputError, match="no rows"):
        StradsLasso().fit(df.limit(0))
    with pytest.raises(InputError, match="labelCol 'label' has value .*needs class indices 0, 1, 2"):
        StradsLogisticRegression().fit(df)


def test_arrow_input_reads_the_same_rows_as_the_row_reader(spark):
    """The estimators read vectors through Arrow (``mapInArrow``) in batches; the rows and the
    counts must be what the row-by-row reader gives, for dense rows (zeros
    dropped), sparse rows, empty rows and weights -- and a bad value is named the same way."""
    from pystrads.ml._arrow import collect_per_partition
    from pystrads.ml._linear_input import batch_blocks, scan_input
    from pystrads.programs._rows import canonical_order, rows_to_arrays

    rng = np.random.default_rng(5)
    rows = []
    for i in range(700):
        if i % 3 == 0:
            dense = rng.normal(size=6) * (rng.random(6) < 0.5)
            vec = Vectors.dense(dense)
        elif i % 7 == 0:
            vec = Vectors.sparse(6, [], [])
        else:
            idx = np.sort(rng.choice(6, size=int(rng.integers(1, 4)), replace=False))
            vec = Vectors.sparse(6, idx.tolist(), rng.normal(size=len(idx)).tolist())
        rows.append((float(rng.normal()), float(rng.integers(0, 3)), vec))
    df = spark.createDataFrame(rows, ["label", "w", "features"]).repartition(3)
    arrow_records, arrow_stats = scan_input(df, "features", "label", "w", False, num_workers=2)
    row_records, row_stats = scan_input(df, "features", "label", "w", False, num_workers=0)
    assert arrow_records.rdd.getNumPartitions() == 2  # one partition per worker
    # what the workers' load reads: each Arrow batch as a row block
    blocks = [blk for part in collect_per_partition(arrow_records, lambda bs: [x for b in bs for x in batch_blocks(b)])
              for blk in part]
    assert blocks and all(type(b).__name__ == "RowBlock" for b in blocks)
    for key in ("rows", "nnz", "sizes", "error"):
        assert arrow_stats[key] == row_stats[key], key
    assert arrow_stats["rows"] == 700 and arrow_stats["sizes"] == {6}
    assert arrow_stats["wsum"] == pytest.approx(row_stats["wsum"], rel=1e-12)
    a = canonical_order(*rows_to_arrays(blocks, 6))
    b = canonical_order(*rows_to_arrays(row_records.collect(), 6))
    assert len(a[3]) == sum(1 for r in rows if r[1] != 0)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    bad = spark.createDataFrame(rows[:5] + [(1.0, 1.0, Vectors.dense([0.0, float("nan"), 1, 0, 0, 0]))],
                                ["label", "w", "features"])
    _, stats = scan_input(bad, "features", "label", "w", False, num_workers=2)
    assert stats["error"][0] == "featuresCol 'features' has a value nan"


# ------------------------------------------------------------------ parallel rounds (workingSetLimit=0)


@pytest.fixture(scope="module")
def wide_problem(spark):
    """600 rows x 400 sparse features (correlated neighbours, as the STRADS generator makes them)
    and row weights: with ``workingSetLimit=0`` every update runs in the scheduled parallel
    rounds over the workers' data, which these tests hold to scikit-learn's optimum."""
    return weighted_problem(spark, strads_lasso_problem(600, 400, nnz_per_col=30, corr_prob=0.2, support=20, seed=11),
                            2.0, (3, 4))


def mllib_scale(x, w, standardization):
    """Column scales that turn MLlib's penalty ``lam * std_j |beta_j|`` (weighted, unbiased std)
    into scikit-learn's plain ``lam |b_j|`` on the features ``x / scale``."""
    if not standardization:
        return np.ones(x.shape[1])
    W = w.sum()
    mu = w @ x / W
    return np.sqrt(w @ (x - mu) ** 2 / (W - w @ w / W))


@pytest.mark.parametrize("fit_intercept,standardization", [(True, True), (False, False)])
def test_lasso_parallel_rounds_reach_sklearns_optimum(wide_problem, fit_intercept, standardization):
    import sklearn.linear_model as sklearn
    x, y, _, w, df = wide_problem
    lam = 0.02
    model = StradsLasso(regParam=lam, fitIntercept=fit_intercept, standardization=standardization, weightCol="w",
                        workingSetLimit=0, coordinatesPerRound=128, candidatesPerRound=256, tol=1e-9, maxIter=400,
                        seed=2).fit(df)
    s = model.summary
    assert s.roundUpdatesHistory[-1] > 0 and s.roundUpdatesHistory[-1] == s.updatesHistory[-1]  # rounds only
    scale = mllib_scale(x, w, standardization)
    # scikit-learn normalises sample weights to sum to n: its objective is MLlib's 1/(2W) sum w r^2
    sk = sklearn.Lasso(alpha=lam, fit_intercept=fit_intercept, tol=1e-12, max_iter=1_000_000)
    sk.fit(x / scale, y, sample_weight=w)
    sk_beta = sk.coef_ / scale
    ours = squared_objective(x, y, w, model.coefficients.toArray(), model.intercept, lam, standardization)
    theirs = squared_objective(x, y, w, sk_beta, sk.intercept_, lam, standardization)
    assert abs(ours - theirs) <= 1e-7 * theirs, (ours, theirs)
    assert np.count_nonzero(sk_beta) >= 10  # a problem whose solution the rounds must find, not all zeros
    np.testing.assert_allclose(model.coefficients.toArray(), sk_beta, atol=1e-3 * np.abs(sk_beta).max())
    assert model.intercept == pytest.approx(sk.intercept_, abs=1e-3 * max(1.0, abs(sk.intercept_)))


def test_the_auto_round_width_follows_the_data_and_pipelined_rounds_reach_sklearns_optimum(wide_problem):
    import sklearn.linear_model as sklearn
    x, y, _, w, df = wide_problem
    lam = 0.02
    model = StradsLasso(regParam=lam, weightCol="w", workingSetLimit=0, tol=1e-9, maxIter=400, seed=2).fit(df)
    steps = model.summary.steps
    row_nnz = np.count_nonzero(x, axis=1).astype(float)
    expected = auto_width(x.shape[1], row_nnz.sum(), row_nnz @ row_nnz, 2)  # local[2]: two workers
    assert 16 < expected <= x.shape[1]
    assert steps["coordinates_per_round"].dropna().tolist() == [expected]
    assert steps["planned_ahead"].any() and not steps["planned_ahead"].iloc[:2].any()  # once the set settled
    assert model.summary.timings["schedule_wait_s"] < model.summary.timings["schedule_s"]
    scale = mllib_scale(x, w, True)
    sk = sklearn.Lasso(alpha=lam, tol=1e-12, max_iter=1_000_000).fit(x / scale, y, sample_weight=w)
    ours = squared_objective(x, y, w, model.coefficients.toArray(), model.intercept, lam, True)
    theirs = squared_objective(x, y, w, sk.coef_ / scale, sk.intercept_, lam, True)
    assert abs(ours - theirs) <= 1e-7 * theirs, (ours, theirs)


def test_relaxation_reaches_the_rounds_and_plain_steps_follow_another_path(wide_problem):
    """``relaxation`` is the program's: 1 (plain coordinate descent) and the default 1.8 take
    different paths through the same rounds, both lowering the objective every iteration."""
    _, _, _, _, df = wide_problem
    paths = {}
    for omega in (1.0, None):
        est = StradsLasso(regParam=0.02, weightCol="w", workingSetLimit=0, coordinatesPerRound=32,
                          candidatesPerRound=64, tol=1e-12, maxIter=4, seed=2)
        if omega is not None:
            est.setRelaxation(omega)
        paths[omega] = np.array(est.fit(df).summary.objectiveHistory)
        assert np.all(np.diff(paths[omega]) <= 0), paths
    assert StradsLasso().getRelaxation() == 1.8
    assert paths[None][0] == paths[1.0][0] and paths[None][-1] != pytest.approx(paths[1.0][-1], rel=1e-9), paths


@pytest.mark.slow
def test_logistic_parallel_rounds_reach_sklearns_optimum(wide_problem):
    import sklearn.linear_model as sklearn
    x, _, yb, w, df = wide_problem
    # at 0.005 scikit-learn's saga needs ~80,000 epochs (about 4 minutes) to reach tol 1e-12 here;
    # at 0.01 about 4,000, with ~150 non-zero coefficients still to find
    lam = 0.01
    model = StradsLogisticRegression(labelCol="clicked", regParam=lam, elasticNetParam=1.0, weightCol="w",
                                     workingSetLimit=0,
                                     coordinatesPerRound=128, candidatesPerRound=256, tol=1e-9, maxIter=400,
                                     seed=2).fit(df)
    assert model.summary.roundUpdatesHistory[-1] > 0
    scale = mllib_scale(x, w, True)
    # scikit-learn's sum_i w_i log-loss + 1/C |b|_1 is W (MLlib's objective) at C = 1 / (lam W)
    sk = sklearn.LogisticRegression(C=1.0 / (lam * w.sum()), l1_ratio=1.0, solver="saga", tol=1e-12,
                                    max_iter=200_000).fit(x / scale, yb, sample_weight=w)
    sk_beta = sk.coef_[0] / scale
    ours = logistic_objective(x, yb, w, model.coefficients.toArray(), model.intercept, lam, True)
    theirs = logistic_objective(x, yb, w, sk_beta, sk.intercept_[0], lam, True)
    assert abs(ours - theirs) <= 1e-6 * theirs, (ours, theirs)
    assert np.count_nonzero(np.abs(sk_beta) > 1e-8) >= 5
    # the margins, not each coefficient: a nearly flat objective along pairs of correlated columns
    # (the generator copies a column's rows to its neighbour) leaves such pairs free to trade weight
    ours_margin = x @ model.coefficients.toArray() + model.intercept
    sk_margin = x @ sk_beta + sk.intercept_[0]
    np.testing.assert_allclose(ours_margin, sk_margin, atol=1e-2 * np.abs(sk_margin).max())


@pytest.fixture(scope="module")
def overfitting_problem(spark):
    """400 rows x 300 dense features, 10 of them relevant, half the rows marked for validation: with
    a tiny regParam the fit overfits the 200 training rows, so the validation loss falls to a
    minimum and rises after it."""
    rng = np.random.default_rng(0)
    n, p = 400, 300
    X = rng.standard_normal((n, p))
    beta = np.zeros(p)
    beta[:10] = rng.standard_normal(10)
    y = X @ beta + rng.standard_normal(n) + 3.0
    labels = (1.0 / (1.0 + np.exp(-(X @ beta))) > rng.random(n)).astype(float)
    held = rng.random(n) < 0.5
    return spark.createDataFrame([(float(y[i]), float(labels[i]), Vectors.dense(X[i]), bool(held[i]))
                                  for i in range(n)], ["y", "binary", "features", "validation"]).cache()


@pytest.mark.parametrize("estimator", ["lasso", "logistic"])
def test_early_stopping_on_the_validation_loss(overfitting_problem, estimator):
    """The validation rows are never trained on; after every iteration their mean loss (half the
    squared error; the log-loss) is that of the model's predictions at that point; the fit stops 2
    iterations after the best one."""
    df = overfitting_problem
    common = dict(featuresCol="features", maxIter=60, tol=1e-12, validationIndicatorCol="validation",
                  workingSetLimit=0, coordinatesPerRound=8)
    if estimator == "lasso":
        est = StradsLasso(labelCol="y", regParam=0.001, relaxation=1.0, **common)
    else:
        est = StradsLogisticRegression(labelCol="binary", regParam=0.0001, **common)
    model = est.fit(df)
    summary = model.summary
    curve = summary.validationHistory
    best = int(np.argmin(curve)) + 1
    assert summary.stoppedEarly and summary.stopReason.startswith("early stopping: validation_loss")
    assert summary.bestIteration == best and summary.totalIterations == len(curve) == best + 2 < 60
    assert curve[0] > curve[best - 1] < curve[-1]  # falls to the best, then rises
    held = df.filter("validation")
    rows = model.transform(held).collect()
    if estimator == "lasso":
        loss = 0.5 * np.mean([(r.y - r.prediction) ** 2 for r in rows])
    else:
        p1 = np.array([r.probability[1] for r in rows])
        y = np.array([r.binary for r in rows])
        loss = -np.mean(y * np.log(p1) + (1 - y) * np.log(1 - p1))
    assert curve[-1] == pytest.approx(loss, rel=1e-8)
    assert summary.numInstances == df.filter("not validation").count() and summary.numValidationInstances == len(rows)


def test_every_row_marked_for_validation_is_refused(overfitting_problem):
    with pytest.raises(InputError, match=r"validationIndicatorCol 'validation' marks every row \(\d+\) for validation"):
        StradsLasso(labelCol="y", validationIndicatorCol="validation").fit(overfitting_problem.filter("validation"))


def test_a_model_carries_its_estimators_uid(spark):
    """As MLlib's models do (pyspark's JavaModel takes the Java model's uid, the estimator's):
    tools key fitted stages on it, and the model's params belong to that uid."""
    from pystrads.ml import StradsLDA
    from pystrads.testing import _lda_data, _linear_data

    for est, df in ((StradsLasso(regParam=0.01, maxIter=5), _linear_data(spark, False)),
                    (StradsLDA(k=2, maxIter=3, seed=1), _lda_data(spark))):
        model = est.fit(df)
        assert model.uid == est.uid, type(est).__name__
        assert all(p.parent == est.uid for p in model.params)
