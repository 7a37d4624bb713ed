"""``StradsLDA``: LDA topic models by scheduled model-parallel collapsed Gibbs sampling.

A drop-in for :class:`pyspark.ml.clustering.LDA` on the ``features`` column
that :class:`~pyspark.ml.feature.CountVectorizer` produces.
"""

from __future__ import annotations

import logging
import math
import warnings
from typing import Any, List, Optional

import numpy as np
from pyspark import keyword_only
from pyspark.ml.linalg import DenseMatrix, DenseVector, VectorUDT
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasCheckpointInterval, HasFeaturesCol, HasMaxIter, HasSeed

from ..errors import ConfigurationError, InputError
from ..kernels.lda import SAMPLERS, choose_sampler
from ..programs.lda import LDAProgram
from ..ps.partition import range_bounds
from ._base import Fit, _StradsEstimator, _StradsModel
from ._lda_input import _doc_records
from ._params import HasNumWorkers, above, at_least, one_of, vector_column
from ._summary import FitSummary

log = logging.getLogger(__name__)

#: topicsMatrix() warns above this many cells (it builds the matrix on the driver).
LARGE_MODEL_CELLS = 50_000_000


class _StradsLDAParams(HasMaxIter, HasFeaturesCol, HasSeed, HasCheckpointInterval, HasNumWorkers):
    """Params shared by :class:`StradsLDA` and :class:`StradsLDAModel` (getters from
    :class:`~pystrads.ml._params._StradsParams`)."""

    k: Param[int] = Param(Params._dummy(), "k", "number of topics (clusters) to infer; must be > 1.",
                          typeConverter=TypeConverters.toInt)
    docConcentration: Param[List[float]] = Param(
        Params._dummy(), "docConcentration",
        "concentration parameter (commonly named 'alpha') for the symmetric Dirichlet prior on documents' "
        "distributions over topics ('theta'); one value or k equal values, all > 0. Unset: 50 / k "
        "(Griffiths & Steyvers; the prior MLlib's EM optimizer effectively uses, its default 50/k + 1 "
        "being a MAP shift by 1).", typeConverter=TypeConverters.toListFloat)
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

    _param_rules = {"k": at_least(2, note="LDA needs at least 2 topics"),
                    "topicConcentration": above(0, finite=True, note="e.g. 0.1"),
                    "sampler": one_of("auto", *SAMPLERS),
                    "logLikelihoodEvery": at_least(0, note="0 = never"),
                    "foldInIterations": at_least(2)}
    _column_kinds = {"featuresCol": vector_column("a vector of term counts (as CountVectorizer produces)")}

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(k=10, maxIter=20, checkpointInterval=10, topicDistributionCol="topicDistribution",
                         sampler="auto", logLikelihoodEvery=1, foldInIterations=20)

    # -- resolved hyper-parameters
    def _alpha(self) -> float:
        k = self.getK()
        if not self.isDefined(self.docConcentration):
            return 50.0 / k
        values = self.getDocConcentration()
        if len(values) not in (1, k) or len(set(values)) != 1:
            raise ConfigurationError(
                f"docConcentration={values}: StradsLDA uses a symmetric prior; give one value or {k} equal "
                "values (e.g. docConcentration=[{:.4g}])".format(50.0 / k))
        return float(values[0])

    def _beta(self) -> float:
        return float(self.getTopicConcentration()) if self.isDefined(self.topicConcentration) else 0.1

    def _check_params(self) -> None:
        super()._check_params()
        alpha = self._alpha()
        if not alpha > 0 or not math.isfinite(alpha):
            raise ConfigurationError(f"docConcentration={alpha} must be a finite number > 0 (e.g. "
                                     f"{50.0 / self.getK():.4g})")


class StradsLDASummary(FitSummary):
    """Training history of a :class:`StradsLDAModel` fit (:class:`~pystrads.ml._summary.FitSummary`).

    ``iterations``: one row per iteration with ``log_likelihood`` (log p(w, z)),
    ``log_perplexity`` (−log p(w, z) / tokens), ``s_error`` (the STRADS
    supplement's Δt) and ``tokens``; ``steps`` adds tokens/s to the time split
    (``compute_s``, ``sync_s``, ``spark_s``, ``schedule_s``).
    """

    def __init__(self, result, fit):
        super().__init__(result, fit)
        if len(self.steps):
            self.steps["tokens_per_s"] = self.steps["tokens"] / self.steps["job_s"]
        self.shards = result.summary.shards  # per shard: table bytes, resident memory, traffic
        stats = fit.stats
        self.numDocuments = int(stats["docs"])
        self.numEmptyDocuments = int(stats["empty"])  # all-zero vectors: skipped
        self.numNullDocuments = int(stats["null"])  # null vectors: skipped
        self.numTokens = int(stats["tokens"])
        self.sampler = stats["sampler"]
        self.numWorkers = fit.workers

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
        return self._plot(ax, "log_likelihood", "log p(w, z)", marker=".",
                          title=f"StradsLDA: {self.numTokens} tokens, {self.tokensPerSecond:,.0f} tokens/s")


class StradsLDA(_StradsEstimator, _StradsLDAParams):
    """Latent Dirichlet Allocation by model-parallel collapsed Gibbs sampling (STRADS LDA).

    Objective: samples the posterior of LDA's topic assignments z (collapsed
    Gibbs: ``p(z = t) ∝ (n_dt + α)(n_wt + β)/(n_t + Vβ)``); the model's topics
    are the word-topic counts of the last sample.

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

    _fit_columns = ("featuresCol",)
    _summary_class = StradsLDASummary

    @keyword_only
    def __init__(self, *, featuresCol: str = "features", maxIter: int = 20, seed: Optional[int] = None,
                 checkpointInterval: int = 10, k: int = 10, docConcentration: Optional[List[float]] = None,
                 topicConcentration: Optional[float] = None, topicDistributionCol: str = "topicDistribution",
                 numWorkers: int = 0, sampler: str = "auto", logLikelihoodEvery: int = 1,
                 foldInIterations: int = 20):
        super().__init__()
        self._set(**self._input_kwargs)

    def _scan(self, fit: Fit):
        col = self.getFeaturesCol()
        records, stats = _doc_records(fit.dataset, col)
        bad = stats["bad"]  # (partition, row, term, value, size); term None: a vector of another size
        if bad is not None and bad[2] is not None:
            raise InputError(f"featuresCol {col!r}: row {bad[1]} of partition {bad[0]} has count {bad[3]} for term "
                             f"{bad[2]}; term counts must be finite non-negative integers (CountVectorizer output)")
        if bad is not None or len(stats["sizes"]) > 1:
            raise InputError(f"featuresCol {col!r}: vectors have different sizes {sorted(stats['sizes'])}; "
                             "every document needs the same vocabulary (one CountVectorizer model)")
        if stats["docs"] + stats["empty"] + stats["null"] == 0:
            raise InputError(f"featuresCol {col!r}: the input has no rows; LDA needs at least one non-empty document")
        if stats["docs"] == 0:
            raise InputError(f"featuresCol {col!r}: no document has any term ({stats['empty']} empty, "
                             f"{stats['null']} null rows); LDA needs at least one non-empty document")
        if stats["empty"] or stats["null"]:
            log.info("StradsLDA: skipped %d empty and %d null documents", stats["empty"], stats["null"])
        return records, stats

    def _program(self, fit: Fit) -> LDAProgram:
        stats, k, alpha, beta = fit.stats, self.getK(), self._alpha(), self._beta()
        vocab, freq = int(next(iter(stats["sizes"]))), stats["freq"]
        sampler = self.getSampler()
        stats["sampler"] = sampler = choose_sampler(k, stats["tokens"] / stats["docs"]) if sampler == "auto" \
            else sampler
        log.info("StradsLDA: %d documents (%d empty skipped), %d tokens, V=%d, k=%d, alpha=%.4g, beta=%.4g, "
                 "sampler=%s, %d workers", stats["docs"], stats["empty"], stats["tokens"], vocab, k, alpha, beta,
                 sampler, fit.workers)
        return LDAProgram(k, vocab, fit.workers, range_bounds(vocab, fit.workers, freq), alpha, beta,
                          self.getMaxIter(), sampler, fit.seed, word_weights=freq.astype(np.float64),
                          log_likelihood_every=self.getLogLikelihoodEvery())

    def _read_model(self, result, fit: Fit) -> "StradsLDAModel":
        return StradsLDAModel(result.read_table("word_topic"), self._alpha(), self._beta())


class StradsLDAModel(_StradsModel, _StradsLDAParams):
    """A fitted :class:`StradsLDA` model: word-topic counts and the priors.  MLlib's LDAModel
    setters: ``setFeaturesCol``, ``setTopicDistributionCol`` and ``setSeed`` (of the fold-in
    sampler that ``transform`` runs)."""

    _setters = ("featuresCol", "topicDistributionCol", "seed")

    def __init__(self, word_topic: Optional[np.ndarray] = None, alpha: float = 0.0, beta: float = 0.0):
        super().__init__()
        self._word_topic = None if word_topic is None else np.ascontiguousarray(word_topic, dtype=np.int32)
        self._alpha_value = float(alpha)
        self._beta_value = float(beta)

    # -- MLlib LDAModel API
    def vocabSize(self) -> int:
        return int(self._word_topic.shape[0])

    def isDistributed(self) -> bool:
        return False

    def estimatedDocConcentration(self) -> DenseVector:
        return DenseVector(np.full(self._word_topic.shape[1], self._alpha_value))

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

        self._check_columns(dataset, "featuresCol")
        phi = self.topic_word_prob()
        if phi.shape[0] == 0:
            raise ConfigurationError("the model has an empty vocabulary")
        seed = int(self.getSeed())
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
                theta = [np.zeros(k) if lengths[i] == 0 else (counts[i] + alpha) / (lengths[i] + k * alpha)
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
        alpha, k = self._alpha_value, self._word_topic.shape[1]

        def score(batches):
            _, counts, lengths, words, ptr = fold_in(batches)
            ll = 0.0
            for i in np.flatnonzero(lengths):
                theta = (counts[i] + alpha) / (lengths[i] + k * alpha)
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

    # -- persistence: one row per term that has tokens in data/
    def _save_data(self, write) -> dict:
        from pyspark.sql.types import ArrayType, IntegerType, StructField, StructType

        wt = self._word_topic
        write("data", StructType([StructField("term", IntegerType(), False),
                                  StructField("counts", ArrayType(IntegerType(), False), False)]),
              [(int(i), wt[i].tolist()) for i in np.flatnonzero(wt.any(axis=1))])
        return {"alpha": self._alpha_value, "beta": self._beta_value, "vocabSize": self.vocabSize(),
                "k": int(wt.shape[1])}

    @classmethod
    def _load_data(cls, read, metadata) -> "StradsLDAModel":
        word_topic = np.zeros((int(metadata["vocabSize"]), int(metadata["k"])), dtype=np.int32)
        for row in read("data").toLocalIterator():
            word_topic[row["term"]] = row["counts"]
        return cls(word_topic, metadata["alpha"], metadata["beta"])
