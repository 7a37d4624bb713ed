"""What StradsLasso and StradsLogisticRegression share: params, the fit, the model (the input scan
is :mod:`pystrads.ml._linear_input`).

The estimators only orchestrate: check params and schema (no Spark job),
scan the input once (bad values, sizes, counts and the row sample for the
correlation check), build the program (:mod:`pystrads.programs.lasso`) and
run it on the engine, then wrap the coefficients in a model.
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Any, List

import numpy as np
from pyspark.ml.linalg import DenseVector, SparseVector, Vectors, VectorUDT
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import (HasFeaturesCol, HasFitIntercept, HasLabelCol, HasMaxIter, HasPredictionCol,
                                     HasRegParam, HasSeed, HasStandardization, HasTol, HasWeightCol)
from pyspark.sql import types as T

from ..engine import Engine
from ..engine.preflight import check_cluster, default_num_workers
from ..errors import ConfigurationError, InputError
from ..engine.spark import is_dataframe
from ..programs.lasso import PRIORITIES, SCHEDULES, ColumnSample
from ._linear_input import _block_of, scan_input
from ._params import HasNumWorkers, check_common_params
from ._summary import FitSummary, HasTrainingSummary
from ._validation import check_num_workers

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
    coordinatesPerRound: Param[int] = Param(
        Params._dummy(), "coordinatesPerRound", "coefficients updated in parallel per round (STRADS's L; >= 1)",
        typeConverter=TypeConverters.toInt)
    candidatesPerRound: Param[int] = Param(
        Params._dummy(), "candidatesPerRound",
        "candidates the dependency check examines per round (STRADS's L'; >= coordinatesPerRound)",
        typeConverter=TypeConverters.toInt)
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
        "largest working set the driver solves exactly from its Gram matrix (squared loss only; 0 = never): "
        "from the first sweep on, while the non-zeros number at most 3/4 of it, the problem restricted to the "
        "non-zeros and the worst KKT violators is solved on the driver; beyond, parallel rounds",
        typeConverter=TypeConverters.toInt)

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(regParam=0.0, elasticNetParam=1.0, maxIter=100, tol=1e-6, fitIntercept=True,
                         standardization=True, schedule="dynamic", priority="gradient", coordinatesPerRound=256,
                         candidatesPerRound=512, correlationThreshold=0.3, correlationSampleSize=10000,
                         workingSetLimit=4096, featuresCol="features", labelCol="label",
                         predictionCol="prediction")

    def getElasticNetParam(self) -> float:
        return self.getOrDefault(self.elasticNetParam)

    def getSchedule(self) -> str:
        return self.getOrDefault(self.schedule)

    def getPriority(self) -> str:
        return self.getOrDefault(self.priority)

    def getCoordinatesPerRound(self) -> int:
        return self.getOrDefault(self.coordinatesPerRound)

    def getCandidatesPerRound(self) -> int:
        return self.getOrDefault(self.candidatesPerRound)

    def getCorrelationThreshold(self) -> float:
        return self.getOrDefault(self.correlationThreshold)

    def getCorrelationSampleSize(self) -> int:
        return self.getOrDefault(self.correlationSampleSize)

    def getWorkingSetLimit(self) -> int:
        return self.getOrDefault(self.workingSetLimit)

    # -- checks that need no Spark job
    def _check_params(self) -> None:
        def bad(name, why):
            raise ConfigurationError(f"{name}={self.getOrDefault(name)!r} {why}")

        if not (self.getRegParam() >= 0 and math.isfinite(self.getRegParam())):
            bad("regParam", "must be a finite number >= 0")
        if not 0.0 <= self.getElasticNetParam() <= 1.0:
            bad("elasticNetParam", "must be in [0, 1] (1 is the lasso, 0 ridge)")
        check_common_params(self)
        if not (self.getTol() > 0 and math.isfinite(self.getTol())):
            bad("tol", "must be a finite number > 0")
        if self.getSchedule() not in SCHEDULES:
            bad("schedule", f"is not one of {SCHEDULES}")
        if self.getPriority() not in PRIORITIES:
            bad("priority", f"is not one of {PRIORITIES}")
        if self.getCoordinatesPerRound() < 1:
            bad("coordinatesPerRound", "must be >= 1")
        if self.getCandidatesPerRound() < self.getCoordinatesPerRound():
            bad("candidatesPerRound", f"must be >= coordinatesPerRound ({self.getCoordinatesPerRound()})")
        if not 0 < self.getCorrelationThreshold() <= 1:
            bad("correlationThreshold", "must be in (0, 1]")
        if self.getCorrelationSampleSize() < 1:
            bad("correlationSampleSize", "must be >= 1")
        if not 0 <= self.getWorkingSetLimit() <= 16384:
            bad("workingSetLimit", "must be in [0, 16384] (its Gram matrix lives on the shards)")

    def _check_schema(self, dataset) -> None:
        fcol, lcol = self.getFeaturesCol(), self.getLabelCol()
        cols = dataset.columns
        for param, col in (("featuresCol", fcol), ("labelCol", lcol)) + (
                (("weightCol", self.getWeightCol()),) if self.isDefined(self.weightCol) and self.getWeightCol()
                else ()):
            if col not in cols:
                raise InputError(f"{param} {col!r} is not a column of the input (columns: {cols}); set {param} "
                                 f"to the right column")
        ftype = dataset.schema[fcol].dataType
        if not isinstance(ftype, VectorUDT):
            raise InputError(f"featuresCol {fcol!r} has type {ftype.simpleString()}; expected a vector column "
                             f"(pyspark.ml.linalg, e.g. from VectorAssembler)")
        for param in ("labelCol", "weightCol"):
            if param == "weightCol" and not (self.isDefined(self.weightCol) and self.getWeightCol()):
                continue
            col = self.getOrDefault(param)
            dtype = dataset.schema[col].dataType
            if not isinstance(dtype, T.NumericType):
                raise InputError(f"{param} {col!r} has type {dtype.simpleString()}; expected a numeric column "
                                 f"(cast it, e.g. F.col({col!r}).cast('double'), or index strings with "
                                 "StringIndexer)")


def fit_linear(estimator, dataset, program_cls, binary_labels: bool):
    """The shared ``_fit``: checks, scan, program, engine; returns ``(coefficients, intercept, summary)``."""
    t_start = time.perf_counter()
    estimator._check_params()
    estimator._check_schema(dataset)
    fcol, lcol = estimator.getFeaturesCol(), estimator.getLabelCol()
    wcol = estimator.getWeightCol() if estimator.isDefined(estimator.weightCol) and estimator.getWeightCol() else None
    check_num_workers(dataset, estimator.getNumWorkers())
    U = default_num_workers(dataset, estimator.getNumWorkers() or None)
    check_cluster(dataset, U)  # before any job
    records, stats = scan_input(dataset, fcol, lcol, wcol, estimator.getCorrelationSampleSize(), binary_labels,
                                U)
    if stats["rows"] == 0:
        raise InputError("the input has no rows; fit needs at least one (label, features) row")
    if stats["error"]:
        what, fix = stats["error"]
        raise InputError(f"{what}: {fix}")
    if wcol and not stats["wsum"] > 0:
        raise InputError(f"weightCol {wcol!r}: the weights sum to {stats['wsum']!r}; at least one row needs a "
                         "positive weight (as MLlib requires)")
    sizes = stats["sizes"] - {-1}
    if len(sizes) != 1:
        raise InputError(f"featuresCol {fcol!r}: vectors have different sizes {sorted(sizes)[:10]}; all rows need "
                         f"the same number of features")
    num_features = int(next(iter(sizes)))
    if num_features < 1:
        raise InputError(f"featuresCol {fcol!r}: vectors have size 0; there is nothing to fit")
    scan_s = time.perf_counter() - t_start
    sample = ColumnSample(stats["sample"], num_features)
    seed = int(estimator.getOrDefault(estimator.seed))  # HasSeed always has a default
    program = program_cls(
        num_features, estimator.getRegParam(), fit_intercept=estimator.getFitIntercept(),
        elastic_net=estimator.getElasticNetParam(),
        standardization=estimator.getStandardization(), schedule=estimator.getSchedule(),
        priority=estimator.getPriority(), coords_per_round=estimator.getCoordinatesPerRound(),
        candidates_per_round=estimator.getCandidatesPerRound(), rho=estimator.getCorrelationThreshold(),
        max_iter=estimator.getMaxIter(), tol=estimator.getTol(), gram_limit=estimator.getWorkingSetLimit(),
        sample=sample)
    program.t_origin = t_start
    log.info("%s: %d rows, %d features, %d non-zeros, %d workers, schedule %s", type(estimator).__name__,
             stats["rows"], num_features, stats["nnz"], U, estimator.getSchedule())
    frame = is_dataframe(records)  # row blocks through Arrow, already one partition per worker
    with Engine(program, records, num_workers=U, seed=seed, keep_states=False, prepartitioned=frame,
                decode=_block_of if frame else None).fit() as result:
        t0 = time.perf_counter()
        coef = result.read_table("coef")
        coefficients, intercept = program.result(coef)
        summary = LinearTrainingSummary(result.summary, result.stop_reason, program, scan_s,
                                        time.perf_counter() - t0, stats)
    return coefficients, intercept, summary


class _SparseLinearSetters:
    """``set<Param>`` for every estimator param (MLlib's convention), shared by both estimators."""

    def setFeaturesCol(self, value):
        return self._set(featuresCol=value)

    def setLabelCol(self, value):
        return self._set(labelCol=value)

    def setPredictionCol(self, value):
        return self._set(predictionCol=value)

    def setWeightCol(self, value):
        return self._set(weightCol=value)

    def setRegParam(self, value):
        return self._set(regParam=value)

    def setElasticNetParam(self, value):
        return self._set(elasticNetParam=value)

    def setMaxIter(self, value):
        return self._set(maxIter=value)

    def setTol(self, value):
        return self._set(tol=value)

    def setFitIntercept(self, value):
        return self._set(fitIntercept=value)

    def setStandardization(self, value):
        return self._set(standardization=value)

    def setSeed(self, value):
        return self._set(seed=value)

    def setSchedule(self, value):
        return self._set(schedule=value)

    def setPriority(self, value):
        return self._set(priority=value)

    def setCoordinatesPerRound(self, value):
        return self._set(coordinatesPerRound=value)

    def setCandidatesPerRound(self, value):
        return self._set(candidatesPerRound=value)

    def setCorrelationThreshold(self, value):
        return self._set(correlationThreshold=value)

    def setCorrelationSampleSize(self, value):
        return self._set(correlationSampleSize=value)

    def setWorkingSetLimit(self, value):
        return self._set(workingSetLimit=value)

    def setNumWorkers(self, value):
        return self._set(numWorkers=value)


class LinearTrainingSummary(FitSummary):
    """Training history of an L1 fit.

    ``objectiveHistory``: the objective (MLlib's scaling) at the start and after
    every iteration; ``updatesHistory``: cumulative coordinate updates at each of
    those points (``roundUpdatesHistory``: those done by the parallel rounds on the
    data; the rest by the driver's working-set solver); ``gapHistory``: duality gap
    (Lasso); ``totalIterations``; ``stopReason``; ``steps`` (pandas: per Spark
    step, rounds, seconds and the time split); ``timings`` (one-off costs in s).
    """

    def __init__(self, engine_summary, stop_reason, program, scan_s, read_s, stats):
        super().__init__(engine_summary, scan_s=scan_s, read_model_s=read_s)
        self.stopReason = stop_reason or "maxIter"
        self.numInstances = int(stats["rows"])
        self.numNonZeros = int(stats["nnz"])

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
        ax = self._axes(ax)
        obj = np.asarray(self.objectiveHistory)
        best = obj.min() if len(obj) else 0.0
        ax.semilogy(self.iterations[x], np.maximum(obj - best, 1e-16 * max(abs(best), 1e-300)), marker="o")
        ax.set_xlabel(x)
        ax.set_ylabel("objective - final")
        return ax


class SparseLinearModelMixin(HasTrainingSummary):
    """Coefficients, intercept, persistence, the column setters; subclasses define ``transform``."""

    def setFeaturesCol(self, value: str):
        """Read the features from another column (e.g. a loaded model on new data)."""
        return self._set(featuresCol=value)

    def setPredictionCol(self, value: str):
        return self._set(predictionCol=value)

    def _init_coefficients(self, coefficients=None, intercept: float = 0.0):
        self._coef = None if coefficients is None else np.asarray(coefficients, dtype=np.float64)
        self._intercept = float(intercept)
        self._summary = None

    @property
    def coefficients(self) -> DenseVector:
        return Vectors.dense(self._coef)

    @property
    def intercept(self) -> float:
        return self._intercept

    @property
    def numFeatures(self) -> int:
        return int(len(self._coef))

    def _margin_udf(self):
        coef, intercept = self._coef, self._intercept

        def margin(v):
            if v is None:
                return None
            if isinstance(v, SparseVector):
                return float(np.dot(v.values, coef[v.indices]) + intercept)
            return float(np.dot(v.toArray(), coef) + intercept)

        return margin

    def _check_features(self, dataset) -> None:
        col = self.getFeaturesCol()
        if col not in dataset.columns:
            raise InputError(f"featuresCol {col!r} is not a column of the input (columns: {dataset.columns})")
        if not isinstance(dataset.schema[col].dataType, VectorUDT):
            raise InputError(f"featuresCol {col!r} has type {dataset.schema[col].dataType.simpleString()}; "
                             f"expected a vector column")

    def _extra_metadata(self) -> dict:
        return {"numFeatures": self.numFeatures}

    def _save_data(self, path: str, spark) -> None:
        schema = T.StructType([T.StructField("intercept", T.DoubleType(), False),
                               T.StructField("coefficients", T.ArrayType(T.DoubleType(), False), False)])
        spark.createDataFrame([(self._intercept, self._coef.tolist())], schema).write.parquet(
            os.path.join(path, "data"))

    @classmethod
    def _from_data(cls, path: str, spark, metadata):
        row = spark.read.parquet(os.path.join(path, "data")).first()
        return cls(np.asarray(row["coefficients"], dtype=np.float64), float(row["intercept"]))
