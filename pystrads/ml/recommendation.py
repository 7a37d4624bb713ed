"""``StradsMF``: matrix factorisation for explicit ratings, a drop-in for ``pyspark.ml.recommendation.ALS``.

Same params and outputs as ALS (``userFactors`` / ``itemFactors`` with
``id`` and ``features``, ``prediction``, ``recommendFor*`` with ALS's column
names); the factors are fitted by STRADS coordinate descent (CCD++ order,
W/H alternation, H on parameter-server shards) on the same objective as ALS.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, List, Optional

import numpy as np
import pyspark
from pyspark import keyword_only
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import (HasCheckpointInterval, HasMaxIter, HasPredictionCol, HasRegParam, HasSeed,
                                     HasStepSize)
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..errors import ConfigurationError, InputError
from ..programs.mf import MFProgram, MFSGDProgram
from ._arrow import collect_per_partition
from ._base import Fit, _StradsEstimator, _StradsModel
from ._params import HasNumWorkers, Rule, _StradsParams, above, at_least, numeric_column, one_of
from ._summary import FitSummary
from ._validation import check_ratings

log = logging.getLogger(__name__)

_ALS_CASTS_IDS = int(pyspark.__version__.split(".")[0]) >= 4
#: featureBlockSize=0 resolves to blocks of at most AUTO_BLOCK_SIZE features, as balanced as possible
#: (see jobs/bench_mf.py and docs/benchmarks.md, "Matrix factorisation on MovieLens", for the measurements)
AUTO_BLOCK_SIZE = 8


class _StradsMFModelParams(HasPredictionCol, _StradsParams):
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

    _param_rules = {"coldStartStrategy": one_of("nan", "drop"), "blockSize": at_least(1)}
    _column_kinds = {param: numeric_column("a numeric column (integer ids within int32, as ALS; index strings with "
                                           "StringIndexer)") for param in ("userCol", "itemCol")}

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(userCol="user", itemCol="item", coldStartStrategy="nan", predictionCol="prediction",
                         blockSize=4096)


class _StradsMFParams(_StradsMFModelParams, HasMaxIter, HasRegParam, HasCheckpointInterval, HasSeed, HasStepSize,
                      HasNumWorkers):
    """Params of StradsMF (as pyspark's _ALSParams)."""

    rank: Param[int] = Param(Params._dummy(), "rank", "rank of the factorization (>= 1)",
                             typeConverter=TypeConverters.toInt)
    implicitPrefs: Param[bool] = Param(Params._dummy(), "implicitPrefs",
                                       "whether to use implicit preference (not supported yet: must be False)",
                                       typeConverter=TypeConverters.toBoolean)
    alpha: Param[float] = Param(Params._dummy(), "alpha", "alpha for implicit preference (unused: explicit only)",
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

    _param_rules = {
        "rank": at_least(1),
        "implicitPrefs": Rule(lambda v, p: not v, "is not supported: StradsMF fits explicit ratings only so far; "
                                                  "use pyspark.ml.recommendation.ALS for implicit feedback"),
        "alpha": at_least(0, finite=True, note="ALS's range; unused with explicit ratings"),
        "innerIterations": at_least(0, note="0 = automatic"),
        "featureBlockSize": at_least(0, note="0 = automatic"),
        "algorithm": one_of("cd", "sgd", note="'cd': coordinate descent, the default; 'sgd': SGD with block "
                                              "rotation"),
        "stepSize": above(0, finite=True, note="SGD's initial step size; the default 0.05 suits ratings on a "
                                               "1-5 scale")}
    _column_kinds = {"ratingCol": numeric_column("a numeric column (cast it, e.g. F.col({col}).cast('double'))")}

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(rank=10, maxIter=10, regParam=0.1, implicitPrefs=False, alpha=1.0, ratingCol="rating",
                         nonnegative=False, checkpointInterval=10, innerIterations=0, featureBlockSize=0,
                         algorithm="cd", stepSize=0.05)

    def _check_params(self) -> None:
        super()._check_params()
        if self.getNonnegative() and self.getFeatureBlockSize() > 1:
            raise ConfigurationError(f"featureBlockSize={self.getFeatureBlockSize()} with nonnegative=True: "
                                     "nonnegative factors are updated one feature at a time; set featureBlockSize=1 "
                                     "(or 0)")

    def _inner_iterations(self) -> int:
        """The resolved innerIterations (0 = automatic)."""
        if self.getInnerIterations() > 0:
            return self.getInnerIterations()
        return 1 if self._block_size() > 1 else 3

    def _block_size(self) -> int:
        """The resolved featureBlockSize (0 = automatic)."""
        if self.getFeatureBlockSize() > 0:
            return min(self.getFeatureBlockSize(), self.getRank())
        if self.getNonnegative():
            return 1
        blocks = -(-self.getRank() // AUTO_BLOCK_SIZE)  # as few blocks as allowed, of balanced sizes
        return -(-self.getRank() // blocks)


class StradsMFSummary(FitSummary):
    """Training history (:class:`~pystrads.ml._summary.FitSummary`): ``iterations`` has
    train_rmse, sse and the regularisation per iteration."""

    @property
    def trainRmseHistory(self) -> List[float]:
        return self._history("train_rmse")

    def plot(self, ax=None):
        """Training RMSE per iteration (needs matplotlib: ``pip install 'pystrads[plot]'``)."""
        return self._plot(ax, "train_rmse", "training RMSE")


class StradsMF(_StradsEstimator, _StradsMFParams):
    """Matrix factorisation for explicit ratings by scheduled model-parallel coordinate descent.

    Objective (exactly ALS's for explicit feedback)::

        sum (r_ui - x_u . y_i)^2 + regParam * (sum_u n_u |x_u|^2 + sum_i n_i |y_i|^2)

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

    _fit_columns = ("userCol", "itemCol", "ratingCol")
    _summary_class = StradsMFSummary

    @keyword_only
    def __init__(self, *, rank: int = 10, maxIter: int = 10, regParam: float = 0.1, implicitPrefs: bool = False,
                 alpha: float = 1.0, userCol: str = "user", itemCol: str = "item", seed: Optional[int] = None,
                 ratingCol: str = "rating", nonnegative: bool = False, checkpointInterval: int = 10,
                 coldStartStrategy: str = "nan", predictionCol: str = "prediction", numWorkers: int = 0,
                 innerIterations: int = 0, featureBlockSize: int = 0, algorithm: str = "cd",
                 stepSize: float = 0.05, blockSize: int = 4096):
        super().__init__()
        self._set(**self._input_kwargs)

    def _scan(self, fit: Fit):
        ucol, icol, rcol = self.getUserCol(), self.getItemCol(), self.getRatingCol()
        triples = fit.dataset.select(F.col(ucol).cast("double").alias("u"), F.col(icol).cast("double").alias("i"),
                                     F.col(rcol).cast("double").alias("r"))
        check_ratings(triples, ucol, icol, rcol)  # one job: empty input, bad ids / ratings (column, value, fix)
        # then the distinct users and the per-item counts, in one pass without a shuffle
        users, items, item_counts = _ids_and_item_counts(triples)
        if not len(users) or not len(items):
            raise InputError("the input has no ratings; StradsMF needs at least one (user, item, rating) row")
        # each worker holds whole users: its partition of a hash partitioning by user
        return triples.repartition(fit.workers, "u"), {"users": users, "items": items, "item_counts": item_counts}

    def _program(self, fit: Fit):
        users, items, item_counts = fit.stats["users"], fit.stats["items"], fit.stats["item_counts"]
        if self.getAlgorithm() == "sgd":
            for name in ("featureBlockSize", "innerIterations"):
                if self.isSet(name) and self.getOrDefault(name):
                    log.warning("StradsMF: %s=%s is ignored with algorithm='sgd'", name, self.getOrDefault(name))
            program = MFSGDProgram(len(users), len(items), self.getRank(), self.getRegParam(), item_counts,
                                   self.getMaxIter(), fit.workers, self.getStepSize(), self.getNonnegative(), fit.seed)
        else:
            program = MFProgram(len(users), len(items), self.getRank(), self.getRegParam(), item_counts,
                                self.getMaxIter(), self._inner_iterations(), self.getNonnegative(), fit.seed,
                                block_size=self._block_size())
        log.info("StradsMF: %d ratings, %d users, %d items, rank %d, %d workers, %r", int(item_counts.sum()),
                 len(users), len(items), self.getRank(), fit.workers, program)
        return program

    def _engine_args(self, fit: Fit):
        # the workers hand their users' factors over when the fit ends (no second job, nothing cached)
        return {"prepartitioned": True, "decode": functools.partial(_dense_ids, fit.stats["users"], fit.stats["items"]),
                "export": _user_factors}

    def _read_model(self, result, fit: Fit) -> "StradsMFModel":
        users, items = fit.stats["users"], fit.stats["items"]
        w = np.zeros((len(users), self.getRank()))
        for local, rows in result.exports:
            w[local] = rows
        return StradsMFModel(self.getRank(), users, w, items, fit.program.item_matrix(result.read_table("item_factors")))


def _dense_ids(users, items, row):
    """A rating ``(u, i, r)`` with its ids as positions in the sorted ``users`` / ``items`` (on the workers)."""
    u, i, r = row
    return int(np.searchsorted(users, int(u))), int(np.searchsorted(items, int(i))), float(r)


def _user_factors(worker, data, state):
    """What a worker hands over when the fit ends: its users' positions and factor rows."""
    return data.users, state.w


def _ids_and_item_counts(triples):
    """``(users, items, item_counts)`` of checked ``triples`` (columns u, i as double): sorted
    distinct ids as int64 and each item's number of ratings.  One Spark job and no shuffle: each
    partition reduces its rows to its distinct users and item counts with numpy (Arrow batches),
    the driver merges them -- the ids end up on the driver anyway."""
    def reduce(batches):
        us, its, cs = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
        for batch in batches:
            us.append(np.unique(batch.column(0).to_numpy(zero_copy_only=False).astype(np.int64)))
            ids, counts = np.unique(batch.column(1).to_numpy(zero_copy_only=False).astype(np.int64),
                                    return_counts=True)
            its.append(ids)
            cs.append(counts)
        return np.unique(np.concatenate(us)), np.concatenate(its), np.concatenate(cs)

    parts = collect_per_partition(triples.select("u", "i"), reduce) or [(np.zeros(0, np.int64),) * 3]
    users = np.unique(np.concatenate([p[0] for p in parts]))
    items, where = np.unique(np.concatenate([p[1] for p in parts]), return_inverse=True)
    item_counts = np.bincount(where, weights=np.concatenate([p[2] for p in parts]), minlength=len(items))
    return users, items, item_counts.astype(np.float64)


def _factors_df(spark, ids: np.ndarray, factors: np.ndarray):
    schema = T.StructType([T.StructField("id", T.IntegerType(), False),
                           T.StructField("features", T.ArrayType(T.FloatType(), False), True)])
    rows = [(int(i), [float(x) for x in f]) for i, f in zip(ids, factors.astype(np.float32))]
    return spark.createDataFrame(rows, schema)


class StradsMFModel(_StradsModel, _StradsMFModelParams):
    """A fitted :class:`StradsMF`: user and item factors, predictions, recommendations (ALS's
    model setters: the columns, ``coldStartStrategy`` and ``blockSize``)."""

    _setters = ("userCol", "itemCol", "predictionCol", "coldStartStrategy", "blockSize")

    def __init__(self, rank: int = 0, user_ids=None, user_factors=None, item_ids=None, item_factors=None):
        super().__init__()
        self._rank = int(rank)
        self._user_ids = None if user_ids is None else np.asarray(user_ids, dtype=np.int64)
        self._w = None if user_factors is None else np.asarray(user_factors, dtype=np.float64)
        self._item_ids = None if item_ids is None else np.asarray(item_ids, dtype=np.int64)
        self._h = None if item_factors is None else np.asarray(item_factors, dtype=np.float64)

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

        self._check_params()
        self._check_columns(dataset, "userCol", "itemCol")
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
        self._check_params()
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

    # -- persistence: userFactors/ and itemFactors/ hold (id, features) rows
    def _save_data(self, write) -> dict:
        schema = T.StructType([T.StructField("id", T.LongType(), False),
                               T.StructField("features", T.ArrayType(T.DoubleType(), False), False)])
        for name, ids, factors in (("userFactors", self._user_ids, self._w), ("itemFactors", self._item_ids, self._h)):
            write(name, schema, [(int(i), row.tolist()) for i, row in zip(ids, factors)])
        return {"rank": self.rank}

    @classmethod
    def _load_data(cls, read, metadata) -> "StradsMFModel":
        parts = []
        for name in ("userFactors", "itemFactors"):
            rows = sorted((r["id"], r["features"]) for r in read(name).collect())
            parts += [np.array([r[0] for r in rows], dtype=np.int64),
                      np.array([r[1] for r in rows], dtype=np.float64).reshape(len(rows), -1)]
        return cls(int(metadata["rank"]), *parts)
