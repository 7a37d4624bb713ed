"""Collapsed Gibbs sampling kernels for LDA on word-major token blocks.

Data layout (fixed by the runtime)
----------------------------------
A worker holds its documents' tokens sorted by word id (word-major, as the
STRADS word rotation needs):

``token_word`` int32[n]
    global word id, sorted ascending.
``token_doc`` int32[n]
    local document index in ``[0, n_docs)``.
``token_topic`` int32[n]
    topic assignment z (mutated).
``doc_topic`` int32[n_docs, K]
    document-topic counts of the worker's documents (mutated).

In a round the worker samples the tokens ``[tok_lo, tok_hi)`` whose words lie
in the block ``[word_lo, word_hi)``.  It holds ``word_topic_block``
int32[word_hi - word_lo, K] (row ``i`` is word ``word_lo + i``) and
``topic_totals`` int64[K], a local copy of the global topic totals that the
caller re-syncs every round (the copy drifts within a round: the STRADS
supplement's s-error).  A sampler moves every reassigned token from its old
topic to its new one in all three count structures at once.

Per-document helper structures (built by :func:`build_doc_tokens` and
:func:`build_doc_nonzero`, shared by every sampler so samplers are
interchangeable at any time):

``doc_ptr`` int64[n_docs + 1]
    CSR offsets: document ``d`` owns slots ``doc_ptr[d]:doc_ptr[d + 1]``
    (its number of tokens on this worker) in the two arrays below.
``doc_tokens`` int32[n]
    token indices of each document (immutable; MH doc proposals).
``doc_nz_topics`` int32[n], ``doc_nz_count`` int32[n_docs]
    the topics with ``doc_topic[d, t] > 0`` in the first
    ``doc_nz_count[d]`` slots of document ``d`` (in no particular order),
    kept exact by every sampler through append / swap-remove.

Samplers (all with the signature documented in :func:`sample_block`)
---------------------------------------------------------------------
``"dense"``
    Plain O(K) conditional; the correctness reference and speed baseline.
``"sparse"``
    SparseLDA's s/r/q buckets (Yao, Mimno & McCallum, KDD 2009, the sampler
    STRADS used), with the roles of word and document swapped for the
    word-major order: the word bucket is cached across a word's tokens, the
    document bucket is summed over the document's non-zero topics.
``"fplus"``
    F+LDA word-by-word (Yu et al., WWW 2015; LDA* §3.1.1): the dense word
    part sits in an F+ (sum) tree over K, updated in O(log K) per count
    change, the document part runs over the document's non-zero topics.
``"mh"``
    Metropolis-Hastings in the LightLDA / WarpLDA family (LDA* §2.2, §3.1.2):
    alternating O(1) document proposals (a random token of the document)
    and O(log K) word proposals (drawn from the same F+ tree), ``MH_CYCLES``
    cycles per token.  Exact MH for each token given the others.

:func:`choose_sampler` returns the recommended one for K and the mean
document length (dense for K <= 40, F+LDA beyond), from the measurements
of ``jobs/bench_lda_kernel.py`` recorded in its docstring.

Equations (LDA* eq. 1; Griffiths & Steyvers 2004), with ``¬`` meaning the
token's own assignment removed from the counts::

    p(z = t | rest) ∝ (n_dt¬ + α) (n_wt¬ + β) / (n_t¬ + V β)

Kernels never validate their input; callers do.
"""

import math

import numpy as np
from numba import njit

from .random import STATE_SIZE, randint, seed_states, uniform

#: Metropolis-Hastings cycles (one document proposal + one word proposal
#: each) per token for the ``"mh"`` sampler; LDA*'s and WarpLDA's default.
MH_CYCLES = 2


# --------------------------------------------------------------------------
# Counts and helper structures
# --------------------------------------------------------------------------


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
    doc_ptr = np.zeros(n_docs + 1, dtype=np.int64)
    for i in range(n):
        doc_ptr[token_doc[i] + 1] += 1
    for d in range(n_docs):
        doc_ptr[d + 1] += doc_ptr[d]
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
    n_docs, n_topics = doc_topic.shape
    doc_nz_topics = np.zeros(doc_ptr[n_docs], dtype=np.int32)
    doc_nz_count = np.zeros(n_docs, dtype=np.int32)
    for d in range(n_docs):
        base = doc_ptr[d]
        count = 0
        for t in range(n_topics):
            if doc_topic[d, t] > 0:
                doc_nz_topics[base + count] = t
                count += 1
        doc_nz_count[d] = count
    return doc_nz_topics, doc_nz_count


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


# --------------------------------------------------------------------------
# F+ tree: a complete binary sum tree over K leaves (Yu et al., F+LDA)
# --------------------------------------------------------------------------


@njit(cache=True, nogil=True, inline="always")
def _tree_leaf_offset(n_topics):
    offset = 1
    while offset < n_topics:
        offset <<= 1
    return offset


@njit(cache=True, nogil=True, inline="always")
def _tree_rebuild(tree, offset):
    # Leaves live at tree[offset + t]; padding leaves are zero.
    for node in range(offset - 1, 0, -1):
        tree[node] = tree[2 * node] + tree[2 * node + 1]


@njit(cache=True, nogil=True, inline="always")
def _tree_set(tree, offset, t, value):
    # Recompute ancestors from their children (no accumulated rounding drift).
    node = offset + t
    tree[node] = value
    node >>= 1
    while node >= 1:
        tree[node] = tree[2 * node] + tree[2 * node + 1]
        node >>= 1


@njit(cache=True, nogil=True, inline="always")
def _tree_sample(tree, offset, n_topics, u):
    # Leaf t with prefix(t) <= u < prefix(t) + leaf(t), for u in [0, tree[1]).
    node = 1
    while node < offset:
        left = 2 * node
        if u < tree[left]:
            node = left
        else:
            u -= tree[left]
            node = left + 1
    t = node - offset
    if t >= n_topics:  # rounding walked into the zero padding
        t = n_topics - 1
    return t


@njit(cache=True, nogil=True, inline="always")
def _tree_depth(offset):
    depth = 0
    while (1 << depth) < offset:
        depth += 1
    return depth


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


@njit(cache=True, nogil=True, inline="always")
def _tree_switch_word(tree, offset, depth, row, beta, inv_denom,
                      word_nz_topics, word_nz_pos, word_nz_count):
    # The tree holds q_t = (n_wt + β) / (n_t + Vβ) for the current word.
    # Outside the word's non-zero topics a leaf is β / (n_t + Vβ), whatever
    # the word, so switching words only touches the leaves of the old and the
    # new word's non-zero topics: O((K_w_old + K_w_new) log K) instead of an
    # O(K) rebuild, which matters for the many rare words of a Zipf corpus.
    # Returns the new word's number of non-zero topics.
    n_topics = row.shape[0]
    full = word_nz_count * depth >= n_topics
    if not full:
        for j in range(word_nz_count):
            t = word_nz_topics[j]
            _tree_set(tree, offset, t, beta * inv_denom[t])
    count = _word_nz_scan(row, word_nz_topics, word_nz_pos, word_nz_count)
    if full or count * depth >= n_topics:
        for t in range(n_topics):
            tree[offset + t] = (row[t] + beta) * inv_denom[t]
        _tree_rebuild(tree, offset)
    else:
        for j in range(count):
            t = word_nz_topics[j]
            _tree_set(tree, offset, t, (row[t] + beta) * inv_denom[t])
    return count


# --------------------------------------------------------------------------
# Samplers
# --------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def sample_block_dense(
    token_word,
    token_doc,
    token_topic,
    tok_lo,
    tok_hi,
    word_lo,
    word_topic_block,
    topic_totals,
    doc_topic,
    doc_ptr,
    doc_tokens,
    doc_nz_topics,
    doc_nz_count,
    alpha,
    beta,
    vocab_size,
    rng_state,
):
    """Plain O(K) collapsed Gibbs sweep over tokens ``[tok_lo, tok_hi)``.

    The reference sampler.  Signature, arguments and return value as in
    :func:`sample_block`.
    """
    n_topics = topic_totals.shape[0]
    v_beta = vocab_size * beta
    cumulative = np.empty(n_topics, dtype=np.float64)
    n_changed = 0
    for i in range(tok_lo, tok_hi):
        w = token_word[i] - word_lo
        d = token_doc[i]
        old = token_topic[i]
        word_topic_block[w, old] -= 1
        topic_totals[old] -= 1
        _doc_decrement(doc_topic, d, old, doc_ptr, doc_nz_topics, doc_nz_count)
        # LDA* eq. 1: p(t) ∝ (n_dt¬ + α)(n_wt¬ + β) / (n_t¬ + Vβ)
        total = 0.0
        for t in range(n_topics):
            total += (
                (doc_topic[d, t] + alpha)
                * (word_topic_block[w, t] + beta)
                / (topic_totals[t] + v_beta)
            )
            cumulative[t] = total
        u = uniform(rng_state) * total
        new = 0
        while new < n_topics - 1 and cumulative[new] <= u:
            new += 1
        word_topic_block[w, new] += 1
        topic_totals[new] += 1
        _doc_increment(doc_topic, d, new, doc_ptr, doc_nz_topics, doc_nz_count)
        token_topic[i] = new
        if new != old:
            n_changed += 1
    return n_changed


@njit(cache=True, nogil=True)
def sample_block_sparse(
    token_word,
    token_doc,
    token_topic,
    tok_lo,
    tok_hi,
    word_lo,
    word_topic_block,
    topic_totals,
    doc_topic,
    doc_ptr,
    doc_tokens,
    doc_nz_topics,
    doc_nz_count,
    alpha,
    beta,
    vocab_size,
    rng_state,
):
    """SparseLDA bucket sweep, adapted to word-major order.

    Yao, Mimno & McCallum (2009) eq. 2-4, with word and document swapped::

        p(t) ∝ αβ/(n_t+Vβ)              s: all K, sum kept up to date
             + α n_wt/(n_t+Vβ)          q: the word's non-zero topics, sum
                                           cached across the word's tokens
             + n_dt (n_wt+β)/(n_t+Vβ)   r: the document's non-zero topics,
                                           summed per token in O(K_d)

    O(K) per distinct word (a scan of the row for non-zeros), O(K_d) per
    token, plus O(K_w) or O(K) in the rare draws that land in q or s.
    Signature, arguments and return value as in :func:`sample_block`.
    """
    n_topics = topic_totals.shape[0]
    v_beta = vocab_size * beta
    alpha_beta = alpha * beta
    inv_denom = np.empty(n_topics, dtype=np.float64)  # 1 / (n_t + Vβ)
    for t in range(n_topics):
        inv_denom[t] = 1.0 / (topic_totals[t] + v_beta)
    word_nz_topics = np.empty(n_topics, dtype=np.int32)
    word_nz_pos = np.full(n_topics, -1, dtype=np.int32)
    word_nz_count = 0
    doc_cumulative = np.empty(n_topics, dtype=np.float64)
    s_mass = 0.0
    for t in range(n_topics):
        s_mass += inv_denom[t]
    s_mass *= alpha_beta
    since_refresh = 0
    q_mass = 0.0
    current_word = -1
    n_changed = 0
    for i in range(tok_lo, tok_hi):
        w = token_word[i] - word_lo
        if w != current_word:
            # New word: rescan its non-zero list and recompute the q sum.
            current_word = w
            word_nz_count = _word_nz_scan(word_topic_block[w], word_nz_topics,
                                          word_nz_pos, word_nz_count)
            q_mass = 0.0
            for j in range(word_nz_count):
                t = word_nz_topics[j]
                q_mass += word_topic_block[w, t] * inv_denom[t]
            q_mass *= alpha
            if since_refresh >= n_topics:
                # s is updated incrementally; recompute it from scratch
                # every >= K tokens (amortised O(1)) to drop rounding drift.
                since_refresh = 0
                s_mass = 0.0
                for t in range(n_topics):
                    s_mass += inv_denom[t]
                s_mass *= alpha_beta
        since_refresh += 1
        d = token_doc[i]
        old = token_topic[i]

        # Remove the token: take topic `old` out of s and q, change its
        # counts, put it back.
        c = word_topic_block[w, old]
        s_mass -= alpha_beta * inv_denom[old]
        q_mass -= alpha * c * inv_denom[old]
        c -= 1
        word_topic_block[w, old] = c
        topic_totals[old] -= 1
        inv_denom[old] = 1.0 / (topic_totals[old] + v_beta)
        s_mass += alpha_beta * inv_denom[old]
        q_mass += alpha * c * inv_denom[old]
        if c == 0:
            word_nz_count = _word_nz_remove(word_nz_topics, word_nz_pos, word_nz_count, old)
        _doc_decrement(doc_topic, d, old, doc_ptr, doc_nz_topics, doc_nz_count)

        # r bucket over the document's non-zero topics.
        base = doc_ptr[d]
        n_nz = doc_nz_count[d]
        r_mass = 0.0
        for j in range(n_nz):
            t = doc_nz_topics[base + j]
            r_mass += doc_topic[d, t] * (word_topic_block[w, t] + beta) * inv_denom[t]
            doc_cumulative[j] = r_mass
        if q_mass < 0.0:  # rounding guard; the true value is >= 0
            q_mass = 0.0
        u = uniform(rng_state) * (r_mass + q_mass + s_mass)
        if u < r_mass:
            j = 0
            while j < n_nz - 1 and doc_cumulative[j] <= u:
                j += 1
            new = doc_nz_topics[base + j]
        elif u < r_mass + q_mass and word_nz_count > 0:
            u = (u - r_mass) / alpha
            new = word_nz_topics[word_nz_count - 1]
            acc = 0.0
            for j in range(word_nz_count):
                t = word_nz_topics[j]
                acc += word_topic_block[w, t] * inv_denom[t]
                if u < acc:
                    new = t
                    break
        else:
            u = (u - r_mass - q_mass) / alpha_beta
            new = n_topics - 1
            acc = 0.0
            for t in range(n_topics):
                acc += inv_denom[t]
                if u < acc:
                    new = t
                    break

        # Add the token to topic `new`.
        c = word_topic_block[w, new]
        s_mass -= alpha_beta * inv_denom[new]
        q_mass -= alpha * c * inv_denom[new]
        c += 1
        word_topic_block[w, new] = c
        topic_totals[new] += 1
        inv_denom[new] = 1.0 / (topic_totals[new] + v_beta)
        s_mass += alpha_beta * inv_denom[new]
        q_mass += alpha * c * inv_denom[new]
        if c == 1:
            word_nz_count = _word_nz_add(word_nz_topics, word_nz_pos, word_nz_count, new)
        _doc_increment(doc_topic, d, new, doc_ptr, doc_nz_topics, doc_nz_count)
        token_topic[i] = new
        if new != old:
            n_changed += 1
    return n_changed


@njit(cache=True, nogil=True)
def sample_block_fplus(
    token_word,
    token_doc,
    token_topic,
    tok_lo,
    tok_hi,
    word_lo,
    word_topic_block,
    topic_totals,
    doc_topic,
    doc_ptr,
    doc_tokens,
    doc_nz_topics,
    doc_nz_count,
    alpha,
    beta,
    vocab_size,
    rng_state,
):
    """F+LDA word-by-word sweep (Yu et al. 2015; LDA* §3.1.1).

    With ``q_t = (n_wt + β) / (n_t + Vβ)`` kept in an F+ tree for the
    current word::

        p(t) ∝ α q_t          (tree: total in O(1), draw in O(log K))
             + n_dt q_t       (the document's non-zero topics, O(K_d))

    Each count change updates one leaf in O(log K).  When the word changes
    only the leaves of the old and new word's non-zero topics change
    (O((K_w + K_w') log K), or an O(K) rebuild if that is cheaper), after
    an O(K) scan of the new row.  Signature, arguments and return value as in
    :func:`sample_block`.
    """
    n_topics = topic_totals.shape[0]
    v_beta = vocab_size * beta
    offset = _tree_leaf_offset(n_topics)
    depth = _tree_depth(offset)
    tree = np.zeros(2 * offset, dtype=np.float64)
    inv_denom = np.empty(n_topics, dtype=np.float64)  # 1 / (n_t + Vβ)
    for t in range(n_topics):
        inv_denom[t] = 1.0 / (topic_totals[t] + v_beta)
        tree[offset + t] = beta * inv_denom[t]  # no current word yet
    _tree_rebuild(tree, offset)
    word_nz_topics = np.empty(n_topics, dtype=np.int32)
    word_nz_pos = np.full(n_topics, -1, dtype=np.int32)
    word_nz_count = 0
    doc_cumulative = np.empty(n_topics, dtype=np.float64)
    current_word = -1
    n_changed = 0
    for i in range(tok_lo, tok_hi):
        w = token_word[i] - word_lo
        if w != current_word:
            current_word = w
            word_nz_count = _tree_switch_word(
                tree, offset, depth, word_topic_block[w], beta, inv_denom,
                word_nz_topics, word_nz_pos, word_nz_count)
        d = token_doc[i]
        old = token_topic[i]

        c = word_topic_block[w, old] - 1
        word_topic_block[w, old] = c
        if c == 0:
            word_nz_count = _word_nz_remove(word_nz_topics, word_nz_pos, word_nz_count, old)
        topic_totals[old] -= 1
        inv_denom[old] = 1.0 / (topic_totals[old] + v_beta)
        _tree_set(tree, offset, old, (c + beta) * inv_denom[old])
        _doc_decrement(doc_topic, d, old, doc_ptr, doc_nz_topics, doc_nz_count)

        # Document part: sum over non-zero n_dt of n_dt * q_t (q_t = leaf).
        base = doc_ptr[d]
        n_nz = doc_nz_count[d]
        doc_mass = 0.0
        for j in range(n_nz):
            t = doc_nz_topics[base + j]
            doc_mass += doc_topic[d, t] * tree[offset + t]
            doc_cumulative[j] = doc_mass
        u = uniform(rng_state) * (doc_mass + alpha * tree[1])
        if u < doc_mass:
            j = 0
            while j < n_nz - 1 and doc_cumulative[j] <= u:
                j += 1
            new = doc_nz_topics[base + j]
        else:
            new = _tree_sample(tree, offset, n_topics, (u - doc_mass) / alpha)

        c = word_topic_block[w, new] + 1
        word_topic_block[w, new] = c
        if c == 1:
            word_nz_count = _word_nz_add(word_nz_topics, word_nz_pos, word_nz_count, new)
        topic_totals[new] += 1
        inv_denom[new] = 1.0 / (topic_totals[new] + v_beta)
        _tree_set(tree, offset, new, (c + beta) * inv_denom[new])
        _doc_increment(doc_topic, d, new, doc_ptr, doc_nz_topics, doc_nz_count)
        token_topic[i] = new
        if new != old:
            n_changed += 1
    return n_changed


@njit(cache=True, nogil=True)
def sample_block_mh(
    token_word,
    token_doc,
    token_topic,
    tok_lo,
    tok_hi,
    word_lo,
    word_topic_block,
    topic_totals,
    doc_topic,
    doc_ptr,
    doc_tokens,
    doc_nz_topics,
    doc_nz_count,
    alpha,
    beta,
    vocab_size,
    rng_state,
):
    """Metropolis-Hastings sweep with cycling doc / word proposals.

    LightLDA's cycle proposal (Yuan et al. 2015; LDA* §2.2 Algorithm 1,
    §3.1.2), for a token with current state ``x`` and counts ``¬``
    excluding the token:

    * document proposal ``q(t | x) ∝ n_dt¬ + [t = x] + α``, drawn in O(1)
      by taking the topic of a random token of the document (or a uniform
      topic with probability ``Kα / (L_d + Kα)``); acceptance
      ``min(1, q_w(t) / q_w(x))``;
    * word proposal ``q_w(t) ∝ (n_wt¬ + β) / (n_t¬ + Vβ)``, drawn in
      O(log K) from an F+ tree that is always current; acceptance
      ``min(1, (n_dt¬ + α) / (n_dx¬ + α))``.

    Both are exact MH steps for the token's conditional (no stale tables).
    ``MH_CYCLES`` cycles per token; cost O(log K) per token, independent of
    the document's number of topics.  Signature, arguments and return value
    as in :func:`sample_block`.
    """
    n_topics = topic_totals.shape[0]
    v_beta = vocab_size * beta
    k_alpha = n_topics * alpha
    offset = _tree_leaf_offset(n_topics)
    depth = _tree_depth(offset)
    tree = np.zeros(2 * offset, dtype=np.float64)
    inv_denom = np.empty(n_topics, dtype=np.float64)  # 1 / (n_t + Vβ)
    for t in range(n_topics):
        inv_denom[t] = 1.0 / (topic_totals[t] + v_beta)
        tree[offset + t] = beta * inv_denom[t]  # no current word yet
    _tree_rebuild(tree, offset)
    word_nz_topics = np.empty(n_topics, dtype=np.int32)
    word_nz_pos = np.full(n_topics, -1, dtype=np.int32)
    word_nz_count = 0
    current_word = -1
    n_changed = 0
    for i in range(tok_lo, tok_hi):
        w = token_word[i] - word_lo
        if w != current_word:
            current_word = w
            word_nz_count = _tree_switch_word(
                tree, offset, depth, word_topic_block[w], beta, inv_denom,
                word_nz_topics, word_nz_pos, word_nz_count)
        d = token_doc[i]
        old = token_topic[i]

        c = word_topic_block[w, old] - 1
        word_topic_block[w, old] = c
        if c == 0:
            word_nz_count = _word_nz_remove(word_nz_topics, word_nz_pos, word_nz_count, old)
        topic_totals[old] -= 1
        inv_denom[old] = 1.0 / (topic_totals[old] + v_beta)
        _tree_set(tree, offset, old, (c + beta) * inv_denom[old])
        _doc_decrement(doc_topic, d, old, doc_ptr, doc_nz_topics, doc_nz_count)

        base = doc_ptr[d]
        doc_len = doc_ptr[d + 1] - base  # includes this token
        state = old
        for _ in range(MH_CYCLES):
            # Document proposal.
            u = uniform(rng_state) * (doc_len + k_alpha)
            if u < doc_len:
                j = doc_tokens[base + np.int64(u)]
                cand = state if j == i else token_topic[j]
            else:
                cand = np.int64((u - doc_len) / alpha)
                if cand >= n_topics:
                    cand = n_topics - 1
            if cand != state:
                ratio = tree[offset + cand] / tree[offset + state]
                if ratio >= 1.0 or uniform(rng_state) < ratio:
                    state = cand
            # Word proposal.
            cand = _tree_sample(tree, offset, n_topics, uniform(rng_state) * tree[1])
            if cand != state:
                ratio = (doc_topic[d, cand] + alpha) / (doc_topic[d, state] + alpha)
                if ratio >= 1.0 or uniform(rng_state) < ratio:
                    state = cand
        new = state

        c = word_topic_block[w, new] + 1
        word_topic_block[w, new] = c
        if c == 1:
            word_nz_count = _word_nz_add(word_nz_topics, word_nz_pos, word_nz_count, new)
        topic_totals[new] += 1
        inv_denom[new] = 1.0 / (topic_totals[new] + v_beta)
        _tree_set(tree, offset, new, (c + beta) * inv_denom[new])
        _doc_increment(doc_topic, d, new, doc_ptr, doc_nz_topics, doc_nz_count)
        token_topic[i] = new
        if new != old:
            n_changed += 1
    return n_changed


#: Sampler name -> kernel; every kernel has the signature of :func:`sample_block`.
SAMPLERS = {
    "dense": sample_block_dense,
    "sparse": sample_block_sparse,
    "fplus": sample_block_fplus,
    "mh": sample_block_mh,
}


def get_sampler(name):
    """Return the kernel registered under ``name`` (one of ``SAMPLERS``).

    Raises
    ------
    ValueError
        If ``name`` is not a known sampler; the message lists the names.
    """
    try:
        return SAMPLERS[name]
    except KeyError:
        raise ValueError(
            f"unknown LDA sampler {name!r}; choose one of {sorted(SAMPLERS)}"
        ) from None


def sample_block(
    sampler,
    token_word,
    token_doc,
    token_topic,
    tok_lo,
    tok_hi,
    word_lo,
    word_topic_block,
    topic_totals,
    doc_topic,
    doc_ptr,
    doc_tokens,
    doc_nz_topics,
    doc_nz_count,
    alpha,
    beta,
    vocab_size,
    rng_state,
):
    """Resample the topics of tokens ``[tok_lo, tok_hi)`` with a named sampler.

    Every kernel in ``SAMPLERS`` takes exactly the arguments after
    ``sampler``, in this order; call ``get_sampler(name)`` once and call
    the kernel directly in a loop to skip the lookup.

    Parameters
    ----------
    sampler : {"dense", "sparse", "fplus", "mh"}
    token_word : ndarray of int32, shape (n,)
        Global word id per token, sorted ascending (only efficiency depends
        on the order: per-word structures are rebuilt when the word changes).
    token_doc : ndarray of int32, shape (n,)
        Local document index per token, in ``[0, n_docs)``.
    token_topic : ndarray of int32, shape (n,)
        Topic per token; entries ``[tok_lo, tok_hi)`` are resampled in place.
    tok_lo, tok_hi : int
        Token range whose words all lie in ``[word_lo, word_lo + B)``.
    word_lo : int
        First word id of the block.
    word_topic_block : ndarray of int32, shape (B, K)
        Word-topic counts of the block's words (row ``i`` = word
        ``word_lo + i``); updated in place.
    topic_totals : ndarray of int64, shape (K,)
        Local copy of the global topic totals; updated in place.
    doc_topic : ndarray of int32, shape (n_docs, K)
        Document-topic counts; updated in place.
    doc_ptr : ndarray of int64, shape (n_docs + 1,)
    doc_tokens : ndarray of int32, shape (n,)
        From :func:`build_doc_tokens` (read only).
    doc_nz_topics : ndarray of int32, shape (n,)
    doc_nz_count : ndarray of int32, shape (n_docs,)
        From :func:`build_doc_nonzero`; kept exact in place.
    alpha, beta : float
        Symmetric Dirichlet concentrations (document-topic, topic-word).
    vocab_size : int
        V, the global vocabulary size (normaliser ``n_t + Vβ``).
    rng_state : ndarray of uint64, shape (4,)
        From :func:`pystrads.kernels.random.new_state`; advanced in place.

    Returns
    -------
    int
        Number of tokens whose topic changed.
    """
    return get_sampler(sampler)(
        token_word,
        token_doc,
        token_topic,
        tok_lo,
        tok_hi,
        word_lo,
        word_topic_block,
        topic_totals,
        doc_topic,
        doc_ptr,
        doc_tokens,
        doc_nz_topics,
        doc_nz_count,
        alpha,
        beta,
        vocab_size,
        rng_state,
    )


def choose_sampler(n_topics, mean_doc_len):
    """Return the name of the recommended sampler for K and the mean doc length.

    ``"dense"`` when K <= 40, or K <= 60 with documents of 500+ tokens;
    ``"fplus"`` otherwise.  ``"mh"`` is never the default (see below).

    Parameters
    ----------
    n_topics : int
        K.
    mean_doc_len : float
        Mean tokens per document.

    Returns
    -------
    str
        A key of ``SAMPLERS``.

    Notes
    -----
    Measured with ``jobs/bench_lda_kernel.py`` on one core of the 2-core
    development VM (AMD EPYC, shared with other work, so +-20 %): 200 000
    tokens, V = 20 000 Zipf words, alpha = 50/K, beta = 0.01, two word
    blocks, one sweep after 10 F+LDA burn-in sweeps, median of 3 runs
    (K = 60: median of 7 interleaved runs).  Million tokens/s/core:

    ==============  =====  =====  ======  =====  ====
    mean doc len    K      dense  sparse  fplus  mh
    ==============  =====  =====  ======  =====  ====
    50              20     15.9   11.3    10.1   5.9
    50              60      6.8    7.6     8.1   5.2
    50              100     4.8    7.3     6.5   4.8
    50              1000    0.50   2.9     3.1   2.3
    1000            20     16.5   11.2    10.8   7.0
    1000            60      8.2    7.3     7.0   6.9
    1000            100     5.5    5.9     5.5   6.6
    1000            1000    0.58   3.7     2.4   2.7
    ==============  =====  =====  ======  =====  ====

    The dense loop wins while K is small (no bookkeeping); beyond that the
    sparse samplers win and their cost follows K_d, not K.  ``sparse`` and
    ``fplus`` are within noise of each other in interleaved A/B runs;
    ``fplus`` is the default because its dense bucket is drawn in O(log K)
    (with alpha = 1, K = 1000 it ran 2.2 vs 1.7 M tokens/s).  All three
    Gibbs samplers reach the same log-likelihood per sweep.  ``mh``
    (2 cycles per token) gains less per sweep: from a random start it
    needed 1.2-2.6x more time than ``fplus`` to reach the log-likelihood
    of its own 15th sweep in every cell above; only with 5000-token documents
    and K = 4000 did it reach early levels 2x sooner, and ``fplus``
    overtook it by its 6th sweep.  LDA* (§3.2, K > 600 and L_d > 600 for
    WarpLDA) puts the crossover lower than we measure; re-measure for
    larger K before making ``mh`` a default.
    """
    if n_topics <= 40 or (n_topics <= 60 and mean_doc_len >= 500):
        return "dense"
    return "fplus"


# --------------------------------------------------------------------------
# Log-likelihood log p(w, z) in parts that add up across workers and shards
# --------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def doc_log_likelihood(doc_topic, doc_lengths, alpha):
    """Document part of log p(w, z): log p(z | α) for a worker's documents.

    ``Σ_d [lgamma(Kα) - lgamma(L_d + Kα) + Σ_t (lgamma(n_dt + α) - lgamma(α))]``
    (Griffiths & Steyvers 2004, eq. 3).  Sums over workers add up.

    Parameters
    ----------
    doc_topic : ndarray of int, shape (n_docs, K)
    doc_lengths : ndarray of int, shape (n_docs,)
        Tokens per document (the row sums of ``doc_topic``).
    alpha : float

    Returns
    -------
    float
    """
    n_docs, n_topics = doc_topic.shape
    k_alpha = n_topics * alpha
    lgamma_alpha = math.lgamma(alpha)
    lgamma_k_alpha = math.lgamma(k_alpha)
    ll = 0.0
    for d in range(n_docs):
        ll += lgamma_k_alpha - math.lgamma(doc_lengths[d] + k_alpha)
        for t in range(n_topics):
            count = doc_topic[d, t]
            if count > 0:
                ll += math.lgamma(count + alpha) - lgamma_alpha
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
    n_rows, n_topics = word_topic_rows.shape
    lgamma_beta = math.lgamma(beta)
    ll = 0.0
    for w in range(n_rows):
        for t in range(n_topics):
            count = word_topic_rows[w, t]
            if count > 0:
                ll += math.lgamma(count + beta) - lgamma_beta
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
    word_topic, topic_totals, doc_topic, doc_lengths, alpha, beta, vocab_size
):
    """Return log p(w, z | α, β) for the whole model.

    The sum of :func:`doc_log_likelihood` (per worker),
    :func:`word_log_likelihood_rows` (per shard) and
    :func:`topic_totals_log_likelihood` (once).

    Parameters
    ----------
    word_topic : ndarray of int32 or int64, shape (V or n_rows, K)
    topic_totals : ndarray of int, shape (K,)
    doc_topic : ndarray of int, shape (n_docs, K)
    doc_lengths : ndarray of int, shape (n_docs,)
    alpha, beta : float
    vocab_size : int

    Returns
    -------
    float
    """
    return (
        doc_log_likelihood(doc_topic, doc_lengths, alpha)
        + word_log_likelihood_rows(word_topic, beta)
        + topic_totals_log_likelihood(topic_totals, beta, vocab_size)
    )


# --------------------------------------------------------------------------
# Held-out documents: fold-in with fixed topics, document completion
# --------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def _fold_in_run(doc_words, doc_ptr, topic_word_prob, alpha, n_iter, n_burn,
                 rng_states, doc_topic, doc_topic_sum):
    # Gibbs with fixed φ: p(z = t) ∝ (n_dt¬ + α) φ[w, t].  The first pass
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
                    total += (doc_topic[d, t] + alpha) * topic_word_prob[w, t]
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
    ``p(z = t) ∝ (n_dt¬ + α) φ[w, t]``, ``n_iter`` sweeps, the first one
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
    alpha : float
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
    return _fold_in(doc_words, doc_ptr, topic_word_prob, alpha, n_iter, _as_states(rng_state))


@njit(cache=True, nogil=True)
def _fold_in(doc_words, doc_ptr, topic_word_prob, alpha, n_iter, rng_states):
    n_docs = doc_ptr.shape[0] - 1
    n_topics = topic_word_prob.shape[1]
    doc_topic = np.zeros((n_docs, n_topics), dtype=np.int32)
    doc_topic_sum = np.zeros((n_docs, n_topics), dtype=np.float64)
    _fold_in_run(doc_words, doc_ptr, topic_word_prob, alpha, n_iter, n_iter,
                 rng_states, doc_topic, doc_topic_sum)
    return doc_topic


def document_completion_log_likelihood(doc_words, doc_ptr, topic_word_prob, alpha, n_iter, rng_state):
    """Document-completion log-likelihood of held-out documents.

    For each document, θ_d is estimated by fold-in on its first
    ``L_d // 2`` tokens (counts averaged over the last ``n_iter - n_iter // 2``
    sweeps, ``θ_dt = (n̄_dt + α) / (L_d // 2 + Kα)``) and the remaining
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
    return _completion(doc_words, doc_ptr, topic_word_prob, alpha, n_iter, _as_states(rng_state))


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
    theta = np.empty(n_topics, dtype=np.float64)
    log_lik = 0.0
    n_scored = 0
    for d in range(n_docs):
        n_est = est_ptr[d + 1] - est_ptr[d]
        norm = 1.0 / (n_est + n_topics * alpha)
        for t in range(n_topics):
            theta[t] = (doc_topic_sum[d, t] / n_kept + alpha) * norm
        for i in range(doc_ptr[d] + n_est, doc_ptr[d + 1]):
            w = doc_words[i]
            p = 0.0
            for t in range(n_topics):
                p += theta[t] * topic_word_prob[w, t]
            log_lik += math.log(p)
            n_scored += 1
    return log_lik, n_scored
