"""Count tables of the LDA kernels and the non-zero-topic lists kept beside them.

* :func:`random_topics`: the initial topic of each token;
* :func:`count_word_topic`, :func:`count_topic_totals`: the word-topic and
  total counts from the tokens' topics; :func:`count_doc_topic`: the dense
  document-topic table (a reference: the samplers keep :class:`DocCounts`);
* :func:`build_doc_tokens`: each document's token index, and
  :class:`DocCounts`: each document's topic counts as its sorted or hashed
  non-zeros or its K counts (the layouts in :mod:`pystrads.kernels.lda`);
* inline helpers the samplers use to move one token's count:
  ``_doc_count`` / ``_doc_increment`` / ``_doc_decrement`` (the document's
  counts in any form) and ``_word_nz_add`` / ``_word_nz_remove`` /
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
#: ... or the table layout (no room for them: the dense sampler's) ...
TABLE_LAYOUT = 2
#: ... or the hash layout (short documents hashed, no lists: the MH and alias samplers' at large K).
HASH_LAYOUT = 3
#: The layouts by name (``DocCounts.from_tokens(layout=...)``).
LAYOUTS = {"lists": LISTS_KEPT, "table": TABLE_LAYOUT, "hash": HASH_LAYOUT}
#: Multiplier of the hash layout's Fibonacci hashing (2^32 / golden ratio).
_HASH_MULTIPLIER = 2654435769


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
    ``m_d`` and then its counts in one of three forms, chosen by the layout
    and its length ``L_d``:

    * **sparse** (``2 L_d < K``, the default ``"lists"`` layout): ``m_d = K_d``
      pairs ``(t, n_dt)``, the topics with ``n_dt > 0`` in ascending order,
      with room for ``L_d`` pairs (its tokens bound its distinct topics);
      ``n_dt`` is found by bisection, a topic that appears or leaves shifts
      the pairs after it (O(K_d));
    * **hashed** (the ``"hash"`` layout, where ``2 C_d < K + 1`` for ``C_d``
      the least power of two ``>= 2 L_d``): ``m_d = -b`` and ``C_d = 2^b``
      slots of ``(t, n_dt)`` pairs, open addressing with linear probing
      (Fibonacci hashing of t, empty slots ``(-1, 0)``, a load of at most
      1/2; a topic that leaves shifts back the probe run after it), so that
      ``n_dt`` and its updates are O(1) expected: at K = 100,000 the sorted
      pairs' bisections and shifts cost the MH and alias samplers ~10 % of
      an iteration.  Walkers visit all ``C_d`` slots (readers skip zero
      counts);
    * **dense** (``2 L_d >= K``, or in the hash layout where the slots would
      take as much): ``m_d = K``, the K counts ``n_dt`` in topic order (zeros
      included: a count is O(1) and a sweep over them vectorises, as with a
      dense table's row); in the default layout then ``K_d`` and the topics
      with ``n_dt > 0`` in no order (room for ``min(L_d, K)``; a topic that
      leaves is found by a scan and swapped with the last), so that F+LDA
      and SparseLDA walk K_d topics, not K.  The samplers that never read
      these lists stop keeping them and F+LDA and SparseLDA list them again
      when they take over (:func:`keep_doc_lists`).

    ``entries[0]``, before every document's, says which layout: 1 the lists
    are kept, 0 they are not, 2 the **table** layout (``layout="table"``):
    every document dense at one stride ``K + 1`` (its header and K counts,
    no room for lists), the plain documents x K table of the dense sampler,
    which reads its rows without a lookup and runs as fast as on a bare
    table (the lists' room doubles a document's footprint: at K = 20 that
    cost it ~7 % once Reuters' documents outgrew L2); 3 the **hash** layout
    (``layout="hash"``).  Every sampler but F+LDA and SparseLDA (which need
    the lists) runs on any layout.

    A document's counts are adjacent cache lines, its header in the first.
    At most 12 bytes a token plus 8 a document in the default layout, 32 a
    token in the hash layout (a dense documents x K table takes 4 K bytes a
    document: 3 GB at 7,500 documents and K = 100,000).  (The header lives
    in the document's own cache line: a separate per-document count array,
    written only in the sparse form, slowed every token's count updates
    3-4x in a numba loop.)
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

    @property
    def layout(self) -> str:
        """``"lists"``, ``"table"`` or ``"hash"``."""
        code = int(self.entries[0])
        return "table" if code == TABLE_LAYOUT else "hash" if code == HASH_LAYOUT else "lists"

    @classmethod
    def from_tokens(cls, token_topic, doc_ptr, doc_tokens, n_topics, layout="lists"):
        """The counts of the tokens' topics (``doc_ptr, doc_tokens`` from :func:`build_doc_tokens`)
        in ``layout`` (``"lists"``, ``"table"`` or ``"hash"``; see the class)."""
        return cls(*_doc_counts_from_tokens(token_topic, doc_ptr, doc_tokens, int(n_topics), _layout_code(layout)))

    @classmethod
    def from_dense(cls, doc_topic, layout="lists"):
        """The counts of a dense ``(n_docs, K)`` table in ``layout``."""
        return cls(*_doc_counts_from_dense(np.ascontiguousarray(doc_topic), _layout_code(layout)))

    def to_dense(self, n_topics):
        """The dense ``(n_docs, n_topics)`` int32 table."""
        return _doc_counts_to_dense(self.ptr, self.entries, n_topics)

    def copy(self):
        return DocCounts(self.ptr, self.entries.copy())


def _layout_code(layout):
    if layout not in LAYOUTS:
        raise ValueError(f"DocCounts layout={layout!r}: use one of {sorted(LAYOUTS)}")
    return LAYOUTS[layout]


@njit(cache=True, nogil=True)
def _hash_bits(length, n_topics):
    # b of a hashed document of `length` tokens (2^b >= 2 length), or -1 when its K counts take no more room
    b = 1
    while (1 << b) < 2 * length:
        b += 1
    if 2 * (1 << b) >= n_topics + 1:
        return -1
    return b


@njit(cache=True, nogil=True)
def _doc_rows_ptr(lengths, n_topics, layout):
    # a header, then in the dense form (2 L_d >= K) K counts, K_d and room for min(L_d, K) topics;
    # in the sparse one room for L_d pairs; in the table layout every document a header and K counts;
    # in the hash layout a header and 2^b slots, or a header and K counts
    n_docs = lengths.shape[0]
    ptr = np.zeros(n_docs + 1, dtype=np.int64)
    ptr[0] = 1  # entries[0]: the layout (lists kept, not kept, table, hash)
    for d in range(n_docs):
        length = lengths[d]
        if layout == TABLE_LAYOUT:
            ptr[d + 1] = ptr[d] + 1 + n_topics
        elif layout == HASH_LAYOUT:
            b = _hash_bits(length, n_topics)
            ptr[d + 1] = ptr[d] + 1 + (n_topics if b < 0 else 2 << b)
        elif 2 * length >= n_topics:
            ptr[d + 1] = ptr[d] + 2 + n_topics + min(length, n_topics)
        else:
            ptr[d + 1] = ptr[d] + 1 + 2 * length
    return ptr


@njit(cache=True, nogil=True)
def _doc_counts_fill(ptr, entries, d, row, length, n_topics, layout):
    # document d's entries from its dense counts `row` (K,) and its length
    p = ptr[d]
    k = 0
    b = _hash_bits(length, n_topics) if layout == HASH_LAYOUT else -1
    if layout == TABLE_LAYOUT or (layout == HASH_LAYOUT and b < 0):  # the counts only
        for t in range(n_topics):
            entries[p + 1 + t] = row[t]
        entries[p] = n_topics
    elif layout == HASH_LAYOUT:
        entries[p] = -b
        for s in range(1 << b):
            entries[p + 1 + 2 * s] = -1
            entries[p + 2 + 2 * s] = 0
        for t in range(n_topics):
            if row[t] > 0:
                s = _hash_slot(entries, p, b, t)
                entries[p + 1 + 2 * s] = t
                entries[p + 2 + 2 * s] = row[t]
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
def _doc_counts_from_tokens(token_topic, doc_ptr, doc_tokens, n_topics, layout):
    n_docs = doc_ptr.shape[0] - 1
    ptr = _doc_rows_ptr(doc_ptr[1:] - doc_ptr[:-1], n_topics, layout)
    entries = np.zeros(ptr[n_docs] + (layout == TABLE_LAYOUT), dtype=np.int32)  # the table: one int of padding
    entries[0] = layout
    row = np.zeros(n_topics, dtype=np.int32)
    for d in range(n_docs):
        for j in range(doc_ptr[d], doc_ptr[d + 1]):
            row[token_topic[doc_tokens[j]]] += 1
        _doc_counts_fill(ptr, entries, d, row, doc_ptr[d + 1] - doc_ptr[d], n_topics, layout)
        for j in range(doc_ptr[d], doc_ptr[d + 1]):
            row[token_topic[doc_tokens[j]]] = 0
    return ptr, entries


@njit(cache=True, nogil=True)
def _doc_counts_from_dense(doc_topic, layout):
    n_docs, n_topics = doc_topic.shape
    lengths = np.zeros(n_docs, dtype=np.int64)
    for d in range(n_docs):
        for t in range(n_topics):
            lengths[d] += doc_topic[d, t]
    ptr = _doc_rows_ptr(lengths, n_topics, layout)
    entries = np.zeros(ptr[n_docs] + (layout == TABLE_LAYOUT), dtype=np.int32)  # the table: one int of padding
    entries[0] = layout
    for d in range(n_docs):
        _doc_counts_fill(ptr, entries, d, doc_topic[d], lengths[d], n_topics, layout)
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
            if c > 0:  # (a hashed document's empty slots: (-1, 0))
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
    if doc_nz[0] == TABLE_LAYOUT or doc_nz[0] == HASH_LAYOUT:
        raise ValueError("F+LDA and SparseLDA walk the documents' non-zero topics, which the table and hash "
                         "layouts of DocCounts do not keep: build the counts with layout='lists'")
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
    # dense-form document's K counts (zeros included), a sparse one's pairs, a hashed one's slots
    # (empty ones (-1, 0)): readers skip zero counts
    m = doc_nz[p]
    if m == n_topics:
        return True, n_topics
    if m < 0:
        return False, 1 << -m
    return False, m


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
def _hash_home(t, b):
    # the first slot of topic t in a hashed document of 2^b slots
    return ((t * _HASH_MULTIPLIER) & 0xFFFFFFFF) >> (32 - b)


@njit(cache=True, nogil=True, inline="always")
def _hash_slot(doc_nz, p, b, t):
    # the slot of topic t in the hashed document at p, or the empty slot where it would go
    mask = (1 << b) - 1
    s = _hash_home(t, b)
    while True:
        k = doc_nz[p + 1 + 2 * s]
        if k == t or k < 0:
            return s
        s = (s + 1) & mask


@njit(cache=True, nogil=True, inline="always")
def _hash_remove(doc_nz, p, b, s):
    # empty slot s of the hashed document at p, moving back the entries of the probe run after it
    # that may move (whose home is not cyclically in (s, j]), so that no lookup stops short
    mask = (1 << b) - 1
    j = s
    while True:
        j = (j + 1) & mask
        k = doc_nz[p + 1 + 2 * j]
        if k < 0:
            break
        h = _hash_home(k, b)
        if (j > s and (h <= s or h > j)) or (j < s and h <= s and h > j):
            doc_nz[p + 1 + 2 * s] = k
            doc_nz[p + 2 + 2 * s] = doc_nz[p + 2 + 2 * j]
            s = j
    doc_nz[p + 1 + 2 * s] = -1
    doc_nz[p + 2 + 2 * s] = 0


@njit(cache=True, nogil=True, inline="always")
def _doc_count(d, t, doc_nz_ptr, doc_nz, n_topics):
    # n_dt: O(1) in a dense document, O(1) expected in a hashed one, bisection in a sparse one.
    p = doc_nz_ptr[d]
    m = doc_nz[p]
    if m == n_topics:
        return doc_nz[p + 1 + t]
    if m < 0:
        return doc_nz[p + 2 + 2 * _hash_slot(doc_nz, p, -m, t)]
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
    elif m < 0:
        s = _hash_slot(doc_nz, p, -m, t)
        c = doc_nz[p + 2 + 2 * s] - 1
        if c > 0:
            doc_nz[p + 2 + 2 * s] = c
        else:
            _hash_remove(doc_nz, p, -m, s)
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
    elif m < 0:
        s = _hash_slot(doc_nz, p, -m, t)
        doc_nz[p + 1 + 2 * s] = t
        doc_nz[p + 2 + 2 * s] += 1
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
