"""``StradsMF``: matrix factorisation for explicit ratings and implicit feedback, a drop-in for
``pyspark.ml.recommendation.ALS``.

Same params and outputs as ALS (``userFactors`` / ``itemFactors`` with
``id`` and ``features``, ``prediction``, ``recommendFor*`` with ALS's column
names); the factors are fitted by STRADS coordinate descent (feature blocks,
W/H alternation, H on parameter-server shards) on the same objective as ALS,
explicit (:mod:`pystrads.programs.mf`) or implicit (:mod:`pystrads.programs.mf_implicit`).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, List, Optional

import numpy as np
import pyspark
from pyspark import keyword_only
from pyspark.ml import Estimator, Model
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import (HasCheckpointInterval, HasMaxIter, HasPredictionCol, HasRegParam, HasSeed,
                                     HasStepSize)
from pyspark.ml.util import DefaultParamsReadable, DefaultParamsWritable
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..engine import Engine
from ..engine.preflight import check_cluster, default_num_workers
from ..errors import ConfigurationError, InputError
from ..programs.mf import MFProgram, MFSGDProgram
from ..programs.mf_implicit import ImplicitMFProgram
from ._params import HasNumWorkers, check_common_params
from ._persistence import PersistentModel
from ._summary import FitSummary, HasTrainingSummary
from ._validation import check_num_workers, check_ratings

log = logging.getLogger(__name__)

_ALS_CASTS_IDS = int(pyspark.__version__.split(".")[0]) >= 4
#: featureBlockSize=0 resolves to blocks of at most AUTO_BLOCK_SIZE features, as balanced as possible
#: (see jobs/bench_mf.py and docs/benchmarks.md, "Matrix factorisation on MovieLens", for the measurements)
AUTO_BLOCK_SIZE = 8

INT32_MAX = 2 ** 31 - 1


class _StradsMFModelParams(HasPredictionCol):
    """Params of both StradsMF and StradsMFModel (as pyspark's _ALSModelParams)."""

    userCol: Param[str] = Param(Params._dummy(), "userCol", "column name for user ids. Ids must be within the "
                                "integer value range.", typeConverter=TypeConverters.toString)
    itemCol: Param[str] = Param(Params._dummy(), "itemCol", "column name for item ids. Ids must be within the "
                                "integer value range.", typeConverter=TypeConverters.toString)
    coldStartStrategy: Param[str] = Param(
        Params._dummy(), "coldStartStrategy",
        "strategy for dealing with unknown or new users/items at prediction time: 'nan' (predict NaN) or "
        "'drop' (drop those rows, e.g. for cross-validation). Supported values: 'nan', 'drop'.",
        typeConverter=TypeConverters.toString)
    blockSize: Param[int] = Param(
        Params._dummy(), "blockSize", "block size for stacking input data in matrices: recommendForAll* scores "
        "this many users (items) per block against all items (users); > 0.", typeConverter=TypeConverters.toInt)

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(userCol="user", itemCol="item", coldStartStrategy="nan", predictionCol="prediction",
                         blockSize=4096)

    def getBlockSize(self) -> int:
        return self.getOrDefault(self.blockSize)

    def getUserCol(self) -> str:
        return self.getOrDefault(self.userCol)

    def getItemCol(self) -> str:
        return self.getOrDefault(self.itemCol)

    def getColdStartStrategy(self) -> str:
        return self.getOrDefault(self.coldStartStrategy)

    def _check_cold_start(self) -> None:
        if self.getColdStartStrategy() not in ("nan", "drop"):
            raise ConfigurationError(f"coldStartStrategy={self.getColdStartStrategy()!r} is not one of 'nan', 'drop'")
        if self.getBlockSize() < 1:
            raise ConfigurationError(f"blockSize={self.getBlockSize()!r} must be >= 1")

    # setters of the params a fitted model uses too (as pyspark's ALSModel has them)
    def setUserCol(self, value: str):
        return self._set(userCol=value)

    def setItemCol(self, value: str):
        return self._set(itemCol=value)

    def setPredictionCol(self, value: str):
        return self._set(predictionCol=value)

    def setColdStartStrategy(self, value: str):
        return self._set(coldStartStrategy=value)

    def setBlockSize(self, value: int):
        return self._set(blockSize=value)

    def _check_id_columns(self, dataset, need_rating: bool) -> None:
        cols = [("userCol", self.getUserCol()), ("itemCol", self.getItemCol())]
        if need_rating:
            cols.append(("ratingCol", self.getOrDefault("ratingCol")))
        for param, col in cols:
            if col not in dataset.columns:
                raise InputError(f"{param} {col!r} is not a column of the input (columns: {dataset.columns}); "
                                 f"set {param} to the right column")
            dtype = dataset.schema[col].dataType
            if not isinstance(dtype, T.NumericType):
                raise InputError(f"{param} {col!r} has type {dtype.simpleString()}; expected a numeric column "
                                 + ("(integer ids within int32, as ALS; index strings with StringIndexer)"
                                    if param != "ratingCol" else "(cast it, e.g. F.col(...).cast('double'))"))


class _StradsMFParams(_StradsMFModelParams, HasMaxIter, HasRegParam, HasCheckpointInterval, HasSeed, HasStepSize,
                      HasNumWorkers):
    """Params of StradsMF (as pyspark's _ALSParams)."""

    rank: Param[int] = Param(Params._dummy(), "rank", "rank of the factorization (>= 1)",
                             typeConverter=TypeConverters.toInt)
    implicitPrefs: Param[bool] = Param(Params._dummy(), "implicitPrefs",
                                       "whether to use implicit preference",
                                       typeConverter=TypeConverters.toBoolean)
    alpha: Param[float] = Param(Params._dummy(), "alpha", "alpha for implicit preference",
                                typeConverter=TypeConverters.toFloat)
    ratingCol: Param[str] = Param(Params._dummy(), "ratingCol", "column name for ratings",
                                  typeConverter=TypeConverters.toString)
    nonnegative: Param[bool] = Param(Params._dummy(), "nonnegative",
                                     "whether to use nonnegative constraint for least squares",
                                     typeConverter=TypeConverters.toBoolean)
    innerIterations: Param[int] = Param(
        Params._dummy(), "innerIterations",
        "alternations per feature block in each iteration (>= 1; 0 = automatic: 1 with blocks of several "
        "features, whose solves are exact, 3 for CCD++ with featureBlockSize 1)", typeConverter=TypeConverters.toInt)
    featureBlockSize: Param[int] = Param(
        Params._dummy(), "featureBlockSize",
        "features updated together per round by exact block solves (1 = CCD++, one feature per round; "
        "rank = ALS-like whole-row solves); fewer rounds per iteration, b(b+1)/2 + b partial sums per item. "
        "0 = automatic: 1 with nonnegative=True, else min(rank, 8)", typeConverter=TypeConverters.toInt)
    algorithm: Param[str] = Param(
        Params._dummy(), "algorithm",
        "'cd': coordinate descent with W/H alternation (exact block solves, no step size; the default); "
        "'sgd': stochastic gradient descent with block rotation (each worker sweeps its ratings of one item "
        "block per round, stepSize / sqrt(1 + iteration))", typeConverter=TypeConverters.toString)

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(rank=10, maxIter=10, regParam=0.1, implicitPrefs=False, alpha=1.0, ratingCol="rating",
                         nonnegative=False, checkpointInterval=10, innerIterations=0, featureBlockSize=0,
                         algorithm="cd", stepSize=0.05)

    def getAlgorithm(self) -> str:
        return self.getOrDefault(self.algorithm)

    def getRank(self) -> int:
        return self.getOrDefault(self.rank)

    def getImplicitPrefs(self) -> bool:
        return self.getOrDefault(self.implicitPrefs)

    def getAlpha(self) -> float:
        return self.getOrDefault(self.alpha)

    def getRatingCol(self) -> str:
        return self.getOrDefault(self.ratingCol)

    def getNonnegative(self) -> bool:
        return self.getOrDefault(self.nonnegative)

    def getInnerIterations(self) -> int:
        return self.getOrDefault(self.innerIterations)

    def _inner_iterations(self) -> int:
        """The resolved innerIterations (0 = automatic)."""
        if self.getInnerIterations() > 0:
            return self.getInnerIterations()
        return 1 if self._block_size() > 1 else 3

    def getFeatureBlockSize(self) -> int:
        return self.getOrDefault(self.featureBlockSize)

    def _block_size(self) -> int:
        """The resolved featureBlockSize (0 = automatic)."""
        if self.getFeatureBlockSize() > 0:
            return min(self.getFeatureBlockSize(), self.getRank())
        if self.getNonnegative():
            return 1
        blocks = -(-self.getRank() // AUTO_BLOCK_SIZE)  # as few blocks as allowed, of balanced sizes
        return -(-self.getRank() // blocks)


class StradsMF(Estimator, _StradsMFParams, DefaultParamsReadable, DefaultParamsWritable):
    """Matrix factorisation for explicit ratings or implicit feedback by scheduled model-parallel
    coordinate descent.

    Objective (exactly ALS's for explicit feedback)::

        sum (r_ui - x_u . y_i)^2 + regParam * (sum_u n_u |x_u|^2 + sum_i n_i |y_i|^2)

    With ``implicitPrefs=True``, ALS's implicit objective (Hu, Koren & Volinsky), summed over
    every user-item pair, with confidence ``1 + alpha |r_ui|`` on the observed pairs (1
    elsewhere), preference 1 where ``r_ui > 0`` (0 elsewhere) and ``n_u``, ``n_i`` counting
    positive observations; solved by the same feature blocks (iALS++), the unobserved pairs
    through the factors' Gramians.

    Schedule: STRADS MF -- for each block of ``featureBlockSize`` features, item
    factors are updated from every worker's partial sums (aggregated and
    solved on the shards next to the rows), then user factors locally;
    ``innerIterations`` alternations per block (featureBlockSize 1 is CCD++).
    Ratings are partitioned by user; item factors live on the shards.

    ``algorithm='sgd'`` instead runs SGD with block rotation (STRADS thesis,
    static schedule): items are cut into one block per worker, and in each
    round every worker sweeps its ratings of a different block, so no two
    workers ever update the same item factors; step size
    ``stepSize / sqrt(1 + iteration)``.  Same objective, same params.

    Example
    -------
    >>> from pystrads.ml import StradsMF
    >>> ratings = spark.createDataFrame([(0, 0, 4.0), (0, 1, 2.0), (1, 1, 3.0)], ["user", "item", "rating"])
    >>> model = StradsMF(rank=2, maxIter=5, seed=1).fit(ratings)
    >>> model.recommendForAllUsers(1).show()    # doctest: +SKIP
    """

    @keyword_only
    def __init__(self, *, rank: int = 10, maxIter: int = 10, regParam: float = 0.1, implicitPrefs: bool = False,
                 alpha: float = 1.0, userCol: str = "user", itemCol: str = "item", seed: Optional[int] = None,
                 ratingCol: str = "rating", nonnegative: bool = False, checkpointInterval: int = 10,
                 coldStartStrategy: str = "nan", predictionCol: str = "prediction", numWorkers: int = 0,
                 innerIterations: int = 0, featureBlockSize: int = 0, algorithm: str = "cd",
                 stepSize: float = 0.05, blockSize: int = 4096):
        super().__init__()
        self.setParams(**self._input_kwargs)

    @keyword_only
    def setParams(self, *, rank: int = 10, maxIter: int = 10, regParam: float = 0.1, implicitPrefs: bool = False,
                  alpha: float = 1.0, userCol: str = "user", itemCol: str = "item", seed: Optional[int] = None,
                  ratingCol: str = "rating", nonnegative: bool = False, checkpointInterval: int = 10,
                  coldStartStrategy: str = "nan", predictionCol: str = "prediction", numWorkers: int = 0,
                  innerIterations: int = 0, featureBlockSize: int = 0, algorithm: str = "cd",
                  stepSize: float = 0.05, blockSize: int = 4096) -> "StradsMF":
        return self._set(**self._input_kwargs)

    def setRank(self, value: int) -> "StradsMF":
        return self._set(rank=value)

    def setMaxIter(self, value: int) -> "StradsMF":
        return self._set(maxIter=value)

    def setRegParam(self, value: float) -> "StradsMF":
        return self._set(regParam=value)



    def setRatingCol(self, value: str) -> "StradsMF":
        return self._set(ratingCol=value)



    def setNonnegative(self, value: bool) -> "StradsMF":
        return self._set(nonnegative=value)

    def setSeed(self, value: int) -> "StradsMF":
        return self._set(seed=value)

    def setNumWorkers(self, value: int) -> "StradsMF":
        return self._set(numWorkers=value)

    def setInnerIterations(self, value: int) -> "StradsMF":
        return self._set(innerIterations=value)

    def setFeatureBlockSize(self, value: int) -> "StradsMF":
        return self._set(featureBlockSize=value)

    def setAlgorithm(self, value: str) -> "StradsMF":
        return self._set(algorithm=value)

    def setStepSize(self, value: float) -> "StradsMF":
        return self._set(stepSize=value)

    def setImplicitPrefs(self, value: bool) -> "StradsMF":
        return self._set(implicitPrefs=value)

    def setAlpha(self, value: float) -> "StradsMF":
        return self._set(alpha=value)

    def setCheckpointInterval(self, value: int) -> "StradsMF":
        return self._set(checkpointInterval=value)

    def _validate(self, dataset) -> None:
        if self.getImplicitPrefs() and self.getAlgorithm() == "sgd":
            raise ConfigurationError("implicitPrefs=True with algorithm='sgd': SGD covers explicit ratings only "
                                     "(the implicit objective sums over every user-item pair); use "
                                     "algorithm='cd', the default")
        if self.getRank() < 1:
            raise ConfigurationError(f"rank={self.getRank()} must be >= 1")
        check_common_params(self, "ALS's")
        if not (self.getRegParam() >= 0 and np.isfinite(self.getRegParam())):
            raise ConfigurationError(f"regParam={self.getRegParam()} must be a finite number >= 0")
        if not (self.getAlpha() >= 0 and np.isfinite(self.getAlpha())):
            raise ConfigurationError(f"alpha={self.getAlpha()} must be a finite number >= 0 (ALS's range; the "
                                     "confidence of an observation is 1 + alpha |rating|)")
        if self.getInnerIterations() < 0:
            raise ConfigurationError(f"innerIterations={self.getInnerIterations()} must be >= 1 (or 0 = automatic)")
        if self.getFeatureBlockSize() < 0:
            raise ConfigurationError(f"featureBlockSize={self.getFeatureBlockSize()} must be >= 0 (0 = automatic)")
        if self.getNonnegative() and self.getFeatureBlockSize() > 1:
            raise ConfigurationError(f"featureBlockSize={self.getFeatureBlockSize()} with nonnegative=True: nonnegative factors "
                                     "are updated one feature at a time; set featureBlockSize=1 (or 0)")
        self._check_algorithm()
        self._check_cold_start()
        self._check_id_columns(dataset, need_rating=True)
        check_num_workers(dataset, self.getNumWorkers())

    def _check_algorithm(self) -> None:
        if self.getAlgorithm() not in ("cd", "sgd"):
            raise ConfigurationError(f"algorithm={self.getAlgorithm()!r} is not one of 'cd' (coordinate descent, "
                                     "the default) or 'sgd' (SGD with block rotation)")
        step = self.getStepSize()
        if not (np.isfinite(step) and step > 0):
            raise ConfigurationError(f"stepSize={step} must be a finite number > 0 (SGD's initial step size; "
                                     "the default 0.05 suits ratings on a 1-5 scale)")

    def _fit(self, dataset) -> "StradsMFModel":
        t_start = time.perf_counter()
        self._validate(dataset)
        ucol, icol, rcol = self.getUserCol(), self.getItemCol(), self.getRatingCol()
        triples = dataset.select(F.col(ucol).cast("double").alias("u"), F.col(icol).cast("double").alias("i"),
                                 F.col(rcol).cast("double").alias("r"))
        U = default_num_workers(dataset, self.getNumWorkers() or None)
        check_cluster(dataset, U)  # before any job
        check_ratings(triples, ucol, icol, rcol)  # one job: empty input, bad ids / ratings (column, value, fix)
        # then the distinct users and the per-item counts, in one pass without a shuffle
        users, items, item_counts, item_positives = _ids_and_item_counts(triples)
        if not len(users) or not len(items):
            raise InputError("the input has no ratings; StradsMF needs at least one (user, item, rating) row")
        scan_s = time.perf_counter() - t_start

        def to_dense(row):  # on the workers; the id arrays travel with the function
            u, i, r = row
            return int(np.searchsorted(users, int(u))), int(np.searchsorted(items, int(i))), float(r)

        # each worker holds whole users: its partition of a hash partitioning by user
        records = triples.repartition(U, "u")
        seed = int(self.getOrDefault(self.seed))  # HasSeed always has a default
        rank = self.getRank()
        if self.getImplicitPrefs():
            if self.isSet("innerIterations") and self.getInnerIterations():
                log.warning("StradsMF: innerIterations=%s is ignored with implicitPrefs=True (exact block solves)",
                            self.getInnerIterations())
            program = ImplicitMFProgram(len(users), len(items), rank, self.getRegParam(), item_positives,
                                        self.getAlpha(), U, self.getMaxIter(), self.getNonnegative(), seed,
                                        block_size=self._block_size())
        elif self.getAlgorithm() == "sgd":
            for name in ("featureBlockSize", "innerIterations"):
                if self.isSet(name) and self.getOrDefault(name):
                    log.warning("StradsMF: %s=%s is ignored with algorithm='sgd'", name, self.getOrDefault(name))
            program = MFSGDProgram(len(users), len(items), rank, self.getRegParam(), item_counts, self.getMaxIter(),
                                   U, self.getStepSize(), self.getNonnegative(), seed)
        else:
            program = MFProgram(len(users), len(items), rank, self.getRegParam(), item_counts, self.getMaxIter(),
                                self._inner_iterations(), self.getNonnegative(), seed, block_size=self._block_size())
        log.info("StradsMF: %d ratings, %d users, %d items, rank %d, %d workers, %r", int(item_counts.sum()),
                 len(users), len(items), rank, U, program)
        # checkpoints every checkpointInterval steps when a checkpoint directory is set (ALS's rule)
        # the workers hand their users' factors over when the fit ends (no second job, nothing cached)
        with Engine(program, records, num_workers=U, seed=seed, keep_states=False, prepartitioned=True,
                    decode=to_dense, export=lambda wk, data, state: (data.users, state.w),
                    config={"checkpoint.interval": max(0, self.getCheckpointInterval())}).fit() as result:
            h = program.item_matrix(result.read_table("item_factors"))
            w = np.zeros((len(users), rank))
            for local, rows in result.exports:
                w[local] = rows
            summary = StradsMFSummary(result.summary, scan_s, program)
        model = StradsMFModel(rank, users, w, items, h)
        model._summary = summary
        return self._copyValues(model)


def _ids_and_item_counts(triples):
    """``(users, items, item_counts, item_positives)`` of checked ``triples`` (columns u, i, r as
    double): sorted distinct ids as int64, each item's number of ratings and of ratings > 0.  One Spark job and no shuffle: each
    partition reduces its rows to its distinct users and item counts with numpy (Arrow batches),
    the driver merges them -- the ids end up on the driver anyway."""
    import pickle

    def reduce(batches):
        us, its, cs, ps = [], [], [], []
        for batch in batches:
            u = batch.column(0).to_numpy(zero_copy_only=False).astype(np.int64)
            i = batch.column(1).to_numpy(zero_copy_only=False).astype(np.int64)
            r = batch.column(2).to_numpy(zero_copy_only=False)
            us.append(np.unique(u))
            ids, where, counts = np.unique(i, return_inverse=True, return_counts=True)
            its.append(ids)
            cs.append(counts)
            ps.append(np.bincount(where, weights=r > 0, minlength=len(ids)).astype(np.int64))
        import pyarrow as pa

        def joined(parts):
            return np.concatenate(parts) if parts else np.zeros(0, np.int64)

        blob = pickle.dumps((np.unique(joined(us)), joined(its), joined(cs), joined(ps)))
        yield pa.record_batch([pa.array([blob], pa.binary())], names=["part"])

    parts = [pickle.loads(r["part"]) for r in triples.mapInArrow(reduce, "part binary").collect()]
    users = np.unique(np.concatenate([p[0] for p in parts])) if parts else np.zeros(0, np.int64)
    all_items = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.int64)
    all_counts = np.concatenate([p[2] for p in parts]) if parts else np.zeros(0, np.int64)
    items, where = np.unique(all_items, return_inverse=True)
    item_counts = np.bincount(where, weights=all_counts, minlength=len(items)).astype(np.float64)
    all_positives = np.concatenate([p[3] for p in parts]) if parts else np.zeros(0, np.int64)
    item_positives = np.bincount(where, weights=all_positives, minlength=len(items)).astype(np.float64)
    return users, items, item_counts, item_positives


class StradsMFSummary(FitSummary):
    """Training history (:class:`~pystrads.ml._summary.FitSummary`): ``iterations`` has, per
    iteration, train_rmse, sse and the regularisation (explicit ratings), or the implicit
    objective, its loss and its regularisation (``implicitPrefs=True``)."""

    def __init__(self, engine_summary, scan_s, program):
        super().__init__(engine_summary, scan_s=scan_s)

    @property
    def trainRmseHistory(self) -> List[float]:
        """Training RMSE per iteration (explicit ratings; empty with implicitPrefs=True)."""
        return self._history("train_rmse")

    @property
    def objectiveHistory(self) -> List[float]:
        """The implicit objective per iteration, which never increases (implicitPrefs=True;
        empty with explicit ratings: see trainRmseHistory)."""
        return self._history("objective")

    def plot(self, ax=None):
        """Training RMSE (or the implicit objective) per iteration (needs matplotlib:
        ``pip install 'pystrads[plot]'``)."""
        ax = self._axes(ax)
        column, label = ("train_rmse", "training RMSE") if "train_rmse" in self.iterations else \
            ("objective", "objective")
        ax.plot(self.iterations["iteration"], self.iterations[column], marker="o")
        ax.set_xlabel("iteration")
        ax.set_ylabel(label)
        return ax


def _factors_df(spark, ids: np.ndarray, factors: np.ndarray):
    schema = T.StructType([T.StructField("id", T.IntegerType(), False),
                           T.StructField("features", T.ArrayType(T.FloatType(), False), True)])
    rows = [(int(i), [float(x) for x in f]) for i, f in zip(ids, factors.astype(np.float32))]
    return spark.createDataFrame(rows, schema)


class StradsMFModel(HasTrainingSummary, Model, _StradsMFModelParams, PersistentModel):
    """A fitted :class:`StradsMF`: user and item factors, predictions, recommendations."""

    def __init__(self, rank: int = 0, user_ids=None, user_factors=None, item_ids=None, item_factors=None):
        super().__init__()
        self._rank = int(rank)
        self._user_ids = None if user_ids is None else np.asarray(user_ids, dtype=np.int64)
        self._w = None if user_factors is None else np.asarray(user_factors, dtype=np.float64)
        self._item_ids = None if item_ids is None else np.asarray(item_ids, dtype=np.int64)
        self._h = None if item_factors is None else np.asarray(item_factors, dtype=np.float64)
        self._summary: Optional[StradsMFSummary] = None

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def userFactors(self):
        """DataFrame (id int, features array<float>), as ALSModel.userFactors."""
        from pyspark.sql import SparkSession

        return _factors_df(SparkSession.active(), self._user_ids, self._w)

    @property
    def itemFactors(self):
        from pyspark.sql import SparkSession

        return _factors_df(SparkSession.active(), self._item_ids, self._h)

    def _transform(self, dataset):
        from pyspark.sql.functions import pandas_udf

        self._check_cold_start()
        self._check_id_columns(dataset, need_rating=False)
        factors = (self._user_ids, self._w.astype(np.float32), self._item_ids, self._h.astype(np.float32))

        @pandas_udf("float")  # the factors travel with the function (Spark broadcasts large ones)
        def predict(users, items):
            import pandas as pd

            uid, w, iid, h = factors
            u = users.to_numpy(dtype=np.float64, na_value=np.nan)
            i = items.to_numpy(dtype=np.float64, na_value=np.nan)
            ui = np.searchsorted(uid, np.nan_to_num(u, nan=-1).astype(np.int64))
            ii = np.searchsorted(iid, np.nan_to_num(i, nan=-1).astype(np.int64))
            ui_c, ii_c = np.minimum(ui, len(uid) - 1), np.minimum(ii, len(iid) - 1)
            known = (uid[ui_c] == u) & (iid[ii_c] == i)
            out = np.full(len(u), np.nan, dtype=np.float32)
            out[known] = np.einsum("ij,ij->i", w[ui_c[known]], h[ii_c[known]])
            return pd.Series(out)

        ucol, icol = self.getUserCol(), self.getItemCol()
        # as ALSModel.transform: prediction as non-null float (NaN when unknown); Spark >= 4 also
        # casts the ids to int, 3.5 keeps their input type
        out = dataset
        if _ALS_CASTS_IDS:
            out = out.withColumn(ucol, F.col(ucol).cast("int")).withColumn(icol, F.col(icol).cast("int"))
        out = out.withColumn(self.getPredictionCol(), F.coalesce(predict(F.col(ucol), F.col(icol)),
                                                                 F.lit(float("nan")).cast("float")))
        if self.getColdStartStrategy() == "drop":
            out = out.where(~F.isnan(F.col(self.getPredictionCol())))
        return out

    # -- recommendations (ALS's schemas)
    def _recommend(self, src_ids, src, dst_ids, dst, num: int, src_col: str, dst_col: str, subset=None):
        from pyspark.sql import SparkSession

        spark = SparkSession.active()
        if num < 1:
            raise ConfigurationError(f"numItems/numUsers={num} must be >= 1")
        if subset is not None:
            pos = np.searchsorted(src_ids, subset)
            pos = np.minimum(pos, len(src_ids) - 1)
            keep = src_ids[pos] == subset
            rows_idx = np.unique(pos[keep])
        else:
            rows_idx = np.arange(len(src_ids))
        factors = (src_ids, src.astype(np.float32), dst_ids, dst.astype(np.float32))
        n = min(num, len(dst_ids))
        self._check_cold_start()
        size = self.getBlockSize()
        blocks = [rows_idx[i:i + size] for i in range(0, len(rows_idx), size)]

        def top(block):
            s_ids, s, d_ids, d = factors
            scores = s[block] @ d.T
            part = np.argpartition(-scores, n - 1, axis=1)[:, :n] if n < scores.shape[1] else \
                np.tile(np.arange(scores.shape[1]), (len(block), 1))
            for r, row in enumerate(block):
                cand = part[r]
                order = cand[np.argsort(-scores[r, cand], kind="stable")]
                yield (int(s_ids[row]), [(int(d_ids[j]), float(scores[r, j])) for j in order])

        schema = T.StructType([
            T.StructField(src_col, T.IntegerType(), False),
            T.StructField("recommendations", T.ArrayType(T.StructType([
                T.StructField(dst_col, T.IntegerType(), True), T.StructField("rating", T.FloatType(), True)]),
                True), True)])
        # one row per block of blockSize source rows, spread over partitions; each partition scores
        # its blocks against all destinations (the factors travel with the function)
        parts = max(1, min(len(blocks), int(spark.conf.get("spark.sql.shuffle.partitions", "4") or 4)))
        starts = spark.range(0, len(blocks), 1, parts)

        def score(batches):
            import pyarrow as pa

            rec_type = pa.list_(pa.struct([(dst_col, pa.int32()), ("rating", pa.float32())]))
            for batch in batches:
                out = [rec for b in batch.column(0).to_pylist() for rec in top(blocks[int(b)])]
                yield pa.RecordBatch.from_arrays(
                    [pa.array([r[0] for r in out], pa.int32()),
                     pa.array([[{dst_col: d, "rating": v} for d, v in r[1]] for r in out], rec_type)],
                    [src_col, "recommendations"])

        return starts.mapInArrow(score, schema)

    def recommendForAllUsers(self, numItems: int):
        """DataFrame(userCol, recommendations: array<struct<itemCol, rating>>): each user's top items."""
        return self._recommend(self._user_ids, self._w, self._item_ids, self._h, numItems, self.getUserCol(),
                               self.getItemCol())

    def recommendForAllItems(self, numUsers: int):
        """DataFrame(itemCol, recommendations: array<struct<userCol, rating>>): each item's top users."""
        return self._recommend(self._item_ids, self._h, self._user_ids, self._w, numUsers, self.getItemCol(),
                               self.getUserCol())

    def recommendForUserSubset(self, dataset, numItems: int):
        ids = np.array([int(r[0]) for r in dataset.select(self.getUserCol()).distinct().collect()], dtype=np.int64)
        return self._recommend(self._user_ids, self._w, self._item_ids, self._h, numItems, self.getUserCol(),
                               self.getItemCol(), subset=ids)

    def recommendForItemSubset(self, dataset, numUsers: int):
        ids = np.array([int(r[0]) for r in dataset.select(self.getItemCol()).distinct().collect()], dtype=np.int64)
        return self._recommend(self._item_ids, self._h, self._user_ids, self._w, numUsers, self.getItemCol(),
                               self.getUserCol(), subset=ids)

    # -- persistence
    def _extra_metadata(self) -> dict:
        return {"rank": self.rank}

    def _save_data(self, path: str, spark) -> None:
        m = self
        schema = T.StructType([T.StructField("id", T.LongType(), False),
                               T.StructField("features", T.ArrayType(T.DoubleType(), False), False)])
        for name, ids, f in (("userFactors", m._user_ids, m._w), ("itemFactors", m._item_ids, m._h)):
            rows = [(int(i), row.tolist()) for i, row in zip(ids, f)]
            spark.createDataFrame(rows, schema).write.parquet(os.path.join(path, name))

    @classmethod
    def _from_data(cls, path: str, spark, metadata) -> "StradsMFModel":
        parts = {}
        for name in ("userFactors", "itemFactors"):
            rows = sorted((r["id"], r["features"]) for r in spark.read.parquet(
                os.path.join(path, name)).collect())
            parts[name] = (np.array([r[0] for r in rows], dtype=np.int64),
                           np.array([r[1] for r in rows], dtype=np.float64).reshape(len(rows), -1))
        return cls(int(metadata["rank"]), parts["userFactors"][0], parts["userFactors"][1],
                   parts["itemFactors"][0], parts["itemFactors"][1])
