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


@njit(cache=True, nogil=True)
def doc_topic_histograms(doc_topic, doc_ptr, doc_nz_topics, doc_nz_count, doc_lengths, max_length):
    """Histograms of a worker's document-topic counts and document lengths.

    ``out[k, n]`` = documents with ``doc_topic[d, k] == n`` (n >= 1; column 0
    is left 0: it adds nothing to the fixed point), ``out[K, n]`` = documents
    of length ``n``.  Counts above ``max_length`` go to column ``max_length``.
    O(non-zeros): reads only each document's non-zero topics.

    Parameters
    ----------
    doc_topic : ndarray of int32, shape (n_docs, K)
    doc_ptr, doc_nz_topics, doc_nz_count
        The documents' non-zero topic lists (:func:`build_doc_nonzero`).
    doc_lengths : ndarray of int, shape (n_docs,)
    max_length : int
        L; the histograms have ``L + 1`` columns.

    Returns
    -------
    ndarray of int64, shape (K + 1, L + 1)
    """
    n_docs, n_topics = doc_topic.shape
    out = np.zeros((n_topics + 1, max_length + 1), dtype=np.int64)
    for d in range(n_docs):
        base = doc_ptr[d]
        for j in range(doc_nz_count[d]):
            t = doc_nz_topics[base + j]
            out[t, min(doc_topic[d, t], max_length)] += 1
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
