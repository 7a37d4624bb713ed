"""Count tables of the LDA kernels and the non-zero-topic lists kept beside them.

* :func:`random_topics`: the initial topic of each token;
* :func:`count_word_topic`, :func:`count_topic_totals`: the word-topic and
  total counts from the tokens' topics; :func:`count_doc_topic`: the dense
  document-topic table (a reference: the samplers keep :class:`DocCounts`);
* :func:`build_doc_tokens`: each document's token index, and
  :class:`DocCounts`: each document's topic counts as its sorted non-zeros
  (the layout in :mod:`pystrads.kernels.lda`);
* inline helpers the samplers use to move one token's count:
  ``_doc_count`` / ``_doc_increment`` / ``_doc_decrement`` (the document's
  sorted list) and ``_word_nz_add`` / ``_word_nz_remove`` /
  ``_word_nz_scan`` (the list of the word being swept).
"""

from typing import NamedTuple

import numpy as np
from numba import njit

from ..offsets import bucket_offsets
from ..random import randint

#: ``DocCounts.entries[0]``: the dense-form documents' lists of non-zero topics are kept ...
LISTS_KEPT = 1
#: ... are not kept (the samplers that never walk them stop keeping them) ...
LISTS_DROPPED = 0
#: ... or the table layout (no room for them: the dense sampler's).
TABLE_LAYOUT = 2


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
    """Count document-topic assignments into a dense table (a reference: O(n_docs K) memory;
    the samplers keep :class:`DocCounts`).

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


class DocCounts(NamedTuple):
    """A worker's document-topic counts, O(tokens) memory whatever K.

    Document ``d`` owns ``entries[ptr[d]:ptr[d + 1]]`` (int32): a header
    ``m_d`` and then its counts in one of two forms, chosen by its length
    ``L_d``:

    * **sparse** (``2 L_d < K``): ``m_d = K_d`` pairs ``(t, n_dt)``, the
      topics with ``n_dt > 0`` in ascending order, with room for ``L_d``
      pairs (its tokens bound its distinct topics); ``n_dt`` is found by
      bisection, a topic that appears or leaves shifts the pairs after it
      (O(K_d));
    * **dense** (``2 L_d >= K``): ``m_d = K``, the K counts ``n_dt`` in topic
      order (zeros included: a count is O(1) and a sweep over them
      vectorises, as with a dense table's row), then ``K_d`` and the topics
      with ``n_dt > 0`` in no order (room for ``min(L_d, K)``; a topic
      that leaves is found by a scan and swapped with the last), so that
      F+LDA and SparseLDA walk K_d topics, not K.  The samplers that never
      read these lists stop keeping them and F+LDA and SparseLDA list them
      again when they take over (:func:`keep_doc_lists`).

    ``entries[0]``, before every document's, says which: 1 the lists are
    kept, 0 they are not, 2 the **table** layout (``table=True``): every
    document dense at one stride ``K + 1`` (its header and K counts, no
    room for lists), the plain documents x K table of the dense sampler,
    which reads its rows without a lookup and runs as fast as on a bare
    table (the lists' room doubles a document's footprint: at K = 20 that
    cost it ~7 % once Reuters' documents outgrew L2).  Every sampler but
    F+LDA and SparseLDA (which need the lists) runs on either layout.

    A document's counts are adjacent cache lines, its header in the first.
    At most 12 bytes a token plus 8 a document in the default layout (a
    dense documents x K table takes 4 K bytes a document: 3 GB at 7,500
    documents and K = 100,000).  (The header lives in the document's own
    cache line: a separate per-document count array, written only in the
    sparse form, slowed every token's count updates 3-4x in a numba loop.)
    """

    ptr: np.ndarray  # int64[n_docs + 1]
    entries: np.ndarray  # int32[ptr[-1]] (the table layout: ptr[-1] + 1)

    @property
    def num_docs(self) -> int:
        return self.ptr.shape[0] - 1

    @property
    def is_table(self) -> bool:
        """Whether this is the table layout (every document's K counts, no lists)."""
        return bool(self.entries[0] == TABLE_LAYOUT)

    @classmethod
    def from_tokens(cls, token_topic, doc_ptr, doc_tokens, n_topics, table=False):
        """The counts of the tokens' topics (``doc_ptr, doc_tokens`` from :func:`build_doc_tokens`);
        ``table``: the table layout (for the dense sampler)."""
        return cls(*_doc_counts_from_tokens(token_topic, doc_ptr, doc_tokens, int(n_topics), bool(table)))

    @classmethod
    def from_dense(cls, doc_topic, table=False):
        """The counts of a dense ``(n_docs, K)`` table; ``table``: the table layout."""
        return cls(*_doc_counts_from_dense(np.ascontiguousarray(doc_topic), bool(table)))

    def to_dense(self, n_topics):
        """The dense ``(n_docs, n_topics)`` int32 table."""
        return _doc_counts_to_dense(self.ptr, self.entries, n_topics)

    def copy(self):
        return DocCounts(self.ptr, self.entries.copy())


@njit(cache=True, nogil=True)
def _doc_rows_ptr(lengths, n_topics, table):
    # a header, then in the dense form (2 L_d >= K) K counts, K_d and room for min(L_d, K) topics;
    # in the sparse one room for L_d pairs; in the table layout every document a header and K counts
    n_docs = lengths.shape[0]
    ptr = np.zeros(n_docs + 1, dtype=np.int64)
    ptr[0] = 1  # entries[0]: the layout (lists kept, not kept, table)
    for d in range(n_docs):
        length = lengths[d]
        if table:
            ptr[d + 1] = ptr[d] + 1 + n_topics
        elif 2 * length >= n_topics:
            ptr[d + 1] = ptr[d] + 2 + n_topics + min(length, n_topics)
        else:
            ptr[d + 1] = ptr[d] + 1 + 2 * length
    return ptr


@njit(cache=True, nogil=True)
def _doc_counts_fill(ptr, entries, d, row, length, n_topics, table):
    # document d's entries from its dense counts `row` (K,) and its length
    p = ptr[d]
    k = 0
    if table:  # the table layout's row: the counts only
        for t in range(n_topics):
            entries[p + 1 + t] = row[t]
        entries[p] = n_topics
    elif 2 * length >= n_topics:
        for t in range(n_topics):
            entries[p + 1 + t] = row[t]
            if row[t] > 0:
                entries[p + 2 + n_topics + k] = t
                k += 1
        entries[p] = n_topics
        entries[p + 1 + n_topics] = k
    else:
        for t in range(n_topics):
            if row[t] > 0:
                entries[p + 1 + 2 * k] = t
                entries[p + 2 + 2 * k] = row[t]
                k += 1
        entries[p] = k


@njit(cache=True, nogil=True)
def _doc_counts_from_tokens(token_topic, doc_ptr, doc_tokens, n_topics, table):
    n_docs = doc_ptr.shape[0] - 1
    ptr = _doc_rows_ptr(doc_ptr[1:] - doc_ptr[:-1], n_topics, table)
    entries = np.zeros(ptr[n_docs] + table, dtype=np.int32)  # the table: one int of padding
    entries[0] = TABLE_LAYOUT if table else LISTS_KEPT
    row = np.zeros(n_topics, dtype=np.int32)
    for d in range(n_docs):
        for j in range(doc_ptr[d], doc_ptr[d + 1]):
            row[token_topic[doc_tokens[j]]] += 1
        _doc_counts_fill(ptr, entries, d, row, doc_ptr[d + 1] - doc_ptr[d], n_topics, table)
        for j in range(doc_ptr[d], doc_ptr[d + 1]):
            row[token_topic[doc_tokens[j]]] = 0
    return ptr, entries


@njit(cache=True, nogil=True)
def _doc_counts_from_dense(doc_topic, table):
    n_docs, n_topics = doc_topic.shape
    lengths = np.zeros(n_docs, dtype=np.int64)
    for d in range(n_docs):
        for t in range(n_topics):
            lengths[d] += doc_topic[d, t]
    ptr = _doc_rows_ptr(lengths, n_topics, table)
    entries = np.zeros(ptr[n_docs] + table, dtype=np.int32)  # the table: one int of padding
    entries[0] = TABLE_LAYOUT if table else LISTS_KEPT
    for d in range(n_docs):
        _doc_counts_fill(ptr, entries, d, doc_topic[d], lengths[d], n_topics, table)
    return ptr, entries


@njit(cache=True, nogil=True)
def _doc_counts_to_dense(ptr, entries, n_topics):
    n_docs = ptr.shape[0] - 1
    out = np.zeros((n_docs, n_topics), dtype=np.int32)
    for d in range(n_docs):
        p = ptr[d]
        dense, k = _doc_topics_counts(entries, p, n_topics)
        for j in range(k):
            t, c = _doc_count_at(entries, p, dense, j)
            out[d, t] = c
    return out


@njit(cache=True, nogil=True, inline="always")
def _doc_list_nonzero(doc_nz, p, n_topics):
    # list the non-zero topics of the dense-form document at p from its counts
    q = p + 1 + n_topics
    k = 0
    for t in range(n_topics):
        if doc_nz[p + 1 + t] > 0:
            doc_nz[q + 1 + k] = t
            k += 1
    doc_nz[q] = k


@njit(cache=True, nogil=True, inline="always")
def _doc_nonzero(doc_nz, p, n_topics):
    # (dense form?, K_d) of the document whose header is at p (the lists kept: see keep_doc_lists)
    if doc_nz[p] == n_topics:
        return True, doc_nz[p + 1 + n_topics]
    return False, doc_nz[p]


@njit(cache=True, nogil=True)
def keep_doc_lists(doc_nz_ptr, doc_nz, n_topics):
    """Make the dense-form documents' lists of non-zero topics current and kept from now on (the
    samplers that walk them call it first; the others stop keeping them: :func:`drop_doc_lists`).
    O(K) per dense-form document when they were not kept, O(1) otherwise: one rebuild when a
    sampler that walks them takes over, never within a fit (which keeps one sampler).  The table
    layout has no room for them: ValueError."""
    if doc_nz[0] == TABLE_LAYOUT:
        raise ValueError("F+LDA and SparseLDA walk the documents' non-zero topics, which the table layout "
                         "of DocCounts does not keep: build the counts with table=False")
    if doc_nz[0] == LISTS_DROPPED:
        for d in range(doc_nz_ptr.shape[0] - 1):
            p = doc_nz_ptr[d]
            if doc_nz[p] == n_topics:
                _doc_list_nonzero(doc_nz, p, n_topics)
        doc_nz[0] = LISTS_KEPT


@njit(cache=True, nogil=True, inline="always")
def drop_doc_lists(doc_nz):
    # a sampler that never walks the lists of non-zero topics stops keeping them (no-op on a table)
    if doc_nz[0] == LISTS_KEPT:
        doc_nz[0] = LISTS_DROPPED


@njit(cache=True, nogil=True, inline="always")
def _doc_topics_counts(doc_nz, p, n_topics):
    # (dense form?, the number of (t, n_dt) to walk) for a reader that does not need the lists: a
    # dense-form document's K counts (zeros included), a sparse one's pairs
    if doc_nz[p] == n_topics:
        return True, n_topics
    return False, doc_nz[p]


@njit(cache=True, nogil=True, inline="always")
def _doc_count_at(doc_nz, p, dense, j):
    # (t, n_dt) of the j-th entry a _doc_topics_counts walk visits
    if dense:
        return j, doc_nz[p + 1 + j]
    return doc_nz[p + 1 + 2 * j], doc_nz[p + 2 + 2 * j]


@njit(cache=True, nogil=True, inline="always")
def _doc_entry(doc_nz, p, dense, j, n_topics):
    # (t, n_dt) of the j-th non-zero topic of the document whose header is at p
    if dense:
        t = doc_nz[p + 2 + n_topics + j]
        return t, doc_nz[p + 1 + t]
    return doc_nz[p + 1 + 2 * j], doc_nz[p + 2 + 2 * j]


@njit(cache=True, nogil=True, inline="always")
def _doc_slot(doc_nz, p, m, t):
    # The position in [0, m) of the first pair of the sparse document at p whose topic is >= t
    # (m if none): bisection down to a few pairs, then a scan (most documents have a handful).
    lo, hi = 0, m
    while hi - lo > 8:
        mid = (lo + hi) >> 1
        if doc_nz[p + 1 + 2 * mid] < t:
            lo = mid + 1
        else:
            hi = mid
    while lo < hi and doc_nz[p + 1 + 2 * lo] < t:
        lo += 1
    return lo


@njit(cache=True, nogil=True, inline="always")
def _doc_count(d, t, doc_nz_ptr, doc_nz, n_topics):
    # n_dt: O(1) in a dense document, bisection in a sparse one.
    p = doc_nz_ptr[d]
    m = doc_nz[p]
    if m == n_topics:
        return doc_nz[p + 1 + t]
    j = _doc_slot(doc_nz, p, m, t)
    if j < m and doc_nz[p + 1 + 2 * j] == t:
        return doc_nz[p + 2 + 2 * j]
    return 0


@njit(cache=True, nogil=True, inline="always")
def _doc_decrement(d, t, doc_nz_ptr, doc_nz, n_topics):
    # n_dt -= 1 (n_dt > 0); in a sparse document a count that reaches 0 leaves the list, which
    # stays sorted.
    p = doc_nz_ptr[d]
    m = doc_nz[p]
    if m == n_topics:
        c = doc_nz[p + 1 + t] - 1
        doc_nz[p + 1 + t] = c
        if c == 0 and doc_nz[0] == LISTS_KEPT:  # swap-remove t from the non-zero topics (when kept)
            q = p + 1 + n_topics
            last = q + doc_nz[q]
            k = q + 1
            while doc_nz[k] != t:
                k += 1
            doc_nz[k] = doc_nz[last]
            doc_nz[q] -= 1
    else:
        j = _doc_slot(doc_nz, p, m, t)
        c = doc_nz[p + 2 + 2 * j] - 1
        if c > 0:
            doc_nz[p + 2 + 2 * j] = c
        else:
            for k in range(p + 1 + 2 * j, p + 2 * m - 1):
                doc_nz[k] = doc_nz[k + 2]
            doc_nz[p] = m - 1


@njit(cache=True, nogil=True, inline="always")
def _doc_increment(d, t, doc_nz_ptr, doc_nz, n_topics):
    # n_dt += 1; in a sparse document a topic new to it enters the list at its place (there is
    # room for L_d pairs).
    p = doc_nz_ptr[d]
    m = doc_nz[p]
    if m == n_topics:
        c = doc_nz[p + 1 + t]
        doc_nz[p + 1 + t] = c + 1
        if c == 0 and doc_nz[0] == LISTS_KEPT:  # append t to the non-zero topics (when kept)
            q = p + 1 + n_topics
            doc_nz[q + 1 + doc_nz[q]] = t
            doc_nz[q] += 1
    else:
        j = _doc_slot(doc_nz, p, m, t)
        if j < m and doc_nz[p + 1 + 2 * j] == t:
            doc_nz[p + 2 + 2 * j] += 1
        else:
            for k in range(p + 2 * m, p + 2 * j, -1):
                doc_nz[k + 2] = doc_nz[k]
            doc_nz[p + 1 + 2 * j] = t
            doc_nz[p + 2 + 2 * j] = 1
            doc_nz[p] = m + 1


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
