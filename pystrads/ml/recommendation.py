"""``StradsMF``: matrix factorisation for explicit ratings and implicit feedback, a drop-in for
``pyspark.ml.recommendation.ALS``.

Same params and outputs as ALS (``userFactors`` / ``itemFactors`` with
``id`` and ``features``, ``prediction``, ``recommendFor*`` with ALS's column
names); the factors are fitted by STRADS coordinate descent (feature blocks,
W/H alternation, H on parameter-server shards) on the same objective as ALS,
explicit (:mod:`pystrads.programs.mf`) or implicit (:mod:`pystrads.programs.mf_implicit`).
"""

from __future__ import annotations

import functools
import logging
from typing import Any, List, Optional

from pyspark import keyword_only
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import (HasCheckpointInterval, HasMaxIter, HasPredictionCol, HasRegParam, HasSeed,
                                     HasStepSize)

from ..programs.mf import MFProgram, MFSGDProgram
from ..programs.mf_implicit import ImplicitMFProgram
from ._base import Fit, _StradsEstimator, _StradsModel
from ._mf_data import (dense_ids, fitted_factors, load_factors, predictions, read_ratings, recommendations,
                       save_factors, user_factors)
from ._params import (HasEarlyStopping, HasNumWorkers, MLlibOnly, Rule, _StradsParams, above, at_least, numeric_column,
                      one_of)
from ._summary import FitSummary

log = logging.getLogger(__name__)

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
                      HasNumWorkers, HasEarlyStopping):
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
    scaleRegParam: Param[bool] = Param(
        Params._dummy(), "scaleRegParam",
        "whether regParam is scaled by each user's and item's number of ratings (positive ones with "
        "implicitPrefs=True): True as Spark's ALS (ALS-WR); False applies regParam alone to every factor row, "
        "the objective of the implicit library and of Hu, Koren & Volinsky", typeConverter=TypeConverters.toBoolean)
    algorithm: Param[str] = Param(
        Params._dummy(), "algorithm",
        "'cd': coordinate descent with W/H alternation (exact block solves, no step size; the default); "
        "'sgd': stochastic gradient descent with block rotation (each worker sweeps its ratings of one item "
        "block per round, stepSize / sqrt(1 + iteration))", typeConverter=TypeConverters.toString)

    # ALS's partitioning and storage params, accepted so that pipelines written for ALS run unchanged; the
    # workers are numWorkers' data partitions and the factors live on the shards, then in the model's tables
    numUserBlocks: Param[int] = Param(Params._dummy(), "numUserBlocks",
                                      "number of user blocks (ALS's; accepted and ignored: the users are split "
                                      "over numWorkers workers)", typeConverter=TypeConverters.toInt)
    numItemBlocks: Param[int] = Param(Params._dummy(), "numItemBlocks",
                                      "number of item blocks (ALS's; accepted and ignored: the item factors are "
                                      "range-partitioned over the shards)", typeConverter=TypeConverters.toInt)
    intermediateStorageLevel: Param[str] = Param(
        Params._dummy(), "intermediateStorageLevel",
        "StorageLevel for intermediate datasets (ALS's; accepted and ignored: the workers keep their ratings in "
        "memory for the fit)", typeConverter=TypeConverters.toString)
    finalStorageLevel: Param[str] = Param(
        Params._dummy(), "finalStorageLevel",
        "StorageLevel for ALS model factors (ALS's; accepted and ignored: see spark.pystrads.model.dir for where "
        "the factors are kept)", typeConverter=TypeConverters.toString)

    _mllib_only = {name: MLlibOnly("pystrads' own partitioning (numWorkers workers, the factors on the shards)")
                   for name in ("numUserBlocks", "numItemBlocks", "intermediateStorageLevel", "finalStorageLevel")}

    _param_rules = {
        "numUserBlocks": at_least(1, note="ALS's range"),
        "numItemBlocks": at_least(1, note="ALS's range"),
        "intermediateStorageLevel": Rule(lambda v, p: v != "NONE", "cannot be 'NONE' (ALS's rule)"),
        "rank": at_least(1),
        "alpha": at_least(0, finite=True, note="ALS's range; the confidence of an observation is 1 + alpha |rating|"),
        "innerIterations": at_least(0, note="0 = automatic"),
        "featureBlockSize": [at_least(0, note="0 = automatic"),
                             Rule(lambda v, p: v <= 1 or not p.getNonnegative(),
                                  "with nonnegative=True: nonnegative factors are updated one feature at a time; "
                                  "set featureBlockSize=1 (or 0)")],
        "implicitPrefs": Rule(lambda v, p: not v or p.getAlgorithm() != "sgd",
                              "with algorithm='sgd': SGD covers explicit ratings only (the implicit objective sums "
                              "over every user-item pair); use algorithm='cd', the default"),
        "scaleRegParam": Rule(lambda v, p: v or p.getAlgorithm() != "sgd",
                              "with algorithm='sgd': SGD regularises each rating's update, which is the scaled "
                              "form; use algorithm='cd', the default, or scaleRegParam=True"),
        "algorithm": one_of("cd", "sgd", note="'cd': coordinate descent, the default; 'sgd': SGD with block "
                                              "rotation"),
        "stepSize": above(0, finite=True, note="SGD's initial step size; the default 0.05 suits ratings on a "
                                               "1-5 scale")}
    _column_kinds = {"ratingCol": numeric_column("a numeric column (cast it, e.g. F.col({col}).cast('double'))")}

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(rank=10, maxIter=10, regParam=0.1, implicitPrefs=False, alpha=1.0, ratingCol="rating",
                         nonnegative=False, checkpointInterval=10, innerIterations=0, featureBlockSize=0,
                         algorithm="cd", stepSize=0.05, scaleRegParam=True, numUserBlocks=10, numItemBlocks=10,
                         intermediateStorageLevel="MEMORY_AND_DISK", finalStorageLevel="MEMORY_AND_DISK")

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
    """Training history (:class:`~pystrads.ml._summary.FitSummary`): ``iterations`` has, per
    iteration, train_rmse, sse and the regularisation (explicit ratings), or the implicit
    objective, its loss and its regularisation (``implicitPrefs=True``)."""

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
        explicit = "train_rmse" in self.iterations
        return self._plot(ax, *(("train_rmse", "training RMSE") if explicit else ("objective", "objective")))


class StradsMF(_StradsEstimator, _StradsMFParams):
    """Matrix factorisation for explicit ratings or implicit feedback by scheduled model-parallel
    coordinate descent.

    Objective (exactly ALS's for explicit feedback)::

        sum (r_ui - x_u . y_i)^2 + regParam * (sum_u n_u |x_u|^2 + sum_i n_i |y_i|^2)

    (``scaleRegParam=False``: ``regParam * (sum_u |x_u|^2 + sum_i |y_i|^2)``, the ``implicit``
    library's form).

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
    ``stepSize / sqrt(1 + iteration)``.  Same objective, same params, but for those
    one algorithm alone uses (``stepSize``: SGD; ``featureBlockSize``,
    ``innerIterations``: coordinate descent): a fit logs a warning naming any
    of them that is set and ignored.

    Examples
    --------
    >>> from pystrads.ml import StradsMF
    >>> ratings = spark.createDataFrame([(0, 0, 4.0), (0, 1, 2.0), (1, 1, 3.0)], ["user", "item", "rating"])
    >>> model = StradsMF(rank=2, maxIter=5, seed=1).fit(ratings)
    >>> model.recommendForAllUsers(1).show()    # doctest: +SKIP
    """

    _fit_columns = ("userCol", "itemCol", "ratingCol", "validationIndicatorCol")
    _summary_class = StradsMFSummary

    @keyword_only
    def __init__(self, *, rank: int = 10, maxIter: int = 10, regParam: float = 0.1, implicitPrefs: bool = False,
                 alpha: float = 1.0, userCol: str = "user", itemCol: str = "item", seed: Optional[int] = None,
                 ratingCol: str = "rating", nonnegative: bool = False, checkpointInterval: int = 10,
                 coldStartStrategy: str = "nan", predictionCol: str = "prediction", numWorkers: int = 0,
                 innerIterations: int = 0, featureBlockSize: int = 0, algorithm: str = "cd",
                 stepSize: float = 0.05, scaleRegParam: bool = True, blockSize: int = 4096,
                 numUserBlocks: int = 10, numItemBlocks: int = 10,
                 intermediateStorageLevel: str = "MEMORY_AND_DISK", finalStorageLevel: str = "MEMORY_AND_DISK",
                 validationIndicatorCol: str = "", validationTol: float = 0.0,
                 earlyStoppingRounds: int = 2):
        super().__init__()
        self._set(**self._input_kwargs)

    def _scan(self, fit: Fit):
        return read_ratings(fit.dataset, self.getUserCol(), self.getItemCol(), self.getRatingCol(), fit.workers,
                            self._validation_col())

    def _multithreaded(self) -> bool:
        return self.getAlgorithm() != "sgd"  # SGD writes a user's and an item's row per rating: one thread

    def _program(self, fit: Fit):
        users, items, item_counts = fit.stats["users"], fit.stats["items"], fit.stats["item_counts"]
        if self.getImplicitPrefs():
            self._warn_ignored("implicitPrefs=True (exact block solves)", "innerIterations", "stepSize")
            program = ImplicitMFProgram(len(users), len(items), self.getRank(), self.getRegParam(),
                                        fit.stats["item_positives"], self.getAlpha(), fit.workers, self.getMaxIter(),
                                        self.getNonnegative(), fit.seed, block_size=self._block_size(),
                                        early_stopping=self._early_stopping("validation_mpr"),
                                        scale_reg=self.getScaleRegParam())
        elif self.getAlgorithm() == "sgd":
            self._warn_ignored("algorithm='sgd'", "featureBlockSize", "innerIterations")
            program = MFSGDProgram(len(users), len(items), self.getRank(), self.getRegParam(), item_counts,
                                   self.getMaxIter(), fit.workers, self.getStepSize(), self.getNonnegative(), fit.seed,
                                   early_stopping=self._early_stopping("validation_rmse"))
        else:
            self._warn_ignored("algorithm='cd'", "stepSize")
            program = MFProgram(len(users), len(items), self.getRank(), self.getRegParam(), item_counts,
                                self.getMaxIter(), self._inner_iterations(), self.getNonnegative(), fit.seed,
                                block_size=self._block_size(), early_stopping=self._early_stopping("validation_rmse"),
                                scale_reg=self.getScaleRegParam())
        log.info("StradsMF: %d ratings, %d users, %d items, rank %d, %d workers, %r", int(item_counts.sum()),
                 len(users), len(items), self.getRank(), fit.workers, program)
        return program

    def _engine_args(self, fit: Fit):
        # the workers leave their users' factors on the shards when the fit ends (nothing cached)
        ids = functools.partial(dense_ids, fit.stats["users"], fit.stats["items"])
        return {"prepartitioned": True, "decode_batch": ids, "export": user_factors}

    def _read_model(self, result, fit: Fit) -> "StradsMFModel":
        # executors read the factors from the shards into DataFrames; none reach the driver
        users, items = fitted_factors(fit.dataset.sparkSession, result, fit.program, fit.stats["users"],
                                      fit.stats["items"], self.getRank(), fit.setup.config)
        return StradsMFModel(self.getRank(), users, items)


class StradsMFModel(_StradsModel, _StradsMFModelParams):
    """A fitted :class:`StradsMF`: user and item factors, predictions, recommendations (ALS's
    model setters: the columns, ``coldStartStrategy`` and ``blockSize``).

    As ``ALSModel``, the model holds its factors as DataFrames, never on the driver: made by
    the executors from the shards when the fit ends (kept as Spark local checkpoints, or as
    Parquet under ``spark.pystrads.model.dir``), or read from a saved model's Parquet."""

    _setters = ("userCol", "itemCol", "predictionCol", "coldStartStrategy", "blockSize")

    def __init__(self, rank: int = 0, user_factors=None, item_factors=None):
        super().__init__()
        self._rank = int(rank)
        self._user_factors = user_factors  # DataFrame (id int, features array<float>)
        self._item_factors = item_factors

    @property
    def rank(self) -> int:
        return self._rank

    def _repr_fields(self):
        return {"rank": self._rank}

    @property
    def userFactors(self):
        """DataFrame (id int, features array<float>), as ALSModel.userFactors."""
        self._check_open()
        return self._user_factors

    @property
    def itemFactors(self):
        """DataFrame (id int, features array<float>), as ALSModel.itemFactors."""
        self._check_open()
        return self._item_factors

    def _kept_frames(self) -> list:
        return [self._user_factors, self._item_factors]

    def _forget_frames(self) -> None:
        self._user_factors = self._item_factors = None

    def _transform(self, dataset):
        self._check_params()
        self._check_columns(dataset, "userCol", "itemCol")
        return predictions(dataset, self.getUserCol(), self.getItemCol(), self.getPredictionCol(), self.userFactors,
                           self.itemFactors, drop=self.getColdStartStrategy() == "drop")

    # -- recommendations (ALS's schemas)
    def _recommend(self, for_users: bool, num: int, dataset=None):
        self._check_params()
        sides = [(self.userFactors, self.getUserCol()), (self.itemFactors, self.getItemCol())]
        (src, src_col), (dst, dst_col) = sides if for_users else sides[::-1]
        if dataset is not None:
            self._check_columns(dataset, "userCol" if for_users else "itemCol")
        return recommendations(src, dst, num, src_col, dst_col, self.getBlockSize(), dataset)

    def recommendForAllUsers(self, numItems: int):
        """DataFrame(userCol, recommendations: array<struct<itemCol, rating>>): each user's top items."""
        return self._recommend(True, numItems)

    def recommendForAllItems(self, numUsers: int):
        """DataFrame(itemCol, recommendations: array<struct<userCol, rating>>): each item's top users."""
        return self._recommend(False, numUsers)

    def recommendForUserSubset(self, dataset, numItems: int):
        """The top items of the users in ``dataset``'s userCol."""
        return self._recommend(True, numItems, dataset)

    def recommendForItemSubset(self, dataset, numUsers: int):
        """The top users of the items in ``dataset``'s itemCol."""
        return self._recommend(False, numUsers, dataset)

    # -- persistence: userFactors/ and itemFactors/ hold (id long, features array<double>) rows
    def _save_data(self, write) -> dict:
        save_factors(write, self.userFactors, self.itemFactors)
        return {"rank": self.rank}

    @classmethod
    def _load_data(cls, read, metadata) -> "StradsMFModel":
        return cls(int(metadata["rank"]), *load_factors(read))
