"""A run's word-topic rows as their non-zeros, with room for the run's changes.

The samplers that cost O(1) per token (``"alias"``) must not cost O(K) per
word either: at K = 10,000 a dense block of the run's rows, filled from the
shards' entries and diffed against them afterwards, costs more than sampling
every token of a typical word.  A *row store* keeps each row as its
``(topic, count)`` pairs instead, in slots sized so that a sweep never has to
move a row: a token adds at most one topic to its word's row, so row ``r``
gets ``min(K, nnz_r + tokens_r)`` slots, and the store's size follows the
run's non-zeros and tokens, never V x K.

Layout (the four arrays of :func:`row_store`, passed to the samplers as they
are)::

    ptr     int64[n + 1]   row r owns the slots ptr[r]:ptr[r + 1]
    used    int64[n]       its first used[r] slots hold its entries
    topics  int32[slots]   each used slot's topic (a topic has one slot in its row)
    counts  int32[slots]   and its count (>= 0: a count that falls to 0 keeps
                           its slot until the store is turned back into entries)

Entries in and out are CSR ``(offsets int64, cols int32, vals)`` with the
columns ascending in each row, as the shards send and take them
(:meth:`pystrads.ps.client.TableHandle.read_entries` / ``add``).
"""

import numpy as np
from numba import njit

from ..rows import grow_pair


@njit(cache=True, nogil=True)
def row_store(offsets, cols, vals, row_tokens, n_topics):
    """The store of ``n`` rows given as CSR entries, with room for ``row_tokens[r]`` more topics in
    row ``r`` (its tokens in the sweep): ``(ptr, used, topics, counts)``."""
    n = offsets.shape[0] - 1
    ptr = np.empty(n + 1, dtype=np.int64)
    ptr[0] = 0
    for r in range(n):
        nnz = offsets[r + 1] - offsets[r]
        ptr[r + 1] = ptr[r] + min(n_topics, nnz + row_tokens[r])
    used = np.empty(n, dtype=np.int64)
    topics = np.empty(ptr[n], dtype=np.int32)
    counts = np.empty(ptr[n], dtype=np.int32)
    for r in range(n):
        s = ptr[r]
        m = 0
        for k in range(offsets[r], offsets[r + 1]):
            if vals[k] != 0:
                topics[s + m] = cols[k]
                counts[s + m] = vals[k]
                m += 1
        used[r] = m
    return ptr, used, topics, counts


@njit(cache=True, nogil=True)
def row_store_entries(ptr, used, topics, counts):
    """The store's rows as CSR entries: their non-zero counts, topics ascending."""
    n = used.shape[0]
    offsets = np.empty(n + 1, dtype=np.int64)
    offsets[0] = 0
    total = 0
    for r in range(n):
        for s in range(ptr[r], ptr[r] + used[r]):
            total += counts[s] != 0
    cols = np.empty(total, dtype=np.int32)
    vals = np.empty(total, dtype=np.int32)
    k = 0
    for r in range(n):
        lo = k
        for s in range(ptr[r], ptr[r] + used[r]):
            if counts[s] != 0:
                cols[k] = topics[s]
                vals[k] = counts[s]
                k += 1
        if k - lo > 1:
            order = np.argsort(cols[lo:k])
            cols[lo:k] = cols[lo:k][order]
            vals[lo:k] = vals[lo:k][order]
        offsets[r + 1] = k
    return offsets, cols, vals


@njit(cache=True, nogil=True)
def row_store_delta(ptr, used, topics, counts, offsets, cols, vals, n_topics):
    """What changed in the store since its rows were the CSR entries ``(offsets, cols, vals)``:
    ``(rows int64, d_offsets int64, d_cols int32, d_vals)``, the changed rows (ascending) and the
    store's counts minus the entries' as their non-zeros, topics ascending (a sparse write's
    arguments).  O(non-zeros of both) per row: the rows' old entries are scattered into a
    K-long scratch row, the store's counts added, and only their topics visited."""
    n = used.shape[0]
    d_rows = np.empty(n, dtype=np.int64)
    d_offsets = np.zeros(n + 1, dtype=np.int64)
    cap = max(16, offsets[n] - offsets[0])
    d_cols = np.empty(cap, dtype=np.int32)
    d_vals = np.empty(cap, dtype=vals.dtype)
    diff = np.zeros(n_topics, dtype=np.int64)
    mark = np.zeros(n_topics, dtype=np.bool_)
    seen = np.empty(n_topics, dtype=np.int32)
    m = 0
    k_out = 0
    for r in range(n):
        n_seen = 0
        for k in range(offsets[r], offsets[r + 1]):
            t = cols[k]
            diff[t] -= vals[k]
            if not mark[t]:
                mark[t] = True
                seen[n_seen] = t
                n_seen += 1
        for s in range(ptr[r], ptr[r] + used[r]):
            t = topics[s]
            diff[t] += counts[s]
            if not mark[t]:
                mark[t] = True
                seen[n_seen] = t
                n_seen += 1
        changed = 0
        for j in range(n_seen):
            changed += diff[seen[j]] != 0
        if changed:
            if k_out + changed > d_cols.shape[0]:
                d_cols, d_vals = grow_pair(d_cols, d_vals, k_out, max(2 * d_cols.shape[0], k_out + changed))
            part = np.sort(seen[:n_seen])
            for j in range(n_seen):
                t = part[j]
                if diff[t] != 0:
                    d_cols[k_out] = t
                    d_vals[k_out] = diff[t]
                    k_out += 1
            d_rows[m] = r
            m += 1
            d_offsets[m] = k_out
        for j in range(n_seen):
            t = seen[j]
            diff[t] = 0
            mark[t] = False
    return d_rows[:m].copy(), d_offsets[:m + 1].copy(), d_cols[:k_out].copy(), d_vals[:k_out].copy()


@njit(cache=True, nogil=True)
def run_row_tokens(token_row, tok_lo, tok_hi, row_lo, n_rows):
    """How many of the tokens ``[tok_lo, tok_hi)`` each row ``row_lo + r`` has (a store's room)."""
    out = np.zeros(n_rows, dtype=np.int64)
    for i in range(tok_lo, tok_hi):
        out[token_row[i] - row_lo] += 1
    return out


@njit(cache=True, nogil=True)
def count_word_topic_entries(token_row, token_topic, tok_lo, tok_hi, row_lo, n_rows, n_topics):
    """The word-topic counts of the tokens ``[tok_lo, tok_hi)`` (rows ``row_lo + r``, any order) as
    CSR entries ``(offsets, cols, vals)`` over the ``n_rows`` rows, topics ascending: the
    initial counts of a run without a dense ``n_rows x K`` block."""
    n = tok_hi - tok_lo
    start = np.zeros(n_rows + 1, dtype=np.int64)
    for i in range(tok_lo, tok_hi):
        start[token_row[i] - row_lo + 1] += 1
    for r in range(n_rows):
        start[r + 1] += start[r]
    fill = start[:n_rows].copy()
    by_row = np.empty(n, dtype=np.int32)
    for i in range(tok_lo, tok_hi):
        r = token_row[i] - row_lo
        by_row[fill[r]] = token_topic[i]
        fill[r] += 1
    offsets = np.zeros(n_rows + 1, dtype=np.int64)
    cols = np.empty(n, dtype=np.int32)
    vals = np.empty(n, dtype=np.int32)
    k = 0
    for r in range(n_rows):
        part = np.sort(by_row[start[r]:start[r + 1]])
        j = 0
        while j < part.shape[0]:
            t = part[j]
            c = 0
            while j < part.shape[0] and part[j] == t:
                c += 1
                j += 1
            cols[k] = t
            vals[k] = c
            k += 1
        offsets[r + 1] = k
    return offsets, cols[:k].copy(), vals[:k].copy()


@njit(cache=True, nogil=True)
def block_row_store(word_topic_block, token_row, tok_lo, tok_hi, row_lo):
    """The store of the block rows that tokens ``[tok_lo, tok_hi)`` touch (other rows: no slots),
    for running a store sampler on a dense block."""
    n, n_topics = word_topic_block.shape
    tokens = run_row_tokens(token_row, tok_lo, tok_hi, row_lo, n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    for r in range(n):
        c = 0
        if tokens[r]:
            for t in range(n_topics):
                c += word_topic_block[r, t] != 0
        offsets[r + 1] = offsets[r] + c
    cols = np.empty(offsets[n], dtype=np.int32)
    vals = np.empty(offsets[n], dtype=np.int32)
    for r in range(n):
        if tokens[r]:
            k = offsets[r]
            for t in range(n_topics):
                if word_topic_block[r, t] != 0:
                    cols[k] = t
                    vals[k] = word_topic_block[r, t]
                    k += 1
    return row_store(offsets, cols, vals, tokens, n_topics)


@njit(cache=True, nogil=True)
def store_into_block(ptr, used, topics, counts, word_topic_block):
    """Write the store's rows back into the dense block (rows with slots only)."""
    for r in range(used.shape[0]):
        if ptr[r + 1] > ptr[r]:
            for s in range(ptr[r], ptr[r] + used[r]):
                word_topic_block[r, topics[s]] = counts[s]
