"""``StradsLasso``: L1 / elastic-net linear regression, shaped like ``pyspark.ml.regression.LinearRegression``
and fitted by STRADS's scheduled parallel coordinate descent.

Objective (exactly LinearRegression's for every ``fitIntercept`` / ``standardization``
and ``elasticNetParam`` alpha)::

    1/(2 W) sum_i w_i (y_i - b - x_i . beta)^2
        + regParam * (alpha * sum_j s_j |beta_j| + (1 - alpha) / (2 sigma_y) * sum_j s_j^2 beta_j^2)

with ``W = sum w_i``, ``s_j`` the (weighted, unbiased) standard deviation of
feature j with ``standardization=True`` and 1 without, and ``sigma_y`` the
label's (MLlib fits the standardised label with ``regParam / sigma_y``, which
leaves this factor in the L2 part only); features of zero variance keep
coefficient 0, as in MLlib.  Sparse features stay sparse.  The default
``elasticNetParam`` is 1.0 (the lasso; MLlib's is 0, ridge).
"""

from __future__ import annotations

from typing import Any, List, Optional

import pyarrow as pa
from pyspark import keyword_only
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.regression import LinearRegressionSummary, LinearRegressionTrainingSummary
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..programs.lasso import LassoProgram
from ._linear import LinearTrainingSummary, _SparseLinearEstimator, _SparseLinearModel, _SparseLinearParams
from ._params import MLlibOnly, Rule, _number, above, one_of


class _LassoParams(_SparseLinearParams):
    """The L1 params plus LinearRegression's ``solver``, ``loss`` and ``epsilon`` (accepted so that
    code written for MLlib runs: the solver is always coordinate descent, the loss the squared one)."""

    solver: Param[str] = Param(
        Params._dummy(), "solver",
        "MLlib's solver: 'auto', 'normal' or 'l-bfgs' (accepted and ignored: StradsLasso always fits by "
        "scheduled coordinate descent, to the same objective)", typeConverter=TypeConverters.toString)
    loss: Param[str] = Param(
        Params._dummy(), "loss",
        "the loss function: 'squaredError' (MLlib's 'huber' is refused: use "
        "pyspark.ml.regression.LinearRegression(loss='huber') for a robust fit)", typeConverter=TypeConverters.toString)
    epsilon: Param[float] = Param(
        Params._dummy(), "epsilon",
        "the shape parameter of MLlib's huber loss (> 1; only with loss='huber', which StradsLasso refuses)",
        typeConverter=TypeConverters.toFloat)

    _mllib_only = {"solver": MLlibOnly("scheduled coordinate descent (StradsLasso's one solver; the objective is "
                                       "the same)", honoured=("auto",)),
                   "loss": MLlibOnly("StradsLasso fits the squared loss; for a robust fit use "
                                     "pyspark.ml.regression.LinearRegression(loss='huber')", refused=True,
                                     honoured=("squaredError",)),
                   "epsilon": MLlibOnly("the squared loss (epsilon shapes MLlib's huber loss only)")}
    _param_rules = {"solver": one_of("auto", "normal", "l-bfgs", note="MLlib's choices"),
                    "loss": one_of("squaredError", "huber", note="MLlib's choices"),
                    "epsilon": above(1, finite=True, note="MLlib's range")}

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(solver="auto", loss="squaredError", epsilon=1.35)


#: the most features whose least-squares standard errors a summary computes (MLlib's normal
#: solver, which gives them, covers as many; a (p + 1)^2 Gram matrix is summed on the driver)
INFERENCE_MAX_FEATURES = 4096


class LassoTrainingSummary(LinearTrainingSummary, LinearRegressionTrainingSummary):
    """A :class:`StradsLasso` fit's training summary: pystrads' history
    (:class:`~pystrads.ml._linear.LinearTrainingSummary`) and, as an MLlib
    ``LinearRegressionTrainingSummary``, MLlib's fields of the training data.

    An unregularised fit (``regParam=0``: least squares) has MLlib's ``coefficientStandardErrors``,
    ``tValues`` and ``pValues`` (the coefficients', then the intercept's), from one pass over the
    training data that sums ``X'WX``; a regularised fit has none, as MLlib's."""

    def __init__(self, result, fit):
        super().__init__(result, fit)
        self._penalised = fit.program.reg_param > 0
        self._inference = None

    def _least_squares(self):
        if self._penalised:
            raise NotImplementedError("No Std. Error of coefficients available for this model: a regularised fit "
                                      "(regParam > 0) has none, as MLlib's; fit with regParam=0 (least squares) "
                                      "for standard errors, t-values and p-values")
        model = self._model
        if model.numFeatures > INFERENCE_MAX_FEATURES:
            raise NotImplementedError(f"No Std. Error of coefficients available for {model.numFeatures} features: "
                                      f"as MLlib's normal solver, a summary computes them for at most "
                                      f"{INFERENCE_MAX_FEATURES}")
        if self._inference is None:
            wcol = model.getOrDefault("weightCol") if model.isDefined("weightCol") else None
            self._inference = least_squares_inference(
                self._dataset, model.getFeaturesCol(), model.getLabelCol(), wcol or None, model._coef,
                model.intercept, model.getFitIntercept())
        return self._inference

    @property
    def coefficientStandardErrors(self) -> List[float]:
        return self._least_squares()["se"]

    @property
    def tValues(self) -> List[float]:
        return self._least_squares()["t"]

    @property
    def pValues(self) -> List[float]:
        return self._least_squares()["p"]


def least_squares_inference(frame, fcol: str, lcol: str, wcol: Optional[str], coef, intercept: float,
                            fit_intercept: bool) -> dict:
    """MLlib's inference for a least-squares fit (``LinearRegressionSummary``'s definitions):
    standard errors ``sqrt(diag((A'WA)^-1) * rss / dof)`` -- ``A`` the features with a column of
    ones last when there is an intercept, ``rss`` the weighted sum of squared residuals, ``dof``
    the rows less the coefficients -- and their t-values and two-sided p-values, for the
    coefficients and then the intercept.  One Spark job over ``frame`` (any session kind)."""
    import numpy as np

    from ._arrow import collect_per_partition, row_entries

    coef = np.asarray(coef, dtype=np.float64)
    J, extra = len(coef), 1 if fit_intercept else 0
    columns = [fcol, lcol] + ([wcol] if wcol else [])

    def partial(batches):
        gram, rss, rows = np.zeros((J + extra, J + extra)), 0.0, 0
        for batch in batches:
            features = batch.column(0)
            chunks = features.chunks if hasattr(features, "chunks") else [features]
            y = np.asarray(batch.column(1).to_numpy(zero_copy_only=False), dtype=np.float64)
            w = np.asarray(batch.column(2).to_numpy(zero_copy_only=False), dtype=np.float64) if wcol else \
                np.ones(len(y))
            start = 0
            for chunk in chunks:
                valid, of_row, cols, values = row_entries(chunk, J, fcol)
                for lo in range(0, len(chunk), 1024):  # dense blocks of 1,024 rows
                    hi = min(lo + 1024, len(chunk))
                    a, b = np.searchsorted(of_row, [lo, hi])
                    x = np.zeros((hi - lo, J + extra))
                    x[of_row[a:b] - lo, cols[a:b]] = values[a:b]
                    if extra:
                        x[:, J] = 1.0
                    keep = valid[lo:hi]
                    x, yy, ww = x[keep], y[start + lo:start + hi][keep], w[start + lo:start + hi][keep]
                    r = yy - x[:, :J] @ coef - intercept
                    rss += float(ww @ (r * r))
                    gram += x.T @ (ww[:, None] * x)
                    rows += len(yy)
                start += len(chunk)
        return gram, rss, rows

    # each partition's (J + 1)^2 partial reaches the driver: at most ~1 GiB of them at once
    gram_bytes = 8 * (J + extra) ** 2 + 1024
    parts = collect_per_partition(frame.select(*columns).coalesce(max(1, (1 << 30) // gram_bytes)), partial)
    gram = sum(p[0] for p in parts)
    rss, rows = sum(p[1] for p in parts), sum(p[2] for p in parts)
    try:
        diag = np.diag(np.linalg.inv(gram))
    except np.linalg.LinAlgError:
        raise NotImplementedError("No Std. Error of coefficients available: X'WX is singular (a constant or "
                                  "collinear feature), as MLlib's normal solver finds it") from None
    dof = rows - J - extra
    se = np.sqrt(np.maximum(diag, 0.0) * rss / dof) if dof > 0 else np.full(J + extra, np.nan)
    estimates = np.concatenate([coef, [intercept]]) if extra else coef
    with np.errstate(divide="ignore", invalid="ignore"):
        t = estimates / se
    p = [student_t_two_sided(float(v), dof) for v in t]
    return {"se": se.tolist(), "t": t.tolist(), "p": p}


def student_t_two_sided(t: float, dof: int) -> float:
    """``P(|T| > |t|)`` for Student's t with ``dof`` degrees of freedom: the regularised incomplete
    beta function ``I_x(dof / 2, 1 / 2)`` at ``x = dof / (dof + t^2)`` (a continued fraction)."""
    import math

    if dof <= 0 or math.isnan(t):
        return math.nan
    if math.isinf(t):
        return 0.0
    return _incomplete_beta(dof / 2.0, 0.5, dof / (dof + t * t))


def _incomplete_beta(a: float, b: float, x: float) -> float:
    import math

    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 1000):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


class StradsLassoModel(_SparseLinearModel, _LassoParams):
    """A fitted :class:`StradsLasso`: ``coefficients``, ``intercept``, ``predict``, ``transform``, ``evaluate``.

    On a classic session ``transform`` and ``evaluate`` run MLlib's own
    ``LinearRegressionModel`` with these coefficients (scoring in the JVM;
    ``evaluate`` returns MLlib's ``LinearRegressionSummary``); under Spark
    Connect ``transform`` scores in Arrow batches (the same values) and ``evaluate`` returns a
    :class:`LassoEvaluation` with the summary's fields."""

    _mllib_class = "ml.regression.LinearRegressionModel"

    @property
    def scale(self) -> float:
        """MLlib's: the value by which ``||y - X'w||`` is scaled down with the huber loss; 1.0 for
        the squared loss, the one StradsLasso fits."""
        return 1.0

    def predict(self, value) -> float:
        """Prediction for one feature vector."""
        return self._margin_udf()(value)

    _export_formats = ("internal", "pmml")

    def _export(self, source: str, path: str, spark) -> None:
        """``write().format("pmml")``: a PMML 4.2 ``RegressionModel`` in one text file under
        ``path`` (``sc.textFile(path)`` reads it), laid out as MLlib's export of its linear
        regression model (fields ``field_0`` ... and ``target``)."""
        spark.createDataFrame([(pmml_regression(self._coef, self._intercept),)], "value string") \
            .coalesce(1).write.text(path)

    def _transform(self, dataset):
        self._check_columns(dataset, "featuresCol")
        out = self.getPredictionCol()
        if not out:
            return dataset
        mllib = self._mllib_model(dataset)
        if mllib is not None:
            return mllib.transform(dataset)
        margin = self._margin_column(dataset)
        if margin is not None:
            self._refuse_existing(dataset, [out])
            return dataset.withColumn(out, margin)
        return self._score_arrow(dataset, lambda margin, valid: {out: pa.array(margin, mask=~valid)},
                                 [T.StructField(out, T.DoubleType(), True)])

    def evaluate(self, dataset):
        """Regression metrics of the model on ``dataset``, as ``LinearRegressionModel.evaluate``:
        MLlib's ``LinearRegressionSummary`` (``r2``, ``r2adj``, ``rootMeanSquaredError``,
        ``residuals``, ``numInstances``, ``degreesOfFreedom``, ...) on a classic session, a
        :class:`LassoEvaluation` under Spark Connect."""
        self._check_columns(dataset, "featuresCol", "labelCol")
        mllib = self._mllib_model(dataset)
        if mllib is not None:
            return mllib.evaluate(dataset)
        return LassoEvaluation(self.transform(dataset), self.getPredictionCol(), self.getLabelCol(),
                               self.getFeaturesCol(),
                               self.getOrDefault("weightCol") if self.isDefined("weightCol") else None,
                               self.getFitIntercept(), self.numFeatures)


def pmml_regression(coefficients, intercept: float) -> str:
    """A linear regression model as a PMML 4.2 document, in the layout of MLlib's export."""
    import datetime
    from xml.etree import ElementTree as ET

    from .. import __version__

    names = [f"field_{j}" for j in range(len(coefficients))]
    root = ET.Element("PMML", xmlns="http://www.dmg.org/PMML-4_2", version="4.2")
    header = ET.SubElement(root, "Header", description="linear regression (pystrads StradsLasso, in the layout "
                                                       "of Apache Spark MLlib's PMML export)")
    ET.SubElement(header, "Application", name="pystrads", version=__version__)
    ET.SubElement(header, "Timestamp").text = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    dictionary = ET.SubElement(root, "DataDictionary", numberOfFields=str(len(names) + 1))
    for name in names + ["target"]:
        ET.SubElement(dictionary, "DataField", name=name, optype="continuous", dataType="double")
    model = ET.SubElement(root, "RegressionModel", modelName="linear regression", functionName="regression")
    schema = ET.SubElement(model, "MiningSchema")
    for name in names:
        ET.SubElement(schema, "MiningField", name=name, usageType="active")
    ET.SubElement(schema, "MiningField", name="target", usageType="target")
    table = ET.SubElement(model, "RegressionTable", intercept=repr(float(intercept)))
    for name, value in zip(names, coefficients):
        ET.SubElement(table, "NumericPredictor", name=name, coefficient=repr(float(value)))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n' + ET.tostring(root, encoding="unicode")


class StradsLasso(_SparseLinearEstimator, _LassoParams):
    """Lasso (or elastic-net) regression by STRADS dynamic-schedule parallel coordinate descent.

    ``relaxation`` (1.8) over-relaxes the rounds' coordinate steps (SOR); 1 is plain
    coordinate descent (see :class:`~pystrads.programs.lasso.LassoProgram`).

    Examples
    --------
    >>> from pystrads.ml import StradsLasso
    >>> model = StradsLasso(regParam=0.01).fit(df)        # df: (label double, features vector)
    >>> model.coefficients, model.intercept, model.summary.objectiveHistory[-1]   # doctest: +SKIP
    """

    _program_class = LassoProgram
    _model_class = StradsLassoModel
    _summary_class = LassoTrainingSummary

    relaxation: Param[float] = Param(
        Params._dummy(), "relaxation",
        "over-relaxation of the parallel rounds' coordinate steps, in (0, 2): a coefficient moves relaxation "
        "times its soft-thresholded step where its sign stays (SOR; each step still lowers the objective), "
        "which speeds up coordinate descent along correlated columns; 1 is plain coordinate descent",
        typeConverter=TypeConverters.toFloat)
    _param_rules = {"relaxation": Rule(lambda v, p: _number(v, True) and 0 < v < 2,
                                       "must be in (0, 2) (1 is plain coordinate descent)")}

    @keyword_only
    def __init__(self, *, featuresCol: str = "features", labelCol: str = "label", predictionCol: str = "prediction",
                 maxIter: int = 100, regParam: float = 0.0, elasticNetParam: float = 1.0, tol: float = 1e-6,
                 fitIntercept: bool = True, standardization: bool = True, weightCol: Optional[str] = None,
                 seed: Optional[int] = None, schedule: str = "dynamic", priority: str = "gradient",
                 coordinatesPerRound: Any = "auto", candidatesPerRound: Any = "auto", correlationThreshold: float = 0.3,
                 correlationSampleSize: int = 10000, workingSetLimit: int = 4096, relaxation: float = 1.8,
                 numWorkers: int = 0, validationIndicatorCol: str = "", validationTol: float = 0.0,
                 earlyStoppingRounds: int = 2, solver: str = "auto", loss: str = "squaredError", epsilon: float = 1.35,
                 aggregationDepth: int = 2, maxBlockSizeInMB: float = 0.0):
        super().__init__()
        self._setDefault(relaxation=1.8)
        self._set(**self._input_kwargs)

    def _program(self, fit):
        program = super()._program(fit)
        program.relaxation = float(self.getRelaxation())
        return program


class LassoEvaluation(LinearRegressionSummary):
    """An MLlib ``LinearRegressionSummary`` whose fields are computed with MLlib's evaluators (what
    :meth:`StradsLassoModel.evaluate` gives under Spark Connect, where MLlib's own summary
    cannot be made): ``rootMeanSquaredError``, ``meanSquaredError``, ``meanAbsoluteError``,
    ``r2``, ``explainedVariance`` (weighted, through the origin without an intercept, as
    MLlib's), ``r2adj``, ``residuals``, ``devianceResiduals``, ``numInstances``,
    ``degreesOfFreedom``, ``predictions`` and the column names; standard errors raise as
    MLlib's do for a regularised fit."""

    _java_obj = None  # MLlib's base wraps a JVM summary: none here

    def __init__(self, predictions, prediction_col: str, label_col: str, features_col: str = "features",
                 weight_col: Optional[str] = None, fit_intercept: bool = True, num_features: int = 0):
        self._predictions = predictions
        self._cols = {"predictionCol": prediction_col, "labelCol": label_col, "featuresCol": features_col,
                      "weightCol": weight_col or None}
        self._fit_intercept, self._num_features = bool(fit_intercept), int(num_features)
        self._cache = {}

    predictions = property(lambda self: self._predictions)
    predictionCol = property(lambda self: self._cols["predictionCol"])
    labelCol = property(lambda self: self._cols["labelCol"])
    featuresCol = property(lambda self: self._cols["featuresCol"])
    weightCol = property(lambda self: self._cols["weightCol"])

    @property
    def devianceResiduals(self) -> List[float]:
        """MLlib's: the smallest and largest weighted residual ``sqrt(w) (label - prediction)``."""
        if "deviance" not in self._cache:
            w = F.sqrt(F.col(self.weightCol).cast("double")) if self.weightCol else F.lit(1.0)
            r = w * (F.col(self.labelCol).cast("double") - F.col(self.predictionCol))
            row = self.predictions.select(F.min(r).alias("lo"), F.max(r).alias("hi")).first()
            self._cache["deviance"] = [float(row["lo"]), float(row["hi"])]
        return self._cache["deviance"]

    def _metric(self, name: str) -> float:
        if name not in self._cache:
            from pyspark.ml.evaluation import RegressionEvaluator

            ev = RegressionEvaluator(predictionCol=self.predictionCol, labelCol=self.labelCol, metricName=name,
                                     throughOrigin=not self._fit_intercept)
            if self.weightCol:
                ev.setWeightCol(self.weightCol)
            self._cache[name] = float(ev.evaluate(self.predictions))
        return self._cache[name]

    @property
    def numInstances(self) -> int:
        if "n" not in self._cache:
            self._cache["n"] = int(self.predictions.count())
        return self._cache["n"]

    @property
    def degreesOfFreedom(self) -> int:
        return self.numInstances - self._num_features - (1 if self._fit_intercept else 0)

    @property
    def r2adj(self) -> float:
        """MLlib's: ``1 - (1 - r2) (n - i) / (n - p - i)``, ``i`` = 1 with an intercept."""
        i = 1 if self._fit_intercept else 0
        return 1.0 - (1.0 - self.r2) * (self.numInstances - i) / (self.numInstances - self._num_features - i)

    @property
    def residuals(self):
        """A DataFrame of ``label - prediction`` (column ``residuals``)."""
        return self.predictions.select((F.col(self.labelCol).cast("double") - F.col(self.predictionCol))
                                       .alias("residuals"))

    def _no_standard_errors(self):
        raise NotImplementedError("No Std. Error of coefficients available for this model: a regularised fit has "
                                  "none (MLlib gives them for its 'normal' solver without regularisation only)")

    coefficientStandardErrors = tValues = pValues = property(_no_standard_errors)

    @property
    def rootMeanSquaredError(self) -> float:
        return self._metric("rmse")

    @property
    def meanSquaredError(self) -> float:
        return self._metric("mse")

    @property
    def meanAbsoluteError(self) -> float:
        return self._metric("mae")

    @property
    def r2(self) -> float:
        return self._metric("r2")

    @property
    def explainedVariance(self) -> float:
        return self._metric("var")


__all__ = ["StradsLasso", "StradsLassoModel", "LassoTrainingSummary", "LinearTrainingSummary", "LassoEvaluation"]
