"""StradsLDAModel without V x K on the driver: the word-topic counts stay a DataFrame on
the executors; describeTopics, transform, logLikelihood and save / load give what the driver-side
model gave, and the Python driver's allocations stay far below the model's size."""

import os
import tempfile
import tracemalloc

import numpy as np
import pytest
from pyspark.ml.linalg import Vectors

from pystrads import config
from pystrads.ml import StradsLDA, StradsLDAModel
from pystrads.ml._lda_model import WordTopics


def reference_topics(word_topic, beta, n):
    """describeTopics as the driver-side model computed it: a stable sort of each column of phi."""
    wt = word_topic.astype(np.float64)
    phi = (wt + beta) / (wt.sum(axis=0) + wt.shape[0] * beta)
    out = []
    for t in range(wt.shape[1]):
        top = np.argsort(-phi[:, t], kind="stable")[:min(n, wt.shape[0])]
        out.append((t, top.tolist(), [float(phi[i, t]) for i in top]))
    return out


def test_describe_topics_is_the_driver_side_sort_with_its_ties_and_zero_counts(spark):
    rng = np.random.default_rng(5)
    wt = rng.integers(0, 4, size=(300, 5)).astype(np.int32)  # many ties, many zeros
    wt[:, 3] = 0
    wt[[7, 250, 11], 3] = [2, 2, 1]  # topic 3: three terms with tokens, the others tied at zero
    wt[100:140] = 0  # terms without any token (not in the model's rows at all)
    model = StradsLDAModel(wt, 0.5, 0.07)
    frame = model._topics.rows_frame(spark).repartition(4)  # candidates from several partitions
    model._topics = WordTopics(frame, wt.sum(axis=0, dtype=np.int64), 300)
    for n in (1, 6, 300, 400):
        got = [(r.topic, r.termIndices, r.termWeights) for r in model.describeTopics(n).orderBy("topic").collect()]
        assert got == reference_topics(wt, 0.07, n), n
    assert model.describeTopics(6).collect()[3].termIndices == [7, 250, 11, 0, 1, 2]


def _zipf_documents(spark, vocab, docs, length, seed=0, used=None):
    """Zipf-distributed words among the first ``used`` (default all) of ``vocab``, plus one empty document."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, (used or vocab) + 1) ** 0.9
    rows = []
    for d in range(docs):
        idx, cnt = np.unique(rng.choice(used or vocab, size=length, p=p / p.sum()), return_counts=True)
        rows.append((d, Vectors.sparse(vocab, idx.tolist(), cnt.astype(float).tolist())))
    return spark.createDataFrame(rows + [(docs, Vectors.sparse(vocab, [], []))], ["id", "features"]).repartition(2)


@pytest.mark.slow
def test_the_joined_fold_in_equals_the_fold_in_with_phi_shipped(spark, monkeypatch):
    """The same fitted model applied both ways gives the same topic mixtures bit for bit and the
    same log-likelihood: each task then gets only the model rows its documents use (new documents
    with words the training never saw included)."""
    train = _zipf_documents(spark, 400, 120, 30, used=300)
    default = config.DEFAULTS["lda.localModelBytes"]
    monkeypatch.setitem(config.DEFAULTS, "lda.localModelBytes", 0)  # as a large model: rows left on the executors
    model = StradsLDA(k=3, maxIter=5, seed=4, numWorkers=2).fit(train)
    monkeypatch.setitem(config.DEFAULTS, "lda.localModelBytes", default)
    df = _zipf_documents(spark, 400, 120, 30, seed=1).cache()
    assert model._topics.dense is None and model._topics.frame is not None  # the fit left the counts on the executors
    rows = model._topics.frame.count()
    counts = model.topicsMatrix().toArray()
    assert 0 < rows <= 300 and rows == int(counts.any(axis=1).sum())
    assert model._topics.topic_totals.tolist() == counts.sum(axis=0).tolist()  # n_t read from the shards
    local = StradsLDA(k=3, maxIter=5, seed=4, numWorkers=2).fit(train)  # small: read onto the driver, no frame
    assert local._topics.frame is None and np.array_equal(local._topics.dense, counts)
    assert local._topics.topic_totals.tolist() == counts.sum(axis=0).tolist()

    def results(m):
        out = m.transform(df).select("id", "topicDistribution").collect()
        theta = {r.id: r.topicDistribution.toArray() for r in out}
        return theta, m.logLikelihood(df), m.logPerplexity(df)

    shipped = results(model)
    assert model._topics.dense is not None  # a small model: collected once, kept
    joined_model = model.copy()
    joined_model._topics = WordTopics(model._topics.frame, model._topics.topic_totals, model.vocabSize())
    monkeypatch.setitem(config.DEFAULTS, "lda.localModelBytes", 0)
    joined = results(joined_model)
    assert joined_model._topics.dense is None
    assert shipped[0].keys() == joined[0].keys() and len(shipped[0]) == 121
    for i in shipped[0]:
        np.testing.assert_array_equal(shipped[0][i], joined[0][i])
    assert shipped[0][120].tolist() == [0.0, 0.0, 0.0]  # the empty document
    assert shipped[1:] == joined[1:] and shipped[1] < 0
    # a bucket folds its documents in runs of at most FOLD_PHI_BYTES of φ rows: runs of one to
    # three documents (40 words' rows) give the very same mixtures and scores
    from pystrads.ml import _lda_data

    monkeypatch.setattr(_lda_data, "FOLD_PHI_BYTES", 40 * 3 * 8)
    in_runs = results(joined_model)
    for i in shipped[0]:
        np.testing.assert_array_equal(shipped[0][i], in_runs[0][i])
    assert in_runs[1:] == joined[1:]

    # the fit's rows hold each term's non-zero counts only; the rows of models saved by earlier
    # versions (each term's K counts) give the very same results on every path
    assert model._topics.frame.columns == ["term", "topics", "counts"]
    entries = model._topics.frame.orderBy("term").collect()
    assert all(len(r.topics) == len(r.counts) and all(c > 0 for c in r.counts) and r.topics == sorted(r.topics)
               for r in entries)
    assert sum(len(r.topics) for r in entries) == int(np.count_nonzero(counts))
    from pystrads.ml._lda_model import COUNTS_SCHEMA

    old_rows = spark.createDataFrame([(int(i), counts[i].astype(int).tolist()) for i in np.flatnonzero(counts.any(axis=1))],
                                     COUNTS_SCHEMA).repartition(3)
    old_model = model.copy()
    old_model._topics = WordTopics.from_frame(old_rows, model.vocabSize(), 3)
    assert old_model._topics.topic_totals.tolist() == model._topics.topic_totals.tolist()
    old = results(old_model)  # the joined path (localModelBytes 0)
    for i in shipped[0]:
        np.testing.assert_array_equal(shipped[0][i], old[0][i])
    assert old[1:] == joined[1:]
    assert [r.termIndices for r in old_model.describeTopics(4).collect()] == \
        [r.termIndices for r in model.describeTopics(4).collect()]
    np.testing.assert_array_equal(old_model.topicsMatrix().toArray(), counts)


def _apply_all(df, k, path, **params):
    """Fit, describe, transform, score, save, load and transform again; what each gave."""
    model = StradsLDA(k=k, maxIter=2, seed=1, numWorkers=2, optimizeDocConcentration=False, **params).fit(df)
    top = model.describeTopics(5).collect()
    theta = model.transform(df).select("id", "topicDistribution").collect()
    perplexity = model.logPerplexity(df)
    model.write().overwrite().save(path)
    loaded = StradsLDAModel.load(path)
    again = loaded.transform(df).select("id", "topicDistribution").collect()
    return model, loaded, top, theta, perplexity, again, loaded.describeTopics(5).collect()


@pytest.mark.slow  # a model too big for the driver: ~16 s
@pytest.mark.timeout(300)
def test_the_driver_never_holds_the_model(spark, monkeypatch):
    """A 60,000 x 150 model (34 MiB as int32): fit, describe, transform, score, save, load and
    transform again while the Python driver's traced allocations (numpy's included) peak far
    below the model.  A tiny model goes through the same calls first, so that one-off imports
    (about 20 MiB of module objects) are not counted."""
    vocab, k = 60_000, 150
    model_bytes = vocab * k * 4
    monkeypatch.setitem(config.DEFAULTS, "lda.localModelBytes", model_bytes // 2)  # the join, as for big models
    tmp = tempfile.mkdtemp()
    _apply_all(_zipf_documents(spark, 50, 20, 10), 2, os.path.join(tmp, "warm"), logLikelihoodEvery=1)
    df = _zipf_documents(spark, vocab, 400, 200, seed=1).cache()
    df.count()
    tracemalloc.start()
    try:
        model, loaded, top, theta, perplexity, again, loaded_top = _apply_all(df, k, os.path.join(tmp, "big"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(f"driver peak {peak / 2**20:.2f} MiB, model {model_bytes / 2**20:.1f} MiB")
    assert len(top) == k and all(len(r.termIndices) == 5 for r in top)
    assert len(theta) == 401 and perplexity > 0
    assert loaded.vocabSize() == vocab and list(loaded._topics.topic_totals) == list(model._topics.topic_totals)
    assert model._topics.topic_totals.sum() == model.summary.numTokens
    assert dict((r.id, r.topicDistribution) for r in again) == dict((r.id, r.topicDistribution) for r in theta)
    assert [r.termIndices for r in loaded_top] == [r.termIndices for r in top]
    # the driver-side model held V x K int32, then V x K doubles for describeTopics: ~200 MiB here
    assert peak < 0.15 * model_bytes, f"driver peak {peak / 2**20:.1f} MiB for a {model_bytes / 2**20:.0f} MiB model"
