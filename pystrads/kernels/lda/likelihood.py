"""Log-likelihood of the LDA model, and inference on held-out documents.

log p(w, z) in parts that add up across workers and shards:
:func:`doc_log_likelihood` (per worker), :func:`word_log_likelihood_rows`
(per shard) and :func:`topic_totals_log_likelihood` (once), summed by
:func:`joint_log_likelihood`.  Held-out documents: :func:`fold_in` (Gibbs
with the topics held fixed), :func:`doc_states` (one generator per
document) and :func:`document_completion_log_likelihood` (Wallach et al.
2009).
"""

import math

import numpy as np
from numba import njit

from ..random import STATE_SIZE, seed_states, uniform
from .counts import DocCounts, _doc_count_at, _doc_topics_counts
from .priors import alpha_vector


# --------------------------------------------------------------------------
# Log-likelihood log p(w, z) in parts that add up across workers and shards
# --------------------------------------------------------------------------


@njit(cache=True, nogil=True, inline="always")
def _add_count_terms(ll, counts, prior, lgamma_prior):
    # ll + Σ_t (lgamma(n_t + prior) - lgamma(prior)) over the non-zero counts of
    # one row: the Dirichlet-multinomial term of the word part (the document
    # part writes it out with a prior per topic), added term by term onto ll.
    for t in range(counts.shape[0]):
        count = counts[t]
        if count > 0:
            ll += math.lgamma(count + prior) - lgamma_prior
    return ll


def doc_log_likelihood(doc_counts, doc_lengths, alpha):
    """Document part of log p(w, z): log p(z | α) for a worker's documents.

    ``Σ_d [lgamma(α_0) - lgamma(L_d + α_0) + Σ_t (lgamma(n_dt + α_t) - lgamma(α_t))]``
    with ``α_0 = Σ_t α_t`` (Griffiths & Steyvers 2004, eq. 3, with an
    asymmetric prior).  Sums over workers add up.  O(non-zeros).

    Parameters
    ----------
    doc_counts : DocCounts or ndarray of int, shape (n_docs, K)
        The document-topic counts (a dense table is converted).
    doc_lengths : ndarray of int, shape (n_docs,)
        Tokens per document (the sums of its counts).
    alpha : float or ndarray of float64, shape (K,)
        A number is the symmetric prior (with a dense table only: a
        :class:`DocCounts` does not know K).

    Returns
    -------
    float
    """
    if not isinstance(doc_counts, DocCounts):
        dense = np.asarray(doc_counts)
        alpha = alpha_vector(alpha, dense.shape[1])
        doc_counts = DocCounts.from_dense(dense.astype(np.int32))
    elif np.ndim(alpha) == 0:
        raise ValueError("doc_log_likelihood: give alpha as a vector of K values with DocCounts")
    return _doc_log_likelihood(*doc_counts, np.asarray(doc_lengths), alpha_vector(alpha, len(alpha)))


@njit(cache=True, nogil=True)
def _doc_log_likelihood(doc_nz_ptr, doc_nz, doc_lengths, alpha):
    n_topics = alpha.shape[0]
    alpha_sum = 0.0
    lgamma_alpha = np.empty(n_topics, dtype=np.float64)
    for t in range(n_topics):
        alpha_sum += alpha[t]
        lgamma_alpha[t] = math.lgamma(alpha[t])
    lgamma_alpha_sum = math.lgamma(alpha_sum)
    ll = 0.0
    for d in range(doc_nz_ptr.shape[0] - 1):
        ll += lgamma_alpha_sum - math.lgamma(doc_lengths[d] + alpha_sum)
        p = doc_nz_ptr[d]
        dense, k = _doc_topics_counts(doc_nz, p, n_topics)
        for j in range(k):  # term by term, as _add_count_terms
            t, c = _doc_count_at(doc_nz, p, dense, j)
            if c > 0:  # (a document in the dense form lists its zeros too)
                ll += math.lgamma(c + alpha[t]) - lgamma_alpha[t]
    return ll


@njit(cache=True, nogil=True)
def word_log_likelihood_rows(word_topic_rows, beta):
    """Word-row part of log p(w | z, β) for some rows of the word-topic table.

    ``Σ_w Σ_t (lgamma(n_wt + β) - lgamma(β))``.  All-zero rows add 0, so each
    shard sums its own rows; the sums over shards add up.

    Parameters
    ----------
    word_topic_rows : ndarray of int32 or int64, shape (n_rows, K)
    beta : float

    Returns
    -------
    float
    """
    n_rows = word_topic_rows.shape[0]
    lgamma_beta = math.lgamma(beta)
    ll = 0.0
    for w in range(n_rows):
        ll = _add_count_terms(ll, word_topic_rows[w], beta, lgamma_beta)
    return ll


@njit(cache=True, nogil=True)
def topic_totals_log_likelihood(topic_totals, beta, vocab_size):
    """Topic-total part of log p(w | z, β); count it once per model.

    ``Σ_t (lgamma(Vβ) - lgamma(n_t + Vβ))``.

    Parameters
    ----------
    topic_totals : ndarray of int, shape (K,)
    beta : float
    vocab_size : int

    Returns
    -------
    float
    """
    v_beta = vocab_size * beta
    lgamma_v_beta = math.lgamma(v_beta)
    ll = 0.0
    for t in range(topic_totals.shape[0]):
        ll += lgamma_v_beta - math.lgamma(topic_totals[t] + v_beta)
    return ll


def joint_log_likelihood(
    word_topic, topic_totals, doc_counts, doc_lengths, alpha, beta, vocab_size
):
    """Return log p(w, z | α, β) for the whole model.

    The sum of :func:`doc_log_likelihood` (per worker),
    :func:`word_log_likelihood_rows` (per shard) and
    :func:`topic_totals_log_likelihood` (once).

    Parameters
    ----------
    word_topic : ndarray of int32 or int64, shape (V or n_rows, K)
    topic_totals : ndarray of int, shape (K,)
    doc_counts : DocCounts or ndarray of int, shape (n_docs, K)
    doc_lengths : ndarray of int, shape (n_docs,)
    alpha : float or ndarray of float64, shape (K,)
    beta : float
    vocab_size : int

    Returns
    -------
    float
    """
    return (
        doc_log_likelihood(doc_counts, doc_lengths, alpha_vector(alpha, word_topic.shape[1]))
        + word_log_likelihood_rows(word_topic, beta)
        + topic_totals_log_likelihood(topic_totals, beta, vocab_size)
    )


# --------------------------------------------------------------------------
# Held-out documents: fold-in with fixed topics, document completion
# --------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def _fold_in_run(doc_words, doc_ptr, topic_word_prob, alpha, n_iter, n_burn,
                 rng_states, doc_topic, doc_topic_sum):
    # Gibbs with fixed φ: p(z = t) ∝ (n_dt¬ + α_t) φ[w, t].  The first pass
    # adds tokens one by one (sequential initialisation); counts of the
    # passes after the first n_burn ones are accumulated in doc_topic_sum.
    # rng_states: one row shared by all documents, or one row per document.
    n_docs = doc_ptr.shape[0] - 1
    per_doc = rng_states.shape[0] > 1
    n_topics = topic_word_prob.shape[1]
    token_topic = np.empty(doc_words.shape[0], dtype=np.int32)
    cumulative = np.empty(n_topics, dtype=np.float64)
    for it in range(n_iter):
        for d in range(n_docs):
            rng_state = rng_states[d] if per_doc else rng_states[0]
            for i in range(doc_ptr[d], doc_ptr[d + 1]):
                w = doc_words[i]
                if it > 0:
                    doc_topic[d, token_topic[i]] -= 1
                total = 0.0
                for t in range(n_topics):
                    total += (doc_topic[d, t] + alpha[t]) * topic_word_prob[w, t]
                    cumulative[t] = total
                u = uniform(rng_state) * total
                new = 0
                while new < n_topics - 1 and cumulative[new] <= u:
                    new += 1
                token_topic[i] = new
                doc_topic[d, new] += 1
        if it >= n_burn:
            for d in range(n_docs):
                for t in range(n_topics):
                    doc_topic_sum[d, t] += doc_topic[d, t]


def _as_states(rng_state):
    """A 1-D state as a one-row (shared) table of states; a 2-D table (one row per document) as is."""
    rng_state = np.asarray(rng_state)
    return rng_state if rng_state.ndim == 2 else rng_state.reshape(1, -1)


def doc_states(seed, streams):
    """One generator state per document, from ``seed`` and a stream per document (e.g. a hash of
    its content): a document's draws then depend on it alone, not on its neighbours or its order."""
    states = np.zeros((len(streams), STATE_SIZE), dtype=np.uint64)
    seed_states(states, np.uint64(int(seed) & ((1 << 64) - 1)), np.asarray(streams, dtype=np.uint64))
    return states


def fold_in(doc_words, doc_ptr, topic_word_prob, alpha, n_iter, rng_state):
    """Infer topic counts of held-out documents with the topics held fixed.

    Collapsed Gibbs over the documents' tokens with
    ``p(z = t) ∝ (n_dt¬ + α_t) φ[w, t]``, ``n_iter`` sweeps, the first one
    a sequential initialisation.

    Parameters
    ----------
    doc_words : ndarray of int, shape (n,)
        Row of ``topic_word_prob`` for each token (a global word id, or a
        local id if the caller passes only the rows it needs).
    doc_ptr : ndarray of int64, shape (n_docs + 1,)
        CSR offsets: document ``d`` is ``doc_words[doc_ptr[d]:doc_ptr[d+1]]``.
    topic_word_prob : ndarray of float64, shape (V or n_rows, K)
        Fixed φ, ``topic_word_prob[w, t] = p(w | t)``.
    alpha : float or ndarray of float64, shape (K,)
        The document-topic prior (a number: symmetric).
    n_iter : int
        Number of sweeps, >= 1.
    rng_state : ndarray of uint64
        One state shared by the documents in turn, or a table of one state per
        document (:func:`doc_states`); advanced in place.

    Returns
    -------
    ndarray of int32, shape (n_docs, K)
        Document-topic counts after the last sweep.
    """
    return _fold_in(doc_words, doc_ptr, topic_word_prob, alpha_vector(alpha, topic_word_prob.shape[1]), n_iter,
                    _as_states(rng_state))


@njit(cache=True, nogil=True)
def _fold_in(doc_words, doc_ptr, topic_word_prob, alpha, n_iter, rng_states):
    n_docs = doc_ptr.shape[0] - 1
    n_topics = topic_word_prob.shape[1]
    doc_topic = np.zeros((n_docs, n_topics), dtype=np.int32)
    # no pass is averaged (n_burn = n_iter): no running sums (3x the counts' memory at large K)
    _fold_in_run(doc_words, doc_ptr, topic_word_prob, alpha, n_iter, n_iter,
                 rng_states, doc_topic, np.zeros((0, n_topics), dtype=np.float64))
    return doc_topic


def document_completion_log_likelihood(doc_words, doc_ptr, topic_word_prob, alpha, n_iter, rng_state):
    """Document-completion log-likelihood of held-out documents.

    For each document, θ_d is estimated by fold-in on its first
    ``L_d // 2`` tokens (counts averaged over the last ``n_iter - n_iter // 2``
    sweeps, ``θ_dt = (n̄_dt + α_t) / (L_d // 2 + Σα)``) and the remaining
    tokens are scored by ``log Σ_t θ_dt φ[w, t]`` (Wallach et al. 2009).
    Perplexity is ``exp(-log_lik / n_scored)``.

    Parameters
    ----------
    doc_words, doc_ptr, topic_word_prob, alpha, n_iter, rng_state
        As in :func:`fold_in`.

    Returns
    -------
    log_lik : float
        Total log-likelihood of the scored (second-half) tokens.
    n_scored : int
        Number of scored tokens.
    """
    return _completion(doc_words, doc_ptr, topic_word_prob, alpha_vector(alpha, topic_word_prob.shape[1]), n_iter,
                       _as_states(rng_state))


@njit(cache=True, nogil=True)
def _completion(doc_words, doc_ptr, topic_word_prob, alpha, n_iter, rng_states):
    n_docs = doc_ptr.shape[0] - 1
    n_topics = topic_word_prob.shape[1]
    est_ptr = np.zeros(n_docs + 1, dtype=np.int64)
    for d in range(n_docs):
        est_ptr[d + 1] = est_ptr[d] + (doc_ptr[d + 1] - doc_ptr[d]) // 2
    est_words = np.empty(est_ptr[n_docs], dtype=doc_words.dtype)
    for d in range(n_docs):
        for j in range(est_ptr[d + 1] - est_ptr[d]):
            est_words[est_ptr[d] + j] = doc_words[doc_ptr[d] + j]
    doc_topic = np.zeros((n_docs, n_topics), dtype=np.int32)
    doc_topic_sum = np.zeros((n_docs, n_topics), dtype=np.float64)
    n_burn = n_iter // 2
    _fold_in_run(est_words, est_ptr, topic_word_prob, alpha, n_iter, n_burn,
                 rng_states, doc_topic, doc_topic_sum)
    n_kept = n_iter - n_burn
    alpha_sum = 0.0
    for t in range(n_topics):
        alpha_sum += alpha[t]
    theta = np.empty(n_topics, dtype=np.float64)
    log_lik = 0.0
    n_scored = 0
    for d in range(n_docs):
        n_est = est_ptr[d + 1] - est_ptr[d]
        norm = 1.0 / (n_est + alpha_sum)
        for t in range(n_topics):
            theta[t] = (doc_topic_sum[d, t] / n_kept + alpha[t]) * norm
        for i in range(doc_ptr[d] + n_est, doc_ptr[d + 1]):
            w = doc_words[i]
            p = 0.0
            for t in range(n_topics):
                p += theta[t] * topic_word_prob[w, t]
            log_lik += math.log(p)
            n_scored += 1
    return log_lik, n_scored
