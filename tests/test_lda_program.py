"""The LDA program on the runtime (local[2]): count invariants, learning, failures."""

import os
import sys
import tempfile

import numpy as np
import pytest
from pyspark import cloudpickle

from pystrads.engine import Engine
from pystrads.kernels import lda as K
from pystrads.programs.lda import LDAProgram
from pystrads.ps.partition import range_bounds

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def synthetic_corpus(n_docs=300, vocab=400, topics=5, doc_len=60, seed=0):
    """Documents drawn from a true LDA model with well separated topics."""
    rng = np.random.default_rng(seed)
    phi = rng.dirichlet(np.full(vocab, 0.05), size=topics)
    docs = []
    for d in range(n_docs):
        theta = rng.dirichlet(np.full(topics, 0.2))
        z = rng.choice(topics, size=doc_len, p=theta)
        words = np.array([rng.choice(vocab, p=phi[t]) for t in z])
        uniq, counts = np.unique(words, return_counts=True)
        docs.append((d, uniq, counts))
    return docs, phi


def make_program(docs, vocab, workers, iterations, cls=LDAProgram, **kw):
    weights = np.zeros(vocab)
    for _, w, c in docs:
        np.add.at(weights, w, c)
    bounds = range_bounds(vocab, workers, weights)
    return cls(num_topics=5, vocab_size=vocab, num_workers=workers, block_bounds=bounds, alpha=0.5, beta=0.1,
               max_iterations=iterations, sampler=kw.pop("sampler", "fplus"), seed=3, word_weights=weights, **kw)


def recount(result, vocab, k):
    """Word-topic counts recomputed from every worker's token topics."""
    def count(worker, data, state):
        out = np.zeros((vocab, k), dtype=np.int64)
        for b, words in enumerate(data.block_words):
            lo, hi = data.block_tok[b], data.block_tok[b + 1]
            np.add.at(out, (words[data.token_row[lo:hi]], state.token_topic[lo:hi]), 1)
        return out
    return sum(result.map_states(count))


@pytest.fixture(scope="module")
def corpus():
    return synthetic_corpus()


def test_counts_are_exact_and_likelihood_rises(sc, corpus):
    docs, _ = corpus
    tokens = sum(int(c.sum()) for _, _, c in docs)
    program = make_program(docs, 400, 2, iterations=15)
    with Engine(program, sc.parallelize(docs, 2), seed=1).fit() as res:
        word_topic = res.read_table("word_topic")
        totals = res.read_table("topic_totals")[0]
        assert word_topic.sum() == tokens
        assert np.array_equal(totals, word_topic.sum(axis=0))
        assert np.array_equal(word_topic, recount(res, 400, 5))
        its = res.summary.iterations
    assert [r["iteration"] for r in its] == list(range(1, 16))
    assert all(r["tokens"] == tokens for r in its)
    ll = [r["log_likelihood"] for r in its]
    assert ll[-1] > ll[0] + 0.05 * abs(ll[0]), ll
    assert 0 <= its[-1]["s_error"] < 0.05


def test_log_likelihood_matches_a_direct_recount(sc, corpus):
    docs, _ = corpus
    program = make_program(docs, 400, 2, iterations=3)
    with Engine(program, sc.parallelize(docs, 2), seed=1).fit() as res:
        word_topic = res.read_table("word_topic")
        totals = res.read_table("topic_totals")[0]
        doc_parts = res.map_states(lambda w, data, state: K.doc_log_likelihood(
            K.count_doc_topic(data.token_doc, state.token_topic, len(data.doc_ids), 5), data.doc_lengths, 0.5))
        reported = res.summary.iterations[-1]["log_likelihood"]
    direct = sum(doc_parts) + K.word_log_likelihood_rows(word_topic, 0.1) + \
        K.topic_totals_log_likelihood(totals, 0.1, 400)
    assert reported == pytest.approx(direct, rel=1e-12)


class FailingLDA(LDAProgram):
    def __init__(self, *args, marker=None, **kw):
        super().__init__(*args, **kw)
        self.marker = marker

    def push(self, ctx, data, state, block):
        state = super().push(ctx, data, state, block)
        if ctx.step == 2 and ctx.worker == 0 and ctx.local_round == 1 and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            raise RuntimeError("injected failure mid-iteration")
        return state


def test_counts_stay_exact_after_an_injected_task_failure(sc, corpus):
    docs, _ = corpus
    tokens = sum(int(c.sum()) for _, _, c in docs)
    marker = os.path.join(tempfile.mkdtemp(), "failed")
    program = make_program(docs, 400, 2, iterations=6, cls=FailingLDA, marker=marker)
    engine = Engine(program, sc.parallelize(docs, 2), seed=1, config={"step.targetSeconds": 0.01})
    with engine.fit() as res:
        assert os.path.exists(marker)
        word_topic = res.read_table("word_topic")
        assert word_topic.sum() == tokens
        assert np.array_equal(word_topic, recount(res, 400, 5))
        assert np.array_equal(res.read_table("topic_totals")[0], word_topic.sum(axis=0))
        assert res.summary.iterations[-1]["iteration"] == 6
