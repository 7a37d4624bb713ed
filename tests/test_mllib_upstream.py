"""What Spark's own Python tests (``python/pyspark/ml/tests``: test_algorithms, test_clustering,
test_regression, test_classification, test_als, test_tuning, test_persistence, test_param,
test_training_summary) expect of LDA, ALS, LinearRegression and LogisticRegression, asked of the
drop-ins: their calls and checks, on their small inputs, with the values compared where the
objective is MLlib's."""

import os

import numpy as np
import pytest
from pyspark.ml.linalg import DenseVector, Vectors
from pyspark.sql import Row

from pystrads.ml import (StradsLasso, StradsLassoModel, StradsLDA, StradsLDAModel, StradsLogisticRegression,
                         StradsLogisticRegressionModel, StradsMF, StradsMFModel)


def test_param_type_conversion_as_test_param():
    lr = StradsLogisticRegression(maxIter=5.0, tol=1)
    assert lr.getMaxIter() == 5 and type(lr.getMaxIter()) is int
    assert lr.getTol() == 1.0 and type(lr.getTol()) is float
    for bad in (dict(maxIter=5.1), dict(maxIter="notAnInt"), dict(featuresCol=2.3), dict(fitIntercept=1),
                dict(fitIntercept="false")):
        with pytest.raises(TypeError):
            StradsLogisticRegression(**bad)
    assert StradsLogisticRegression().setFeaturesCol(np.str_("features")).getFeaturesCol() == "features"


def test_default_params_round_trip_keeps_what_is_set_and_what_is_default(spark, tmp_path):
    """test_persistence's test_default_read_write(_default_params): set values, defaults and isSet
    survive a save and an overwrite."""
    lr = StradsLogisticRegression().setMaxIter(50).setThreshold(0.75)
    assert not lr.isSet("predictionCol") and lr.hasDefault("predictionCol")
    path = str(tmp_path / "lr")
    lr.save(path)
    back = StradsLogisticRegression.load(path)
    assert back.uid == lr.uid and back.extractParamMap() == lr.extractParamMap()
    assert back.isSet("threshold") and not back.isSet("predictionCol")
    lr.setThreshold(0.8)
    lr.write().overwrite().save(path)
    assert StradsLogisticRegression.load(path).getThreshold() == 0.8


def test_logistic_thresholds_at_the_edges_as_test_classification(spark):
    """test_logistic_regression_with_threshold: threshold 0 predicts 1 everywhere, 1 predicts 0
    everywhere, 0.5 the fitted classes; predict() agrees with transform()."""
    df = spark.createDataFrame([(1.0, 1.0, Vectors.dense(0.0, 5.0)), (0.0, 2.0, Vectors.dense(1.0, 2.0)),
                                (1.0, 3.0, Vectors.dense(2.0, 1.0)), (0.0, 4.0, Vectors.dense(3.0, 3.0))],
                               ["label", "weight", "features"])
    model = StradsLogisticRegression(weightCol="weight").fit(df)
    for threshold, expected in ((0.0, [1, 1, 1, 1]), (0.5, [0, 1, 1, 0]), (1.0, [0, 0, 0, 0])):
        model.setThreshold(threshold)
        got = [r.prediction for r in model.transform(df).orderBy("weight").collect()]
        assert got == expected, (threshold, got)
        assert [model.predict(r.features) for r in df.orderBy("weight").collect()] == expected


def test_exact_regression_through_the_origin_as_test_training_summary(spark):
    """test_linear_regression_summary's data: an exact fit without an intercept (one all-zero
    sparse row): r2 = r2adj = 1, no error, MLlib's other fields."""
    df = spark.createDataFrame([(1.0, 2.0, Vectors.dense(1.0)), (0.0, 2.0, Vectors.sparse(1, [], []))],
                               ["label", "weight", "features"])
    model = StradsLasso(weightCol="weight", fitIntercept=False, regParam=0.0, maxIter=5).fit(df)
    s = model.summary
    assert model.coefficients[0] == pytest.approx(1.0, abs=1e-9) and model.intercept == 0.0
    assert s.r2 == pytest.approx(1.0) and s.r2adj == pytest.approx(1.0)
    assert s.meanAbsoluteError == pytest.approx(0.0, abs=1e-9) and s.rootMeanSquaredError == pytest.approx(0, abs=1e-9)
    assert s.explainedVariance == pytest.approx(0.25) and s.degreesOfFreedom == 1 and s.numInstances == 2
    assert s.predictionCol == "prediction" and s.labelCol == "label" and s.featuresCol == "features"
    assert s.residuals.columns == ["residuals"] and s.residuals.count() == 2
    assert isinstance(s.coefficientStandardErrors, list) and s.coefficientStandardErrors == pytest.approx([0.0])
    assert isinstance(s.tValues, list) and isinstance(s.pValues, list) and len(s.pValues) == 1
    assert not isinstance(model.evaluate(df), type(s))  # evaluate gives a plain summary


def test_weighted_regression_reaches_mllibs_unregularised_answer(spark, tmp_path):
    """test_regression's test_linear_regression: weights, no penalty: MLlib's coefficients,
    intercept and prediction; the model overwrites its estimator's directory and loads equal."""
    df = spark.createDataFrame([(1.0, 1.0, Vectors.dense(0.0, 5.0)), (0.0, 2.0, Vectors.dense(1.0, 2.0)),
                                (1.5, 3.0, Vectors.dense(2.0, 1.0)), (0.7, 4.0, Vectors.dense(1.5, 3.0))],
                               ["label", "weight", "features"])
    lr = StradsLasso(regParam=0.0, maxIter=50, weightCol="weight", tol=1e-12)
    model = lr.fit(df)
    assert model.intercept == pytest.approx(-0.35, abs=1e-4)
    np.testing.assert_allclose(model.coefficients.toArray(), [0.65, 0.1125], atol=1e-4)
    assert model.predict(Vectors.dense(0.0, 5.0)) == pytest.approx(0.2125, abs=1e-4)
    # least squares' inference, as MLlib's normal solver gives it (upstream's figures, and MLlib's own)
    from pyspark.ml.regression import LinearRegression

    s, ref = model.summary, LinearRegression(regParam=0.0, solver="normal", weightCol="weight").fit(df).summary
    np.testing.assert_allclose(s.coefficientStandardErrors, [1.2860, 0.6249, 3.1645], atol=1e-4)
    for name in ("coefficientStandardErrors", "tValues", "pValues"):
        np.testing.assert_allclose(getattr(s, name), getattr(ref, name), rtol=1e-6, err_msg=name)
    with pytest.raises(NotImplementedError, match="regularised fit .regParam > 0. has none"):
        StradsLasso(regParam=0.1, weightCol="weight").fit(df).summary.pValues
    path = str(tmp_path / "lr")
    lr.save(path)
    model.write().overwrite().save(path)
    back = StradsLassoModel.load(path)
    assert str(back) == str(model) and back.coefficients == model.coefficients


def test_binary_summary_methods_as_test_training_summary(spark):
    df = spark.createDataFrame([(1.0, 2.0, Vectors.dense(1.0)), (0.0, 2.0, Vectors.sparse(1, [], []))],
                               ["label", "weight", "features"])
    model = StradsLogisticRegression(maxIter=5, regParam=0.01, weightCol="weight", fitIntercept=False).fit(df)
    s = model.summary
    assert s.totalIterations > 0 and len(s.objectiveHistory) == s.totalIterations + 1
    assert s.labels == [0.0, 1.0] and len(s.fMeasureByLabel()) == 2 == len(s.fMeasureByLabel(1.0))
    assert isinstance(s.weightedFMeasure(1.0), float) and 0 <= s.areaUnderROC <= 1
    for frame, columns in ((s.roc, ["FPR", "TPR"]), (s.pr, ["recall", "precision"]),
                           (s.fMeasureByThreshold, ["threshold", "F-Measure"]),
                           (s.precisionByThreshold, ["threshold", "precision"]),
                           (s.recallByThreshold, ["threshold", "recall"])):
        assert frame.columns == columns and frame.count() > 0
    assert sorted(model.evaluate(df).predictions.collect()) == sorted(s.predictions.collect())


@pytest.mark.slow  # several seconds; the README's command keeps a faster test of the same kind
def test_train_validation_split_over_max_iter_zero_and_one(spark, tmp_path):
    """test_tuning's grid over maxIter [0, 1]: the maxIter=0 model is MLlib's starting point
    (an AUC of 0.5), the TVS and its model save and load."""
    from pyspark.ml.evaluation import BinaryClassificationEvaluator
    from pyspark.ml.tuning import ParamGridBuilder, TrainValidationSplit, TrainValidationSplitModel

    rows = [(Vectors.dense([float(i % 7) - 3.0]), float(i % 7 > 3)) for i in range(40)]
    df = spark.createDataFrame(rows, ["features", "label"])
    lr = StradsLogisticRegression()
    grid = ParamGridBuilder().addGrid(lr.maxIter, [0, 1]).build()
    tvs = TrainValidationSplit(estimator=lr, estimatorParamMaps=grid, evaluator=BinaryClassificationEvaluator(),
                               seed=42)
    model = tvs.fit(df)
    assert model.validationMetrics[0] == pytest.approx(0.5) and model.validationMetrics[1] > 0.9
    assert model.bestModel.summary.totalIterations == 1
    path = str(tmp_path / "tvs")
    tvs.save(path)
    assert str(TrainValidationSplit.load(path).getEstimator()) == str(lr)
    model.write().overwrite().save(path + "_model")
    back = TrainValidationSplitModel.load(path + "_model")
    assert isinstance(back.bestModel, StradsLogisticRegressionModel)
    assert back.bestModel.coefficients == model.bestModel.coefficients


@pytest.mark.slow
def test_one_vs_rest_trains_the_drop_in_per_class(spark, tmp_path):
    """test_algorithms' OneVsRestTests: OneVsRest of the binomial drop-in (its label columns
    are named mc2b$<i>), with weights, copies of the classifier's params, the same sub-models
    at parallelism 1 and 2, and persistence."""
    from pyspark.ml.classification import OneVsRest, OneVsRestModel

    df = spark.createDataFrame([(0.0, 1.0, Vectors.dense(1.0, 0.8)), (1.0, 1.0, Vectors.sparse(2, [], [])),
                                (2.0, 2.0, Vectors.dense(0.5, 0.5))] * 4, ["label", "weight", "features"])
    lr = StradsLogisticRegression(maxIter=5, regParam=0.01)
    ovr = OneVsRest(classifier=lr, weightCol="weight")
    assert ovr.copy({lr.maxIter: 10}).getClassifier().getMaxIter() == 10
    model = ovr.fit(df)
    out = model.transform(df)
    assert out.columns == ["label", "weight", "features", "rawPrediction", "prediction"]
    assert isinstance(out.head().rawPrediction, DenseVector)
    assert model.copy({model.predictionCol: "indexed"}).transform(df).columns[-1] == "indexed"
    parallel = OneVsRest(classifier=lr, weightCol="weight", parallelism=2).fit(df)
    for one, two in zip(model.models, parallel.models):
        np.testing.assert_allclose(one.coefficients.toArray(), two.coefficients.toArray(), atol=1e-4)
    path = str(tmp_path / "ovr")
    model.save(path)
    back = OneVsRestModel.load(path)
    assert [type(m) for m in back.models] == [StradsLogisticRegressionModel] * 3
    assert [r.prediction for r in back.transform(df).collect()] == [r.prediction for r in out.collect()]


def test_lda_on_upstreams_two_document_corpus(spark, tmp_path):
    """test_clustering's test_local_lda / LDATest: two documents of one token each, k=2: uid,
    likelihoods, describeTopics past the vocabulary, transform's columns, save and load."""
    df = spark.createDataFrame([(1, Vectors.dense([0.0, 1.0])), (2, Vectors.sparse(2, {0: 1.0}))],
                               ["id", "features"])
    lda = StradsLDA(k=2, seed=1, optimizer="em").setMaxIter(1)
    model = lda.fit(df)
    assert lda.uid == model.uid and model.vocabSize() == 2
    assert isinstance(model.logLikelihood(df), float) and isinstance(model.logPerplexity(df), float)
    topics = model.describeTopics()
    assert topics.columns == ["topic", "termIndices", "termWeights"] and topics.count() == 2
    assert model.transform(df).columns == ["id", "features", "topicDistribution"]
    path = str(tmp_path / "lda")
    lda.write().overwrite().save(path)
    model.write().overwrite().save(path)
    back = StradsLDAModel.load(path)
    assert str(back) == str(model) and back.topicsMatrix() == model.topicsMatrix()
    assert back.getOptimizer() == "em" and model.toLocal().uid == model.uid


def test_als_on_upstreams_ratings_and_a_self_join_of_its_factors(spark, tmp_path):
    """test_als: integer ratings and item ids {15, 2, 3}, ALS's block params, a model loaded
    through an instance, and transform over a cross join of its own factor frames under both
    settings of failAmbiguousSelfJoin."""
    from pyspark.sql.functions import col

    data = spark.createDataFrame([[1, 15, 1], [1, 2, 2], [2, 3, 4], [2, 2, 5]], ["user", "item", "rating"])
    model = StradsMF(numUserBlocks=10, numItemBlocks=10, maxIter=1, seed=42).fit(data)
    path = str(tmp_path / "als")
    model.write().overwrite().save(path)
    loaded = StradsMFModel().load(path)
    for fail in ("true", "false"):
        spark.conf.set("spark.sql.analyzer.failAmbiguousSelfJoin", fail)
        try:
            pairs = loaded.userFactors.select(col("id").alias("user")).crossJoin(
                loaded.itemFactors.select(col("id").alias("item")))
            assert loaded.transform(pairs).count() == 2 * 3
        finally:
            spark.conf.unset("spark.sql.analyzer.failAmbiguousSelfJoin")


def test_bound_params_save_and_load_as_test_classification(spark, tmp_path):
    """test_logistic_regression: an estimator with MLlib's bounds set saves and loads them (alone
    and in a Pipeline), though a fit refuses them (docs/user-guide.md's differences)."""
    from pyspark.ml import Pipeline
    from pyspark.ml.linalg import Matrices

    bounds = dict(lowerBoundsOnIntercepts=Vectors.dense([1.0, 2.0]),
                  upperBoundsOnIntercepts=Vectors.sparse(2, [1], [5.0]),
                  lowerBoundsOnCoefficients=Matrices.dense(3, 2, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]),
                  upperBoundsOnCoefficients=Matrices.sparse(3, 2, [0, 1, 2], [0, 1], [5.0, 6.0]))
    lr = StradsLogisticRegression(maxIter=1, **bounds)
    path = str(tmp_path / "lr")
    lr.save(path)
    back = StradsLogisticRegression.load(path)
    for name, value in bounds.items():
        got = back.getOrDefault(name)
        assert type(got) is type(value) and np.array_equal(got.toArray(), value.toArray()), name
    Pipeline(stages=[lr]).write().overwrite().save(path + "_pipeline")
    stage = Pipeline.load(path + "_pipeline").getStages()[0]
    assert stage.getUpperBoundsOnCoefficients().toArray().tolist() == bounds["upperBoundsOnCoefficients"].toArray().tolist()
