"""``StradsLogisticRegression``: binomial and multinomial L1 / elastic-net logistic regression (the
thesis's SchMP-SLR), shaped like ``pyspark.ml.classification.LogisticRegression``.

Objective (MLlib's; ``alpha`` is ``elasticNetParam``, default 0 as in MLlib: set 1.0 for a sparse L1 model)::

    binomial:     1/W sum_i w_i (log(1 + exp(m_i)) - y_i m_i)
                  + regParam * (alpha * sum_j s_j |beta_j| + (1 - alpha) / 2 * sum_j s_j^2 beta_j^2)
    multinomial:  1/W sum_i w_i (logsumexp_k(m_ik) - m_{i, y_i})
                  + regParam * (alpha * sum_jk s_j |B_kj| + (1 - alpha) / 2 * sum_jk s_j^2 B_kj^2)

with ``m_i = b + x_i . beta`` (``m_ik = b_k + x_i . B_k``) and ``s_j`` the feature's standard
deviation with ``standardization``.  ``family="auto"`` is multinomial for more than two classes,
as in MLlib.  Same program as :class:`~pystrads.ml.StradsLasso` with the log-loss
(:class:`~pystrads.programs.logistic.L1LogisticProgram`) or the softmax loss, each feature's
K coefficients updated in the same round (:class:`~pystrads.programs.multinomial.MultinomialProgram`).
"""

from __future__ import annotations

import math
from typing import Any, List, Optional

import numpy as np
import pyarrow as pa
from pyspark import keyword_only
from pyspark.ml.linalg import DenseMatrix, Matrix, SparseMatrix, SparseVector, Vector, Vectors, VectorUDT
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.classification import (BinaryLogisticRegressionSummary, BinaryLogisticRegressionTrainingSummary,
                                       LogisticRegressionSummary, LogisticRegressionTrainingSummary)
from pyspark.ml.param.shared import HasProbabilityCol, HasRawPredictionCol, HasThreshold, HasThresholds
from pyspark.sql import types as T

from ..errors import ConfigurationError, InputError
from ..programs.logistic import L1LogisticProgram
from ..programs.multinomial import MultinomialProgram
from ._arrow import dense_vectors
from ._linear import LinearTrainingSummary, _SparseLinearEstimator, _SparseLinearModel, _SparseLinearParams
from ._params import MLlibOnly, matrix_or_json, one_of, vector_or_json, within


class _LogisticParams(_SparseLinearParams, HasProbabilityCol, HasRawPredictionCol, HasThreshold, HasThresholds):
    """Params of StradsLogisticRegression and its model: the linear ones, MLlib's classifier outputs and
    thresholds (with MLlib's rule tying ``threshold`` and ``thresholds``) and ``family``."""

    family: Param[str] = Param(Params._dummy(), "family",
                               "label distribution: 'auto' (multinomial for more than two classes), 'binomial' or "
                               "'multinomial', as MLlib", typeConverter=TypeConverters.toString)

    lowerBoundsOnCoefficients: Param[Matrix] = Param(
        Params._dummy(), "lowerBoundsOnCoefficients",
        "MLlib's lower bounds on the coefficients (refused: StradsLogisticRegression fits without bounds; use "
        "pyspark.ml.classification.LogisticRegression for a bound-constrained fit)",
        typeConverter=matrix_or_json)
    upperBoundsOnCoefficients: Param[Matrix] = Param(
        Params._dummy(), "upperBoundsOnCoefficients",
        "MLlib's upper bounds on the coefficients (refused, as lowerBoundsOnCoefficients)",
        typeConverter=matrix_or_json)
    lowerBoundsOnIntercepts: Param[Vector] = Param(
        Params._dummy(), "lowerBoundsOnIntercepts",
        "MLlib's lower bounds on the intercepts (refused, as lowerBoundsOnCoefficients)",
        typeConverter=vector_or_json)
    upperBoundsOnIntercepts: Param[Vector] = Param(
        Params._dummy(), "upperBoundsOnIntercepts",
        "MLlib's upper bounds on the intercepts (refused, as lowerBoundsOnCoefficients)",
        typeConverter=vector_or_json)

    _mllib_only = {name: MLlibOnly("StradsLogisticRegression fits without bounds; use "
                                   "pyspark.ml.classification.LogisticRegression for a bound-constrained fit",
                                   refused=True)
                   for name in ("lowerBoundsOnCoefficients", "upperBoundsOnCoefficients", "lowerBoundsOnIntercepts",
                                "upperBoundsOnIntercepts")}
    _param_rules = {"family": one_of("auto", "binomial", "multinomial"), "threshold": within(0, 1)}

    def __init__(self, *args):
        super().__init__(*args)
        self._setDefault(threshold=0.5, family="auto", probabilityCol="probability",
                         rawPredictionCol="rawPrediction", maxIter=100, tol=1e-6, elasticNetParam=0.0)

    def getThreshold(self) -> float:
        """The probability cut for class 1; from ``thresholds`` when those are set (MLlib's rule:
        predict the class of the largest ``p_i / t_i``, i.e. 1 when ``p > 1 / (1 + t0 / t1)``)."""
        ts = self._set_thresholds()
        if ts is not None and len(ts) == 2:
            t0, t1 = ts
            return 0.0 if t1 == 0 else (1.0 if t0 == 0 else 1.0 / (1.0 + t0 / t1))
        return self.getOrDefault(self.threshold)

    def _set_thresholds(self):
        return list(self.getOrDefault(self.thresholds)) if self.isSet(self.thresholds) and \
            self.getOrDefault(self.thresholds) is not None else None

    def setThreshold(self, value: float):
        """Set the cut for class 1 (and clear ``thresholds``, as MLlib does)."""
        self._set(threshold=value)
        self.clear(self.thresholds)
        return self

    def setThresholds(self, value):
        """Set per-class thresholds ``[t0, t1, ...]`` (and clear ``threshold``, as MLlib does)."""
        self._set(thresholds=value)
        self.clear(self.threshold)
        return self

    def _check_params(self) -> None:
        super()._check_params()
        ts = self._set_thresholds()
        if ts is not None and (len(ts) < 2 or not all(math.isfinite(t) and t >= 0 for t in ts) or ts.count(0.0) > 1):
            raise ConfigurationError(f"thresholds={ts!r} must be one finite value >= 0 per class (at least two), "
                                     "at most one of them 0")
        self._check_set_params()

    def _check_set_params(self) -> None:
        """``threshold`` and two ``thresholds`` that disagree are refused when they are set, as
        MLlib refuses them (a ``ValueError``)."""
        ts = self._set_thresholds()
        if ts is not None and len(ts) == 2 and all(math.isfinite(t) and t >= 0 for t in ts) and \
                self.isSet(self.threshold) and abs(self.getThreshold() - self.getOrDefault(self.threshold)) > 1e-5:
            raise ConfigurationError(  # MLlib's words first: code matches on them
                f"Logistic Regression getThreshold found inconsistent values for threshold="
                f"{self.getOrDefault(self.threshold)!r} and thresholds={ts!r} (which mean threshold="
                f"{self.getThreshold()!r}): set one of them")


def compressed_matrix(a: np.ndarray) -> Matrix:
    """``a`` as MLlib's ``Matrix.compressed`` stores it: of dense (by columns), sparse by columns
    and sparse by rows, the first that takes the fewest bytes (MLlib's estimates: 8 bytes a
    value, 4 an index or pointer, 12 an array header, 9 the shape and layout)."""
    rows, cols = a.shape
    nnz = int(np.count_nonzero(a))
    dense = 8 * rows * cols + 12 + 9
    by_cols, by_rows = 12 * nnz + 4 * (cols + 1) + 36 + 9, 12 * nnz + 4 * (rows + 1) + 36 + 9
    if dense <= min(by_cols, by_rows):
        return DenseMatrix(rows, cols, a.ravel(order="F").tolist(), 0)  # isTransposed as MLlib's arrive: 0 / 1
    major = a.T if by_cols <= by_rows else a  # the rows of ``major`` are the stored runs
    ptrs = np.concatenate([[0], np.cumsum(np.count_nonzero(major, axis=1))])
    index = np.nonzero(major)
    return SparseMatrix(rows, cols, ptrs.tolist(), index[1].tolist(), major[index].tolist(), int(by_rows < by_cols))


def _sigmoid(margin: np.ndarray) -> np.ndarray:
    """``1 / (1 + exp(-margin))`` elementwise, without overflow (as :func:`_probability`)."""
    e = np.exp(-np.abs(margin))
    return np.where(margin >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _arrow_vector_type():
    """VectorUDT's SQL struct as an Arrow type (what ``mapInArrow`` reads and writes)."""
    from pyspark.sql.pandas.types import to_arrow_type

    return to_arrow_type(VectorUDT().sqlType())


def _softmax(margins: np.ndarray) -> np.ndarray:
    """Row-wise softmax of ``(n, K)`` margins, without overflow."""
    e = np.exp(margins - margins.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _class_prediction(probability: np.ndarray, thresholds) -> np.ndarray:
    """MLlib's multiclass rule: the class of the largest ``p_k`` (of ``p_k / t_k`` with ``thresholds``;
    a 0 threshold wins), first on ties."""
    if thresholds is None:
        return np.argmax(probability, axis=-1).astype(np.float64)
    t = np.asarray(thresholds, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = np.where(t > 0, probability / np.where(t > 0, t, 1.0), np.inf)
    return np.argmax(scaled, axis=-1).astype(np.float64)


def _probability(margin):
    """``[1 - p, p]`` with ``p = 1 / (1 + exp(-margin))`` (without overflow); None for None."""
    if margin is None:
        return None
    p = 1.0 / (1.0 + math.exp(-margin)) if margin >= 0 else math.exp(margin) / (1.0 + math.exp(margin))
    return Vectors.dense([1.0 - p, p])


class StradsLogisticRegressionModel(_SparseLinearModel, _LogisticParams):
    """A fitted model with MLlib's outputs: binomial, ``rawPrediction`` ([-m, m]), ``probability``
    ([1-p, p]) and ``prediction``; multinomial, the K margins, their softmax and the most probable
    class (with ``thresholds``: the largest ``p_k / t_k``), as MLlib's columns.

    ``coefficientMatrix`` and ``interceptVector`` hold both kinds (a binomial model's as one
    row); ``coefficients`` and ``intercept`` are the binomial model's, and a multinomial model
    refuses them with MLlib's words.  On a classic session ``transform`` and ``evaluate`` run
    MLlib's own ``LogisticRegressionModel`` with these coefficients (scoring in the JVM;
    ``evaluate`` returns MLlib's ``BinaryLogisticRegressionSummary`` or
    ``LogisticRegressionSummary``); under Spark Connect ``transform`` scores in Arrow batches
    (the same columns and values) and ``evaluate`` gives a :class:`LogisticEvaluation` with the
    summary's fields but the curves."""

    _setters = _SparseLinearModel._setters + ("probabilityCol", "rawPredictionCol")
    _mllib_class = "ml.classification.LogisticRegressionModel"

    def __init__(self, coefficients=None, intercept=0.0):
        """Binomial: a coefficient vector and a float intercept; multinomial: a ``(K, features)``
        coefficient matrix and K intercepts."""
        matrix = coefficients is not None and np.ndim(coefficients) == 2
        super().__init__(None if matrix else coefficients, 0.0 if matrix else intercept)
        if matrix:
            self._coef = np.asarray(coefficients, dtype=np.float64)
            self._intercept = np.asarray(intercept, dtype=np.float64).reshape(-1)

    @property
    def isMultinomial(self) -> bool:
        return self._coef is not None and self._coef.ndim == 2

    @property
    def numClasses(self) -> int:
        return int(self._coef.shape[0]) if self.isMultinomial else 2

    @property
    def numFeatures(self) -> int:
        return int(self._coef.shape[-1])

    @property
    def coefficients(self):
        if self.isMultinomial:
            raise ValueError("Multinomial models contain a matrix of coefficients, use coefficientMatrix instead.")
        return super().coefficients

    @property
    def intercept(self) -> float:
        if self.isMultinomial:
            raise ValueError("Multinomial models contain a vector of intercepts, use interceptVector instead.")
        return self._intercept

    @property
    def coefficientMatrix(self) -> Matrix:
        """The coefficients as MLlib's ``(numClasses, numFeatures)`` matrix (one row when binomial),
        stored as MLlib stores it (``Matrix.compressed``): sparse, by columns or by rows, where that
        takes less memory than dense (an L1 fit's), else dense by columns."""
        return compressed_matrix(self._coef.reshape(-1, self.numFeatures))

    @property
    def interceptVector(self):
        return Vectors.dense(np.atleast_1d(self._intercept))

    def _repr_fields(self):
        return {"numClasses": self.numClasses, "numFeatures": self.numFeatures}

    def _jvm_model_args(self, to_java) -> tuple:
        if not self.isMultinomial:
            return super()._jvm_model_args(to_java)
        return self.uid, to_java(self.coefficientMatrix), to_java(self.interceptVector), self.numClasses, True

    def _mllib_params(self) -> List[str]:
        chosen = "thresholds" if self._set_thresholds() else ("threshold" if not self.isMultinomial else None)
        return super()._mllib_params() + ["probabilityCol", "rawPredictionCol"] + ([chosen] if chosen else [])

    def _check_params(self) -> None:
        super()._check_params()
        ts = self._set_thresholds()
        if ts is not None and self._coef is not None and len(ts) != self.numClasses:
            raise ConfigurationError(f"thresholds={ts!r} has {len(ts)} values for a model of {self.numClasses} "
                                     f"classes: set one per class")

    def _class_margins(self, value) -> np.ndarray:
        if isinstance(value, SparseVector):
            return self._coef[:, value.indices] @ value.values + self._intercept
        return self._coef @ value.toArray() + self._intercept

    def predictRaw(self, value):
        """MLlib's raw prediction of one feature vector: ``[-m, m]``, or the K margins."""
        if not self.isMultinomial:
            m = self._margin_udf()(value)
            return Vectors.dense([-m, m])
        return Vectors.dense(self._class_margins(value))

    def predictProbability(self, value):
        if not self.isMultinomial:
            return _probability(self._margin_udf()(value))
        return Vectors.dense(_softmax(self._class_margins(value)))

    def predict(self, value) -> float:
        if not self.isMultinomial:
            return 1.0 if self.predictProbability(value)[1] > self.getThreshold() else 0.0
        return float(_class_prediction(self.predictProbability(value).toArray(), self._set_thresholds()))

    def _transform(self, dataset):
        self._check_columns(dataset, "featuresCol")
        self._check_params()  # a threshold set on the model
        if self.getRawPredictionCol() and self.getProbabilityCol() and self.getPredictionCol():
            mllib = self._mllib_model(dataset)
            if mllib is not None:
                return mllib.transform(dataset)
        if self.isMultinomial:
            return self._transform_classes(dataset)
        threshold = self.getThreshold()
        # p > threshold  <=>  margin > logit(threshold)
        cut = math.inf if threshold >= 1 else (-math.inf if threshold <= 0 else math.log(threshold / (1 - threshold)))
        raw_col, prob_col, pred_col = self.getRawPredictionCol(), self.getProbabilityCol(), self.getPredictionCol()
        margin = self._margin_column(dataset)
        if margin is not None:  # the margin from an Arrow UDF, the columns from it in the JVM (MLlib's formulas)
            from pyspark.ml.functions import array_to_vector
            from pyspark.sql import functions as F

            self._refuse_existing(dataset, [c for c in (raw_col, prob_col, pred_col) if c])
            m, name = F.col("__pystrads_margin"), "__pystrads_margin"
            p = F.lit(1.0) / (F.lit(1.0) + F.exp(-m))
            present = m.isNotNull()
            out = dataset.withColumn(name, margin)
            if raw_col:
                out = out.withColumn(raw_col, F.when(present, array_to_vector(F.array(-m, m))))
            if prob_col:
                out = out.withColumn(prob_col, F.when(present, array_to_vector(F.array(F.lit(1.0) - p, p))))
            if pred_col:
                out = out.withColumn(pred_col, F.when(present, F.when(m > F.lit(cut), 1.0).otherwise(0.0)))
            return out.drop(name)
        vector_type = _arrow_vector_type()

        def columns(margin, valid):
            out = {}
            if raw_col:
                out[raw_col] = dense_vectors(np.stack([-margin, margin], axis=1), vector_type, valid)
            if prob_col:
                p = _sigmoid(margin)
                out[prob_col] = dense_vectors(np.stack([1.0 - p, p], axis=1), vector_type, valid)
            if pred_col:
                out[pred_col] = pa.array(np.where(margin > cut, 1.0, 0.0), mask=~valid)
            return out

        fields = [T.StructField(c, VectorUDT(), True) for c in (raw_col, prob_col) if c]
        fields += [T.StructField(pred_col, T.DoubleType(), True)] if pred_col else []
        return self._score_arrow(dataset, columns, fields)

    def _transform_classes(self, dataset):
        """A multinomial model's columns, scored in Arrow batches (MLlib's values)."""
        raw_col, prob_col, pred_col = self.getRawPredictionCol(), self.getProbabilityCol(), self.getPredictionCol()
        thresholds = self._set_thresholds()
        vector_type = _arrow_vector_type()

        def columns(margins, valid):
            out = {}
            if raw_col:
                out[raw_col] = dense_vectors(margins, vector_type, valid)
            p = _softmax(margins) if len(margins) else margins
            if prob_col:
                out[prob_col] = dense_vectors(p, vector_type, valid)
            if pred_col:
                out[pred_col] = pa.array(_class_prediction(p, thresholds) if len(p) else np.zeros(0), mask=~valid)
            return out

        fields = [T.StructField(c, VectorUDT(), True) for c in (raw_col, prob_col) if c]
        fields += [T.StructField(pred_col, T.DoubleType(), True)] if pred_col else []
        return self._score_arrow(dataset, columns, fields)

    def evaluate(self, dataset):
        """The model's metrics on ``dataset``, as ``LogisticRegressionModel.evaluate``: MLlib's
        ``BinaryLogisticRegressionSummary`` (``roc``, ``areaUnderROC``, ``pr``,
        ``fMeasureByThreshold``, ``accuracy``, ``precisionByLabel``, ...) on a classic session;
        under Spark Connect ``areaUnderROC``, ``accuracy`` and ``predictions``."""
        self._check_columns(dataset, "featuresCol", "labelCol")
        self._check_params()
        mllib = self._mllib_model(dataset)
        if mllib is not None:
            return mllib.evaluate(dataset)
        evaluation = BinaryLogisticEvaluation if self.numClasses <= 2 else LogisticEvaluation
        return evaluation(self.transform(dataset), self.getLabelCol(), self.getPredictionCol(),
                                  self.getRawPredictionCol(), self.getProbabilityCol(), self.getFeaturesCol(),
                                  self.getOrDefault("weightCol") if self.isDefined("weightCol") else None,
                                  self.numClasses)

    # -- persistence: a binomial model's data as before; a multinomial model's with its matrix
    def _save_data(self, write) -> dict:
        if not self.isMultinomial:
            return super()._save_data(write)
        write("data", T.StructType([T.StructField("numClasses", T.IntegerType(), False),
                                    T.StructField("interceptVector", T.ArrayType(T.DoubleType(), False), False),
                                    T.StructField("coefficientMatrix", T.ArrayType(T.DoubleType(), False), False)]),
              [(self.numClasses, self._intercept.tolist(), self._coef.ravel().tolist())])
        return {"numFeatures": self.numFeatures, "numClasses": self.numClasses, "isMultinomial": True}

    @classmethod
    def _load_data(cls, read, metadata):
        if not metadata.get("isMultinomial"):
            return super()._load_data(read, metadata)
        row = read("data").first()
        k = int(row["numClasses"])
        return cls(np.asarray(row["coefficientMatrix"], dtype=np.float64).reshape(k, -1),
                   np.asarray(row["interceptVector"], dtype=np.float64))


class LogisticEvaluation(LogisticRegressionSummary):
    """An MLlib ``LogisticRegressionSummary`` (``BinaryLogisticEvaluation``: a
    ``BinaryLogisticRegressionSummary``) whose fields are computed with MLlib's evaluators (what
    :meth:`StradsLogisticRegressionModel.evaluate` gives under Spark Connect, where MLlib's own
    summary cannot be made): ``accuracy``, ``labels``, the ``...ByLabel`` lists, the
    ``weighted...`` rates, ``weightedFMeasure()`` / ``fMeasureByLabel()``, ``areaUnderROC``
    (binomial; MLlib's evaluator: 1,000 bins, where MLlib's summary uses 100), ``predictions`` and
    the column names.  The curves (``roc``, ``pr``, ``...ByThreshold``) need a classic session."""

    _java_obj = None  # MLlib's base wraps a JVM summary: none here

    def __init__(self, predictions, label_col: str, prediction_col: str, raw_prediction_col: str,
                 probability_col: str, features_col: str = "features", weight_col: Optional[str] = None,
                 num_classes: int = 2):
        self._predictions = predictions
        self._cols = {"labelCol": label_col, "predictionCol": prediction_col, "probabilityCol": probability_col,
                      "featuresCol": features_col, "weightCol": weight_col or None}
        self._raw = raw_prediction_col
        self._num_classes = int(num_classes)
        self._cache = {}

    predictions = property(lambda self: self._predictions)
    labelCol = property(lambda self: self._cols["labelCol"])
    predictionCol = property(lambda self: self._cols["predictionCol"])
    probabilityCol = property(lambda self: self._cols["probabilityCol"])
    featuresCol = property(lambda self: self._cols["featuresCol"])
    weightCol = property(lambda self: self._cols["weightCol"])
    scoreCol = probabilityCol

    @property
    def labels(self) -> List[float]:
        """The labels that occur as a label or a prediction, ascending (MLlib's ``MulticlassMetrics.labels``)."""
        if "labels" not in self._cache:
            from pyspark.sql import functions as F

            seen = self.predictions.select(F.col(self.labelCol).cast("double").alias("v")).union(
                self.predictions.select(F.col(self.predictionCol).cast("double").alias("v"))).distinct()
            self._cache["labels"] = sorted(float(r.v) for r in seen.collect() if r.v is not None)
        return self._cache["labels"]

    def _multi(self, metric: str, label: Optional[float] = None, beta: float = 1.0) -> float:
        key = (metric, label, beta)
        if key not in self._cache:
            from pyspark.ml.evaluation import MulticlassClassificationEvaluator

            ev = MulticlassClassificationEvaluator(labelCol=self.labelCol, predictionCol=self.predictionCol,
                                                   metricName=metric, beta=beta)
            if label is not None:
                ev.setMetricLabel(label)
            if self.weightCol:
                ev.setWeightCol(self.weightCol)
            self._cache[key] = float(ev.evaluate(self.predictions))
        return self._cache[key]

    @property
    def areaUnderROC(self) -> float:
        if self._num_classes != 2:
            raise AttributeError("areaUnderROC is a binomial model's: a multinomial summary has none (as MLlib's)")
        if "auc" not in self._cache:
            from pyspark.ml.evaluation import BinaryClassificationEvaluator

            ev = BinaryClassificationEvaluator(rawPredictionCol=self._raw, labelCol=self.labelCol)
            if self.weightCol:
                ev.setWeightCol(self.weightCol)
            self._cache["auc"] = float(ev.evaluate(self.predictions))
        return self._cache["auc"]

    accuracy = property(lambda self: self._multi("accuracy"))
    weightedPrecision = property(lambda self: self._multi("weightedPrecision"))
    weightedRecall = property(lambda self: self._multi("weightedRecall"))
    weightedTruePositiveRate = property(lambda self: self._multi("weightedTruePositiveRate"))
    weightedFalsePositiveRate = property(lambda self: self._multi("weightedFalsePositiveRate"))
    precisionByLabel = property(lambda self: [self._multi("precisionByLabel", x) for x in self.labels])
    recallByLabel = property(lambda self: [self._multi("recallByLabel", x) for x in self.labels])
    truePositiveRateByLabel = property(lambda self: [self._multi("truePositiveRateByLabel", x) for x in self.labels])
    falsePositiveRateByLabel = property(lambda self: [self._multi("falsePositiveRateByLabel", x)
                                                      for x in self.labels])

    def weightedFMeasure(self, beta: float = 1.0) -> float:
        return self._multi("weightedFMeasure", beta=beta)

    def fMeasureByLabel(self, beta: float = 1.0) -> List[float]:
        return [self._multi("fMeasureByLabel", x, beta) for x in self.labels]

    def _needs_classic(self):
        raise NotImplementedError("roc, pr and the by-threshold curves are MLlib's BinaryClassificationMetrics, made "
                                  "in the JVM: evaluate on a classic (non-Connect) session to get them")

    roc = pr = fMeasureByThreshold = precisionByThreshold = recallByThreshold = property(_needs_classic)


class BinaryLogisticEvaluation(LogisticEvaluation, BinaryLogisticRegressionSummary):
    """A binomial model's :class:`LogisticEvaluation`: an MLlib ``BinaryLogisticRegressionSummary``."""


class LogisticTrainingSummary(LinearTrainingSummary, LogisticRegressionTrainingSummary):
    """A multinomial :class:`StradsLogisticRegression` fit's training summary: pystrads' history
    (:class:`~pystrads.ml._linear.LinearTrainingSummary`) and, as an MLlib
    ``LogisticRegressionTrainingSummary``, MLlib's fields of the training data."""


class BinaryLogisticTrainingSummary(LinearTrainingSummary, BinaryLogisticRegressionTrainingSummary):
    """A binomial :class:`StradsLogisticRegression` fit's training summary: an MLlib
    ``BinaryLogisticRegressionTrainingSummary`` (``roc``, ``areaUnderROC`` ... of the training data)."""


def _training_summary(result, fit):
    binary = getattr(fit.program, "num_classes", 2) <= 2  # MLlib's rule: two classes make a binary summary
    return (BinaryLogisticTrainingSummary if binary else LogisticTrainingSummary)(result, fit)


def _label_classes(dataset, lcol: str) -> Optional[int]:
    """The class count the label column's ML attribute declares (StringIndexer writes one), or None."""
    attr = (dataset.schema[lcol].metadata or {}).get("ml_attr") or {}
    if attr.get("type") == "binary":
        return 2
    if attr.get("type") == "nominal":
        if "num_vals" in attr:
            return int(attr["num_vals"])
        if "vals" in attr:
            return len(attr["vals"])
    return None


class StradsLogisticRegression(_SparseLinearEstimator, _LogisticParams):
    """Binomial or multinomial logistic regression with MLlib's elastic-net penalty by STRADS scheduled
    coordinate descent (labels: class indices 0, 1, ...).  ``elasticNetParam`` defaults to 0 (ridge),
    as in MLlib; 1.0 gives the sparse L1 model the STRADS schedule is built for.  The class count is
    the label column's metadata (as StringIndexer writes it), else the largest label + 1; with
    ``family="auto"`` more than two classes fit the multinomial model, as MLlib's.  A multinomial
    fit's ``coordinatesPerRound`` counts features, each with its K coefficients."""

    _program_class = L1LogisticProgram
    _model_class = StradsLogisticRegressionModel
    _summary_class = staticmethod(_training_summary)
    _class_labels = True

    def _scan(self, fit):
        records, stats = super()._scan(fit)
        lcol, family = self.getLabelCol(), self.getOrDefault(self.family)
        seen = int(stats["max_label"]) + 1
        declared = _label_classes(fit.dataset, lcol)
        if declared is not None and seen > declared:
            raise InputError(f"labelCol {lcol!r} has the label {seen - 1} but its metadata declares {declared} "
                             f"classes (labels 0 .. {declared - 1}): re-index the labels (e.g. with StringIndexer)")
        classes = max(declared or 0, seen)
        if family == "binomial" and classes > 2:
            raise InputError(f"family='binomial' fits two classes, but labelCol {lcol!r} has {classes} (labels 0 .. "
                             f"{classes - 1}): set family='multinomial' or 'auto'")
        multinomial = family == "multinomial" or (family == "auto" and classes > 2)
        if multinomial and classes < 2:
            raise InputError(f"family='multinomial': labelCol {lcol!r} has one class (every label is 0); a "
                             "classifier needs at least two")
        ts = self._set_thresholds()
        if ts is not None and len(ts) != (classes if multinomial else 2):
            raise InputError(f"thresholds={ts!r} has {len(ts)} values, but labelCol {lcol!r} has "
                             f"{classes if multinomial else 2} classes: set one threshold per class")
        stats["num_classes"], stats["multinomial"] = classes, multinomial
        return records, stats

    #: the multinomial program's defaults of the schedule's params (where they are not set): a
    #: round costs a pass over the (n, K) margins whatever its width and its line search prices
    #: the overlap of its features exactly, so rounds span the working set and the dependency
    #: check keeps only near-duplicate columns apart
    _MULTINOMIAL_SCHEDULE = {"coordinatesPerRound": ("coords_per_round", 4096),
                             "candidatesPerRound": ("candidates_per_round", 8192),
                             "correlationThreshold": ("rho", 0.9)}

    def _program_kind(self, fit):
        if fit.stats["multinomial"]:
            extra = {"num_classes": fit.stats["num_classes"]}
            for name, (option, value) in self._MULTINOMIAL_SCHEDULE.items():
                if not self.isSet(name):
                    extra[option] = value
            return MultinomialProgram, extra
        return L1LogisticProgram, {}

    @keyword_only
    def __init__(self, *, featuresCol: str = "features", labelCol: str = "label", predictionCol: str = "prediction",
                 probabilityCol: str = "probability", rawPredictionCol: str = "rawPrediction", maxIter: int = 100,
                 regParam: float = 0.0, elasticNetParam: float = 0.0, tol: float = 1e-6, fitIntercept: bool = True,
                 standardization: bool = True, threshold: float = 0.5, thresholds: Optional[List[float]] = None,
                 weightCol: Optional[str] = None,
                 family: str = "auto", seed: Optional[int] = None, schedule: str = "dynamic",
                 priority: str = "gradient", coordinatesPerRound: Any = "auto", candidatesPerRound: Any = "auto",
                 correlationThreshold: float = 0.3, correlationSampleSize: int = 10000, workingSetLimit: int = 4096,
                 numWorkers: int = 0, validationIndicatorCol: str = "", validationTol: float = 0.0,
                 earlyStoppingRounds: int = 2, aggregationDepth: int = 2, maxBlockSizeInMB: float = 0.0,
                 lowerBoundsOnCoefficients: Optional[Matrix] = None, upperBoundsOnCoefficients: Optional[Matrix] = None,
                 lowerBoundsOnIntercepts: Optional[Vector] = None, upperBoundsOnIntercepts: Optional[Vector] = None):
        super().__init__()
        self._set(**self._input_kwargs)
        self._check_set_params()
