"""Count tables of the LDA kernels and the non-zero-topic lists kept beside them.

* :func:`random_topics`: the initial topic of each token;
* :func:`count_word_topic`, :func:`count_doc_topic`,
  :func:`count_topic_totals`: the three count structures from the tokens'
  topics;
* :func:`build_doc_tokens`, :func:`build_doc_nonzero`: each document's token
  index and list of non-zero topics (the layout in :mod:`pystrads.kernels.lda`);
* inline helpers the samplers use to move one token's count and keep the
  non-zero lists exact: ``_doc_increment`` / ``_doc_decrement`` (the
  document's list) and ``_word_nz_add`` / ``_word_nz_remove`` /
  ``_word_nz_scan`` (the list of the word being swept).
"""

import numpy as np
from numba import njit

from ..offsets import bucket_offsets
from ..random import randint


@njit(cache=True, nogil=True)
def random_topics(n_tokens, n_topics, rng_state):
    """Draw an initial topic for each token uniformly at random.

    Parameters
    ----------
    n_tokens, n_topics : int
    rng_state : ndarray of uint64
        Generator state (see :mod:`pystrads.kernels.random`), advanced.

    Returns
    -------
    ndarray of int32, shape (n_tokens,)
    """
    token_topic = np.empty(n_tokens, dtype=np.int32)
    for i in range(n_tokens):
        token_topic[i] = randint(rng_state, n_topics)
    return token_topic


@njit(cache=True, nogil=True)
def count_word_topic(token_word, token_topic, word_lo, word_hi, n_topics):
    """Count word-topic assignments for the words in ``[word_lo, word_hi)``.

    Tokens whose word lies outside the range are ignored.

    Returns
    -------
    ndarray of int32, shape (word_hi - word_lo, n_topics)
        Row ``i`` holds the counts of word ``word_lo + i``.
    """
    word_topic = np.zeros((word_hi - word_lo, n_topics), dtype=np.int32)
    for i in range(token_word.shape[0]):
        w = token_word[i]
        if word_lo <= w < word_hi:
            word_topic[w - word_lo, token_topic[i]] += 1
    return word_topic


@njit(cache=True, nogil=True)
def count_doc_topic(token_doc, token_topic, n_docs, n_topics):
    """Count document-topic assignments.

    Returns
    -------
    ndarray of int32, shape (n_docs, n_topics)
    """
    doc_topic = np.zeros((n_docs, n_topics), dtype=np.int32)
    for i in range(token_doc.shape[0]):
        doc_topic[token_doc[i], token_topic[i]] += 1
    return doc_topic


@njit(cache=True, nogil=True)
def count_topic_totals(token_topic, n_topics):
    """Count tokens per topic.

    Returns
    -------
    ndarray of int64, shape (n_topics,)
    """
    topic_totals = np.zeros(n_topics, dtype=np.int64)
    for i in range(token_topic.shape[0]):
        topic_totals[token_topic[i]] += 1
    return topic_totals


@njit(cache=True, nogil=True)
def build_doc_tokens(token_doc, n_docs):
    """Index each document's tokens (CSR); immutable for a fixed token order.

    Parameters
    ----------
    token_doc : ndarray of int32, shape (n,)
    n_docs : int

    Returns
    -------
    doc_ptr : ndarray of int64, shape (n_docs + 1,)
        Document ``d`` owns slots ``doc_ptr[d]:doc_ptr[d + 1]``; the slot
        count is its number of tokens on this worker.
    doc_tokens : ndarray of int32, shape (n,)
        Token indices of each document, ascending within a document.
    """
    n = token_doc.shape[0]
    doc_ptr = bucket_offsets(token_doc, n_docs)
    fill = doc_ptr[:-1].copy()
    doc_tokens = np.empty(n, dtype=np.int32)
    for i in range(n):
        d = token_doc[i]
        doc_tokens[fill[d]] = i
        fill[d] += 1
    return doc_ptr, doc_tokens


@njit(cache=True, nogil=True)
def build_doc_nonzero(doc_topic, doc_ptr):
    """Build each document's list of non-zero topics from ``doc_topic``.

    Parameters
    ----------
    doc_topic : ndarray of int32, shape (n_docs, K)
    doc_ptr : ndarray of int64, shape (n_docs + 1,)
        From :func:`build_doc_tokens`; a document's capacity is its length,
        which bounds its number of non-zero topics.

    Returns
    -------
    doc_nz_topics : ndarray of int32, shape (doc_ptr[-1],)
    doc_nz_count : ndarray of int32, shape (n_docs,)
    """
    n_docs = doc_topic.shape[0]
    doc_nz_topics = np.zeros(doc_ptr[n_docs], dtype=np.int32)
    doc_nz_count = np.zeros(n_docs, dtype=np.int32)
    for d in range(n_docs):
        _doc_nz_rebuild(doc_topic, d, doc_ptr, doc_nz_topics, doc_nz_count)
    return doc_nz_topics, doc_nz_count


@njit(cache=True, nogil=True, inline="always")
def _doc_nz_rebuild(doc_topic, d, doc_ptr, doc_nz_topics, doc_nz_count):
    # Document d's non-zero list from its row of doc_topic (ascending topics).
    base = doc_ptr[d]
    count = 0
    for t in range(doc_topic.shape[1]):
        if doc_topic[d, t] > 0:
            doc_nz_topics[base + count] = t
            count += 1
    doc_nz_count[d] = count


@njit(cache=True, nogil=True, inline="always")
def _doc_decrement(doc_topic, d, t, doc_ptr, doc_nz_topics, doc_nz_count):
    count = doc_topic[d, t] - 1
    doc_topic[d, t] = count
    if count == 0:  # swap-remove t from the document's non-zero list
        base = doc_ptr[d]
        last = base + doc_nz_count[d] - 1
        j = base
        while doc_nz_topics[j] != t:
            j += 1
        doc_nz_topics[j] = doc_nz_topics[last]
        doc_nz_count[d] -= 1


@njit(cache=True, nogil=True, inline="always")
def _doc_increment(doc_topic, d, t, doc_ptr, doc_nz_topics, doc_nz_count):
    count = doc_topic[d, t]
    doc_topic[d, t] = count + 1
    if count == 0:  # append t to the document's non-zero list
        doc_nz_topics[doc_ptr[d] + doc_nz_count[d]] = t
        doc_nz_count[d] += 1


@njit(cache=True, nogil=True, inline="always")
def _word_nz_remove(word_nz_topics, word_nz_pos, word_nz_count, t):
    # Swap-remove topic t from the current word's non-zero list.
    pos = word_nz_pos[t]
    moved = word_nz_topics[word_nz_count - 1]
    word_nz_topics[pos] = moved
    word_nz_pos[moved] = pos
    word_nz_pos[t] = -1
    return word_nz_count - 1


@njit(cache=True, nogil=True, inline="always")
def _word_nz_add(word_nz_topics, word_nz_pos, word_nz_count, t):
    word_nz_topics[word_nz_count] = t
    word_nz_pos[t] = word_nz_count
    return word_nz_count + 1


@njit(cache=True, nogil=True, inline="always")
def _word_nz_scan(row, word_nz_topics, word_nz_pos, word_nz_count):
    # Replace the current word's non-zero list by that of `row`; returns its size.
    for j in range(word_nz_count):
        word_nz_pos[word_nz_topics[j]] = -1
    count = 0
    for t in range(row.shape[0]):
        if row[t] != 0:
            word_nz_topics[count] = t
            word_nz_pos[t] = count
            count += 1
    return count
