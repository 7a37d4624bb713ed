"""Learning the document-topic prior α: histograms and Minka's fixed point.

An asymmetric α (one concentration per topic) is learned by Minka's fixed
point for the Dirichlet-multinomial (Minka 2000, eq. 55; Wallach, Mimno &
McCallum 2009, "Rethinking LDA: why priors matter"), in the histogram form
of Wallach's thesis (2008, §2.3.5)::

    α_k ← α_k · Σ_n h_k[n] (ψ(n + α_k) − ψ(α_k)) / Σ_n h[n] (ψ(n + α_0) − ψ(α_0)),   α_0 = Σ_k α_k

where ``h_k[n]`` is the number of documents with ``n`` tokens in topic k
and ``h[n]`` the number of documents of length ``n``.  Each digamma
difference is the recurrence ``ψ(n + a) − ψ(a) = Σ_{i<n} 1 / (i + a)``, so
``Σ_n h[n] (ψ(n + a) − ψ(a)) = Σ_i c[i] / (i + a)`` with ``c[i] = Σ_{n>i} h[n]``
(the documents with more than i tokens in the topic): O(K · L_max) per
fixed-point iteration, independent of the number of documents.

The histograms add up across workers (:func:`doc_topic_histograms` per
worker, summed), so only they travel; :func:`minka_fixed_point` runs once on
the combined histograms.

Arrays
------
``histograms`` float64 or int64 [K + 1, L + 1]
    rows ``0 .. K-1``: ``h_k[n]`` for ``n = 0 .. L``; row ``K``: the
    document-length histogram ``h[n]``.  ``L`` is at least the longest
    document's length (longer counts are clipped into column ``L``).
``alpha`` float64 [K]
    the concentrations, all > 0.
"""

import numpy as np
from numba import njit

from .counts import _doc_count_at, _doc_topics_counts

#: Smallest α_k the fixed point returns (tomotopy's floor): a topic no document uses
#: would otherwise go to 0, which the samplers cannot divide by.
MIN_ALPHA = 1e-5


def alpha_vector(alpha, n_topics):
    """``alpha`` as the samplers take it: a contiguous float64 vector of length ``n_topics``
    (a number becomes a constant vector: the symmetric prior)."""
    values = np.asarray(alpha, dtype=np.float64)
    if values.ndim == 0:
        return np.full(int(n_topics), float(values))
    return np.ascontiguousarray(values.reshape(-1))


def doc_topic_histograms(doc_counts, doc_lengths, n_topics, max_length):
    """Histograms of a worker's document-topic counts and document lengths.

    ``out[k, n]`` = documents with ``n_dk == n`` (n >= 1; column 0 is left 0:
    it adds nothing to the fixed point), ``out[K, n]`` = documents of length
    ``n``.  Counts above ``max_length`` go to column ``max_length``.
    O(non-zeros).

    Parameters
    ----------
    doc_counts : DocCounts
        The documents' topic counts.
    doc_lengths : ndarray of int, shape (n_docs,)
    n_topics : int
        K.
    max_length : int
        L; the histograms have ``L + 1`` columns.

    Returns
    -------
    ndarray of int64, shape (K + 1, L + 1)
    """
    return _doc_topic_histograms(*doc_counts, np.asarray(doc_lengths), int(n_topics), int(max_length))


@njit(cache=True, nogil=True)
def _doc_topic_histograms(doc_nz_ptr, doc_nz, doc_lengths, n_topics, max_length):
    out = np.zeros((n_topics + 1, max_length + 1), dtype=np.int64)
    for d in range(doc_nz_ptr.shape[0] - 1):
        p = doc_nz_ptr[d]
        dense, k = _doc_topics_counts(doc_nz, p, n_topics)
        for j in range(k):
            t, c = _doc_count_at(doc_nz, p, dense, j)
            if c > 0:  # (a document in the dense form lists its zeros too)
                out[t, min(c, max_length)] += 1
        out[n_topics, min(doc_lengths[d], max_length)] += 1
    return out


def _digamma_difference_sums(histograms, alpha):
    """``Σ_n h_r[n] (ψ(n + a_r) − ψ(a_r))`` for each row r of ``histograms`` (rows, L + 1)
    and its value ``a_r`` in ``alpha`` (rows,), by the recurrence (see the module docstring)."""
    exceeding = histograms[:, ::-1].cumsum(axis=1)[:, ::-1][:, 1:]  # c[i] = Σ_{n > i} h[n], i = 0 .. L-1
    steps = np.arange(exceeding.shape[1], dtype=np.float64)
    return (exceeding / (steps[None, :] + alpha[:, None])).sum(axis=1)


def minka_fixed_point(alpha, histograms, iterations=10, tol=1e-6, min_alpha=MIN_ALPHA):
    """Minka's fixed point for an asymmetric Dirichlet α from document-topic histograms.

    Parameters
    ----------
    alpha : array of float, shape (K,)
        Starting point (the current α), all > 0.
    histograms : array, shape (K + 1, L + 1)
        Summed :func:`doc_topic_histograms` of every worker.
    iterations : int
        At most this many fixed-point updates (tomotopy runs 10 per update).
    tol : float
        Stop earlier once no α_k moves by more than ``tol`` relatively.
    min_alpha : float
        Floor of every α_k.

    Returns
    -------
    ndarray of float64, shape (K,)
        The new α (the input when the histograms hold no document).
    """
    alpha = np.array(alpha, dtype=np.float64)
    hist = np.asarray(histograms, dtype=np.float64)
    n_topics = hist.shape[0] - 1
    used = np.flatnonzero(hist.any(axis=0))
    if len(used) == 0 or not hist[n_topics, 1:].any():
        return alpha
    hist = hist[:, :used[-1] + 1]  # the columns past the largest count add nothing
    for _ in range(int(iterations)):
        alpha_sum = alpha.sum()
        denominator = _digamma_difference_sums(hist[n_topics:], np.array([alpha_sum]))[0]
        numerators = _digamma_difference_sums(hist[:n_topics], alpha)
        new = np.maximum(alpha * numerators / denominator, min_alpha)
        change = np.max(np.abs(new - alpha) / alpha)
        alpha = new
        if change <= tol:
            break
    return alpha


# -- the topic-word prior β: a symmetric concentration ----------------------------------------
#
# Minka's fixed point for a symmetric Dirichlet (as Mallet's ``learnSymmetricConcentration``)::
#
#     β ← β · Σ_{w,k} (ψ(n_wk + β) − ψ(β)) / (V · Σ_k (ψ(n_k + Vβ) − ψ(Vβ)))
#
# The numerator needs every word-topic count; the shards summarise their rows in one pass
# (:func:`word_topic_count_summary`, summable across shards): the histogram of the counts up to
# BETA_EXACT_COUNTS, where the recurrence of the module docstring is exact, and for larger
# counts n their number, Σ ln n and Σ 1/n, with ψ(n + β) ≈ ln n + (β − ½) / n (error below
# 1 / (12 n²), 8e-8 per count at n = 1024).

#: word-topic counts up to this value enter the learned β's histogram exactly
BETA_EXACT_COUNTS = 1024
#: the learned β's floor (the samplers divide by n_k + Vβ)
MIN_BETA = 1e-6


@njit(cache=True, nogil=True)
def word_topic_count_summary(rows, exact=BETA_EXACT_COUNTS):
    """What the learned β needs of some word-topic rows: float64 [exact + 4], entries
    ``0 .. exact`` the histogram of the non-zero counts up to ``exact`` (entry 0 stays 0), then
    the number of larger counts, the sum of their logs and of their inverses.  Summaries of
    disjoint rows add up.  One pass over ``rows`` (any integer 2-D array)."""
    out = np.zeros(exact + 4)
    n_rows, width = rows.shape
    for r in range(n_rows):
        for k in range(width):
            n = rows[r, k]
            if n <= 0:
                continue
            if n <= exact:
                out[n] += 1.0
            else:
                out[exact + 1] += 1.0
                out[exact + 2] += np.log(n)
                out[exact + 3] += 1.0 / n
    return out


def digamma(x):
    """ψ(x) for x > 0 (numpy, elementwise): the recurrence up to 10, then the asymptotic series
    to x⁻⁸ (error below 1e-12)."""
    x = np.array(x, dtype=np.float64, ndmin=1)
    out = np.zeros_like(x)
    small = x < 10.0
    while small.any():
        out[small] -= 1.0 / x[small]
        x = np.where(small, x + 1.0, x)
        small = x < 10.0
    inv2 = 1.0 / (x * x)
    return out + np.log(x) - 0.5 / x - inv2 * (1.0 / 12 - inv2 * (1.0 / 120 - inv2 * (1.0 / 252 - inv2 / 240)))


def beta_fixed_point(beta, summary, topic_totals, vocab_size, iterations=20, tol=1e-6, min_beta=MIN_BETA):
    """Minka's fixed point for the symmetric topic-word concentration β (see above).

    Parameters
    ----------
    beta : float
        Starting point (the current β), > 0.
    summary : array of float, shape (BETA_EXACT_COUNTS + 4,)
        The summed :func:`word_topic_count_summary` of every row of the word-topic table.
    topic_totals : array of int, shape (K,)
        n_k, the tokens in each topic.
    vocab_size : int
        V.
    iterations, tol
        At most this many updates; stop once β moves by at most ``tol`` relatively.

    Returns
    -------
    float
        The new β (the input when there are no tokens or the summary is empty).
    """
    summary = np.asarray(summary, dtype=np.float64)
    exact = len(summary) - 4
    hist = summary[:exact + 1]
    tail_n, tail_log, tail_inv = summary[exact + 1:]
    totals = np.asarray(topic_totals, dtype=np.float64)
    if totals.sum() <= 0 or hist.sum() + tail_n <= 0:  # no tokens, or no summary of them
        return float(beta)
    exceeding = hist[::-1].cumsum()[::-1][1:]  # c[i] = Σ_{n > i} h[n], i = 0 .. exact - 1
    steps = np.arange(exact, dtype=np.float64)
    beta, vocab = float(beta), float(vocab_size)
    for _ in range(int(iterations)):
        numerator = (exceeding / (steps + beta)).sum() + tail_log + (beta - 0.5) * tail_inv \
            - tail_n * digamma(beta)[0]
        denominator = vocab * (digamma(totals + vocab * beta) - digamma(vocab * beta)).sum()
        new = max(beta * numerator / denominator, min_beta)
        change = abs(new - beta) / beta
        beta = new
        if change <= tol:
            break
    return float(beta)
