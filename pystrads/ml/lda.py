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
from pyspark.ml.linalg import DenseMatrix, DenseVector
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasCheckpointInterval, HasFeaturesCol, HasMaxIter, HasSeed
from pyspark.sql import SparkSession

from ..kernels.lda import SAMPLERS, alpha_vector, choose_sampler
from ..programs.lda import LDAProgram
from ..ps.partition import range_bounds
from ._base import Fit, _StradsEstimator, _StradsModel
from ._lda_data import _doc_records, corpus_blocks
from ._lda_model import FoldIn, WordTopics, describe, fitted_topics, load_topics, save_topics, topics_matrix
from ._params import HasEarlyStopping, HasNumWorkers, MLlibOnly, Rule, above, at_least, one_of, vector_column
from ._summary import FitSummary

log = logging.getLogger(__name__)

#: Default optimizeBurnIn: iterations of Gibbs sampling before the first update of a learned alpha.
OPTIMIZE_BURN_IN = 0


class _StradsLDAParams(HasMaxIter, HasFeaturesCol, HasSeed, HasCheckpointInterval, HasNumWorkers):
    """Params shared by :class:`StradsLDA` and :class:`StradsLDAModel` (getters from
    :class:`~pystrads.ml._params._StradsParams`)."""

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
        "iteration optimizeBurnIn on; estimatedDocConcentration() returns it. Default True, as MLlib's online "
        "optimizer and tomotopy (False: the fixed prior of MLlib's EM optimizer).", typeConverter=TypeConverters.toBoolean)
    optimizeTopicConcentration: Param[bool] = Param(
        Params._dummy(), "optimizeTopicConcentration",
        "learn topicConcentration from the data: a symmetric prior re-estimated by Minka's fixed point from "
        "the word-topic counts every optimizeInterval iterations, from iteration optimizeBurnIn on (as "
        "Mallet's optimizeBeta); estimatedTopicConcentration() returns it. Default False.",
        typeConverter=TypeConverters.toBoolean)
    optimizeInterval: Param[int] = Param(
        Params._dummy(), "optimizeInterval",
        "iterations between two updates of the learned priors (tomotopy's optim_interval); >= 1.",
        typeConverter=TypeConverters.toInt)
    optimizeBurnIn: Param[int] = Param(
        Params._dummy(), "optimizeBurnIn",
        "iterations before the first update of the learned priors (the first update is after the "
        "first iteration that is a multiple of optimizeInterval and >= optimizeBurnIn); >= 0.",
        typeConverter=TypeConverters.toInt)
    topicConcentration: Param[float] = Param(
        Params._dummy(), "topicConcentration",
        "concentration parameter (commonly named 'beta' or 'eta') for the prior placed on topics' "
        "distributions over terms; > 0. Unset: 0.1 (what MLlib EM's default 1.1 means after its MAP shift). "
        "With optimizeTopicConcentration: where the learned prior starts.",
        typeConverter=TypeConverters.toFloat)
    topicDistributionCol: Param[str] = Param(
        Params._dummy(), "topicDistributionCol",
        "output column with estimates of the topic mixture distribution for each document (often called "
        "'theta' in the literature); documents without terms get a zero vector, as in MLlib.",
        typeConverter=TypeConverters.toString)
    sampler: Param[str] = Param(
        Params._dummy(), "sampler",
        "collapsed Gibbs sampler: 'auto' (by k: dense up to 600 topics, F+LDA below 50,000, alias above), 'dense', 'sparse' "
        "(SparseLDA), 'fplus' (F+LDA), 'mh' (Metropolis-Hastings) or 'alias' (LightLDA's alias-table MH).", typeConverter=TypeConverters.toString)
    logLikelihoodEvery: Param[int] = Param(
        Params._dummy(), "logLikelihoodEvery",
        "compute the training log-likelihood log p(w, z) every this many iterations and at the last one "
        "(0 = never); it reads the whole word-topic table on the shards (on Reuters, K = 50, every "
        "iteration made a fit 5-12 % slower than every 10th).",
        typeConverter=TypeConverters.toInt)
    foldInIterations: Param[int] = Param(
        Params._dummy(), "foldInIterations",
        "Gibbs sweeps per document when inferring topic mixtures of new documents (transform, "
        "logLikelihood, logPerplexity); >= 2.", typeConverter=TypeConverters.toInt)

    # MLlib's optimizer params, accepted so that pipelines written for MLlib's LDA run unchanged
    optimizer: Param[str] = Param(
        Params._dummy(), "optimizer",
        "MLlib's optimizer: 'online' or 'em' (accepted and ignored: StradsLDA infers by collapsed Gibbs "
        "sampling; optimizeDocConcentration=False gives the fixed prior of MLlib's 'em')",
        typeConverter=TypeConverters.toString)
    learningOffset: Param[float] = Param(
        Params._dummy(), "learningOffset",
        "MLlib's online optimizer's learning offset (> 0; accepted and ignored, as optimizer)",
        typeConverter=TypeConverters.toFloat)
    learningDecay: Param[float] = Param(
        Params._dummy(), "learningDecay",
        "MLlib's online optimizer's learning-rate decay (> 0; accepted and ignored, as optimizer)",
        typeConverter=TypeConverters.toFloat)
    subsamplingRate: Param[float] = Param(
        Params._dummy(), "subsamplingRate",
        "MLlib's online optimizer's mini-batch fraction, in (0, 1] (accepted and ignored: every iteration "
        "samples every document)", typeConverter=TypeConverters.toFloat)
    keepLastCheckpoint: Param[bool] = Param(
        Params._dummy(), "keepLastCheckpoint",
        "MLlib's EM optimizer's: keep its last checkpoint (accepted and ignored: pystrads' checkpoints are "
        "its own, dropped when the fit ends)", typeConverter=TypeConverters.toBoolean)

    _mllib_only = {"optimizer": MLlibOnly("collapsed Gibbs sampling (StradsLDA's one inference algorithm)"),
                   **{name: MLlibOnly("collapsed Gibbs sampling (it tunes MLlib's online optimizer)")
                      for name in ("learningOffset", "learningDecay", "subsamplingRate")},
                   "keepLastCheckpoint": MLlibOnly("pystrads' own checkpoints (dropped when the fit ends)")}

    _param_rules = {"optimizer": Rule(lambda v, p: v.lower() in ("online", "em"),
                                      "is not one of 'online', 'em' (MLlib's choices)"),
                    "learningOffset": above(0, finite=True, note="MLlib's range"),
                    "learningDecay": above(0, finite=True, note="MLlib's range"),
                    "subsamplingRate": Rule(lambda v, p: 0 < v <= 1, "must be in (0, 1] (MLlib's range)"),
                    "k": at_least(2, note="LDA needs at least 2 topics"),
                    "docConcentration": [
                        Rule(lambda v, p: all(x > 0 and math.isfinite(x) for x in v),
                             lambda p: f"must be finite numbers > 0 (e.g. [{50.0 / p.getK():.4g}])"),
                        Rule(lambda v, p: len(v) in (1, p.getK()),
                             lambda p: f"must be one value (a symmetric prior, e.g. docConcentration="
                                       f"[{50.0 / p.getK():.4g}]) or {p.getK()} values, one per topic")],
                    "optimizeInterval": at_least(1, note="iterations between two updates of the learned "
                                                         "docConcentration"),
                    "optimizeBurnIn": at_least(0, note="iterations before the first update of the learned "
                                                       "docConcentration"),
                    "topicConcentration": above(0, finite=True, note="e.g. 0.1"),
                    "sampler": one_of("auto", *SAMPLERS),
                    "logLikelihoodEvery": at_least(0, note="0 = never"),
                    "foldInIterations": at_least(2)}
    _column_kinds = {"featuresCol": vector_column("a vector of term counts (as CountVectorizer produces)")}

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(k=10, maxIter=20, checkpointInterval=10, topicDistributionCol="topicDistribution",
                         sampler="auto", logLikelihoodEvery=10, foldInIterations=20, optimizeDocConcentration=True,
                         optimizeTopicConcentration=False, optimizeInterval=10, optimizeBurnIn=OPTIMIZE_BURN_IN,
                         optimizer="online", learningOffset=1024.0, learningDecay=0.51, subsamplingRate=0.05,
                         keepLastCheckpoint=True)

    # -- resolved hyper-parameters
    def _alpha(self) -> np.ndarray:
        """docConcentration as k values (one value given: the symmetric prior)."""
        k = self.getK()
        values = self.getDocConcentration() if self.isDefined(self.docConcentration) else [50.0 / k]
        return np.array(values if len(values) == k else list(values) * k, dtype=np.float64)

    def _beta(self) -> float:
        return float(self.getTopicConcentration()) if self.isDefined(self.topicConcentration) else 0.1


class StradsLDASummary(FitSummary):
    """Training history of a :class:`StradsLDAModel` fit (:class:`~pystrads.ml._summary.FitSummary`).

    ``iterations``: one row per iteration with ``log_likelihood`` (log p(w, z)),
    ``alpha_sum`` / ``alpha_min`` / ``alpha_max`` and ``beta`` where a learned prior was updated,
    ``log_perplexity`` (−log p(w, z) / tokens), ``s_error`` (the STRADS
    supplement's Δt) and ``tokens``, and with ``validationIndicatorCol``
    ``validation_log_perplexity`` (the validation documents scored as
    ``model.logPerplexity`` scores them); ``steps`` adds tokens/s to the time split
    (``compute_s``, ``sync_s``, ``outside_rounds_s``, ``schedule_s``).
    """

    def __init__(self, result, fit):
        super().__init__(result, fit)
        if len(self.steps):
            self.steps["tokens_per_s"] = self.steps["tokens"] / self.steps["step_s"]
        stats = fit.stats
        self.numDocuments = int(stats["docs"])
        self.numEmptyDocuments = int(stats["empty"])  # all-zero vectors: skipped
        self.numNullDocuments = int(stats["null"])  # null vectors: skipped
        self.numTokens = int(stats["tokens"])
        self.numValidationDocuments = int(stats.get("validation_docs", 0))  # held out (validationIndicatorCol)
        self.numValidationTokens = int(stats.get("validation_tokens", 0))
        self.sampler = stats["sampler"]
        self.numWorkers = fit.workers

    @property
    def logLikelihoodHistory(self) -> List[float]:
        return self._history("log_likelihood")

    @property
    def tokensPerSecond(self) -> float:
        """Tokens sampled per second over all steps (Spark job time included)."""
        return float(self.steps["tokens"].sum() / self.steps["step_s"].sum()) if len(self.steps) else 0.0

    @property
    def trainingSeconds(self) -> float:
        return float(self.steps["seconds"].sum()) if len(self.steps) else 0.0

    def plot(self, ax=None):
        """Training log-likelihood per iteration (needs matplotlib: ``pip install 'pystrads[plot]'``)."""
        return self._plot(ax, "log_likelihood", "log p(w, z)", marker=".",
                          title=f"StradsLDA: {self.numTokens} tokens, {self.tokensPerSecond:,.0f} tokens/s")


class StradsLDA(_StradsEstimator, _StradsLDAParams, HasEarlyStopping):
    """Latent Dirichlet Allocation by model-parallel collapsed Gibbs sampling (STRADS LDA).

    Objective: samples the posterior of LDA's topic assignments z (collapsed
    Gibbs: ``p(z = t) ∝ (n_dt + α)(n_wt + β)/(n_t + Vβ)``); the model's topics
    are the word-topic counts of the last sample.  With
    ``optimizeDocConcentration`` the prior α is learned too: an asymmetric α
    re-estimated every ``optimizeInterval`` iterations by Minka's fixed point
    (Wallach, Mimno & McCallum 2009), toward the maximum of p(z | α) at the
    current sample; with ``optimizeTopicConcentration`` the symmetric β too
    (as Mallet's ``optimizeBeta``), from the word-topic counts on the shards.

    Schedule: the vocabulary is cut into ``numWorkers`` blocks of equal token
    mass; in round r worker p samples the tokens of block (p + r) mod U, so
    no two workers touch the same word-topic rows at once and every token is
    sampled once per iteration. The word-topic table lives on parameter-server
    shards on the executors, never on the driver during training.

    Examples
    --------
    >>> from pyspark.ml.feature import CountVectorizer
    >>> from pystrads.ml import StradsLDA
    >>> docs = spark.createDataFrame([(["apple", "pie"],), (["spark", "cluster"],)], ["words"])
    >>> counts = CountVectorizer(inputCol="words", outputCol="features").fit(docs).transform(docs)
    >>> model = StradsLDA(k=2, maxIter=10, seed=1).fit(counts)
    >>> model.describeTopics(3).show()        # doctest: +SKIP
    """

    _fit_columns = ("featuresCol", "validationIndicatorCol")
    _summary_class = StradsLDASummary

    @keyword_only
    def __init__(self, *, featuresCol: str = "features", maxIter: int = 20, seed: Optional[int] = None,
                 checkpointInterval: int = 10, k: int = 10, docConcentration: Optional[List[float]] = None,
                 topicConcentration: Optional[float] = None, topicDistributionCol: str = "topicDistribution",
                 numWorkers: int = 0, sampler: str = "auto", logLikelihoodEvery: int = 10,
                 foldInIterations: int = 20, optimizeDocConcentration: bool = True, optimizeInterval: int = 10,
                 optimizeBurnIn: int = OPTIMIZE_BURN_IN, optimizeTopicConcentration: bool = False,
                 validationIndicatorCol: str = "", validationTol: float = 0.0, earlyStoppingRounds: int = 2,
                 optimizer: str = "online", learningOffset: float = 1024.0, learningDecay: float = 0.51,
                 subsamplingRate: float = 0.05, keepLastCheckpoint: bool = True):
        super().__init__()
        self._set(**self._input_kwargs)

    def _check_params(self) -> None:
        super()._check_params()
        interval, burn_in = self.getOptimizeInterval(), self.getOptimizeBurnIn()
        first_update = max(interval, -(-burn_in // interval) * interval)
        if first_update <= self.getMaxIter():
            return
        for learn, prior in ((self.optimizeDocConcentration, self.docConcentration),
                             (self.optimizeTopicConcentration, self.topicConcentration)):
            if not self.getOrDefault(learn):
                continue
            message = (f"{learn.name}=True but {prior.name} stays fixed: the first update would follow iteration "
                       f"{first_update} (optimizeInterval={interval}, optimizeBurnIn={burn_in}), after "
                       f"maxIter={self.getMaxIter()}; lower optimizeInterval / optimizeBurnIn or raise maxIter")
            if any(self.isSet(p) for p in (learn, self.optimizeInterval, self.optimizeBurnIn)):
                warnings.warn(message, UserWarning, stacklevel=3)  # asked for explicitly
            else:  # the defaults' learned prior on a short fit: said in the log, not raised to every caller
                log.warning("StradsLDA: %s", message)

    def _scan(self, fit: Fit):
        # refuses bad counts and empty corpora
        return _doc_records(fit.dataset, self.getFeaturesCol(), self._validation_col())

    def _program(self, fit: Fit) -> LDAProgram:
        stats, k, alpha, beta = fit.stats, self.getK(), self._alpha(), self._beta()
        vocab, freq = int(next(iter(stats["sizes"]))), stats["freq"]
        sampler = self.getSampler()
        stats["sampler"] = sampler = choose_sampler(k, stats["tokens"] / stats["docs"]) if sampler == "auto" \
            else sampler
        program = LDAProgram(k, vocab, fit.workers, range_bounds(vocab, fit.workers, freq), alpha, beta,
                             self.getMaxIter(), sampler, fit.seed, word_weights=freq.astype(np.float64),
                             log_likelihood_every=self.getLogLikelihoodEvery(),
                             optimize_alpha=self.getOptimizeDocConcentration(),
                             optimize_interval=self.getOptimizeInterval(), optimize_burn_in=self.getOptimizeBurnIn(),
                             max_doc_length=stats["max_length"],
                             optimize_beta=self.getOptimizeTopicConcentration(),
                             early_stopping=self._early_stopping("validation_log_perplexity"),
                             fold_in_iterations=self.getFoldInIterations())
        log.info("StradsLDA: %d documents (%d empty skipped), %d tokens, V=%d, %d workers, %r", stats["docs"],
                 stats["empty"], stats["tokens"], vocab, fit.workers, program)
        return program

    def _engine_args(self, fit: Fit):
        return {"decode_batch": corpus_blocks}  # the documents, made from the vectors in the worker itself

    def _read_model(self, result, fit: Fit) -> "StradsLDAModel":
        # the driver's program holds the learned priors; the counts stay on the executors
        topics = fitted_topics(fit.dataset.sparkSession, result, fit.program.vocab_size, self.getK(), fit.setup.config,
                               word_tokens=fit.program.word_weights)
        return StradsLDAModel(topics, fit.program.alpha, fit.program.beta)


class StradsLDAModel(_StradsModel, _StradsLDAParams):
    """A fitted :class:`StradsLDA` model: word-topic counts and the priors.  MLlib's LDAModel
    setters: ``setFeaturesCol``, ``setTopicDistributionCol`` and ``setSeed`` (of the fold-in
    sampler that ``transform`` runs).

    A fitted or loaded model keeps its word-topic counts as a DataFrame on the executors
    (:mod:`pystrads.ml._lda_model`); only the topic totals and the priors are on the driver.
    """

    _setters = ("featuresCol", "topicDistributionCol", "seed")

    def __init__(self, word_topic=None, alpha=0.0, beta: float = 0.0):
        """``word_topic``: V x K counts (an array, kept on the driver) or a fit's
        :class:`~pystrads.ml._lda_model.WordTopics`; ``alpha``: the document-topic prior, one
        value per topic (a number: symmetric)."""
        super().__init__()
        self._topics = WordTopics.of(word_topic)
        self._alpha_value = alpha_vector(alpha, 1 if word_topic is None else self._topics.k).copy()
        self._beta_value = float(beta)

    @property
    def _topics(self) -> WordTopics:
        self._check_open()
        return self._word_topics

    @_topics.setter
    def _topics(self, topics: WordTopics) -> None:
        self._word_topics = topics

    def _kept_frames(self) -> list:
        topics = getattr(self, "_word_topics", None)
        return [topics.frame] if topics is not None and topics.frame is not None else []

    def _forget_frames(self) -> None:
        self._word_topics = None

    def _repr_fields(self):
        return {"k": self._word_topics.k, "numFeatures": self._word_topics.vocab_size}

    # -- MLlib LDAModel API
    def vocabSize(self) -> int:
        return self._topics.vocab_size

    def isDistributed(self) -> bool:
        return False  # MLlib's LocalLDAModel API: no training-corpus methods (topicDistributions, ...)

    def toLocal(self) -> "StradsLDAModel":
        """A copy of this model (MLlib's ``DistributedLDAModel.toLocal``, kept so that code written for
        MLlib's EM optimizer runs: a StradsLDAModel is already a local model)."""
        return self.copy()

    def estimatedDocConcentration(self) -> DenseVector:
        """The document-topic prior the model uses: learned (optimizeDocConcentration) or as given."""
        return DenseVector(self._alpha_value.copy())

    def estimatedTopicConcentration(self) -> float:
        """The topic-word prior β the model uses: learned (optimizeTopicConcentration) or as given."""
        return self._beta_value

    def topicsMatrix(self) -> DenseMatrix:
        """vocabSize x k word-topic **counts** (they sum to the training tokens).

        Collected onto the driver (MLlib's local matrix): a large model needs
        vocabSize * k * 12 bytes of driver memory there, and warns; prefer
        :meth:`describeTopics`, which keeps only the top terms.
        """
        return topics_matrix(self._topics, SparkSession.active())

    def describeTopics(self, maxTermsPerTopic: int = 10):
        """DataFrame(topic, termIndices, termWeights): each topic's top terms by p(term | topic)."""
        return describe(self._topics, self._beta_value, maxTermsPerTopic, SparkSession.active())

    # -- inference (:class:`pystrads.ml._lda_model.FoldIn`)
    def _fold_in(self, dataset) -> FoldIn:
        self._check_columns(dataset, "featuresCol")
        return FoldIn(self._topics, self._beta_value, self._alpha_value, self.getFoldInIterations(), self.getSeed())

    def _transform(self, dataset):
        return self._fold_in(dataset).mixtures(dataset, self.getFeaturesCol(), self.getTopicDistributionCol())

    def logLikelihood(self, dataset) -> float:
        """log p(documents | topics) with each document's topic mixture from Gibbs
        fold-in (topics fixed): Σ_tokens log Σ_t θ_dt φ_tw."""
        return float(self._fold_in(dataset).score(dataset, self.getFeaturesCol())[0])

    def logPerplexity(self, dataset) -> float:
        """−logLikelihood(dataset) / number of tokens (lower is better)."""
        ll, tokens = self._fold_in(dataset).score(dataset, self.getFeaturesCol())
        return float(-ll / tokens) if tokens else float("nan")

    # -- persistence: one row per term that has tokens in data/, written and read by the executors
    def _save_data(self, write) -> dict:
        return save_topics(write, self._topics, self._alpha_value, self._beta_value, SparkSession.active())

    @classmethod
    def _load_data(cls, read, metadata) -> "StradsLDAModel":
        return cls(*load_topics(read, metadata))
