"""What pyspark.ml's own tests expect of the four MLlib classes, asked of the pystrads drop-ins:
the summary and evaluation types, the model surface (``scale``, ``repr``, PMML, a compressed
``coefficientMatrix``), the checks MLlib makes as params are set, ``maxIter=0``, and MLlib's
params that pystrads takes without honouring them (a warning, or a refusal naming the
alternative).  The unit tests need no Spark; the rest share the session's JVM."""

import logging
import os
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from pyspark.ml.linalg import DenseMatrix, SparseMatrix, Vectors

from pystrads.errors import ConfigurationError
from pystrads.ml import (StradsLasso, StradsLassoModel, StradsLDA, StradsLDAModel, StradsLogisticRegression,
                         StradsLogisticRegressionModel, StradsMF)
from pystrads.ml.classification import compressed_matrix
from pystrads.ml.regression import pmml_regression

PMML = "{http://www.dmg.org/PMML-4_2}"


# ----------------------------------------------------------------------------- no Spark
def test_threshold_and_thresholds_that_disagree_are_refused_as_they_are_set():
    """MLlib raises ValueError in the constructor and in setParams (upstream's test matches its
    message's start); agreeing values pass."""
    with pytest.raises(ValueError, match=r"^Logistic Regression getThreshold found inconsistent values for "
                                         r"threshold=0.42 and thresholds=\[0.5, 0.5\] \(which mean threshold=0.5\)"):
        StradsLogisticRegression(threshold=0.42, thresholds=[0.5, 0.5])
    with pytest.raises(ValueError, match="found inconsistent"):
        StradsLogisticRegression().setParams(threshold=0.3, thresholds=[0.5, 0.5])
    agreeing = StradsLogisticRegression(threshold=0.5, thresholds=[0.5, 0.5])
    assert agreeing.getThreshold() == 0.5
    assert StradsLogisticRegression(thresholds=[0.25, 0.75]).getThreshold() == pytest.approx(0.75)


def test_model_repr_names_what_mllib_models_show():
    lasso = StradsLassoModel(np.array([1.0, 0.0, 2.0]), 0.5)
    assert repr(lasso) == f"StradsLassoModel: uid={lasso.uid}, numFeatures=3"
    binary = StradsLogisticRegressionModel(np.zeros(4), 0.0)
    assert repr(binary) == f"StradsLogisticRegressionModel: uid={binary.uid}, numClasses=2, numFeatures=4"
    multi = StradsLogisticRegressionModel(np.zeros((3, 5)), np.zeros(3))
    assert repr(multi).endswith(", numClasses=3, numFeatures=5")
    lda = StradsLDAModel(np.ones((7, 2)), 0.5, 0.1)
    assert repr(lda) == f"StradsLDAModel: uid={lda.uid}, k=2, numFeatures=7"
    assert StradsLassoModel(np.zeros(2)).scale == 1.0  # MLlib's: 1 unless the loss is huber


@pytest.mark.parametrize("shape,nonzeros,kind,by_rows", [
    ((3, 4), [(0, 3), (1, 2), (2, 1)], SparseMatrix, True),    # pyspark's own doctest: by rows
    ((30, 4), [(0, 3), (7, 1)], SparseMatrix, False),          # tall: by columns
    ((3, 40), [(0, 3), (1, 5)], SparseMatrix, True),           # wide: by rows
    ((3, 4), [(i, j) for i in range(3) for j in range(4)], DenseMatrix, False),  # full: dense by columns
])
def test_coefficient_matrix_is_stored_as_mllib_compresses_it(shape, nonzeros, kind, by_rows):
    a = np.zeros(shape)
    for n, (i, j) in enumerate(nonzeros):
        a[i, j] = n + 1.5
    m = compressed_matrix(a)
    assert type(m) is kind and bool(m.isTransposed) == by_rows
    np.testing.assert_array_equal(m.toArray(), a)


def test_mllib_only_params_warn_or_refuse_naming_the_alternative(caplog):
    """Each MLlib param a drop-in takes without honouring it: set, the fit warns (what runs
    instead) or refuses it before any Spark job, naming the MLlib class that has it."""
    lda = StradsLDA(optimizer="em", learningDecay=0.7, subsamplingRate=0.5, keepLastCheckpoint=False)
    with caplog.at_level(logging.WARNING):
        lda._check_params()
        lda._warn_mllib_only()
    for text in ("optimizer='em' is ignored with collapsed Gibbs sampling", "learningDecay=0.7 is ignored",
                 "subsamplingRate=0.5 is ignored", "keepLastCheckpoint=False is ignored"):
        assert text in caplog.text, text
    assert "learningOffset" not in caplog.text  # unset: no warning
    assert StradsLDA().getOptimizer() == "online" and StradsLDA(optimizer="EM")._check_params() is None
    with pytest.raises(ConfigurationError, match="optimizer='gibbs' is not one of 'online', 'em'"):
        StradsLDA(optimizer="gibbs")._check_params()

    caplog.clear()
    lasso = StradsLasso(aggregationDepth=4, maxBlockSizeInMB=1.0, solver="l-bfgs")
    with caplog.at_level(logging.WARNING):
        lasso._check_params()
        lasso._warn_mllib_only()
        StradsLasso(solver="auto", loss="squaredError")._warn_mllib_only()  # what it does anyway: quiet
    assert caplog.text.count("is ignored") == 3, caplog.text
    assert "solver='l-bfgs' is ignored with scheduled coordinate descent" in caplog.text
    with pytest.raises(ConfigurationError, match=r"loss='huber' is not supported: .*LinearRegression\(loss='huber'\)"):
        StradsLasso(loss="huber")._check_params()
    with pytest.raises(ConfigurationError, match="aggregationDepth=1 must be >= 2"):
        StradsLasso(aggregationDepth=1)._check_params()

    bounded = StradsLogisticRegression(lowerBoundsOnCoefficients=DenseMatrix(1, 2, [0.0, 0.0]))
    with pytest.raises(ConfigurationError, match="lowerBoundsOnCoefficients=.* is not supported: .*"
                                                 "pyspark.ml.classification.LogisticRegression"):
        bounded._check_params()
    StradsLogisticRegression(aggregationDepth=3)._check_params()


def test_pmml_document_is_a_regression_table():
    root = ET.fromstring(pmml_regression(np.array([1.5, 0.0, -2.0]), 0.25).split("\n", 1)[1])
    table = root.find(f"{PMML}RegressionModel/{PMML}RegressionTable")
    assert float(table.get("intercept")) == 0.25
    assert [(p.get("name"), float(p.get("coefficient"))) for p in table] == \
        [("field_0", 1.5), ("field_1", 0.0), ("field_2", -2.0)]
    assert root.find(f"{PMML}DataDictionary").get("numberOfFields") == "4"


def test_evaluate_and_transform_of_something_not_a_dataframe_is_a_type_error():
    for model in (StradsLassoModel(np.zeros(2)), StradsLogisticRegressionModel(np.zeros(2), 0.0)):
        with pytest.raises(TypeError, match="dataset must be a DataFrame but got <class 'list'>"):
            model.evaluate([(1.0, Vectors.dense(1.0, 2.0))])
        with pytest.raises(TypeError, match="must be a DataFrame"):
            model.transform([(1.0, Vectors.dense(1.0, 2.0))])
    with pytest.raises(TypeError, match="must be a DataFrame"):
        StradsLasso().fit({"label": [1.0]})


# ----------------------------------------------------------------------------- with Spark
@pytest.fixture(scope="module")
def frames(spark):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(80, 4))
    y = x @ [1.0, 0.0, -2.0, 0.0] + 3 + 0.1 * rng.normal(size=80)
    rows = [(float(a), float(a > 3), float(i % 3 if i % 5 else 0), Vectors.dense(r))
            for i, (a, r) in enumerate(zip(y, x))]
    df = spark.createDataFrame(rows, ["y", "label", "cls", "features"]).cache()
    df.count()
    return df


def test_summaries_and_evaluations_are_mllibs_types(frames):
    from pyspark.ml.classification import (BinaryLogisticRegressionSummary, BinaryLogisticRegressionTrainingSummary,
                                           LogisticRegressionSummary, LogisticRegressionTrainingSummary)
    from pyspark.ml.regression import LinearRegressionSummary, LinearRegressionTrainingSummary

    from pystrads.ml.classification import BinaryLogisticEvaluation, LogisticEvaluation
    from pystrads.ml.regression import LassoEvaluation

    lasso = StradsLasso(labelCol="y", regParam=0.05).fit(frames)
    s = lasso.summary
    assert isinstance(s, LinearRegressionTrainingSummary) and isinstance(s, LinearRegressionSummary)
    assert s.numInstances == 80 and s.totalIterations == len(s.objectiveHistory) - 1 > 0
    mllib = lasso.evaluate(frames)  # classic: MLlib's own summary
    assert isinstance(mllib, LinearRegressionSummary)
    assert s.r2 == pytest.approx(mllib.r2) and s.devianceResiduals == pytest.approx(mllib.devianceResiduals)
    ours = LassoEvaluation(lasso.transform(frames), "prediction", "y", "features", None, True, 4)
    assert isinstance(ours, LinearRegressionSummary)  # what evaluate gives under Spark Connect
    assert ours.devianceResiduals == pytest.approx(mllib.devianceResiduals)
    assert ours.r2 == pytest.approx(mllib.r2) and ours.predictionCol == "prediction"

    binary = StradsLogisticRegression(regParam=0.01).fit(frames)
    assert isinstance(binary.summary, BinaryLogisticRegressionTrainingSummary)
    assert binary.summary.scoreCol == "probability" and 0.5 < binary.summary.areaUnderROC <= 1
    assert isinstance(BinaryLogisticEvaluation(binary.transform(frames), "label", "prediction", "rawPrediction",
                                               "probability"), BinaryLogisticRegressionSummary)
    multi = StradsLogisticRegression(labelCol="cls", regParam=0.1, elasticNetParam=1.0).fit(frames)
    assert isinstance(multi.summary, LogisticRegressionTrainingSummary)
    assert not isinstance(multi.summary, BinaryLogisticRegressionSummary)
    assert isinstance(LogisticEvaluation(multi.transform(frames), "cls", "prediction", "rawPrediction",
                                         "probability", num_classes=3), LogisticRegressionSummary)
    assert multi.summary.accuracy == pytest.approx(multi.evaluate(frames).accuracy)
    # an L1 multinomial fit's matrix is sparse, as MLlib stores it, and MLlib's model takes it
    matrix = multi.coefficientMatrix
    assert isinstance(matrix, SparseMatrix) and np.count_nonzero(matrix.toArray()) < 12
    assert multi._mllib_model(frames).coefficientMatrix.toArray() == pytest.approx(matrix.toArray())


def test_max_iter_zero_returns_mllibs_starting_model(frames):
    """MLlib accepts maxIter=0 (TrainValidationSplit's sub-model test relies on it) and returns
    its starting point: zero coefficients and the intercepts MLlib starts from."""
    from pyspark.ml.classification import LogisticRegression
    from pyspark.ml.regression import LinearRegression

    lasso = StradsLasso(labelCol="y", regParam=0.1, maxIter=0).fit(frames)
    ref = LinearRegression(labelCol="y", regParam=0.1, elasticNetParam=1.0, maxIter=0, solver="l-bfgs").fit(frames)
    assert lasso.coefficients.toArray().tolist() == [0.0] * 4 == ref.coefficients.toArray().tolist()
    assert lasso.intercept == pytest.approx(ref.intercept, abs=1e-9)
    assert lasso.summary.totalIterations == 0 and lasso.summary.stopReason == "maxIter"
    for label in ("label", "cls"):
        ours = StradsLogisticRegression(labelCol=label, maxIter=0).fit(frames)
        theirs = LogisticRegression(labelCol=label, maxIter=0).fit(frames)
        assert not ours.coefficientMatrix.toArray().any()
        np.testing.assert_allclose(ours.interceptVector.toArray(), theirs.interceptVector.toArray(), atol=1e-9)


def test_max_iter_zero_lda_and_mf_return_their_starting_models(spark):
    docs = spark.createDataFrame([(Vectors.dense([float((d * 7 + w) % 3) for w in range(6)]),) for d in range(12)],
                                 ["features"])
    lda = StradsLDA(k=2, maxIter=0, seed=1, optimizeDocConcentration=False).fit(docs)
    tokens = sum(float(r.features.toArray().sum()) for r in docs.collect())
    assert lda.topicsMatrix().toArray().sum() == pytest.approx(tokens)  # every token's initial topic, counted
    ratings = spark.createDataFrame([(u, i, float(1 + (u * i) % 5)) for u in range(6) for i in range(6) if (u + i) % 2],
                                    ["user", "item", "rating"])
    mf = StradsMF(rank=2, maxIter=0, seed=1).fit(ratings)
    assert mf.userFactors.count() == 6 and mf.summary.totalIterations == 0


def test_lda_keeps_mllibs_optimizer_params_through_save_and_load(spark, tmp_path, caplog):
    docs = spark.createDataFrame([(Vectors.dense([float((d + w) % 4) for w in range(5)]),) for d in range(10)],
                                 ["features"])
    with caplog.at_level(logging.WARNING, logger="pystrads.ml.lda"):
        model = StradsLDA(k=2, maxIter=2, seed=1, optimizer="em", learningOffset=64.0,
                          optimizeDocConcentration=False).fit(docs)
    assert "optimizer='em' is ignored" in caplog.text and "learningOffset=64.0 is ignored" in caplog.text
    model.save(str(tmp_path / "lda"))
    back = StradsLDAModel.load(str(tmp_path / "lda"))
    assert (back.getOptimizer(), back.getLearningOffset(), back.getLearningDecay()) == ("em", 64.0, 0.51)


def test_lasso_model_writes_pmml_as_mllibs_linear_regression_does(spark, frames, tmp_path):
    model = StradsLasso(labelCol="y", regParam=0.05).fit(frames)
    path = str(tmp_path / "lr-pmml")
    model.write().format("pmml").save(path)
    text = "\n".join(spark.sparkContext.textFile(path).collect())
    assert "Apache Spark" in text and "PMML" in text  # what pyspark's own PMML test asserts
    table = ET.fromstring(text.split("\n", 1)[1]).find(f"{PMML}RegressionModel/{PMML}RegressionTable")
    assert [float(p.get("coefficient")) for p in table] == model.coefficients.toArray().tolist()
    assert float(table.get("intercept")) == model.intercept
    model.write().overwrite().format("PMML").save(path)  # MLlib's names are case-insensitive; overwrite works
    assert os.path.isdir(path)
    with pytest.raises(ConfigurationError, match="format 'pmml': a StradsLDAModel saves as 'internal'"):
        StradsLDAModel(np.ones((3, 2)), 0.5, 0.1).write().format("pmml")
    with pytest.raises(ConfigurationError, match="format 'onnx'"):
        model.write().format("onnx")
