"""``StradsLDA``: LDA topic models by scheduled model-parallel collapsed Gibbs sampling.

A drop-in for :class:`pyspark.ml.clustering.LDA` on the ``features`` column
that :class:`~pyspark.ml.feature.CountVectorizer` produces.
"""

from __future__ import annotations

import logging
import math
import os
import time
import warnings
from typing import Any, List, Optional

import numpy as np
from pyspark import keyword_only
from pyspark.ml import Estimator, Model
from pyspark.ml.linalg import DenseMatrix, DenseVector, VectorUDT
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasCheckpointInterval, HasFeaturesCol, HasMaxIter, HasSeed
from pyspark.ml.util import DefaultParamsReadable, DefaultParamsWritable

from ..engine import Engine
from ..engine.preflight import check_cluster, default_num_workers
from ..errors import ConfigurationError, InputError
from ..kernels.lda import SAMPLERS, alpha_vector, choose_sampler
from ._lda_input import _doc_records
from ._params import HasNumWorkers, check_common_params
from ._persistence import PersistentModel
from ._summary import FitSummary, HasTrainingSummary
from ._validation import check_num_workers
from ..programs.lda import LDAProgram
from ..ps.partition import range_bounds

log = logging.getLogger(__name__)

#: topicsMatrix() warns above this many cells (it builds the matrix on the driver).
LARGE_MODEL_CELLS = 50_000_000

#: Default optimizeBurnIn: iterations of Gibbs sampling before the first update of a learned alpha.
OPTIMIZE_BURN_IN = 0


class _StradsLDAParams(HasMaxIter, HasFeaturesCol, HasSeed, HasCheckpointInterval, HasNumWorkers):
    """Params shared by :class:`StradsLDA` and :class:`StradsLDAModel`."""

    k: Param[int] = Param(Params._dummy(), "k", "number of topics (clusters) to infer; must be > 1.",
                          typeConverter=TypeConverters.toInt)
    docConcentration: Param[List[float]] = Param(
        Params._dummy(), "docConcentration",
        "concentration parameter (commonly named 'alpha') for the Dirichlet prior on documents' "
        "distributions over topics ('theta'); one value (symmetric) or k values, all > 0. Unset: 50 / k "
        "(Griffiths & Steyvers; the prior MLlib's EM optimizer effectively uses, its default 50/k + 1 "
        "being a MAP shift by 1). With optimizeDocConcentration: where the learned prior starts.",
        typeConverter=TypeConverters.toListFloat)
    optimizeDocConcentration: Param[bool] = Param(
        Params._dummy(), "optimizeDocConcentration",
        "learn docConcentration from the data: an asymmetric prior (one value per topic) re-estimated by "
        "Minka's fixed point from the documents' topic counts every optimizeInterval iterations, from "
        "iteration optimizeBurnIn on; estimatedDocConcentration() returns it. Default False (MLlib's online "
        "optimizer defaults to True; see docs/lda.md).", typeConverter=TypeConverters.toBoolean)
    optimizeInterval: Param[int] = Param(
        Params._dummy(), "optimizeInterval",
        "iterations between two updates of the learned docConcentration (tomotopy's optim_interval); >= 1.",
        typeConverter=TypeConverters.toInt)
    optimizeBurnIn: Param[int] = Param(
        Params._dummy(), "optimizeBurnIn",
        "iterations before the first update of the learned docConcentration (the first update is after the "
        "first iteration that is a multiple of optimizeInterval and >= optimizeBurnIn); >= 0.",
        typeConverter=TypeConverters.toInt)
    topicConcentration: Param[float] = Param(
        Params._dummy(), "topicConcentration",
        "concentration parameter (commonly named 'beta' or 'eta') for the prior placed on topics' "
        "distributions over terms; > 0. Unset: 0.1 (what MLlib EM's default 1.1 means after its MAP shift).",
        typeConverter=TypeConverters.toFloat)
    topicDistributionCol: Param[str] = Param(
        Params._dummy(), "topicDistributionCol",
        "output column with estimates of the topic mixture distribution for each document (often called "
        "'theta' in the literature); documents without terms get a zero vector, as in MLlib.",
        typeConverter=TypeConverters.toString)
    sampler: Param[str] = Param(
        Params._dummy(), "sampler",
        "collapsed Gibbs sampler: 'auto' (chosen by k and mean document length), 'dense', 'sparse' "
        "(SparseLDA), 'fplus' (F+LDA) or 'mh' (Metropolis-Hastings).", typeConverter=TypeConverters.toString)
    logLikelihoodEvery: Param[int] = Param(
        Params._dummy(), "logLikelihoodEvery",
        "compute the training log-likelihood log p(w, z) every this many iterations (0 = never); it reads "
        "the whole word-topic table on the shards, so large models may want it less often.",
        typeConverter=TypeConverters.toInt)
    foldInIterations: Param[int] = Param(
        Params._dummy(), "foldInIterations",
        "Gibbs sweeps per document when inferring topic mixtures of new documents (transform, "
        "logLikelihood, logPerplexity); >= 2.", typeConverter=TypeConverters.toInt)

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(k=10, maxIter=20, checkpointInterval=10, topicDistributionCol="topicDistribution",
                         sampler="auto", logLikelihoodEvery=1, foldInIterations=20, optimizeDocConcentration=False,
                         optimizeInterval=10, optimizeBurnIn=OPTIMIZE_BURN_IN)

    def getK(self) -> int:
        return self.getOrDefault(self.k)

    def getDocConcentration(self) -> List[float]:
        return self.getOrDefault(self.docConcentration)

    def getTopicConcentration(self) -> float:
        return self.getOrDefault(self.topicConcentration)

    def getTopicDistributionCol(self) -> str:
        return self.getOrDefault(self.topicDistributionCol)

    def getSampler(self) -> str:
        return self.getOrDefault(self.sampler)

    def getLogLikelihoodEvery(self) -> int:
        return self.getOrDefault(self.logLikelihoodEvery)

    def getFoldInIterations(self) -> int:
        return self.getOrDefault(self.foldInIterations)

    def getOptimizeDocConcentration(self) -> bool:
        return self.getOrDefault(self.optimizeDocConcentration)

    def getOptimizeInterval(self) -> int:
        return self.getOrDefault(self.optimizeInterval)

    def getOptimizeBurnIn(self) -> int:
        return self.getOrDefault(self.optimizeBurnIn)

    # -- resolved hyper-parameters
    def _alpha(self) -> np.ndarray:
        """docConcentration as k values (one value given: the symmetric prior)."""
        k = self.getK()
        if not self.isDefined(self.docConcentration):
            return np.full(k, 50.0 / k)
        values = self.getDocConcentration()
        if len(values) not in (1, k):
            raise ConfigurationError(
                f"docConcentration has {len(values)} values for k={k} topics; give one value (a symmetric "
                f"prior, e.g. docConcentration=[{50.0 / k:.4g}]) or {k} values, one per topic")
        return np.array(values if len(values) == k else values * k, dtype=np.float64)

    def _beta(self) -> float:
        return float(self.getTopicConcentration()) if self.isDefined(self.topicConcentration) else 0.1

    def _validate_params(self) -> None:
        k = self.getK()
        if k < 2:
            raise ConfigurationError(f"k={k}: LDA needs at least 2 topics; set k >= 2")
        check_common_params(self)
        alpha, beta = self._alpha(), self._beta()
        bad = alpha[~(np.isfinite(alpha) & (alpha > 0))]
        if len(bad):
            raise ConfigurationError(f"docConcentration={bad[0]} must be a finite value > 0 (e.g. {50.0 / k:.4g})")
        if not beta > 0 or not math.isfinite(beta):
            raise ConfigurationError(f"topicConcentration={beta} must be a finite value > 0 (e.g. 0.1)")
        sampler = self.getSampler()
        if sampler != "auto" and sampler not in SAMPLERS:
            raise ConfigurationError(f"sampler={sampler!r} is not one of 'auto', " + ", ".join(
                repr(s) for s in SAMPLERS))
        if self.getLogLikelihoodEvery() < 0:
            raise ConfigurationError(f"logLikelihoodEvery={self.getLogLikelihoodEvery()} must be >= 0")
        if self.getFoldInIterations() < 2:
            raise ConfigurationError(f"foldInIterations={self.getFoldInIterations()} must be >= 2")
        if self.getOptimizeInterval() < 1:
            raise ConfigurationError(f"optimizeInterval={self.getOptimizeInterval()} must be >= 1 (iterations "
                                     "between two updates of the learned docConcentration)")
        if self.getOptimizeBurnIn() < 0:
            raise ConfigurationError(f"optimizeBurnIn={self.getOptimizeBurnIn()} must be >= 0 (iterations before "
                                     "the first update of the learned docConcentration)")
        interval, burn_in = self.getOptimizeInterval(), self.getOptimizeBurnIn()
        first_update = max(interval, -(-burn_in // interval) * interval)
        if self.getOptimizeDocConcentration() and first_update > self.getMaxIter():
            warnings.warn(f"optimizeDocConcentration=True but docConcentration stays fixed: the first update would "
                          f"follow iteration {first_update} (optimizeInterval={interval}, optimizeBurnIn={burn_in}), "
                          f"after maxIter={self.getMaxIter()}; lower optimizeInterval / optimizeBurnIn or raise "
                          "maxIter",
                          UserWarning, stacklevel=3)

    def _validate_schema(self, dataset) -> None:
        col = self.getFeaturesCol()
        if col not in dataset.columns:
            raise InputError(f"featuresCol {col!r} is not a column of the input (columns: {dataset.columns}); "
                             "set featuresCol to the column CountVectorizer wrote")
        dtype = dataset.schema[col].dataType
        if not isinstance(dtype, VectorUDT):
            raise InputError(f"featuresCol {col!r} has type {dtype.simpleString()}, expected a vector of term "
                             "counts (as CountVectorizer produces)")


class StradsLDA(Estimator, _StradsLDAParams, DefaultParamsReadable, DefaultParamsWritable):
    """Latent Dirichlet Allocation by model-parallel collapsed Gibbs sampling (STRADS LDA).

    Objective: samples the posterior of LDA's topic assignments z (collapsed
    Gibbs: ``p(z = t) ∝ (n_dt + α)(n_wt + β)/(n_t + Vβ)``); the model's topics
    are the word-topic counts of the last sample.  With
    ``optimizeDocConcentration`` the prior α is learned too: an asymmetric α
    re-estimated every ``optimizeInterval`` iterations by Minka's fixed point
    (Wallach, Mimno & McCallum 2009), toward the maximum of p(z | α) at the
    current sample.

    Schedule: the vocabulary is cut into ``numWorkers`` blocks of equal token
    mass; in round r worker p samples the tokens of block (p + r) mod U, so
    no two workers touch the same word-topic rows at once and every token is
    sampled once per iteration. The word-topic table lives on parameter-server
    shards on the executors, never on the driver during training.

    Example
    -------
    >>> from pyspark.ml.feature import CountVectorizer
    >>> from pystrads.ml import StradsLDA
    >>> docs = spark.createDataFrame([(["apple", "pie"],), (["spark", "cluster"],)], ["words"])
    >>> counts = CountVectorizer(inputCol="words", outputCol="features").fit(docs).transform(docs)
    >>> model = StradsLDA(k=2, maxIter=10, seed=1).fit(counts)
    >>> model.describeTopics(3).show()        # doctest: +SKIP
    """

    @keyword_only
    def __init__(self, *, featuresCol: str = "features", maxIter: int = 20, seed: Optional[int] = None,
                 checkpointInterval: int = 10, k: int = 10, docConcentration: Optional[List[float]] = None,
                 topicConcentration: Optional[float] = None, topicDistributionCol: str = "topicDistribution",
                 numWorkers: int = 0, sampler: str = "auto", logLikelihoodEvery: int = 1,
                 foldInIterations: int = 20, optimizeDocConcentration: bool = False, optimizeInterval: int = 10,
                 optimizeBurnIn: int = OPTIMIZE_BURN_IN):
        super().__init__()
        kwargs = self._input_kwargs
        self.setParams(**kwargs)

    @keyword_only
    def setParams(self, *, featuresCol: str = "features", maxIter: int = 20, seed: Optional[int] = None,
                  checkpointInterval: int = 10, k: int = 10, docConcentration: Optional[List[float]] = None,
                  topicConcentration: Optional[float] = None, topicDistributionCol: str = "topicDistribution",
                  numWorkers: int = 0, sampler: str = "auto", logLikelihoodEvery: int = 1,
                  foldInIterations: int = 20, optimizeDocConcentration: bool = False, optimizeInterval: int = 10,
                  optimizeBurnIn: int = OPTIMIZE_BURN_IN) -> "StradsLDA":
        kwargs = self._input_kwargs
        return self._set(**kwargs)

    def setK(self, value: int) -> "StradsLDA":
        return self._set(k=value)

    def setMaxIter(self, value: int) -> "StradsLDA":
        return self._set(maxIter=value)

    def setSeed(self, value: int) -> "StradsLDA":
        return self._set(seed=value)

    def setFeaturesCol(self, value: str) -> "StradsLDA":
        return self._set(featuresCol=value)

    def setCheckpointInterval(self, value: int) -> "StradsLDA":
        return self._set(checkpointInterval=value)

    def setDocConcentration(self, value: List[float]) -> "StradsLDA":
        return self._set(docConcentration=value)

    def setTopicConcentration(self, value: float) -> "StradsLDA":
        return self._set(topicConcentration=value)

    def setTopicDistributionCol(self, value: str) -> "StradsLDA":
        return self._set(topicDistributionCol=value)

    def setNumWorkers(self, value: int) -> "StradsLDA":
        return self._set(numWorkers=value)

    def setSampler(self, value: str) -> "StradsLDA":
        return self._set(sampler=value)

    def setLogLikelihoodEvery(self, value: int) -> "StradsLDA":
        return self._set(logLikelihoodEvery=value)

    def setFoldInIterations(self, value: int) -> "StradsLDA":
        return self._set(foldInIterations=value)

    def setOptimizeDocConcentration(self, value: bool) -> "StradsLDA":
        return self._set(optimizeDocConcentration=value)

    def setOptimizeInterval(self, value: int) -> "StradsLDA":
        return self._set(optimizeInterval=value)

    def setOptimizeBurnIn(self, value: int) -> "StradsLDA":
        return self._set(optimizeBurnIn=value)

    def _fit(self, dataset) -> "StradsLDAModel":
        t_start = time.perf_counter()
        self._validate_params()
        self._validate_schema(dataset)
        k, alpha, beta = self.getK(), self._alpha(), self._beta()
        col = self.getFeaturesCol()
        check_num_workers(dataset, self.getNumWorkers())
        U = default_num_workers(dataset, self.getNumWorkers() or None)
        check_cluster(dataset, U)  # before any job
        records, stats = _doc_records(dataset, col)
        if stats["bad"] is not None:
            part, row, term, value, size = stats["bad"]
            if term is None:
                raise InputError(f"featuresCol {col!r}: vectors have different sizes {sorted(stats['sizes'])}; "
                                 "every document needs the same vocabulary (one CountVectorizer model)")
            raise InputError(f"featuresCol {col!r}: row {row} of partition {part} has count {value} for term "
                             f"{term}; term counts must be finite non-negative integers (CountVectorizer output)")
        if len(stats["sizes"]) > 1:
            raise InputError(f"featuresCol {col!r}: vectors have different sizes {sorted(stats['sizes'])}; "
                             "every document needs the same vocabulary (one CountVectorizer model)")
        if stats["docs"] + stats["empty"] + stats["null"] == 0 and stats["bad"] is None:
            raise InputError(f"featuresCol {col!r}: the input has no rows; LDA needs at least one non-empty document")
        if stats["docs"] == 0:
            raise InputError(f"featuresCol {col!r}: no document has any term ({stats['empty']} empty, "
                             f"{stats['null']} null rows); LDA needs at least one non-empty document")
        vocab = int(next(iter(stats["sizes"])))
        freq = stats["freq"]
        if stats["empty"] or stats["null"]:
            log.info("StradsLDA: skipped %d empty and %d null documents", stats["empty"], stats["null"])
        sampler = self.getSampler()
        if sampler == "auto":
            sampler = choose_sampler(k, stats["tokens"] / stats["docs"])
        seed = int(self.getOrDefault(self.seed))  # HasSeed always has a default
        bounds = range_bounds(vocab, U, freq)
        program = LDAProgram(k, vocab, U, bounds, alpha, beta, self.getMaxIter(), sampler, seed,
                             word_weights=freq.astype(np.float64), log_likelihood_every=self.getLogLikelihoodEvery(),
                             optimize_alpha=self.getOptimizeDocConcentration(),
                             optimize_interval=self.getOptimizeInterval(), optimize_burn_in=self.getOptimizeBurnIn(),
                             max_doc_length=stats["max_length"])
        log.info("StradsLDA: %d documents (%d empty skipped), %d tokens, V=%d, %r", stats["docs"], stats["empty"],
                 stats["tokens"], vocab, program)
        scan_s = time.perf_counter() - t_start
        # checkpoints every checkpointInterval steps when a checkpoint directory is set (MLlib's rule)
        engine = Engine(program, records, num_workers=U, seed=seed, keep_states=False,
                        config={"checkpoint.interval": max(0, self.getCheckpointInterval())})
        with engine.fit() as result:
            t0 = time.perf_counter()
            word_topic = result.read_table("word_topic")
            read_s = time.perf_counter() - t0
            summary = StradsLDASummary(result.summary, stats, scan_s, read_s, sampler, U)
        model = StradsLDAModel(word_topic, program.alpha, beta)  # the driver's program holds the learned alpha
        model._summary = summary
        return self._copyValues(model)


class StradsLDASummary(FitSummary):
    """Training history of a :class:`StradsLDAModel` fit (:class:`~pystrads.ml._summary.FitSummary`).

    ``iterations``: one row per iteration with ``log_likelihood`` (log p(w, z)),
    ``log_perplexity`` (−log p(w, z) / tokens), ``s_error`` (the STRADS
    supplement's Δt) and ``tokens``; ``steps`` adds tokens/s to the time split
    (``compute_s``, ``sync_s``, ``spark_s``, ``schedule_s``).
    """

    def __init__(self, engine_summary, stats, scan_s, read_s, sampler, workers):
        super().__init__(engine_summary, scan_s=scan_s, read_model_s=read_s)
        if len(self.steps):
            self.steps["tokens_per_s"] = self.steps["tokens"] / self.steps["job_s"]
        self.shards = engine_summary.shards  # per shard: table bytes, resident memory, traffic
        self.numDocuments = int(stats["docs"])
        self.numEmptyDocuments = int(stats["empty"])  # all-zero vectors: skipped
        self.numNullDocuments = int(stats["null"])  # null vectors: skipped
        self.numTokens = int(stats["tokens"])
        self.sampler = sampler
        self.numWorkers = workers

    @property
    def logLikelihoodHistory(self) -> List[float]:
        return self._history("log_likelihood")

    @property
    def tokensPerSecond(self) -> float:
        """Tokens sampled per second over all steps (Spark job time included)."""
        return float(self.steps["tokens"].sum() / self.steps["job_s"].sum()) if len(self.steps) else 0.0

    @property
    def trainingSeconds(self) -> float:
        return float(self.steps["seconds"].sum()) if len(self.steps) else 0.0

    def plot(self, ax=None):
        """Training log-likelihood per iteration (needs matplotlib: ``pip install 'pystrads[plot]'``)."""
        ax = self._axes(ax)
        it = self.iterations.dropna(subset=["log_likelihood"]) if "log_likelihood" in self.iterations else self.iterations
        ax.plot(it["iteration"], it.get("log_likelihood", []), marker=".")
        ax.set_xlabel("iteration")
        ax.set_ylabel("log p(w, z)")
        ax.set_title(f"StradsLDA: {self.numTokens} tokens, {self.tokensPerSecond:,.0f} tokens/s")
        return ax


class StradsLDAModel(HasTrainingSummary, Model, _StradsLDAParams, PersistentModel):
    """A fitted :class:`StradsLDA` model: word-topic counts and the priors."""

    def __init__(self, word_topic: Optional[np.ndarray] = None, alpha=0.0, beta: float = 0.0):
        """``alpha``: the document-topic prior, one value per topic (a number: symmetric)."""
        super().__init__()
        self._word_topic = None if word_topic is None else np.ascontiguousarray(word_topic, dtype=np.int32)
        k = 1 if word_topic is None else self._word_topic.shape[1]
        self._alpha_value = alpha_vector(alpha, k).copy()
        self._beta_value = float(beta)
        self._summary: Optional[StradsLDASummary] = None

    # -- setters (as MLlib's LDAModel): point a fitted or loaded model at other columns
    def setFeaturesCol(self, value: str) -> "StradsLDAModel":
        return self._set(featuresCol=value)

    def setTopicDistributionCol(self, value: str) -> "StradsLDAModel":
        return self._set(topicDistributionCol=value)

    def setSeed(self, value: int) -> "StradsLDAModel":
        """Seed of the fold-in sampler that ``transform`` runs."""
        return self._set(seed=value)

    # -- MLlib LDAModel API
    def vocabSize(self) -> int:
        return int(self._word_topic.shape[0])

    def isDistributed(self) -> bool:
        return False

    def estimatedDocConcentration(self) -> DenseVector:
        """The document-topic prior the model uses: learned (optimizeDocConcentration) or as given."""
        return DenseVector(self._alpha_value.copy())

    def topicsMatrix(self) -> DenseMatrix:
        """vocabSize x k word-topic **counts** (they sum to the training tokens).

        Built on the driver: for large models (more than ~5e7 cells) this
        needs vocabSize * k * 8 bytes of driver memory; prefer
        :meth:`describeTopics`, which keeps only the top terms.
        """
        v, k = self._word_topic.shape
        if v * k > LARGE_MODEL_CELLS:
            warnings.warn(f"topicsMatrix() builds a {v} x {k} dense matrix ({v * k * 8 / 1e9:.1f} GB) on the "
                          "driver; use describeTopics() for the top terms", stacklevel=2)
        return DenseMatrix(v, k, self._word_topic.astype(np.float64).ravel(order="F"))

    def topic_word_prob(self) -> np.ndarray:
        """phi: V x k, column t is p(word | topic t) = (n_wt + β) / (n_t + Vβ)."""
        wt = self._word_topic.astype(np.float64)
        return (wt + self._beta_value) / (wt.sum(axis=0) + wt.shape[0] * self._beta_value)

    def describeTopics(self, maxTermsPerTopic: int = 10):
        """DataFrame(topic, termIndices, termWeights): each topic's top terms by p(term | topic)."""
        from pyspark.sql import SparkSession
        from pyspark.sql.types import ArrayType, DoubleType, IntegerType, StructField, StructType

        if maxTermsPerTopic < 1:
            raise ConfigurationError(f"maxTermsPerTopic={maxTermsPerTopic} must be >= 1")
        phi = self.topic_word_prob()
        n = min(maxTermsPerTopic, phi.shape[0])
        rows = []
        for t in range(phi.shape[1]):
            top = np.argsort(-phi[:, t], kind="stable")[:n]
            rows.append((t, [int(i) for i in top], [float(phi[i, t]) for i in top]))
        schema = StructType([StructField("topic", IntegerType(), False),
                             StructField("termIndices", ArrayType(IntegerType(), False), False),
                             StructField("termWeights", ArrayType(DoubleType(), False), False)])
        return SparkSession.active().createDataFrame(rows, schema)

    # -- inference
    def _fold_in(self, dataset):
        """``fn(batches)`` for ``mapInArrow``: a partition's batches with, per document, the
        Gibbs fold-in counts (topics fixed) -- ``(batches, counts, lengths, words, ptr)``, one
        fold-in per partition.  Each document draws from its own random stream, seeded by
        ``seed`` and a hash of its terms and counts: its topic distribution depends on it
        alone, never on how the input is partitioned or ordered.  phi travels in the function
        (Spark broadcasts large ones)."""
        import hashlib

        from ..kernels import lda as K
        from ._arrow import vectors

        self._validate_schema(dataset)
        phi = self.topic_word_prob()
        if phi.shape[0] == 0:
            raise ConfigurationError("the model has an empty vocabulary")
        seed = int(self.getOrDefault(self.seed)) if self.isDefined(self.seed) else 0
        index = dataset.columns.index(self.getFeaturesCol())
        alpha, n_iter = self._alpha_value, self.getFoldInIterations()

        def run(batches):
            batches = list(batches)
            k = phi.shape[1]
            words, ptr, streams = [], [0], []
            for batch in batches:
                for vec in vectors(batch.column(index)):
                    if vec is None:
                        idx = cnt = np.zeros(0, np.int64)
                    else:
                        _, idx, val = vec
                        cnt = np.round(val).astype(np.int64)
                    keep = cnt > 0
                    t = np.ascontiguousarray(idx[keep], dtype=np.int64)
                    n = np.ascontiguousarray(cnt[keep], dtype=np.int64)
                    words.append(np.repeat(t, n))
                    ptr.append(ptr[-1] + int(n.sum()))
                    streams.append(int.from_bytes(hashlib.blake2b(t.tobytes() + b"|" + n.tobytes(),
                                                                  digest_size=8).digest(), "little"))
            doc_words = np.concatenate(words) if words else np.zeros(0, np.int64)
            doc_ptr = np.asarray(ptr, dtype=np.int64)
            n_docs = len(ptr) - 1
            rng = K.doc_states(seed, streams)
            counts = K.fold_in(doc_words, doc_ptr, phi, alpha, n_iter, rng) if n_docs else np.zeros((0, k))
            return batches, counts, np.diff(doc_ptr), doc_words, doc_ptr

        return run, phi

    def _transform(self, dataset):
        import pyarrow as pa
        from pyspark.sql.types import StructField, StructType

        from ._arrow import dense_vectors

        out_col = self.getTopicDistributionCol()
        if out_col in dataset.columns:
            raise InputError(f"topicDistributionCol {out_col!r} already exists in the input; choose another name")
        fold_in, _ = self._fold_in(dataset)
        alpha = self._alpha_value
        k = self._word_topic.shape[1]
        index = dataset.columns.index(self.getFeaturesCol())

        def attach(batches):
            batches, counts, lengths, _, _ = fold_in(batches)
            start = 0
            for batch in batches:
                n = batch.num_rows
                theta = [np.zeros(k) if lengths[i] == 0 else (counts[i] + alpha) / (lengths[i] + alpha.sum())
                         for i in range(start, start + n)]
                start += n
                column = dense_vectors(theta, batch.schema.field(index).type)
                yield pa.RecordBatch.from_arrays(list(batch.columns) + [column], batch.schema.names + [out_col])

        schema = StructType(dataset.schema.fields + [StructField(out_col, VectorUDT(), True)])
        return dataset.mapInArrow(attach, schema)

    def _score(self, dataset):
        """(Σ log p(token | θ_d, φ), tokens) over the dataset's documents."""
        from ._arrow import collect_per_partition

        fold_in, phi = self._fold_in(dataset)
        alpha = self._alpha_value

        def score(batches):
            _, counts, lengths, words, ptr = fold_in(batches)
            ll = 0.0
            for i in np.flatnonzero(lengths):
                theta = (counts[i] + alpha) / (lengths[i] + alpha.sum())
                ll += float(np.log(phi[words[ptr[i]:ptr[i + 1]]] @ theta).sum())
            return ll, int(lengths.sum())

        parts = collect_per_partition(dataset, score)
        return sum(p[0] for p in parts), sum(p[1] for p in parts)

    def logLikelihood(self, dataset) -> float:
        """log p(documents | topics) with each document's topic mixture from Gibbs
        fold-in (topics fixed): Σ_tokens log Σ_t θ_dt φ_tw."""
        return float(self._score(dataset)[0])

    def logPerplexity(self, dataset) -> float:
        """−logLikelihood(dataset) / number of tokens (lower is better)."""
        ll, tokens = self._score(dataset)
        return float(-ll / tokens) if tokens else float("nan")

    # -- persistence
    def _extra_metadata(self) -> dict:
        return {"alpha": self._alpha_value.tolist(), "beta": self._beta_value, "vocabSize": self.vocabSize(),
                "k": int(self._word_topic.shape[1])}

    def _save_data(self, path: str, spark) -> None:
        from pyspark.sql.types import ArrayType, IntegerType, StructField, StructType

        wt = self._word_topic  # one row per term that has tokens
        schema = StructType([StructField("term", IntegerType(), False),
                             StructField("counts", ArrayType(IntegerType(), False), False)])
        rows = [(int(i), wt[i].tolist()) for i in np.flatnonzero(wt.any(axis=1))]
        spark.createDataFrame(rows, schema).write.parquet(os.path.join(path, "data"))

    @classmethod
    def _from_data(cls, path: str, spark, metadata) -> "StradsLDAModel":
        v, k = int(metadata["vocabSize"]), int(metadata["k"])
        word_topic = np.zeros((v, k), dtype=np.int32)
        for row in spark.read.parquet(os.path.join(path, "data")).toLocalIterator():
            word_topic[row["term"]] = row["counts"]
        return cls(word_topic, metadata["alpha"], metadata["beta"])  # alpha: k values (one before issue 19)
