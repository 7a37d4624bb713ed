"""What StradsLasso and StradsLogisticRegression share: params, the fit hooks, the training
summary and the model (the input scan is :mod:`pystrads.ml._linear_input`).

The estimators only orchestrate (:class:`~pystrads.ml._base._StradsEstimator`'s ``_fit``):
check params and schema (no Spark job), scan the input once (bad values, sizes, counts),
build the program (:mod:`pystrads.programs.lasso`, :mod:`pystrads.programs.logistic`; its
workers draw the correlation check's row sample as they load) and run it on the engine, then wrap the coefficients in a
model.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, List

import numpy as np
from pyspark.ml.linalg import DenseVector, SparseVector, Vectors
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import (HasFeaturesCol, HasFitIntercept, HasLabelCol, HasMaxIter, HasPredictionCol,
                                     HasRegParam, HasSeed, HasStandardization, HasTol, HasWeightCol)
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..spark import is_dataframe
from ..errors import InputError
from ..programs.lasso import PRIORITIES, SCHEDULES
from ._base import Fit, _StradsEstimator, _StradsModel
from ._linear_input import batch_blocks, scan_input
from ._params import (NUMBERS, VECTORS, HasEarlyStopping, HasNumWorkers, MLlibOnly, at_least, at_least_or_auto,
                      int_or_auto, one_of, within)
from ._summary import FitSummary

log = logging.getLogger(__name__)


class _SparseLinearParams(HasFeaturesCol, HasLabelCol, HasPredictionCol, HasWeightCol, HasRegParam, HasMaxIter,
                          HasTol, HasFitIntercept, HasStandardization, HasSeed, HasNumWorkers):
    """Params shared by the L1 estimators (MLlib's names, defaults and meaning, plus the schedule)."""

    elasticNetParam: Param[float] = Param(
        Params._dummy(), "elasticNetParam",
        "the ElasticNet mixing parameter alpha, in [0, 1]: the penalty is regParam * (alpha * L1 + (1 - alpha) / 2 "
        "* L2), as in MLlib (1 is the lasso, 0 ridge)",
        typeConverter=TypeConverters.toFloat)
    schedule: Param[str] = Param(
        Params._dummy(), "schedule",
        "which coefficients each round updates: 'dynamic' (STRADS: by priority, with the dependency check), "
        "'shotgun' (uniform random, no check) or 'roundrobin' (cyclic, no check)",
        typeConverter=TypeConverters.toString)
    priority: Param[str] = Param(
        Params._dummy(), "priority",
        "dynamic priorities: 'gradient' (the step each coefficient would take, refreshed with the KKT "
        "violations every iteration) or 'delta' (STRADS's (delta beta)^2 + eta)",
        typeConverter=TypeConverters.toString)
    coordinatesPerRound: Param[Any] = Param(
        Params._dummy(), "coordinatesPerRound",
        "coefficients updated in parallel per round (STRADS's L; >= 1), or 'auto': chosen from the data when the "
        "fit starts, as wide as the rows the round's columns share allow (the first step's coordinates_per_round)",
        typeConverter=int_or_auto)
    candidatesPerRound: Param[Any] = Param(
        Params._dummy(), "candidatesPerRound",
        "candidates the dependency check examines per round (STRADS's L'; >= coordinatesPerRound), or 'auto': "
        "twice coordinatesPerRound", typeConverter=int_or_auto)
    correlationThreshold: Param[float] = Param(
        Params._dummy(), "correlationThreshold",
        "no two coefficients whose columns correlate by at least this much are updated in one round "
        "(STRADS's rho, in (0, 1]; 1 keeps only exact duplicates apart)", typeConverter=TypeConverters.toFloat)
    correlationSampleSize: Param[int] = Param(
        Params._dummy(), "correlationSampleSize",
        "rows sampled to estimate column correlations for the dependency check (>= 1)",
        typeConverter=TypeConverters.toInt)
    workingSetLimit: Param[int] = Param(
        Params._dummy(), "workingSetLimit",
        "largest working set the driver solves exactly, on its columns or its Gram matrix (squared and binary "
        "log-loss; 0 = never): "
        "from the first sweep on, while the non-zeros number at most 3/4 of it, the problem restricted to the "
        "non-zeros and the worst KKT violators is solved on the driver; beyond, parallel rounds",
        typeConverter=TypeConverters.toInt)

    aggregationDepth: Param[int] = Param(
        Params._dummy(), "aggregationDepth",
        "suggested depth for treeAggregate (>= 2; MLlib's, accepted and ignored: the workers' partial sums meet "
        "on the parameter-server shards)", typeConverter=TypeConverters.toInt)
    maxBlockSizeInMB: Param[float] = Param(
        Params._dummy(), "maxBlockSizeInMB",
        "maximum memory in MB for stacking input data into blocks (>= 0; MLlib's, accepted and ignored: each "
        "worker keeps its rows as one sparse column store)", typeConverter=TypeConverters.toFloat)

    _mllib_only = {"aggregationDepth": MLlibOnly("pystrads' shards, which sum the workers' partials"),
                   "maxBlockSizeInMB": MLlibOnly("pystrads' column store (each worker's rows in one block)")}

    _param_rules = {"aggregationDepth": at_least(2, note="MLlib's range"),
                    "maxBlockSizeInMB": at_least(0, finite=True, note="MLlib's range"),
                    "elasticNetParam": within(0, 1, note="1 is the lasso, 0 ridge"),
                    "schedule": one_of(*SCHEDULES), "priority": one_of(*PRIORITIES),
                    "coordinatesPerRound": at_least_or_auto(1), "candidatesPerRound": at_least_or_auto("coordinatesPerRound"),
                    "correlationThreshold": within(0, 1, low_open=True), "correlationSampleSize": at_least(1),
                    "workingSetLimit": within(0, 16384, note="its columns or Gram matrix travel through the shards")}
    _column_kinds = {"featuresCol": VECTORS, "labelCol": NUMBERS, "weightCol": NUMBERS}

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(regParam=0.0, elasticNetParam=1.0, maxIter=100, tol=1e-6, fitIntercept=True,
                         standardization=True, schedule="dynamic", priority="gradient", coordinatesPerRound="auto",
                         candidatesPerRound="auto", correlationThreshold=0.3, correlationSampleSize=10000,
                         workingSetLimit=4096, featuresCol="features", labelCol="label",
                         predictionCol="prediction", aggregationDepth=2, maxBlockSizeInMB=0.0)


class LinearTrainingSummary(FitSummary):
    """Training history of an L1 fit.

    ``objectiveHistory``: the objective (MLlib's scaling) at the start and after
    every iteration; ``updatesHistory``: cumulative coordinate updates at each of
    those points (``roundUpdatesHistory``: those done by the parallel rounds on the
    data; the rest by the driver's working-set solver); ``gapHistory``: duality gap
    (Lasso); ``totalIterations``; ``stopReason``; ``steps`` (pandas: per Spark
    step, rounds, seconds and the time split); ``timings`` (one-off costs in s).
    """

    #: MLlib's training-summary fields, computed on the training data by MLlib's own summary of
    #: the fitted coefficients (``model.evaluate``) the first time one is read
    MLLIB_FIELDS = frozenset((
        "predictions", "predictionCol", "labelCol", "featuresCol", "weightCol", "explainedVariance",
        "meanAbsoluteError", "meanSquaredError", "rootMeanSquaredError", "r2", "r2adj", "residuals",
        "degreesOfFreedom", "devianceResiduals", "coefficientStandardErrors", "tValues", "pValues",
        "probabilityCol", "labels", "truePositiveRateByLabel", "falsePositiveRateByLabel", "precisionByLabel",
        "recallByLabel", "fMeasureByLabel", "accuracy", "weightedTruePositiveRate", "weightedFalsePositiveRate",
        "weightedRecall", "weightedPrecision", "weightedFMeasure", "roc", "areaUnderROC", "pr",
        "fMeasureByThreshold", "precisionByThreshold", "recallByThreshold", "scoreCol"))

    #: the subclasses are also MLlib's training-summary types, whose base wraps a JVM object: none here
    _java_obj = None

    def __init__(self, result, fit):
        super().__init__(result, fit)
        self.stopReason = result.stop_reason or "maxIter"
        self._num_instances = int(fit.stats["rows"])
        self.numNonZeros = int(fit.stats["nnz"])
        vcol = fit.stats.get("validation_col")
        # the training data, scored on first use of an MLlib field
        self._dataset = fit.dataset.filter(~F.coalesce(F.col(vcol), F.lit(False))) if vcol else fit.dataset
        self.numValidationInstances = int(fit.stats.get("validation_rows", 0))
        self._model = None  # set by the model that holds this summary
        self._evaluation = None

    @property
    def numInstances(self) -> int:
        """The training rows (those of the validation set excluded)."""
        return self._num_instances

    def _mllib_field(self, name: str):
        if self._model is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}: MLlib's fields need "
                                 "the model that holds this summary")
        if self._evaluation is None:
            self._evaluation = self._model.evaluate(self._dataset)
        return getattr(self._evaluation, name)

    @property
    def objectiveHistory(self) -> List[float]:
        return self._history("objective")

    @property
    def updatesHistory(self) -> List[int]:
        return [int(v) for v in self._history("updates")]

    @property
    def roundUpdatesHistory(self) -> List[int]:
        return [int(v) for v in self._history("round_updates")]

    @property
    def gapHistory(self) -> List[float]:
        return self._history("gap")

    @property
    def totalIterations(self) -> int:
        return max(0, len(self.iterations) - 1)

    def plot(self, ax=None, x: str = "updates"):
        """Convergence plot (objective minus its last value, log scale) with matplotlib."""
        def above_best(obj):
            best = obj.min() if len(obj) else 0.0
            return np.maximum(obj - best, 1e-16 * max(abs(best), 1e-300))

        return self._plot(ax, "objective", "objective - final", x=x, log_y=True, values=above_best)


for _name in LinearTrainingSummary.MLLIB_FIELDS:  # each one read from the model's evaluation of the training data
    setattr(LinearTrainingSummary, _name, property(lambda self, _n=_name: self._mllib_field(_n)))
del _name


class _SparseLinearEstimator(_StradsEstimator, _SparseLinearParams, HasEarlyStopping):
    """The fit hooks of both L1 estimators; each names its ``_program_class``, ``_model_class``
    and whether its labels are class indices (``_class_labels``)."""

    _fit_columns = ("featuresCol", "labelCol", "weightCol", "validationIndicatorCol")
    _summary_class = LinearTrainingSummary
    _class_labels = False

    def _scan(self, fit: Fit):
        fcol, lcol = self.getFeaturesCol(), self.getLabelCol()
        wcol = self.getWeightCol() if self.isDefined(self.weightCol) and self.getWeightCol() else None
        vcol = self._validation_col()
        records, stats = scan_input(fit.dataset, fcol, lcol, wcol, self._class_labels, fit.workers, vcol,
                                    connect=fit.setup.spark.connect)
        if stats["rows"] == 0 and stats["validation_rows"]:
            raise InputError(f"validationIndicatorCol {vcol!r} marks every row ({stats['validation_rows']}) for "
                             "validation; fit needs training rows: mark some false")
        if stats["rows"] == 0:
            raise InputError("the input has no rows; fit needs at least one (label, features) row")
        if vcol and stats["validation_rows"] == 0:
            raise InputError(f"validationIndicatorCol {vcol!r} marks no row for validation (every value is false "
                             "or null); early stopping needs validation rows: mark some true, or unset it to "
                             "train without one")
        if stats["error"]:
            what, fix = stats["error"]
            raise InputError(f"{what}: {fix}")
        if wcol and not stats["wsum"] > 0:
            raise InputError(f"weightCol {wcol!r}: the weights sum to {stats['wsum']!r}; at least one row needs a "
                             "positive weight (as MLlib requires)")
        sizes = stats["sizes"] - {-1}
        if len(sizes) != 1:
            raise InputError(f"featuresCol {fcol!r}: vectors have different sizes {sorted(sizes)[:10]}; all rows "
                             f"need the same number of features")
        stats["features"] = int(next(iter(sizes)))
        stats["validation_col"] = vcol
        if stats["features"] < 1:
            raise InputError(f"featuresCol {fcol!r}: vectors have size 0; there is nothing to fit")
        return records, stats

    def _program_kind(self, fit: Fit):
        """``(program class, its arguments beyond the params' or in place of them)`` for this fit."""
        return self._program_class, {}

    def _program(self, fit: Fit):
        stats = fit.stats
        program_class, extra = self._program_kind(fit)
        options = dict(
            fit_intercept=self.getFitIntercept(),
            elastic_net=self.getElasticNetParam(), standardization=self.getStandardization(),
            schedule=self.getSchedule(), priority=self.getPriority(), coords_per_round=self.getCoordinatesPerRound(),
            candidates_per_round=self.getCandidatesPerRound(), rho=self.getCorrelationThreshold(),
            max_iter=self.getMaxIter(), tol=self.getTol(), gram_limit=self.getWorkingSetLimit(),
            sample_rows=self.getCorrelationSampleSize(), early_stopping=self._early_stopping("validation_loss"))
        options.update(extra)
        program = program_class(stats["features"], self.getRegParam(), **options)
        if not program.gram_limit and self.getWorkingSetLimit():  # the multinomial's rounds run without one
            self._warn_ignored(f"the {program.loss_name} loss (no working-set solver)", "workingSetLimit")
        program.t_origin = fit.t_start
        log.info("%s: %d rows, %d features, %d non-zeros, %d workers, schedule %s", type(self).__name__,
                 stats["rows"], stats["features"], stats["nnz"], fit.workers, self.getSchedule())
        return program

    def _engine_args(self, fit: Fit):
        frame = is_dataframe(fit.records)  # (y, w, x) through Arrow, already one partition per worker
        return {"prepartitioned": frame, "decode_batch": batch_blocks if frame else None}

    def _read_model(self, result, fit: Fit):
        return self._model_class(*fit.program.result(result.read_table("coef")))


class _SparseLinearModel(_StradsModel):
    """Coefficients, intercept, persistence, MLlib's column setters; subclasses define ``transform``."""

    _setters = ("featuresCol", "predictionCol")

    def __init__(self, coefficients=None, intercept: float = 0.0):
        super().__init__()
        self._coef = None if coefficients is None else np.asarray(coefficients, dtype=np.float64)
        self._intercept = float(intercept)

    @property
    def coefficients(self) -> DenseVector:
        return Vectors.dense(self._coef)

    @property
    def intercept(self) -> float:
        return self._intercept

    @property
    def numFeatures(self) -> int:
        return int(len(self._coef))

    def _repr_fields(self):
        return {"numFeatures": self.numFeatures}

    @property
    def summary(self):
        """The training summary: pystrads' history (``objectiveHistory``, ``gapHistory``,
        ``timings`` ...) and MLlib's training-summary fields (``r2``, ``residuals``, ``roc``,
        ``accuracy`` ...), the latter from MLlib's own summary of these coefficients on the
        training data (scored the first time one is read)."""
        summary = super().summary
        summary._model = self
        return summary

    #: the MLlib model class these coefficients make (``_mllib_model``)
    _mllib_class = ""

    def _mllib_model(self, dataset):
        """MLlib's own model with these coefficients and this model's columns, through the JVM
        (None under Spark Connect, where no JVM object can be made): its ``transform`` scores in
        the JVM, and its ``evaluate`` gives MLlib's summary classes, field for field."""
        from ..spark import handle_of

        if handle_of(dataset).connect:
            return None
        import importlib

        from pyspark.ml.common import _py2java

        sc = dataset.sparkSession.sparkContext
        package, name = self._mllib_class.rsplit(".", 1)
        jvm_class = sc._jvm
        for part in ("org.apache.spark." + self._mllib_class).split("."):
            jvm_class = getattr(jvm_class, part)
        model = getattr(importlib.import_module("pyspark." + package), name)(
            jvm_class(*self._jvm_model_args(lambda value: _py2java(sc, value))))
        for param in self._mllib_params():
            if self.isDefined(param) and model.hasParam(param) and self.getOrDefault(param) not in (None, ""):
                model._set(**{param: self.getOrDefault(param)})
        model._transfer_params_to_java()
        return model

    def _jvm_model_args(self, to_java) -> tuple:
        """The MLlib model's constructor arguments (``to_java`` converts a vector or matrix)."""
        return self.uid, to_java(self.coefficients), float(self._intercept)

    def _mllib_params(self) -> List[str]:
        return ["featuresCol", "labelCol", "predictionCol", "weightCol", "fitIntercept"]

    def _score_arrow(self, dataset, columns, fields):
        """``dataset`` with the columns ``columns(margin, valid)`` returns (name -> Arrow array;
        ``fields``: their StructFields, refused when the input has one, as MLlib refuses) appended,
        scored in Arrow batches of whole rows (``mapInArrow``: where pyspark has no Arrow UDF for
        :meth:`_margin_column`, classic and Connect alike): each batch's margins
        ``x . coef + intercept`` (one per class for a coefficient matrix) in a few numpy calls (:func:`~pystrads.ml._arrow.row_dots`),
        ``valid`` False for null features."""
        import pyarrow as pa

        from ._arrow import row_dots

        self._refuse_existing(dataset, [f.name for f in fields])
        coef, intercept, fcol = self._coef.T, self._intercept, self.getFeaturesCol()  # (features[, classes])
        index = dataset.columns.index(fcol)

        def score(batches):
            for batch in batches:
                dots, valid = row_dots(batch.column(index), coef, fcol)
                added = columns(dots + intercept, valid)
                yield pa.RecordBatch.from_arrays(list(batch.columns) + list(added.values()),
                                                 batch.schema.names + list(added))

        return dataset.mapInArrow(score, T.StructType(dataset.schema.fields + list(fields)))

    def _margin_column(self, dataset):
        """The margin ``x . coef + intercept`` of ``dataset``'s features as a Column computed by an
        Arrow UDF (pyspark >= 4.1: only the features travel to Python, a double comes back; null
        for null features), or None where pyspark has no Arrow UDF."""
        try:
            from pyspark.sql.functions import ArrowUDFType, arrow_udf
        except ImportError:
            return None
        import pyarrow as pa

        from ._arrow import row_dots

        coef, intercept, fcol = self._coef, self._intercept, self.getFeaturesCol()

        def margin(column):
            dots, valid = row_dots(column, coef, fcol)
            return pa.array(dots + intercept, mask=~valid)

        with warnings.catch_warnings():  # "prefer type hints": this module's annotations are strings
            warnings.simplefilter("ignore", UserWarning)
            udf = arrow_udf(margin, T.DoubleType(), ArrowUDFType.SCALAR)
        return udf(F.col(fcol))

    def _refuse_existing(self, dataset, names) -> None:
        for name in names:
            if name in dataset.columns:
                raise InputError(f"column {name!r} already exists in the input: set the model's output column "
                                 f"to another name, or drop it first")

    def _margin_udf(self):
        coef, intercept = self._coef, self._intercept

        def margin(v):
            if v is None:
                return None
            if isinstance(v, SparseVector):
                return float(np.dot(v.values, coef[v.indices]) + intercept)
            return float(np.dot(v.toArray(), coef) + intercept)

        return margin

    # -- persistence: data/ holds one row (intercept, coefficients)
    def _save_data(self, write) -> dict:
        write("data", T.StructType([T.StructField("intercept", T.DoubleType(), False),
                                    T.StructField("coefficients", T.ArrayType(T.DoubleType(), False), False)]),
              [(self._intercept, self._coef.tolist())])
        return {"numFeatures": self.numFeatures}

    @classmethod
    def _load_data(cls, read, metadata):
        row = read("data").first()
        return cls(np.asarray(row["coefficients"], dtype=np.float64), float(row["intercept"]))
