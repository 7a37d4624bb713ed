"""StradsLDA / StradsLDAModel: the MLlib LDA surface, pipelines, persistence, bad input."""

import os
import tempfile

import numpy as np
import pytest
from pyspark.sql import functions as F
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.feature import CountVectorizer, RegexTokenizer, StopWordsRemover
from pyspark.ml.linalg import Vectors, VectorUDT
from pyspark.sql.types import StructField, StructType

from pystrads.errors import ConfigurationError, InputError
from pystrads.ml import StradsLDA, StradsLDAModel

COMPUTING = ("spark cluster executors driver tasks stages partitions shuffle scheduler memory cores jobs "
             "broadcast network nodes").split()
BAKING = "apple pie cinnamon sugar oven bread flour water salt butter cake sweet dough yeast honey".split()


def _texts(n=120, seed=0):
    """Documents each drawn from one of two disjoint vocabularies, plus one empty document."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        theme = COMPUTING if i % 2 == 0 else BAKING
        out.append(" ".join(rng.choice(theme, size=12)))
    return out + [""]


TEXTS = _texts()


@pytest.fixture(scope="module")
def text_df(spark):
    return spark.createDataFrame([(i, t) for i, t in enumerate(TEXTS)], ["id", "text"]).repartition(2)


def pipeline(**lda):
    return Pipeline(stages=[
        RegexTokenizer(inputCol="text", outputCol="tokens", pattern="\\W+"),
        StopWordsRemover(inputCol="tokens", outputCol="words"),
        CountVectorizer(inputCol="words", outputCol="features"),
        StradsLDA(**dict(dict(k=2, maxIter=30, seed=7, docConcentration=[0.3], topicConcentration=0.05), **lda))])


@pytest.fixture(scope="module")
def fitted(text_df):
    return pipeline().fit(text_df)


def test_fit_gives_mllib_shaped_model_with_exact_counts(fitted, text_df):
    model, cv = fitted.stages[-1], fitted.stages[-2]
    vectors = cv.transform(fitted.stages[1].transform(fitted.stages[0].transform(text_df)))
    tokens = sum(int(v.values.sum()) for (v,) in vectors.select("features").collect())
    assert model.vocabSize() == len(cv.vocabulary)
    matrix = model.topicsMatrix()
    assert (matrix.numRows, matrix.numCols) == (len(cv.vocabulary), 2)
    assert matrix.toArray().sum() == tokens
    assert model.summary.numTokens == tokens and model.summary.numEmptyDocuments == 1
    assert model.summary.totalIterations == 30
    # the default log-likelihood: every 10th iteration and the last
    lls = model.summary.iterations.dropna(subset=["log_likelihood"])
    assert lls["iteration"].tolist() == [10, 20, 30] and len(model.summary.logLikelihoodHistory) == 3
    assert not model.isDistributed()
    # the default learns the prior (updates after iterations 10, 20, 30), starting from docConcentration
    alpha = model.estimatedDocConcentration().toArray()
    assert alpha.shape == (2,) and np.all(alpha > 0) and not np.allclose(alpha, 0.3)
    assert StradsLDA(k=4)._alpha().tolist() == [12.5] * 4 and StradsLDA()._beta() == 0.1  # defaults: 50 / k, 0.1
    assert StradsLDA().getOptimizeDocConcentration() and StradsLDA().getOptimizeInterval() == 10


def test_topics_separate_the_two_themes(fitted):
    model, vocab = fitted.stages[-1], fitted.stages[-2].vocabulary
    topics = model.describeTopics(4).collect()
    assert [r.topic for r in topics] == [0, 1]
    assert [f.name for f in model.describeTopics(4).schema.fields] == ["topic", "termIndices", "termWeights"]
    words = [{vocab[i] for i in r.termIndices} for r in topics]
    computing, baking = set(COMPUTING), set(BAKING)
    assert any(w <= computing for w in words) and any(w <= baking for w in words), words
    for r in topics:
        assert r.termWeights == sorted(r.termWeights, reverse=True)


def test_transform_adds_topic_distribution_and_empty_docs_get_zeros(fitted, text_df):
    out = fitted.transform(text_df)
    assert isinstance(out.schema["topicDistribution"].dataType, VectorUDT)
    rows = {r.id: r.topicDistribution.toArray() for r in out.select("id", "topicDistribution").collect()}
    assert len(rows) == len(TEXTS)
    empty = len(TEXTS) - 1
    assert rows[empty].tolist() == [0.0, 0.0]
    for i, theta in rows.items():
        if i != empty:
            assert theta.sum() == pytest.approx(1.0)
    # documents of the same theme lean the same way (even ids: computing, odd: baking)
    leaning = {i: int(np.argmax(theta)) for i, theta in rows.items() if i != empty}
    assert {leaning[i] for i in leaning if i % 2 == 0} != {leaning[i] for i in leaning if i % 2 == 1}
    assert len({leaning[i] for i in leaning if i % 2 == 0}) == 1


def test_transform_of_a_document_does_not_depend_on_the_partitioning(spark):
    """Each document's fold-in draws from its own stream (seed and content): the same rows
    partitioned and ordered otherwise get identical topic distributions; another seed differs.
    (Overlapping topics, so that the fold-in really is random.)"""
    rng = np.random.default_rng(3)
    model = StradsLDAModel(rng.integers(1, 20, size=(30, 4)), 0.5, 0.1).setSeed(7)
    docs = []
    for i in range(60):
        idx, cnt = np.unique(rng.integers(0, 30, size=20), return_counts=True)
        docs.append((i, Vectors.sparse(30, idx.tolist(), cnt.astype(float).tolist())))
    vectors = spark.createDataFrame(docs, ["id", "features"]).cache()

    def theta(df, m=model):
        return {r.id: r.topicDistribution.toArray() for r in m.transform(df).select("id", "topicDistribution").collect()}

    base = theta(vectors.coalesce(1))
    other = theta(vectors.repartition(3, "id").sortWithinPartitions(F.desc("id")))
    assert base.keys() == other.keys() and len(base) == len(docs)
    for i in base:
        np.testing.assert_array_equal(base[i], other[i])
    reseeded = theta(vectors, model.copy().setSeed(12345))
    assert sum(not np.array_equal(base[i], reseeded[i]) for i in base) >= len(base) // 2


def test_log_perplexity_is_better_than_uniform(fitted, text_df):
    model = fitted.stages[-1]
    vectors = PipelineModel(fitted.stages[:-1]).transform(text_df)
    perplexity = model.logPerplexity(vectors)
    assert 0 < perplexity < np.log(model.vocabSize())
    assert model.logLikelihood(vectors) < 0


def test_pipeline_model_saves_and_loads(fitted, text_df):
    path = os.path.join(tempfile.mkdtemp(), "lda_pipeline")
    fitted.write().overwrite().save(path)
    loaded = PipelineModel.load(path)
    a, b = fitted.stages[-1], loaded.stages[-1]
    assert isinstance(b, StradsLDAModel)
    assert np.array_equal(a.topicsMatrix().toArray(), b.topicsMatrix().toArray())
    assert b.getK() == 2 and b.getMaxIter() == 30 and b.uid == a.uid
    assert not b.hasSummary
    got = loaded.transform(text_df).select("topicDistribution").collect()
    assert len(got) == len(TEXTS)
    est_path = os.path.join(tempfile.mkdtemp(), "lda_estimator")
    StradsLDA(k=3, maxIter=5, sampler="sparse").save(est_path)
    est = StradsLDA.load(est_path)
    assert (est.getK(), est.getMaxIter(), est.getSampler()) == (3, 5, "sparse")


def test_one_and_two_workers_learn_models_of_similar_quality(text_df):
    perplexities = []
    for workers in (1, 2):
        m = pipeline(numWorkers=workers, maxIter=40).fit(text_df)
        vectors = PipelineModel(m.stages[:-1]).transform(text_df)
        perplexities.append(m.stages[-1].logPerplexity(vectors))
    assert abs(perplexities[0] - perplexities[1]) < 0.05 * perplexities[0], perplexities


def vectors_df(spark, rows, size=4):
    schema = StructType([StructField("features", VectorUDT())])
    return spark.createDataFrame([(v,) for v in rows], schema)


@pytest.mark.parametrize("params, message", [
    ({"k": 1}, r"k=1 must be >= 2 \(LDA needs at least 2 topics\)"),
    ({"maxIter": -1}, r"maxIter=-1 must be >= 0"),
    ({"docConcentration": [0.1, 0.2]}, r"docConcentration=\[0.1, 0.2\] must be one value .* or 10 values, one per topic"),
    ({"docConcentration": [-1.0]}, r"docConcentration=\[-1.0\] must be finite numbers > 0"),
    ({"k": 3, "docConcentration": [0.1, float("nan"), 0.3]}, r"docConcentration=\[0.1, nan, 0.3\] must be finite numbers > 0"),
    ({"optimizeDocConcentration": True, "optimizeInterval": 0}, r"optimizeInterval=0 must be >= 1"),
    ({"optimizeBurnIn": -1}, r"optimizeBurnIn=-1 must be >= 0"),
    ({"topicConcentration": 0.0}, r"topicConcentration=0.0 must be"),
    ({"sampler": "magic"}, r"sampler='magic' is not one of"),
    ({"numWorkers": 5}, r"numWorkers=5 needs 5 task slots"),
])
def test_bad_params_are_refused_with_the_fix_before_any_job(spark, params, message):
    df = vectors_df(spark, [Vectors.sparse(4, [0, 1], [1.0, 2.0])] * 4)
    sc = spark.sparkContext
    group = f"bad-params-{sorted(params)[0]}"
    sc.setJobGroup(group, "validation must not start jobs")
    try:
        with pytest.raises(ConfigurationError, match=message):
            StradsLDA(**params).fit(df)
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    assert list(sc.statusTracker().getJobIdsForGroup(group)) == []


def test_bad_input_is_refused_naming_the_column_and_value(spark):
    good = Vectors.sparse(4, [0, 1], [1.0, 2.0])
    with pytest.raises(InputError, match=r"featuresCol 'nope' is not a column"):
        StradsLDA(featuresCol="nope").fit(vectors_df(spark, [good]))
    strings = spark.createDataFrame([("a",)], ["features"])
    with pytest.raises(InputError, match=r"has type string; expected a vector"):
        StradsLDA().fit(strings)
    with pytest.raises(InputError, match=r"count -1.0 for term 1"):
        StradsLDA().fit(vectors_df(spark, [good, Vectors.sparse(4, [1], [-1.0])]))
    with pytest.raises(InputError, match=r"count 0.5 for term 2"):
        StradsLDA().fit(vectors_df(spark, [good, Vectors.sparse(4, [2], [0.5])]))
    with pytest.raises(InputError, match=r"count nan"):
        StradsLDA().fit(vectors_df(spark, [good, Vectors.dense([0.0, float("nan"), 0.0, 1.0])]))
    with pytest.raises(InputError, match=r"different sizes \[4, 5\]"):
        StradsLDA().fit(vectors_df(spark, [good, Vectors.sparse(5, [0], [1.0])]))
    with pytest.raises(InputError, match=r"no document has any term"):
        StradsLDA().fit(vectors_df(spark, [Vectors.sparse(4, [], [])] * 3))
    with pytest.raises(InputError, match=r"the input has no rows"):
        StradsLDA().fit(vectors_df(spark, [good]).limit(0))
    with pytest.raises(InputError, match=r"count inf for term 1"):
        StradsLDA().fit(vectors_df(spark, [good, Vectors.dense([0.0, float("inf"), 0.0, 1.0])]))


# --------------------------------------------------------------------------
# learned docConcentration (optimizeDocConcentration)
# --------------------------------------------------------------------------


def skewed_vectors(spark, n_docs=300, seed=4):
    """Documents of three disjoint 10-word topics whose mixtures come from Dir([0.05, 0.2, 1.5])."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n_docs):
        z = rng.choice(3, size=30, p=rng.dirichlet([0.05, 0.2, 1.5]))
        idx, cnt = np.unique(10 * z + rng.integers(0, 10, size=30), return_counts=True)
        rows.append((i, Vectors.sparse(30, idx.tolist(), cnt.astype(float).tolist())))
    return spark.createDataFrame(rows, ["id", "features"]).repartition(2)


def test_optimize_doc_concentration_learns_an_asymmetric_prior_the_model_uses(spark):
    df = skewed_vectors(spark)
    fixed = StradsLDA(k=3, maxIter=40, seed=2, docConcentration=[0.5], topicConcentration=0.05,
                      optimizeDocConcentration=False).fit(df)
    learned = StradsLDA(k=3, maxIter=40, seed=2, docConcentration=[0.5], topicConcentration=0.05,
                        optimizeDocConcentration=True, optimizeInterval=5).fit(df)
    assert fixed.estimatedDocConcentration().toArray().tolist() == [0.5] * 3
    alpha = np.sort(learned.estimatedDocConcentration().toArray())
    # measured [0.05 0.2 1.3]-like: the symmetric start is gone, the order of magnitude is the truth's
    assert alpha[-1] / alpha[0] > 5 and alpha[0] < 0.2 and alpha[-1] > 0.6, alpha
    assert "alpha_sum" in learned.summary.iterations
    # the learned prior fits the documents better than the fixed one
    assert learned.logPerplexity(df) < fixed.logPerplexity(df)


def test_optimize_topic_concentration_learns_beta_the_model_uses_and_saves(spark, tmp_path):
    df = skewed_vectors(spark)
    learned = StradsLDA(k=3, maxIter=20, seed=2, topicConcentration=0.5, optimizeTopicConcentration=True,
                        optimizeInterval=5).fit(df)
    history = learned.summary.iterations.dropna(subset=["beta"])
    assert history["iteration"].tolist() == [5, 10, 15, 20]
    beta = learned.estimatedTopicConcentration()
    assert beta == history["beta"].iloc[-1] and beta < 0.5  # the start was far too flat
    assert learned.getTopicConcentration() == 0.5  # the param stays as given, as MLlib's
    # the model's topics and scoring use the learned beta
    counts = learned.topicsMatrix().toArray()
    phi = (counts + beta) / (counts.sum(axis=0) + counts.shape[0] * beta)
    top = learned.describeTopics(30).orderBy("topic").first()
    np.testing.assert_allclose(sorted(top.termWeights, reverse=True), np.sort(phi[:, 0])[::-1], rtol=1e-6)
    learned.write().save(str(tmp_path / "m"))
    assert StradsLDAModel.load(str(tmp_path / "m")).estimatedTopicConcentration() == beta
    assert StradsLDA().getOptimizeTopicConcentration() is False
    with pytest.warns(UserWarning, match="optimizeTopicConcentration=True but topicConcentration stays fixed"):
        StradsLDA(k=3, maxIter=3, optimizeTopicConcentration=True, optimizeDocConcentration=False).fit(df)


def test_transform_and_perplexity_use_the_prior_per_topic(spark):
    rng = np.random.default_rng(8)
    word_topic = rng.integers(1, 20, size=(30, 3))
    short = spark.createDataFrame([(0, Vectors.sparse(30, [1, 2], [1.0, 1.0]))], ["id", "features"])
    theta = {}
    for name, alpha in [("symmetric", 1.0), ("skewed", [20.0, 0.05, 0.05])]:
        model = StradsLDAModel(word_topic, alpha, 0.1).setSeed(1)
        theta[name] = model.transform(short).first().topicDistribution.toArray()
        assert theta[name].sum() == pytest.approx(1.0)
    # two tokens cannot outweigh a prior of 20 on topic 0 (symmetric: about a third each)
    assert theta["skewed"][0] > 0.85 > theta["symmetric"][0]
    skewed = StradsLDAModel(word_topic, [20.0, 0.05, 0.05], 0.1)
    assert skewed.logPerplexity(short) != StradsLDAModel(word_topic, 1.0, 0.1).logPerplexity(short)


def test_the_prior_per_topic_saves_and_loads_and_old_scalar_models_load(spark):
    rng = np.random.default_rng(9)
    model = StradsLDAModel(rng.integers(0, 9, size=(12, 3)), [0.3, 1.7, 0.02], 0.2)
    model.setSeed(3)
    path = os.path.join(tempfile.mkdtemp(), "lda_model")
    model.write().overwrite().save(path)
    loaded = StradsLDAModel.load(path)
    assert loaded.estimatedDocConcentration().toArray().tolist() == [0.3, 1.7, 0.02]
    docs = vectors_df(spark, [Vectors.sparse(12, [0, 5], [2.0, 1.0])], size=12)
    assert model.logPerplexity(docs) == loaded.logPerplexity(docs)
    # a model saved before the per-topic prior has one alpha in its metadata (25.0, k = 2): the symmetric prior
    old = StradsLDAModel.load(os.path.join(os.path.dirname(__file__), "data", "saved_models", "lda"))
    assert old.estimatedDocConcentration().toArray().tolist() == [25.0, 25.0]


def test_a_learned_prior_that_would_never_update_is_warned_about(caplog):
    with pytest.warns(UserWarning, match=r"first update would follow iteration 10 .* after maxIter=5"):
        StradsLDA(optimizeDocConcentration=True, maxIter=5)._check_params()
    with pytest.warns(UserWarning, match=r"iteration 60 \(optimizeInterval=20, optimizeBurnIn=50\)"):
        StradsLDA(optimizeDocConcentration=True, maxIter=50, optimizeInterval=20, optimizeBurnIn=50)._check_params()
    import warnings

    with warnings.catch_warnings(), caplog.at_level("WARNING", logger="pystrads.ml.lda"):
        warnings.simplefilter("error")
        StradsLDA(optimizeDocConcentration=True, maxIter=60, optimizeInterval=20, optimizeBurnIn=50)._check_params()
        StradsLDA(optimizeDocConcentration=False, maxIter=5)._check_params()  # a fixed prior
        assert "stays fixed" not in caplog.text
        # the default learned prior on a short fit: not asked for, so a log line rather than a warning
        StradsLDA(maxIter=5)._check_params()
        assert "StradsLDA: optimizeDocConcentration=True but docConcentration stays fixed" in caplog.text
        assert "after maxIter=5" in caplog.text
    with pytest.warns(UserWarning, match=r"after maxIter=5"):  # asked for through its interval
        StradsLDA(optimizeInterval=7, maxIter=5)._check_params()


def test_the_prior_is_learned_by_default_as_mllib_online_and_tomotopy():
    assert StradsLDA().getOptimizeDocConcentration() is True
    assert StradsLDAModel().getOptimizeDocConcentration() is True


@pytest.fixture(scope="module")
def debian_split(spark):
    """The bundled Debian sample as term counts, with a fixed 15 % of its documents marked for validation."""
    from pystrads.datasets import load_debian_sample

    words = StopWordsRemover(inputCol="tokens", outputCol="words").transform(
        RegexTokenizer(inputCol="text", outputCol="tokens", pattern="[^a-z]+", minTokenLength=3)
        .transform(load_debian_sample(spark)))
    counts = CountVectorizer(inputCol="words", outputCol="features", minDF=3).fit(words).transform(words)
    return counts.select("features", (F.rand(7) < 0.15).alias("validation")).cache()


def _tokens(df) -> int:
    return int(sum(v.values.sum() for (v,) in df.select("features").collect()))


def test_early_stopping_on_the_held_out_perplexity(debian_split):
    """The validation documents are never sampled into the counts; after every iteration they are
    scored exactly as the fitted model's logPerplexity scores them; with earlyStoppingRounds=2 the
    fit follows the same chain and ends 2 iterations after the best held-out perplexity."""
    from pystrads.engine.program.stopping import EarlyStopping

    heldout = debian_split.filter("validation")
    est = StradsLDA(k=20, maxIter=40, seed=3, optimizeDocConcentration=False, validationIndicatorCol="validation",
                    numWorkers=2)  # the chain of two workers, whose held-out curve flattens inside the run
    model = est.copy({est.earlyStoppingRounds: 0}).fit(debian_split)
    full = model.summary
    curve = full.validationHistory
    assert len(curve) == full.totalIterations == 40 and not full.stoppedEarly
    assert curve[-1] == pytest.approx(model.logPerplexity(heldout), rel=1e-9)
    assert curve[-1] < curve[0] - 0.1  # the topics learn: the held-out perplexity falls
    assert model.topicsMatrix().toArray().sum() == full.numTokens == _tokens(debian_split.filter(~F.col("validation")))
    assert full.numValidationTokens == _tokens(heldout) > 0

    replay = EarlyStopping("validation_log_perplexity", 2)
    stop = next((i for i, v in enumerate(curve, 1) if replay.update(i, v)), None)
    assert stop is not None and stop < 40, curve  # the curve flattens into noise inside the run
    stopped = est.fit(debian_split).summary
    assert stopped.stoppedEarly and stopped.totalIterations == stop and stopped.bestIteration == stop - 2
    assert stopped.validationHistory == pytest.approx(curve[:stop], rel=1e-12)


def test_a_lone_worker_scores_its_validation_documents_against_the_committed_counts(debian_split):
    """One worker holds its rows between the rounds of a step: at every validation round it still
    writes them first.  Without a stop rule a step runs several iterations; with one (that never
    fires here) a step per iteration: the same chain, so the same scores."""
    est = StradsLDA(k=8, maxIter=4, seed=1, numWorkers=1, optimizeDocConcentration=False,
                    validationIndicatorCol="validation", earlyStoppingRounds=0)
    model = est.fit(debian_split)
    held = model.summary.validationHistory
    assert held[-1] == pytest.approx(model.logPerplexity(debian_split.filter("validation")), rel=1e-9)
    assert len(model.summary.steps) < 4  # steps of several iterations
    stepwise = est.copy({est.earlyStoppingRounds: 100}).fit(debian_split).summary
    assert len(stepwise.steps) == 4 and stepwise.validationHistory == pytest.approx(held, rel=1e-12)


def test_every_document_marked_for_validation_is_refused(debian_split):
    with pytest.raises(InputError, match=r"every non-empty document \(\d+\) is marked for validation"):
        StradsLDA(k=2, validationIndicatorCol="validation").fit(debian_split.filter("validation"))


def test_the_fit_input_has_no_python_operator_and_its_blocks_are_the_documents(spark):
    """StradsLDA hands the engine a frame of JVM operators only -- the documents are made from the
    vectors in the fit's own workers (``corpus_blocks``) -- so each barrier task runs one Python
    worker; the blocks hold every non-empty document once, with its digest key and terms."""
    from pystrads.ml._lda_data import _doc_records, corpus_blocks

    rows = [(Vectors.sparse(6, [0, 3], [2.0, 1.0]),), (Vectors.sparse(6, [], []),),
            (Vectors.dense([0, 1, 0, 0, 0, 4]),), (Vectors.sparse(6, [0, 3], [2.0, 1.0]),)]
    df = spark.createDataFrame(rows, ["features"])
    frame, stats = _doc_records(df, "features")
    plan = frame._jdf.queryExecution().executedPlan().toString()
    assert "MapInArrow" not in plan and "Python" not in plan, plan
    assert (stats["docs"], stats["empty"], stats["tokens"]) == (3, 1, 11)
    (batch,) = frame.coalesce(1).toArrow().combine_chunks().to_batches()
    (block,) = corpus_blocks(batch)
    assert len(block.docs) == 3 and block.docs[0] == block.docs[2] != block.docs[1]  # equal documents, equal keys
    assert block.lengths.tolist() == [2, 2, 2]
    assert block.terms.tolist() == [0, 3, 1, 5, 0, 3] and block.counts.tolist() == [2, 1, 1, 4, 2, 1]
