"""Tests of the LDA numba kernels against plain numpy / math references (no Spark)."""

import itertools
import math

import numpy as np
import pytest

from pystrads.kernels import lda
from pystrads.kernels.random import STATE_SIZE, new_state, next_uint64, randint, uniform

SAMPLER_NAMES = sorted(lda.SAMPLERS)
FAST_SAMPLERS = [name for name in SAMPLER_NAMES if name != "dense"]
# every sampler on the default layout of the document counts, and those that run on the table and
# hash layouts too ("name:table", "name:hash"; the LDA program gives the dense sampler the table,
# MH and alias the table or the hash layout)
LAYOUT_CASES = SAMPLER_NAMES + ["dense:table", "mh:table", "alias:table", "dense:hash", "mh:hash", "alias:hash"]


def _case(name):
    """``(kernel name, layout of the document counts)`` of a LAYOUT_CASES entry."""
    base, _, layout = name.partition(":")
    return base, layout or "lists"


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


class Chain:
    """A worker's token arrays and counts, built from token topics."""

    def __init__(self, token_word, token_doc, token_topic, vocab_size, n_docs, n_topics, layout="lists"):
        self.token_word = token_word
        self.token_doc = token_doc
        self.token_topic = token_topic
        self.vocab_size = vocab_size
        self.n_docs = n_docs
        self.n_topics = n_topics
        self.word_topic = lda.count_word_topic(token_word, token_topic, 0, vocab_size, n_topics)
        self.topic_totals = lda.count_topic_totals(token_topic, n_topics)
        self.doc_ptr, self.doc_tokens = lda.build_doc_tokens(token_doc, n_docs)
        self.doc_counts = lda.DocCounts.from_tokens(token_topic, self.doc_ptr, self.doc_tokens, n_topics, layout)

    @property
    def doc_topic(self):
        """The document-topic counts as a dense table (a copy)."""
        return self.doc_counts.to_dense(self.n_topics)

    def sample(self, kernel, tok_lo, tok_hi, word_lo, word_hi, alpha, beta, rng_state):
        """``alpha``: a number (the symmetric prior) or one value per topic."""
        return kernel(
            self.token_word, self.token_doc, self.token_topic, tok_lo, tok_hi, word_lo,
            self.word_topic[word_lo:word_hi], self.topic_totals, *self.doc_counts, self.doc_ptr, self.doc_tokens,
            lda.alpha_vector(alpha, self.n_topics), beta, self.vocab_size, rng_state,
        )

    def sweep(self, kernel, word_bounds, alpha, beta, rng_state):
        """One iteration as a worker sees it: the word blocks one after another."""
        tok_bounds = np.searchsorted(self.token_word, word_bounds)
        changed = 0
        for b in range(len(word_bounds) - 1):
            changed += self.sample(kernel, tok_bounds[b], tok_bounds[b + 1],
                                   word_bounds[b], word_bounds[b + 1], alpha, beta, rng_state)
        return changed

    def log_likelihood(self, alpha, beta):
        return lda.joint_log_likelihood(self.word_topic, self.topic_totals, self.doc_counts,
                                        np.diff(self.doc_ptr), alpha, beta, self.vocab_size)


def make_lda_corpus(seed, vocab_size=100, n_topics=5, n_docs=80, doc_len=25, alpha=0.1, beta=0.05):
    """Tokens drawn from a true LDA model, sorted word-major; returns true z too."""
    rng = np.random.default_rng(seed)
    phi = rng.dirichlet(np.full(vocab_size, beta), n_topics)
    theta = rng.dirichlet(np.full(n_topics, alpha), n_docs)
    token_doc = np.repeat(np.arange(n_docs), doc_len)
    token_topic = np.concatenate([rng.choice(n_topics, doc_len, p=theta[d]) for d in range(n_docs)])
    token_word = np.array([rng.choice(vocab_size, p=phi[t]) for t in token_topic])
    order = np.argsort(token_word, kind="stable")
    return (token_word[order].astype(np.int32), token_doc[order].astype(np.int32),
            token_topic[order].astype(np.int32), phi)


def chi2_critical(df, z=3.719):
    """Wilson-Hilferty upper quantile of chi2(df); z = 3.719 is p = 1e-4."""
    return df * (1.0 - 2.0 / (9 * df) + z * math.sqrt(2.0 / (9 * df))) ** 3


# --------------------------------------------------------------------------
# random state
# --------------------------------------------------------------------------


def test_random_state_is_reproducible_and_uniform():
    a, b, c = new_state(7), new_state(7), new_state(7, stream=1)
    assert a.dtype == np.uint64 and a.shape == (STATE_SIZE,)
    seq_a = [next_uint64(a) for _ in range(5)]
    assert seq_a == [next_uint64(b) for _ in range(5)]
    assert seq_a != [next_uint64(c) for _ in range(5)]
    draws = np.array([uniform(a) for _ in range(20000)])
    assert draws.min() >= 0.0 and draws.max() < 1.0
    assert abs(draws.mean() - 0.5) < 0.01  # sd of the mean is 0.002
    ints = np.array([randint(a, 5) for _ in range(5000)])
    assert set(ints.tolist()) == {0, 1, 2, 3, 4}


# --------------------------------------------------------------------------
# count bookkeeping
# --------------------------------------------------------------------------


@pytest.mark.parametrize("n_topics", [13, 41, 61])
@pytest.mark.parametrize("name", LAYOUT_CASES)
def test_counts_match_recount_after_sweeps(name, n_topics):
    """Counts stay exact, and the document counts keep their layout: at K = 13 and 41 the 30-token
    documents take the dense form and the cut ones (a few tokens) the sparse one; at K = 61 every
    document is sparse with up to 30 topics (the bisection); in the table layout every document
    has its K counts at one stride."""
    name, layout = _case(name)
    token_word, token_doc, _, _ = make_lda_corpus(1, vocab_size=200, n_topics=13, doc_len=30)
    keep = (token_doc < 40) | (np.random.default_rng(9).random(token_doc.size) < 0.15)
    token_word, token_doc = token_word[keep], token_doc[keep]
    n_docs = 80  # 13: the F+ tree has padding leaves
    chain = Chain(token_word, token_doc, lda.random_topics(token_word.size, n_topics, new_state(3)),
                  200, n_docs, n_topics, layout)
    rng_state = new_state(4)
    for _ in range(4):
        chain.sweep(lda.SAMPLERS[name], [0, 60, 130, 200], 0.2, 0.05, rng_state)
    z = chain.token_topic
    assert z.min() >= 0 and z.max() < n_topics
    np.testing.assert_array_equal(chain.word_topic,
                                  lda.count_word_topic(token_word, z, 0, 200, n_topics))
    np.testing.assert_array_equal(chain.doc_topic,
                                  lda.count_doc_topic(token_doc, z, n_docs, n_topics))
    np.testing.assert_array_equal(chain.topic_totals, np.bincount(z, minlength=n_topics))
    dense = chain.doc_topic
    ptr, entries = chain.doc_counts
    if layout == "hash":  # short documents hashed (2^b >= 2 L_d slots, 2^(b+1) <= K), the others' K counts
        assert entries[0] == 3 and chain.doc_counts.layout == "hash"
        forms = set()
        for d in range(n_docs):
            m, rest, length = entries[ptr[d]], entries[ptr[d] + 1:ptr[d + 1]], chain.doc_ptr[d + 1] - chain.doc_ptr[d]
            room = 2 ** max(1, math.ceil(math.log2(2 * max(length, 1))))  # the least 2^b >= 2 L_d
            if m == n_topics:
                forms.add("dense")
                assert rest.tolist() == dense[d].tolist() and 2 * room > n_topics
            else:
                forms.add("hashed")
                slots = rest.reshape(-1, 2)
                assert m < 0 and len(slots) == 1 << -m == room and 2 * room <= n_topics
                kept = slots[slots[:, 0] >= 0]
                assert (slots[slots[:, 0] < 0, 1] == 0).all()
                assert sorted(kept.tolist()) == np.c_[np.flatnonzero(dense[d]), dense[d][dense[d] > 0]].tolist()
        assert forms == {"dense", "hashed"}
        return
    if layout == "table":
        assert entries[0] == 2 and chain.doc_counts.is_table
        np.testing.assert_array_equal(ptr, 1 + np.arange(n_docs + 1) * (n_topics + 1))
        assert entries.size == ptr[-1] + 1  # one int of padding: the dense sampler reads the table as rows
        np.testing.assert_array_equal(entries[1:-1].reshape(n_docs, n_topics + 1),
                                      np.c_[np.full(n_docs, n_topics), dense])
        return
    forms = set()
    for d in range(n_docs):  # a short document lists its non-zero topics ascending with their counts,
        m, rest = entries[ptr[d]], entries[ptr[d] + 1:ptr[d + 1]]  # a long one its K counts
        if m == n_topics:
            assert 2 * (chain.doc_ptr[d + 1] - chain.doc_ptr[d]) >= n_topics
            forms.add("dense")  # the K counts, then K_d and the non-zero topics in any order (kept by
            assert m == n_topics and rest[:n_topics].tolist() == dense[d].tolist()  # F+LDA, SparseLDA)
            if name in ("fplus", "sparse"):
                assert sorted(rest[n_topics + 1:n_topics + 1 + rest[n_topics]]) == np.flatnonzero(dense[d]).tolist()
        else:
            forms.add("sparse")
            assert rest[0:2 * m:2].tolist() == np.flatnonzero(dense[d]).tolist()
            assert rest[1:2 * m:2].tolist() == dense[d][dense[d] > 0].tolist()
    assert forms == ({"sparse"} if n_topics == 61 else {"dense", "sparse"})
    assert entries[0] == (name in ("fplus", "sparse"))  # whether the dense form's lists are kept
    assert n_topics != 61 or max(entries[ptr[:-1]]) > 8


def test_samplers_take_over_each_others_document_counts():
    """The dense sampler leaves long documents' lists of non-zero topics stale; F+LDA, SparseLDA and
    MH after it (and the likelihood) read the counts exactly, as in a chain that recounts."""
    token_word, token_doc, _, _ = make_lda_corpus(5, vocab_size=200, n_topics=13, doc_len=30)
    keep = (token_doc < 40) | (np.random.default_rng(9).random(token_doc.size) < 0.15)
    token_word, token_doc = token_word[keep], token_doc[keep]
    chain = Chain(token_word, token_doc, lda.random_topics(token_word.size, 13, new_state(3)), 200, 80, 13)
    rng_state = new_state(4)
    for name in ["dense", "fplus", "dense", "sparse", "dense", "alias", "dense", "mh", "dense"]:
        chain.sweep(lda.SAMPLERS[name], [0, 100, 200], 0.2, 0.05, rng_state)
        recount = Chain(token_word, token_doc, chain.token_topic.copy(), 200, 80, 13)
        np.testing.assert_array_equal(chain.doc_topic, recount.doc_topic)
        assert chain.log_likelihood(0.2, 0.05) == pytest.approx(recount.log_likelihood(0.2, 0.05), rel=1e-12)


def test_each_sampler_gets_the_document_counts_layout_it_is_fastest_on():
    limit_docs = lda.TABLE_MAX_BYTES // (4 * 1000)
    assert lda.doc_counts_layout("dense", 10 ** 7, 10 ** 5) == "table"  # O(K) a token anyway
    for name in ("mh", "alias"):
        assert lda.doc_counts_layout(name, limit_docs, 1000) == "table"
        assert lda.doc_counts_layout(name, limit_docs + 1, 1000) == "hash"
    for name in ("fplus", "sparse"):
        assert lda.doc_counts_layout(name, 10, 10) == "lists"
    assert set(lda.SAMPLERS) == {"dense", "mh", "alias", "fplus", "sparse"}  # a new one: decide its layout
    with pytest.raises(ValueError, match="layout='dense'.*'hash', 'lists', 'table'"):
        lda.DocCounts.from_dense(np.zeros((2, 3), np.int32), layout="dense")


def test_hashed_counts_follow_random_updates_through_collisions_and_wraps():
    """The hash layout's count helpers against a dict: documents of 2 to 7 tokens (4 to 16 slots) at
    K = 1,000, their topics drawn from 24 values so that probe runs collide, wrap around the slots'
    end and lose entries from their middle; after every update each topic's count, the slots'
    invariants (every kept topic reachable from its home slot, empty slots (-1, 0)) and the dense
    view match the reference."""
    from pystrads.kernels.lda.counts import _doc_count, _doc_decrement, _doc_increment, _hash_home

    n_topics, rng = 1000, np.random.default_rng(17)
    lengths = np.array([2, 3, 4, 5, 7])
    token_doc = np.repeat(np.arange(lengths.size), lengths).astype(np.int32)
    palette = rng.choice(n_topics, 24, replace=False)
    token_topic = rng.choice(palette, token_doc.size).astype(np.int32)
    doc_ptr, doc_tokens = lda.build_doc_tokens(token_doc, lengths.size)
    counts = lda.DocCounts.from_tokens(token_topic, doc_ptr, doc_tokens, n_topics, "hash")
    ptr, entries = counts
    assert (entries[ptr[:-1]] < 0).all()  # every document hashed
    moved = wrapped = 0
    for _ in range(6000):
        i = int(rng.integers(token_doc.size))
        d, old, new = int(token_doc[i]), int(token_topic[i]), int(rng.choice(palette))
        _doc_decrement(d, old, ptr, entries, n_topics)
        _doc_increment(d, new, ptr, entries, n_topics)
        token_topic[i] = new
        want = np.bincount(token_topic[token_doc == d], minlength=n_topics)
        assert [_doc_count(d, int(t), ptr, entries, n_topics) for t in palette] == want[palette].tolist()
        b = -int(entries[ptr[d]])
        slots = entries[ptr[d] + 1:ptr[d + 1]].reshape(-1, 2)
        for s, (t, c) in enumerate(slots):
            if t < 0:
                assert c == 0
                continue
            home = int(_hash_home(int(t), b))
            moved += s != home
            wrapped += s < home
            run = [(home + j) % len(slots) for j in range((s - home) % len(slots) + 1)]
            assert all(slots[j, 0] >= 0 for j in run)  # no empty slot between its home and it
    np.testing.assert_array_equal(counts.to_dense(n_topics), lda.count_doc_topic(token_doc, token_topic, 5, n_topics))
    assert moved > 1000 and wrapped >= 10  # collisions and wrapped probe runs were exercised


@pytest.mark.parametrize("name", ["mh", "alias"])
def test_hashed_counts_give_the_lists_draws(name):
    """The MH and alias samplers read counts only: on the hash layout they make the draws they make on
    the sorted lists, token for token, through sweeps that move topics in and out of documents."""
    n_topics = 400
    token_word, token_doc, _, _ = make_lda_corpus(8, vocab_size=100, doc_len=12)
    start = lda.random_topics(token_word.size, n_topics, new_state(2))
    chains = [Chain(token_word, token_doc, start.copy(), 100, 80, n_topics, layout) for layout in ("lists", "hash")]
    assert chains[1].doc_counts.layout == "hash" and (chains[1].doc_counts.entries[chains[1].doc_counts.ptr[:-1]] < 0).all()
    for sweep in range(4):
        for chain in chains:
            chain.sweep(lda.SAMPLERS[name], [0, 30, 100], 0.05, 0.05, new_state(10 + sweep))
        np.testing.assert_array_equal(chains[0].token_topic, chains[1].token_topic)
        np.testing.assert_array_equal(chains[1].doc_topic, lda.count_doc_topic(token_doc, chains[1].token_topic, 80,
                                                                               n_topics))
    assert np.count_nonzero(chains[1].token_topic != start) > token_word.size // 2


def test_table_layout_serves_the_count_readers_and_refuses_the_list_walkers():
    """On the table layout the dense, MH and alias samplers take over each other's counts exactly
    and the likelihood and histograms read them; F+LDA and SparseLDA, which walk the lists of
    non-zero topics it has no room for, refuse it before changing anything."""
    token_word, token_doc, _, _ = make_lda_corpus(5, vocab_size=200, n_topics=13, doc_len=30)
    keep = (token_doc < 40) | (np.random.default_rng(9).random(token_doc.size) < 0.15)
    token_word, token_doc = token_word[keep], token_doc[keep]
    chain = Chain(token_word, token_doc, lda.random_topics(token_word.size, 13, new_state(3)), 200, 80, 13, "table")
    rng_state = new_state(4)
    lengths = np.diff(chain.doc_ptr)
    for name in ["dense", "mh", "dense", "alias", "dense"]:
        chain.sweep(lda.SAMPLERS[name], [0, 100, 200], 0.2, 0.05, rng_state)
        recount = Chain(token_word, token_doc, chain.token_topic.copy(), 200, 80, 13)
        np.testing.assert_array_equal(chain.doc_topic, recount.doc_topic)
        assert chain.doc_counts.entries[0] == 2
        assert chain.log_likelihood(0.2, 0.05) == pytest.approx(recount.log_likelihood(0.2, 0.05), rel=1e-12)
        np.testing.assert_array_equal(lda.doc_topic_histograms(chain.doc_counts, lengths, 13, 31),
                                      lda.doc_topic_histograms(recount.doc_counts, lengths, 13, 31))
    before = (chain.token_topic.copy(), chain.doc_counts.entries.copy(), chain.topic_totals.copy())
    for name in ("fplus", "sparse"):
        with pytest.raises(ValueError, match="table and hash layouts .* layout='lists'"):
            chain.sweep(lda.SAMPLERS[name], [0, 100, 200], 0.2, 0.05, rng_state)
    for a, b in zip(before, (chain.token_topic, chain.doc_counts.entries, chain.topic_totals)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", ["sparse", "mh", "alias", "mh:hash", "alias:hash"])
def test_document_counts_take_memory_by_tokens_not_topics(name):
    """At K = 100,000 the documents' counts take at most 8 bytes a token and 4 a document, hashed
    at most 32 bytes a token and 4 a document (a dense table would be 80 x 100,000 int32, 32 MB),
    and stay exact through sweeps."""
    name, layout = _case(name)
    n_topics = 100_000
    token_word, token_doc, _, _ = make_lda_corpus(6, vocab_size=100, doc_len=25)
    chain = Chain(token_word, token_doc, lda.random_topics(token_word.size, n_topics, new_state(7)),
                  100, 80, n_topics, layout)
    per_token = 32 if layout == "hash" else 8
    assert chain.doc_counts.entries.nbytes <= per_token * token_word.size + 4 * 80 + 4
    rng_state = new_state(8)
    for _ in range(2):
        chain.sweep(lda.SAMPLERS[name], [0, 50, 100], 0.1, 0.05, rng_state)
    ptr, entries = chain.doc_counts
    for d in range(80):
        topics, counts = np.unique(chain.token_topic[token_doc == d], return_counts=True)
        m = entries[ptr[d]]
        if layout == "hash":
            slots = entries[ptr[d] + 1:ptr[d + 1]].reshape(-1, 2)
            kept = sorted(slots[slots[:, 0] >= 0].tolist())
        else:
            kept = entries[ptr[d] + 1:ptr[d] + 1 + 2 * m].reshape(-1, 2).tolist()
        assert kept == np.c_[topics, counts].tolist()


@pytest.mark.parametrize("name", SAMPLER_NAMES)
def test_only_the_block_changes(name):
    token_word, token_doc, _, _ = make_lda_corpus(2, vocab_size=60, doc_len=20)
    chain = Chain(token_word, token_doc, lda.random_topics(token_word.size, 6, new_state(5)),
                  60, 80, 6)
    z_before, rows_before = chain.token_topic.copy(), chain.word_topic.copy()
    tok_lo, tok_hi = np.searchsorted(token_word, [20, 40])
    changed = chain.sample(lda.SAMPLERS[name], tok_lo, tok_hi, 20, 40, 0.5, 0.1, new_state(6))
    outside = np.r_[0:tok_lo, tok_hi:token_word.size]
    np.testing.assert_array_equal(chain.token_topic[outside], z_before[outside])
    np.testing.assert_array_equal(chain.word_topic[:20], rows_before[:20])
    np.testing.assert_array_equal(chain.word_topic[40:], rows_before[40:])
    assert changed == np.count_nonzero(chain.token_topic != z_before) > 0


# --------------------------------------------------------------------------
# distributional correctness
# --------------------------------------------------------------------------

TINY_WORD = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 3, 3], np.int32)
TINY_DOC = np.array([0, 1, 2, 0, 0, 1, 2, 2, 0, 1, 1, 2], np.int32)
TINY_TOPIC = np.array([0, 3, 3, 1, 0, 5, 6, 3, 2, 4, 0, 3], np.int32)


# one per topic of the tiny chains (K = 7): the token's document has topics 3 and 6 (unequal
# alphas) and 4 is heavy; the MH acceptance ratios all differ from the symmetric ones
ASYMMETRIC_ALPHA = (0.02, 0.05, 0.1, 1.5, 2.0, 0.6, 0.3)


def _draw_token_against_exact_conditional(name, chain, i, alpha, beta, n_draws, seed):
    """Resample token ``i`` of ``chain`` ``n_draws`` times with sampler ``name`` and return the
    chi-square statistic of its topics against the exact conditional (the token's own
    assignment removed). Gibbs kernels draw independently each call; the MH chains ("mh",
    "alias") are thinned (5 calls = 10 MH cycles between kept draws) so draws are ~independent."""
    n_topics = chain.n_topics
    w, d, t0 = chain.token_word[i], chain.token_doc[i], chain.token_topic[i]
    n_wt, n_t, n_dt = chain.word_topic[w].copy(), chain.topic_totals.copy(), chain.doc_topic[d].copy()
    n_wt[t0] -= 1
    n_t[t0] -= 1
    n_dt[t0] -= 1
    p = (n_dt + alpha) * (n_wt + beta) / (n_t + chain.vocab_size * beta)
    p /= p.sum()
    name = _case(name)[0]
    thin = 5 if name in ("mh", "alias") else 1
    kernel, rng_state = lda.SAMPLERS[name], new_state(seed)
    hits = np.zeros(n_topics)
    for _ in range(n_draws):
        for _ in range(thin):
            chain.sample(kernel, i, i + 1, w, w + 1, alpha, beta, rng_state)
        hits[chain.token_topic[i]] += 1
    return ((hits - n_draws * p) ** 2 / (n_draws * p)).sum(), hits / n_draws, p


@pytest.mark.parametrize("alpha", [0.05, 2.0, ASYMMETRIC_ALPHA])  # document part / word part dominates / per topic
@pytest.mark.parametrize("name", LAYOUT_CASES)
def test_single_token_draws_follow_exact_conditional(name, alpha):
    n_topics, vocab_size, beta, i = 7, 4, 0.2, 2
    alpha = lda.alpha_vector(alpha, n_topics)
    chain = Chain(TINY_WORD, TINY_DOC, TINY_TOPIC.copy(), vocab_size, 3, n_topics, _case(name)[1])
    chi2, freq, p = _draw_token_against_exact_conditional(name, chain, i, alpha, beta, 30000, 11)
    # p = 1e-4 critical value of chi2(6) ~ 28; ignoring the token's own count
    # instead gives chi2 > 2000 at this number of draws.
    assert chi2 < chi2_critical(n_topics - 1), (freq, p)
    # Other tokens and the counts are untouched apart from token i.
    assert np.array_equal(np.delete(chain.token_topic, i), np.delete(TINY_TOPIC, i))
    assert chain.topic_totals.sum() == TINY_WORD.size


@pytest.mark.parametrize("name", LAYOUT_CASES)
def test_draws_over_many_topics_follow_exact_conditional(name):
    """K = 21: the dense sampler's draw walks block sums of ``DENSE_BLOCK`` topics (3 blocks here,
    the last one padded), the tree samplers' trees have 32 leaves; every topic must be drawn
    in proportion to the exact conditional, whichever block it lies in."""
    n_topics, vocab_size, n_docs = 21, 5, 4
    rng = np.random.default_rng(5)
    token_word = np.sort(rng.integers(0, vocab_size, 80)).astype(np.int32)
    token_doc = rng.integers(0, n_docs, 80).astype(np.int32)
    chain = Chain(token_word, token_doc, rng.integers(0, n_topics, 80).astype(np.int32), vocab_size, n_docs,
                  n_topics, _case(name)[1])
    i = int(np.flatnonzero(token_word == 2)[0])
    chi2, freq, p = _draw_token_against_exact_conditional(name, chain, i, np.linspace(0.05, 1.5, n_topics), 0.1,
                                                          40000, 12)
    assert chi2 < chi2_critical(n_topics - 1), (freq, p)
    assert np.array_equal(chain.doc_topic, lda.count_doc_topic(token_doc, chain.token_topic, n_docs, n_topics))


@pytest.mark.parametrize("layout, alpha", [("word_blocks", 0.5), ("interleaved", 0.5),
                                           ("word_blocks", (0.1, 0.5, 1.2))])
@pytest.mark.parametrize("name", SAMPLER_NAMES + ["dense:table"])
def test_sweeps_sample_the_exact_posterior(name, layout, alpha):
    """Full sweeps over 4 tokens (3 of one word) in 2 docs visit all K**n
    states with the exact posterior p(z | w) computed by enumeration.

    ``word_blocks``: sorted tokens, one block per word (the runtime's case).
    ``interleaved``: one block whose words alternate, so per-word structures
    are switched back and forth within a call.  A per-topic ``alpha`` checks the
    asymmetric prior's terms (its posterior is 0.56 away from the symmetric
    prior with the same sum, 0.87 from the reversed one)."""
    if layout == "word_blocks":
        token_word = np.array([0, 0, 0, 1], np.int32)
        token_doc = np.array([0, 1, 0, 1], np.int32)
        blocks = [(0, 3, 0, 1), (3, 4, 1, 2)]
    else:
        token_word = np.array([0, 1, 0, 0], np.int32)
        token_doc = np.array([0, 1, 1, 0], np.int32)
        blocks = [(0, 4, 0, 2)]
    n_topics, vocab_size, n_docs, beta = 3, 2, 2, 0.3
    alpha = lda.alpha_vector(alpha, n_topics)

    def log_joint(z):  # Griffiths & Steyvers eq. 2-3, written out (α per topic)
        ll = 0.0
        for d in range(n_docs):
            c = np.bincount(z[token_doc == d], minlength=n_topics)
            ll += math.lgamma(alpha.sum()) - math.lgamma(c.sum() + alpha.sum())
            ll += sum(math.lgamma(x + a) - math.lgamma(a) for x, a in zip(c, alpha))
        for t in range(n_topics):
            c = np.bincount(token_word[z == t], minlength=vocab_size)
            ll += math.lgamma(vocab_size * beta) - math.lgamma(c.sum() + vocab_size * beta)
            ll += sum(math.lgamma(x + beta) - math.lgamma(beta) for x in c)
        return ll

    states = np.array(list(itertools.product(range(n_topics), repeat=token_word.size)))
    log_p = np.array([log_joint(s) for s in states])
    posterior = np.exp(log_p - log_p.max())
    posterior /= posterior.sum()

    rng_state = new_state(21)
    name, layout = _case(name)
    chain = Chain(token_word, token_doc, lda.random_topics(4, n_topics, rng_state),
                  vocab_size, n_docs, n_topics, layout)
    kernel, powers = lda.SAMPLERS[name], n_topics ** np.arange(token_word.size)[::-1]
    n_sweeps = 100_000
    visits = np.zeros(len(states))
    for _ in range(n_sweeps):
        for tok_lo, tok_hi, word_lo, word_hi in blocks:
            chain.sample(kernel, tok_lo, tok_hi, word_lo, word_hi, alpha, beta, rng_state)
        visits[chain.token_topic @ powers] += 1
    total_variation = 0.5 * np.abs(visits / n_sweeps - posterior).sum()
    # Correct samplers measure 0.009-0.012 here (Monte Carlo noise over 81
    # states); the posterior for beta = 0.36 instead of 0.3 is 0.033 away.
    assert total_variation < 0.022


def test_alias_stale_word_proposal_keeps_the_exact_posterior():
    """The alias sampler builds a word's proposal table once, when its run starts: here word 0
    has 5 tokens in 2 documents (and word 1 one token), a call resamples all of them, so the
    row under the table moves by up to 5 counts before the run ends, with β small enough
    (V β = 0.2) that the row's sparse part carries almost all of the proposal's mass.  The
    chain's per-token topic frequencies must still match the exact posterior marginals
    (enumeration of the 3**6 states), which takes the word step's ratio
    π(t) g¬(x) / (π(x) g¬(t)) with g¬ the *stale* table's values, the token's own count
    taken out of it.

    Measured marginal errors of the stationary distributions (exact transition matrices of
    the algorithm): 0.004 for the sampler (staleness of the earlier tokens' topics, see
    :mod:`pystrads.kernels.lda.alias`); 0.052 when g¬ is evaluated on the current counts
    instead of the table's, 0.068 when the token's own count is left in the table
    (LightLDA as usually written), 0.086 without the g¬ factors.  Over 300 000 calls the
    largest deviation of the frequencies measured 0.003-0.016 (8 seeds; 0.005 with this one)."""
    n_topics, vocab_size, beta = 3, 20, 0.01
    alpha = np.array([0.3, 0.6, 1.2])
    token_word = np.array([0, 0, 0, 0, 0, 1], np.int32)
    token_doc = np.array([0, 1, 0, 1, 0, 1], np.int32)
    n = token_word.size

    states = np.array(list(itertools.product(range(n_topics), repeat=n)))
    log_p = np.empty(len(states))
    for k, z in enumerate(states):
        ll = 0.0
        for d in range(2):
            c = np.bincount(z[token_doc == d], minlength=n_topics)
            ll += sum(math.lgamma(x + a) for x, a in zip(c, alpha)) - math.lgamma(c.sum() + alpha.sum())
        for t in range(n_topics):
            c = np.bincount(token_word[z == t], minlength=vocab_size)
            ll += sum(math.lgamma(x + beta) for x in c) - math.lgamma(c.sum() + vocab_size * beta)
        log_p[k] = ll
    posterior = np.exp(log_p - log_p.max())
    posterior /= posterior.sum()
    marginals = np.array([[posterior[states[:, i] == t].sum() for t in range(n_topics)] for i in range(n)])

    chain = Chain(token_word, token_doc, np.zeros(n, np.int32), vocab_size, 2, n_topics)
    rng_state = new_state(70)
    for _ in range(1000):
        chain.sample(lda.sample_block_alias, 0, n, 0, vocab_size, alpha, beta, rng_state)
    n_calls = 300_000
    hits = np.zeros((n, n_topics))
    for _ in range(n_calls):
        chain.sample(lda.sample_block_alias, 0, n, 0, vocab_size, alpha, beta, rng_state)
        hits[np.arange(n), chain.token_topic] += 1
    freq = hits / n_calls
    assert np.abs(freq - marginals).max() < 0.025, (freq, marginals)
    np.testing.assert_array_equal(chain.word_topic,
                                  lda.count_word_topic(token_word, chain.token_topic, 0, vocab_size, n_topics))


def test_fplus_tree_follows_the_word_switches_within_a_call():
    """The F+ tree of the row-store F+LDA is switched between words by setting and resetting the
    leaves of their topics only (K = 64 and words of two tokens: no full rebuild).  The last token
    of a call is drawn after every other word of the call was swept: given the others' states
    after the call, its draws must follow its exact conditional.  Topics are counted by their rank
    in that conditional (the most likely first), so a draw that ignores which topics the word and
    the document hold is seen even where the topics' overall frequencies agree (a leaf left from
    an earlier word gives its topics ~20x their weight: chi2 ~ 16,000 against a critical 38)."""
    n_topics, n_words, n_docs, beta, alpha = 64, 40, 8, 0.05, 0.3
    rng = np.random.default_rng(17)
    token_word = np.repeat(np.arange(n_words), 2).astype(np.int32)
    token_doc = rng.integers(0, n_docs, token_word.size).astype(np.int32)
    chain = Chain(token_word, token_doc, rng.integers(0, n_topics, token_word.size).astype(np.int32),
                  n_words, n_docs, n_topics)
    i, n_calls, rng_state, bins = token_word.size - 1, 20000, new_state(18), 12
    w, d = token_word[i], token_doc[i]
    hits, expected = np.zeros(bins), np.zeros(bins)
    for _ in range(n_calls):
        chain.sample(lda.SAMPLERS["fplus"], 0, token_word.size, 0, n_words, alpha, beta, rng_state)
        t0 = chain.token_topic[i]
        n_wt, n_t = chain.word_topic[w].astype(float), chain.topic_totals.astype(float)
        n_dt = np.bincount(chain.token_topic[token_doc == d], minlength=n_topics).astype(float)
        n_wt[t0] -= 1
        n_t[t0] -= 1
        n_dt[t0] -= 1
        p = (n_dt + alpha) * (n_wt + beta) / (n_t + n_words * beta)
        order = np.argsort(-p, kind="stable")  # rank r: bin min(r, bins - 1)
        np.add.at(expected, np.minimum(np.arange(n_topics), bins - 1), p[order] / p.sum())
        hits[min(int(np.flatnonzero(order == t0)[0]), bins - 1)] += 1
    chi2 = ((hits - expected) ** 2 / expected).sum()
    assert chi2 < chi2_critical(bins - 1), (hits, expected.round(1))
    assert np.array_equal(chain.word_topic, lda.count_word_topic(token_word, chain.token_topic, 0, n_words,
                                                                 n_topics))


def test_alias_steps_argument():
    """``sample_block_alias`` is ``sample_block_alias_steps`` with ``ALIAS_MH_STEPS``; one step per
    call still samples a lone token's exact conditional (thinned 10 calls)."""
    token_word, token_doc, _, _ = make_lda_corpus(5, doc_len=15)
    chains = [Chain(token_word, token_doc, lda.random_topics(token_word.size, 10, new_state(1)), 100, 80, 10)
              for _ in range(2)]
    chains[0].sample(lda.sample_block_alias, 0, token_word.size, 0, 100, 0.1, 0.05, new_state(2))
    chains[1].sample(lambda *args: lda.sample_block_alias_steps(*args, lda.ALIAS_MH_STEPS),
                     0, token_word.size, 0, 100, 0.1, 0.05, new_state(2))
    np.testing.assert_array_equal(chains[0].token_topic, chains[1].token_topic)

    n_topics, vocab_size, beta, i, n_draws = 7, 4, 0.2, 2, 20000
    alpha = lda.alpha_vector(ASYMMETRIC_ALPHA, n_topics)
    chain = Chain(TINY_WORD, TINY_DOC, TINY_TOPIC.copy(), vocab_size, 3, n_topics)
    n_wt, n_t, n_dt = chain.word_topic[0].copy(), chain.topic_totals.copy(), chain.doc_topic[2].copy()
    t0 = chain.token_topic[i]
    n_wt[t0] -= 1
    n_t[t0] -= 1
    n_dt[t0] -= 1
    p = (n_dt + alpha) * (n_wt + beta) / (n_t + vocab_size * beta)
    p /= p.sum()
    rng_state, hits = new_state(13), np.zeros(n_topics)
    for _ in range(n_draws):
        for _ in range(10):
            chain.sample(lambda *args: lda.sample_block_alias_steps(*args, 1), i, i + 1, 0, 1, alpha, beta, rng_state)
        hits[chain.token_topic[i]] += 1
    chi2 = ((hits - n_draws * p) ** 2 / (n_draws * p)).sum()
    assert chi2 < chi2_critical(n_topics - 1), (hits / n_draws, p)


@pytest.mark.parametrize("name", SAMPLER_NAMES)
def test_same_seed_same_chain_other_seed_other_chain(name):
    token_word, token_doc, _, _ = make_lda_corpus(3, doc_len=15)
    runs = []
    for seed in (8, 8, 9):
        chain = Chain(token_word, token_doc,
                      lda.random_topics(token_word.size, 10, new_state(1)), 100, 80, 10)
        rng_state = new_state(seed)
        for _ in range(2):
            chain.sweep(lda.SAMPLERS[name], [0, 50, 100], 0.1, 0.05, rng_state)
        runs.append((chain.token_topic.copy(), chain.doc_topic.copy(), rng_state.copy()))
    for a, b in zip(runs[0], runs[1]):
        np.testing.assert_array_equal(a, b)
    assert np.count_nonzero(runs[0][0] != runs[2][0]) > token_word.size // 10


# --------------------------------------------------------------------------
# chains on a corpus drawn from a true LDA model
# --------------------------------------------------------------------------

ALPHA, BETA = 0.1, 0.05


@pytest.fixture(scope="module")
def lda_corpus():
    return make_lda_corpus(0)


def _mean_log_likelihood_from_truth(corpus, name, seeds=(0, 1, 2), n_sweeps=45, burn=10):
    token_word, token_doc, true_topic, _ = corpus
    means = []
    for seed in seeds:
        chain = Chain(token_word, token_doc, true_topic.copy(), 100, 80, 5)
        rng_state = new_state(seed)
        lls = []
        for sweep in range(n_sweeps):
            chain.sweep(lda.SAMPLERS[name], [0, 50, 100], ALPHA, BETA, rng_state)
            if sweep >= burn:
                lls.append(chain.log_likelihood(ALPHA, BETA))
        means.append(np.mean(lls))
    return np.mean(means)


@pytest.fixture(scope="module")
def dense_mean_log_likelihood(lda_corpus):
    return _mean_log_likelihood_from_truth(lda_corpus, "dense")


@pytest.mark.parametrize("name", FAST_SAMPLERS)
def test_fast_chain_matches_dense_chain(name, lda_corpus, dense_mean_log_likelihood):
    # Started at the true z, chains stay in the true mode; their stationary
    # mean log p(w, z) (~ -6300 over 2000 tokens) has a per-seed sd of 4-9
    # (measured), so the mean of 3 seeds differs by ~6 between correct
    # samplers; 25 is > 4 sd.
    mean_ll = _mean_log_likelihood_from_truth(lda_corpus, name)
    assert abs(mean_ll - dense_mean_log_likelihood) < 25.0, (mean_ll, dense_mean_log_likelihood)


@pytest.mark.parametrize("name", SAMPLER_NAMES)
def test_log_likelihood_climbs_from_random_init(name, lda_corpus):
    token_word, token_doc, true_topic, _ = lda_corpus
    ll_true = Chain(token_word, token_doc, true_topic, 100, 80, 5).log_likelihood(ALPHA, BETA)
    chain = Chain(token_word, token_doc, lda.random_topics(token_word.size, 5, new_state(30)),
                  100, 80, 5)
    ll_init = chain.log_likelihood(ALPHA, BETA)
    rng_state = new_state(31)
    lls = []
    for _ in range(30):
        chain.sweep(lda.SAMPLERS[name], [0, 50, 100], ALPHA, BETA, rng_state)
        lls.append(chain.log_likelihood(ALPHA, BETA))
    # Random init is ~5400 nats below the truth; every sampler closes > 85 %
    # of that gap in 30 sweeps (measured: 100-101 %).
    assert lls[0] > ll_init
    assert lls[-1] > ll_init + 0.85 * (ll_true - ll_init), (ll_init, lls[-1], ll_true)


# --------------------------------------------------------------------------
# log-likelihood parts
# --------------------------------------------------------------------------


def test_log_likelihood_parts_add_up_to_direct_reference(lda_corpus):
    token_word, token_doc, _, _ = lda_corpus
    n_topics, vocab_size, n_docs, alpha, beta = 7, 100, 80, 0.3, 0.02
    z = lda.random_topics(token_word.size, n_topics, new_state(40))
    word_topic = np.zeros((vocab_size, n_topics), np.int64)
    doc_topic = np.zeros((n_docs, n_topics), np.int64)
    np.add.at(word_topic, (token_word, z), 1)
    np.add.at(doc_topic, (token_doc, z), 1)
    topic_totals = word_topic.sum(axis=0)
    doc_lengths = doc_topic.sum(axis=1)

    lg = math.lgamma
    reference = 0.0
    for d in range(n_docs):  # log p(z | alpha)
        reference += lg(n_topics * alpha) - lg(doc_lengths[d] + n_topics * alpha)
        reference += sum(lg(c + alpha) - lg(alpha) for c in doc_topic[d])
    for t in range(n_topics):  # log p(w | z, beta)
        reference += lg(vocab_size * beta) - lg(topic_totals[t] + vocab_size * beta)
        reference += sum(lg(c + beta) - lg(beta) for c in word_topic[:, t])

    full = lda.joint_log_likelihood(word_topic.astype(np.int32), topic_totals, doc_topic.astype(np.int32),
                                    doc_lengths, alpha, beta, vocab_size)
    assert full == pytest.approx(reference, rel=1e-10)
    # Two workers (document halves) and three shards (row ranges, int32 and int64).
    parts = lda.doc_log_likelihood(doc_topic[:30], doc_lengths[:30], alpha)
    parts += lda.doc_log_likelihood(doc_topic[30:].astype(np.int32), doc_lengths[30:], alpha)
    parts += lda.word_log_likelihood_rows(word_topic[:10].astype(np.int32), beta)
    parts += lda.word_log_likelihood_rows(word_topic[10:55], beta)
    parts += lda.word_log_likelihood_rows(word_topic[55:], beta)
    parts += lda.topic_totals_log_likelihood(topic_totals, beta, vocab_size)
    assert parts == pytest.approx(reference, rel=1e-10)
    assert reference < -1000.0  # a real value, not a vacuous zero


def test_doc_log_likelihood_with_a_prior_per_topic_matches_the_direct_reference():
    rng = np.random.default_rng(41)
    alpha = np.array([0.05, 0.4, 2.0, 0.7])
    doc_topic = rng.integers(0, 6, size=(30, 4)).astype(np.int32)
    doc_lengths = doc_topic.sum(axis=1)
    lg = math.lgamma
    reference = sum(lg(alpha.sum()) - lg(doc_lengths[d] + alpha.sum())
                    + sum(lg(c + a) - lg(a) for c, a in zip(doc_topic[d], alpha)) for d in range(30))
    assert lda.doc_log_likelihood(doc_topic, doc_lengths, alpha) == pytest.approx(reference, rel=1e-12)
    # a number is the symmetric prior
    assert lda.doc_log_likelihood(doc_topic, doc_lengths, 0.4) == pytest.approx(
        lda.doc_log_likelihood(doc_topic, doc_lengths, np.full(4, 0.4)), rel=1e-15)


# --------------------------------------------------------------------------
# learned alpha: histograms and Minka's fixed point
# --------------------------------------------------------------------------


def _dirichlet_documents(alpha, n_docs, mean_length, seed):
    """Document-topic counts of documents whose topic mixtures are drawn from Dir(alpha)."""
    rng = np.random.default_rng(seed)
    lengths = np.maximum(1, rng.poisson(mean_length, n_docs))
    theta = rng.dirichlet(alpha, n_docs)
    doc_topic = np.array([rng.multinomial(n, th) for n, th in zip(lengths, theta)]).astype(np.int32)
    return doc_topic, lengths, lda.DocCounts.from_dense(doc_topic)


def test_histograms_count_documents_per_topic_count_and_length():
    doc_topic, lengths, counts = _dirichlet_documents(np.full(6, 0.3), 200, 20, seed=70)
    hist = lda.doc_topic_histograms(counts, lengths, 6, 30)
    assert hist.shape == (7, 31)
    for k in range(6):
        expected = np.bincount(np.minimum(doc_topic[:, k], 30), minlength=31)
        expected[0] = 0  # zero counts are left out (they add nothing)
        np.testing.assert_array_equal(hist[k], expected)
    np.testing.assert_array_equal(hist[6], np.bincount(np.minimum(lengths, 30), minlength=31))
    # two workers' histograms add up to the whole corpus's
    halves = [lda.doc_topic_histograms(lda.DocCounts.from_dense(doc_topic[a:b]), lengths[a:b], 6, 30)
              for a, b in [(0, 120), (120, 200)]]
    np.testing.assert_array_equal(halves[0] + halves[1], hist)


def test_one_fixed_point_step_matches_the_per_document_digamma_recurrence():
    doc_topic, lengths, counts = _dirichlet_documents(np.array([0.1, 0.5, 2.0]), 50, 15, 71)
    hist = lda.doc_topic_histograms(counts, lengths, 3, int(lengths.max()))
    alpha = np.array([0.3, 0.2, 0.9])

    def digamma_difference(n, a):  # ψ(n + a) - ψ(a), summed term by term
        return sum(1.0 / (i + a) for i in range(n))

    denominator = sum(digamma_difference(int(n), alpha.sum()) for n in lengths)
    expected = [alpha[k] * sum(digamma_difference(int(n), alpha[k]) for n in doc_topic[:, k]) / denominator
                for k in range(3)]
    np.testing.assert_allclose(lda.minka_fixed_point(alpha, hist, iterations=1), expected, rtol=1e-12)


def test_fixed_point_recovers_a_known_asymmetric_alpha():
    true = np.array([0.05, 0.1, 0.2, 0.5, 1.0])
    doc_topic, lengths, counts = _dirichlet_documents(true, 3000, 100, seed=72)
    hist = lda.doc_topic_histograms(counts, lengths, len(true), int(lengths.max()))
    start = np.full(5, true.mean())
    learned = lda.minka_fixed_point(start, hist, iterations=2000, tol=1e-10)
    # the maximum-likelihood estimate from 3000 documents: measured 4.5 % off the truth at most
    # over the five topics (the symmetric start is 7x too large for the smallest)
    np.testing.assert_allclose(learned, true, rtol=0.08)
    # tomotopy's 10 iterations per update already move most of the way
    ten = lda.minka_fixed_point(start, hist)
    assert np.all(np.abs(ten - true) < np.abs(start - true))
    # no documents: alpha unchanged; an unused topic stops at the floor
    np.testing.assert_array_equal(lda.minka_fixed_point(start, np.zeros_like(hist)), start)
    hist[2] = 0
    assert lda.minka_fixed_point(start, hist, iterations=2000)[2] == lda.MIN_ALPHA


def test_document_completion_with_a_prior_per_topic_matches_the_closed_form():
    """Topics with disjoint words make the fold-in deterministic (a token's topic is its
    word's), so the completion score has a closed form: θ_dt = (n_dt + α_t) / (L_d // 2 + Σα)
    on the first half, Σ log(θ_d,topic(w) φ_w) over the second."""
    n_topics, alpha = 4, np.array([0.3, 2.0, 0.05, 0.7])
    topic_word_prob = np.zeros((12, n_topics))
    for t in range(n_topics):
        topic_word_prob[3 * t:3 * t + 3, t] = 1.0 / 3
    rng = np.random.default_rng(58)
    docs = [rng.integers(0, 12, size=n) for n in (7, 10, 4, 13)]
    doc_words = np.concatenate(docs).astype(np.int32)
    doc_ptr = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
    reference = 0.0
    for d in docs:
        half = len(d) // 2
        theta = (np.bincount(d[:half] // 3, minlength=n_topics) + alpha) / (half + alpha.sum())
        reference += sum(math.log(theta[w // 3] / 3) for w in d[half:])
    ll, n = lda.document_completion_log_likelihood(doc_words, doc_ptr, topic_word_prob, alpha, 6, new_state(59))
    assert n == sum(len(d) - len(d) // 2 for d in docs)
    assert ll == pytest.approx(reference, rel=1e-12)
    counts = lda.fold_in(doc_words, doc_ptr, topic_word_prob, alpha, 3, new_state(59))
    np.testing.assert_array_equal(counts, [np.bincount(d // 3, minlength=n_topics) for d in docs])


def test_held_out_scores_use_the_prior_per_topic():
    doc_words, doc_ptr, topic_word_prob = _held_out(55)
    symmetric = lda.document_completion_log_likelihood(doc_words, doc_ptr, topic_word_prob, 0.2, 20, new_state(56))
    same = lda.document_completion_log_likelihood(doc_words, doc_ptr, topic_word_prob, np.full(4, 0.2), 20,
                                                  new_state(56))
    assert same == symmetric
    # a prior that puts its mass on topic 0 pulls the fold-in toward it
    skewed = np.array([20.0, 0.01, 0.01, 0.01])
    counts = lda.fold_in(doc_words, doc_ptr, topic_word_prob, skewed, 20, new_state(57))
    even = lda.fold_in(doc_words, doc_ptr, topic_word_prob, np.full(4, 0.2), 20, new_state(57))
    assert counts[:, 0].sum() > even[:, 0].sum() + 200, (counts[:, 0].sum(), even[:, 0].sum())
    other = lda.document_completion_log_likelihood(doc_words, doc_ptr, topic_word_prob, skewed, 20, new_state(56))
    assert other[1] == symmetric[1] and other[0] < symmetric[0]


# --------------------------------------------------------------------------
# held-out documents
# --------------------------------------------------------------------------


def _held_out(seed, n_docs=60, doc_len=40, vocab_size=60, n_topics=4):
    rng = np.random.default_rng(seed)
    # Topic t puts 90 % of its mass on its own 15 words.
    phi = np.full((n_topics, vocab_size), 0.1 / (vocab_size - 15))
    for t in range(n_topics):
        phi[t, 15 * t:15 * (t + 1)] = 0.9 / 15
    theta = rng.dirichlet(np.full(n_topics, 0.2), n_docs)
    words = [rng.choice(vocab_size, doc_len,
                        p=theta[d] @ phi) for d in range(n_docs)]
    doc_ptr = np.arange(n_docs + 1, dtype=np.int64) * doc_len
    return np.concatenate(words).astype(np.int32), doc_ptr, np.ascontiguousarray(phi.T)


def test_document_completion_true_topics_beat_uniform():
    doc_words, doc_ptr, topic_word_prob = _held_out(50)
    ll_true, n_true = lda.document_completion_log_likelihood(
        doc_words, doc_ptr, topic_word_prob, 0.2, 20, new_state(51))
    uniform_phi = np.full_like(topic_word_prob, 1.0 / topic_word_prob.shape[0])
    ll_unif, n_unif = lda.document_completion_log_likelihood(
        doc_words, doc_ptr, uniform_phi, 0.2, 20, new_state(51))
    assert n_true == n_unif == 60 * 20
    perplexity_true, perplexity_unif = math.exp(-ll_true / n_true), math.exp(-ll_unif / n_unif)
    assert perplexity_unif == pytest.approx(60.0)
    # Documents mixing few sharp topics: ~35 with the true phi (measured).
    assert perplexity_true < 0.7 * perplexity_unif, perplexity_true


def test_fold_in_recovers_the_document_topic():
    doc_words, doc_ptr, topic_word_prob = _held_out(52, n_docs=3)
    # Three extra documents written only with topic 2's own words.
    pure = np.random.default_rng(53).integers(30, 45, size=3 * 40).astype(np.int32)
    words = np.concatenate([doc_words, pure])
    ptr = np.concatenate([doc_ptr, doc_ptr[-1] + 40 * np.arange(1, 4)])
    doc_topic = lda.fold_in(words, ptr, topic_word_prob, 0.1, 30, new_state(54))
    np.testing.assert_array_equal(doc_topic.sum(axis=1), np.diff(ptr))
    assert (doc_topic[3:, 2] >= 32).all(), doc_topic[3:]


# --------------------------------------------------------------------------
# dispatch
# --------------------------------------------------------------------------


def test_dispatch_by_name_and_recommendation():
    assert set(lda.SAMPLERS) == {"dense", "sparse", "fplus", "mh", "alias"}
    with pytest.raises(ValueError, match="unknown LDA sampler 'gibbs'"):
        lda.get_sampler("gibbs")
    # the measured crossover (choose_sampler's notes): dense through K = 600 whatever the length
    for n_topics, doc_len in itertools.product([2, 20, 100, 1000, 10000], [1, 50, 1000, 10**5]):
        assert lda.choose_sampler(n_topics, doc_len) == \
            ("dense" if n_topics <= 600 else "fplus" if n_topics < 50_000 else "alias")
    assert (lda.choose_sampler(600, 80), lda.choose_sampler(601, 80)) == ("dense", "fplus")
    # and the alias sampler from K = 50,000 on (F+LDA's document walk reads a large tree at random)
    assert [lda.choose_sampler(k, 200) for k in (49_999, 50_000, 100_000)] == ["fplus", "alias", "alias"]

    token_word, token_doc, true_topic, _ = make_lda_corpus(4, doc_len=10)
    a = Chain(token_word, token_doc, true_topic.copy(), 100, 80, 5)
    b = Chain(token_word, token_doc, true_topic.copy(), 100, 80, 5)
    a.sample(lda.sample_block_fplus, 0, token_word.size, 0, 100, 0.1, 0.05, new_state(60))
    lda.sample_block("fplus", b.token_word, b.token_doc, b.token_topic, 0, token_word.size, 0,
                     b.word_topic, b.topic_totals, *b.doc_counts, b.doc_ptr, b.doc_tokens, np.full(5, 0.1), 0.05, 100,
                     new_state(60))
    np.testing.assert_array_equal(a.token_topic, b.token_topic)


def test_learned_beta_fixed_point_equals_the_exact_digamma_sums_and_finds_the_prior():
    """beta_fixed_point on the shards' summaries (exact histogram up to 1024, ln n and 1/n
    above) equals Minka's fixed point iterated on every count with scipy's digamma, and recovers
    the symmetric prior the counts were drawn with; summaries of disjoint rows add up."""
    from scipy.special import digamma as scipy_digamma

    from pystrads.kernels.lda.priors import beta_fixed_point, digamma, word_topic_count_summary

    x = np.array([1e-6, 0.01, 0.5, 1.0, 3.0, 5.9, 6.0, 7.5, 100.0, 1e6])
    np.testing.assert_allclose(digamma(x), scipy_digamma(x), rtol=1e-12, atol=1e-12)
    rng = np.random.default_rng(0)
    vocab, topics, true_beta = 2000, 20, 0.05
    phi = rng.dirichlet(np.full(vocab, true_beta), size=topics)
    counts = np.stack([rng.multinomial(n, p) for n, p in zip(rng.integers(2000, 200000, topics), phi)]).T
    counts = counts.astype(np.int32)
    assert counts.max() > 1024  # both parts of the summary are used
    summary = word_topic_count_summary(counts)
    np.testing.assert_allclose(summary, word_topic_count_summary(counts[:700]) + word_topic_count_summary(counts[700:]),
                               rtol=1e-14)
    totals = counts.sum(axis=0)
    beta = 0.5
    for _ in range(500):
        beta *= (scipy_digamma(counts + beta) - scipy_digamma(beta)).sum() / (
            vocab * (scipy_digamma(totals + vocab * beta) - scipy_digamma(vocab * beta)).sum())
    learned = beta_fixed_point(0.5, summary, totals, vocab, iterations=500, tol=1e-12)
    assert learned == pytest.approx(beta, rel=1e-8)
    assert learned == pytest.approx(true_beta, rel=0.05)
    assert beta_fixed_point(0.3, summary, np.zeros(topics), vocab) == 0.3  # no tokens: unchanged
    assert beta_fixed_point(0.3, np.zeros_like(summary), totals, vocab) == 0.3  # no summary: unchanged


# --------------------------------------------------------------------------
# row stores (the alias sampler's rows)
# --------------------------------------------------------------------------


def _random_csr(rng, n_rows, n_topics, density):
    dense = np.where(rng.random((n_rows, n_topics)) < density, rng.integers(1, 9, (n_rows, n_topics)), 0)
    offsets = np.concatenate(([0], np.cumsum((dense != 0).sum(axis=1)))).astype(np.int64)
    rows, cols = np.nonzero(dense)
    return dense.astype(np.int32), offsets, cols.astype(np.int32), dense[rows, cols].astype(np.int32)


def _store_dense(store, n_rows, n_topics):
    ptr, used, topics, counts = store
    out = np.zeros((n_rows, n_topics), dtype=np.int64)
    for r in range(n_rows):
        for s in range(ptr[r], ptr[r] + used[r]):
            out[r, topics[s]] += counts[s]
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_row_store_entries_and_delta_match_a_dense_block(seed):
    """A store made from entries, changed as a sweep changes it (moves of one count, new topics in
    their rows' room), gives back its rows as canonical entries and its change as the dense
    difference's non-zeros, whatever the density."""
    rng = np.random.default_rng(seed)
    n_rows, n_topics = 40, 30
    dense, offsets, cols, vals = _random_csr(rng, n_rows, n_topics, [0.05, 0.3, 0.9][seed])
    tokens = rng.integers(0, 6, n_rows)
    store = lda.row_store(offsets, cols, vals, tokens, n_topics)
    ptr, used, topics, counts = store
    assert np.array_equal(_store_dense(store, n_rows, n_topics), dense)
    assert (np.diff(ptr) == np.minimum(n_topics, np.diff(offsets) + tokens)).all()
    after = dense.astype(np.int64).copy()
    for r in range(n_rows):  # each token moves one count of its row, maybe to a topic new to it
        for _ in range(tokens[r]):
            live = [s for s in range(ptr[r], ptr[r] + used[r]) if counts[s] > 0]
            if not live:
                break
            s_old = live[rng.integers(len(live))]
            counts[s_old] -= 1
            after[r, topics[s_old]] -= 1
            new = int(rng.integers(n_topics))
            where = [s for s in range(ptr[r], ptr[r] + used[r]) if topics[s] == new]
            if where:
                counts[where[0]] += 1
            else:
                assert ptr[r] + used[r] < ptr[r + 1]  # the room the store promised
                topics[ptr[r] + used[r]], counts[ptr[r] + used[r]] = new, 1
                used[r] += 1
            after[r, new] += 1
    assert np.array_equal(_store_dense(store, n_rows, n_topics), after)
    o2, c2, v2 = lda.row_store_entries(*store)
    assert np.array_equal(o2, np.concatenate(([0], np.cumsum((after != 0).sum(axis=1)))))
    rows, nz = np.nonzero(after)
    assert np.array_equal(c2, nz) and np.array_equal(v2, after[rows, nz])
    touched, d_off, d_cols, d_vals = lda.row_store_delta(*store, offsets, cols, vals, n_topics)
    diff = after - dense
    assert np.array_equal(touched, np.flatnonzero((diff != 0).any(axis=1)))
    got = np.zeros_like(diff)
    for j, r in enumerate(touched):
        seg = slice(d_off[j], d_off[j + 1])
        assert (np.diff(d_cols[seg]) > 0).all()  # columns ascending, as a sparse write takes them
        got[r, d_cols[seg]] = d_vals[seg]
    assert np.array_equal(got, diff)


def test_count_word_topic_entries_is_the_dense_count():
    rng = np.random.default_rng(3)
    token_row = rng.integers(5, 25, 500).astype(np.int32)
    token_topic = rng.integers(0, 40, 500).astype(np.int32)
    offsets, cols, vals = lda.count_word_topic_entries(token_row, token_topic, 100, 450, 5, 20, 40)
    want = lda.count_word_topic(token_row[100:450], token_topic[100:450], 5, 25, 40)
    got = np.zeros_like(want)
    for r in range(20):
        seg = slice(offsets[r], offsets[r + 1])
        assert (np.diff(cols[seg]) > 0).all()
        got[r, cols[seg]] = vals[seg]
    assert np.array_equal(got, want)
