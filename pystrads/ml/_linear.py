"""What StradsLasso and StradsLogisticRegression share: params, the input scan, the fit, the model.

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
from typing import Any, Dict, List, Optional

import numpy as np
from pyspark.ml.linalg import DenseVector, SparseVector, Vectors, VectorUDT
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import (HasFeaturesCol, HasFitIntercept, HasLabelCol, HasMaxIter, HasPredictionCol,
                                     HasRegParam, HasSeed, HasStandardization, HasTol, HasWeightCol)
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..engine import Engine
from ..engine.preflight import check_cluster, default_num_workers
from ..errors import ConfigurationError, InputError
from ..engine.spark import handle_of, is_dataframe
from ..programs.lasso import PRIORITIES, SCHEDULES, ColumnSample, RowBlock
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


def _vector_parts(v):
    if isinstance(v, SparseVector):
        return v.size, np.asarray(v.indices, dtype=np.int64), np.asarray(v.values, dtype=np.float64)
    arr = np.asarray(v.toArray(), dtype=np.float64)
    nz = np.flatnonzero(arr)
    return len(arr), nz.astype(np.int64), arr[nz]


def _scan_rows(dataset, fcol: str, lcol: str, wcol: Optional[str], sample_rows: int, binary_labels: bool):
    """The row-by-row scan (Python ``Row`` objects): the fallback when Spark cannot hand
    the vector column to Python as Arrow."""
    weight = F.col(wcol).cast("double") if wcol else F.lit(1.0)
    rows = dataset.select(F.col(lcol).cast("double").alias("y"), weight.alias("w"), F.col(fcol).alias("x")).rdd
    parts = max(1, rows.getNumPartitions())
    per_part = max(1, int(math.ceil(sample_rows / parts)))

    def to_record(row):
        size, idx, val = _vector_parts(row.x) if row.x is not None else (-1, None, None)
        return (row.y, row.w, idx, val, size)

    records = rows.map(to_record)

    def check(index, it):
        rng = np.random.default_rng(index)
        n = nnz = 0
        wsum = 0.0
        sizes = set()
        error = None
        reservoir: List[Any] = []
        for y, w, idx, val, size in it:
            n += 1
            if error is None:
                error = _row_error(y, w, val, size, fcol, lcol, wcol, binary_labels)
            sizes.add(size)
            if w is not None and math.isfinite(w):
                wsum += w
            nnz += len(idx) if idx is not None else 0
            if idx is not None:
                if len(reservoir) < per_part:
                    reservoir.append((idx, val))
                else:
                    k = int(rng.integers(0, n))
                    if k < per_part:
                        reservoir[k] = (idx, val)
        yield {"rows": n, "nnz": nnz, "wsum": wsum, "sizes": sizes, "error": error, "sample": reservoir}

    return records.map(lambda r: r[:4]), _merge_stats(records.mapPartitionsWithIndex(check).collect())


def _row_error(y, w, val, size, fcol, lcol, wcol, binary_labels):
    """``(what, fix)`` for the first problem of one row, or None (checks in a fixed order)."""
    if size < 0:
        return (f"featuresCol {fcol!r} is null in a row", "drop or fill the rows with null features")
    if y is None or not math.isfinite(y):
        return (f"labelCol {lcol!r} has value {y!r}", "drop the rows or fill the missing labels")
    if binary_labels and y not in (0.0, 1.0):
        return (f"labelCol {lcol!r} has value {y!r}; binary logistic regression needs labels 0 and 1",
                "recode the labels (e.g. with StringIndexer) to 0.0 / 1.0")
    if w is None or not math.isfinite(w) or w < 0:
        return (f"weightCol {wcol!r} has value {w!r}", "weights must be finite and >= 0")
    if len(val) and not np.all(np.isfinite(val)):
        bad = val[~np.isfinite(val)][0]
        return (f"featuresCol {fcol!r} has a value {float(bad)!r}",
                "drop the rows or impute the values (e.g. pyspark.ml.feature.Imputer)")
    return None


def _merge_stats(parts) -> Dict[str, Any]:
    stats: Dict[str, Any] = {"rows": 0, "nnz": 0, "wsum": 0.0, "sizes": set(), "error": None, "sample": []}
    for part in parts:
        stats["rows"] += part["rows"]
        stats["nnz"] += part["nnz"]
        stats["wsum"] += part["wsum"]
        stats["sizes"] |= part["sizes"]
        stats["error"] = stats["error"] or part["error"]
        stats["sample"].extend(part["sample"])
    return stats


def _arrow_block(batch) -> Dict[str, np.ndarray]:
    """One Arrow batch of ``(y double, w double, x vector)`` -> numpy CSR arrays.

    The vector column arrives as VectorUDT's SQL struct ``(type, size, indices,
    values)``: type 0 sparse, 1 dense (dense rows keep their non-zeros).  Nulls:
    ``y_null``/``w_null`` masks, ``size`` -1 for a null vector."""
    n = batch.num_rows
    y_col, w_col, x = batch.column(0), batch.column(1), batch.column(2)
    y = np.asarray(y_col.to_numpy(zero_copy_only=False), dtype=np.float64)
    w = np.asarray(w_col.to_numpy(zero_copy_only=False), dtype=np.float64)
    y_null = np.asarray(y_col.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    w_null = np.asarray(w_col.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    x_null = np.asarray(x.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    fields = dict(zip([f.name for f in x.type], x.flatten()))  # children with the struct's nulls merged
    kind = np.asarray(fields["type"].fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
    dense = (kind == 1) & ~x_null
    values = fields["values"]
    lens = np.asarray(values.value_lengths().fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
    flat_v = np.asarray(values.flatten().to_numpy(zero_copy_only=False), dtype=np.float64)
    flat_i = np.asarray(fields["indices"].flatten().to_numpy(zero_copy_only=False), dtype=np.int64)
    size = np.asarray(fields["size"].fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)
    size = np.where(dense, lens, np.where(x_null, -1, size))
    row_of = np.repeat(np.arange(n, dtype=np.int64), lens)
    dense_elem = dense[row_of]
    cols = np.empty(len(flat_v), dtype=np.int64)
    cols[~dense_elem] = flat_i
    if dense_elem.any():
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
        pos = np.arange(len(flat_v), dtype=np.int64) - starts[row_of]
        cols[dense_elem] = pos[dense_elem]
        keep = ~dense_elem | (flat_v != 0)
        cols, flat_v, row_of = cols[keep], flat_v[keep], row_of[keep]
    row_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(row_of, minlength=n), out=row_ptr[1:])
    return {"y": y, "w": w, "y_null": y_null, "w_null": w_null, "size": size, "row_ptr": row_ptr,
            "col_idx": cols, "vals": flat_v}


BLOCK_NONZEROS = 1 << 17  # per block (~1.5 MB): one binary value each, which the JVM copies a few times


def _split_block(b: Dict[str, np.ndarray], max_nnz: int):
    """Cut a block into blocks of at most ``max_nnz`` non-zeros (at least one row each)."""
    ptr = b["row_ptr"]
    n = len(b["y"])
    if ptr[-1] <= max_nnz:
        yield b
        return
    start = 0
    while start < n:
        stop = int(np.searchsorted(ptr, ptr[start] + max_nnz, side="right")) - 1
        stop = min(max(stop, start + 1), n)
        lo, hi = ptr[start], ptr[stop]
        part = {key: b[key][start:stop] for key in ("y", "w", "y_null", "w_null", "size")}
        part.update(row_ptr=ptr[start:stop + 1] - lo, col_idx=b["col_idx"][lo:hi], vals=b["vals"][lo:hi])
        yield part
        start = stop


def _arrow_blocks(sel):
    """DataFrame of pickled :func:`_arrow_block` dicts (column ``block``), one or more per Arrow
    batch (``mapInArrow``), and the function that unpickles a row of it."""
    import pickle

    def blocks(batches):
        import pyarrow as pa

        schema = pa.schema([("block", pa.binary())])
        for batch in batches:
            if batch.num_rows:
                for part in _split_block(_arrow_block(batch), BLOCK_NONZEROS):
                    payload = pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL)
                    yield pa.RecordBatch.from_arrays([pa.array([payload], type=pa.binary())], schema=schema)

    return sel.mapInArrow(blocks, "block binary")


def _block_of(row):
    """A worker's record from a row of :func:`_arrow_blocks`."""
    import pickle

    b = pickle.loads(row[0])
    return RowBlock(b["y"], b["w"], b["row_ptr"], b["col_idx"], b["vals"])


def _block_error(b, fcol, lcol, wcol, binary_labels):
    """The first bad row of a block, as :func:`_row_error` words it (None if all good)."""
    y, w, size = b["y"], b["w"], b["size"]
    bad_y = b["y_null"] | ~np.isfinite(y)
    if binary_labels:
        bad_y |= ~np.isin(y, (0.0, 1.0))
    bad_w = b["w_null"] | ~np.isfinite(w) | (w < 0)
    bad_elem = ~np.isfinite(b["vals"])
    bad_x = np.zeros(len(y), dtype=bool)
    if bad_elem.any():
        bad_x = np.add.reduceat(bad_elem.astype(np.int64), b["row_ptr"][:-1]) > 0 if len(bad_elem) else bad_x
        bad_x &= np.diff(b["row_ptr"]) > 0
    bad = (size < 0) | bad_y | bad_w | bad_x
    if not bad.any():
        return None
    i = int(np.argmax(bad))
    lo, hi = b["row_ptr"][i], b["row_ptr"][i + 1]
    return _row_error(None if b["y_null"][i] else float(y[i]), None if b["w_null"][i] else float(w[i]),
                      b["vals"][lo:hi], int(size[i]), fcol, lcol, wcol, binary_labels)


def _scan_arrow(dataset, fcol: str, lcol: str, wcol: Optional[str], sample_rows: int, binary_labels: bool,
                num_workers: int):
    weight = F.col(wcol).cast("double") if wcol else F.lit(1.0)
    sel = dataset.select(F.col(lcol).cast("double").alias("y"), weight.alias("w"), F.col(fcol).alias("x"))
    # row-wise, in the JVM (blocks would balance badly); under Spark Connect the partitions are
    # unknown without a job, so always
    if handle_of(dataset).connect or sel.rdd.getNumPartitions() != num_workers:
        sel = sel.repartition(num_workers)
    blocks = _arrow_blocks(sel)
    per_part = max(1, int(math.ceil(sample_rows / max(1, num_workers))))

    def check(batches):
        import pickle

        from ._arrow import partition_id

        rng = np.random.default_rng(partition_id())
        it = (pickle.loads(b) for batch in batches for b in batch.column(0).to_pylist())
        n = nnz = 0
        wsum = 0.0
        sizes: set = set()
        error = None
        pool_keys = np.zeros(0)
        pool: List[Any] = []
        for b in it:
            m = len(b["y"])
            n += m
            if error is None:
                error = _block_error(b, fcol, lcol, wcol, binary_labels)
            sizes.update(np.unique(b["size"]).tolist())
            ok_w = ~b["w_null"] & np.isfinite(b["w"])
            wsum += float(b["w"][ok_w].sum())
            nnz += int(b["row_ptr"][-1])
            # bottom-k of random keys: a uniform row sample without replacement
            keys = rng.random(m)
            keys[b["size"] < 0] = np.inf
            cand = np.concatenate([pool_keys, keys])
            take = np.argsort(cand, kind="stable")[:per_part]
            take = take[np.isfinite(cand[take])]
            ptr = b["row_ptr"]
            pool = [pool[t] if t < len(pool_keys) else
                    (b["col_idx"][ptr[t - len(pool_keys)]:ptr[t - len(pool_keys) + 1]].copy(),
                     b["vals"][ptr[t - len(pool_keys)]:ptr[t - len(pool_keys) + 1]].copy()) for t in take]
            pool_keys = cand[take]
        return {"rows": n, "nnz": nnz, "wsum": wsum, "sizes": sizes, "error": error, "sample": pool}

    from ._arrow import collect_per_partition

    stats = _merge_stats(collect_per_partition(blocks, check))
    return blocks, stats


def scan_input(dataset, fcol: str, lcol: str, wcol: Optional[str], sample_rows: int, binary_labels: bool,
               num_workers: int = 0):
    """One pass over the input: records for the engine, counts, the first bad row, a row sample.

    Returns ``(records, stats)``; ``stats`` has ``rows``, ``nnz``, ``sizes``
    (distinct vector sizes), ``error`` (first problem found, or None) and
    ``sample`` (list of ``(indices, values)``).  The records are a DataFrame
    of pickled row blocks, one partition per worker (read through Arrow with
    ``mapInArrow``: vectors arrive as numpy arrays, ~4x faster than Python
    ``Row`` objects; the workers turn each into a :class:`RowBlock` with
    :func:`_block_of`); where Spark cannot give the vector column to Arrow
    (classic sessions only), an RDD of ``(label, weight, indices, values)``
    tuples, one per row.
    """
    if num_workers > 0 and _arrow_scan_ok:
        try:
            return _scan_arrow(dataset, fcol, lcol, wcol, sample_rows, binary_labels, num_workers)
        except Exception as exc:  # noqa: BLE001 - e.g. a Spark without Arrow support for UDT columns
            if isinstance(exc, (KeyboardInterrupt, InputError)):
                raise
            text = str(exc)
            log.warning("reading %r through Arrow failed (%s); reading rows instead", fcol,
                        text.splitlines()[0][:300] if text else type(exc).__name__)
            if "UserDefinedType" in text or "nsupported" in text:  # this Spark cannot: do not try again
                _disable_arrow_scan()
    return _scan_rows(dataset, fcol, lcol, wcol, sample_rows, binary_labels)


_arrow_scan_ok = os.environ.get("PYSTRADS_ARROW_INPUT", "1") != "0"


def _disable_arrow_scan() -> None:
    global _arrow_scan_ok
    _arrow_scan_ok = False


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
