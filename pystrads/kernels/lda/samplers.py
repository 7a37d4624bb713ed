"""The LDA samplers, their registry and the choice among them.

``sample_block_dense``, ``sample_block_sparse``, ``sample_block_fplus`` and
``sample_block_mh`` (one signature, documented in :func:`sample_block`; the
algorithms and the data layout in :mod:`pystrads.kernels.lda`), the
``SAMPLERS`` registry (which also holds :func:`~.alias.sample_block_alias`,
defined in :mod:`.alias`) with :func:`get_sampler` and :func:`sample_block`,
and :func:`choose_sampler`, the default for K and the document length, with
the measurements behind it.
"""

import numpy as np
from numba import njit

from ..random import uniform
from .alias import sample_block_alias, sample_rows_alias
from .fplus_rows import sample_rows_fplus
from .rowstore import block_row_store, store_into_block
from .counts import (TABLE_LAYOUT, _doc_count, _doc_decrement, _doc_entry, _doc_increment, _doc_nonzero, drop_doc_lists,
                     keep_doc_lists,
                     _word_nz_add, _word_nz_remove, _word_nz_scan)
from .fplus_tree import _tree_depth, _tree_leaf_offset, _tree_rebuild, _tree_sample, _tree_set, _tree_switch_word

#: ``choose_sampler`` picks the dense sampler up to this many topics (the measured crossover).
DENSE_MAX_TOPICS = 600
#: ``choose_sampler`` picks the ``"alias"`` sampler from this many topics on (measured: see there).
ALIAS_MIN_TOPICS = 50_000
#: The LDA program gives the samplers that read counts by topic (dense, MH, alias) the table layout
#: of ``DocCounts`` while the table takes at most this many bytes on a worker (see doc_counts_layout).
TABLE_MAX_BYTES = 256 << 20
#: Topics per block of the dense sampler's two-level search (8 float32: one AVX2 register).
DENSE_BLOCK = 8


@njit(cache=True, nogil=True, fastmath=True)
def sample_block_dense(token_word, token_doc, token_topic, tok_lo, tok_hi, word_lo,
                       word_topic_block, topic_totals, doc_nz_ptr, doc_nz, doc_ptr,
                       doc_tokens, alpha, beta, vocab_size, rng_state):
    """O(K) collapsed Gibbs sweep over tokens ``[tok_lo, tok_hi)``, written for SIMD.

    The conditional (LDA* eq. 1) as ``p_t = (n_dt¬ + α_t) q_t`` with
    ``q_t = (n_wt¬ + β) / (n_t¬ + Vβ)`` kept for the current word: rebuilt in
    O(K) when the word changes, two entries per token otherwise (the word-major
    order sweeps a word's tokens together).  Per token, one vectorised pass
    computes the weights ``(n_dt + α_t) q_t`` (float32) and their total (for a
    document in the sparse form of :class:`DocCounts`, ``α_t q_t`` and then
    ``n_dt q_t`` over its non-zero topics); the draw then walks block sums of
    ``DENSE_BLOCK`` topics and searches within one block.  On the table
    layout of :class:`DocCounts` (built for this sampler) a document's row is
    found without a lookup and nothing else is kept; on the default layout a
    document in the dense form has only its counts updated per token: this
    sampler keeps no lists of non-zero topics (:func:`keep_doc_lists`;
    keeping them per token cost ~25 % at K = 20, marking them stale per
    token 25 % of the bundled sample's iterations, rebuilding them at the end
    of every call 30 %).

    On Reuters it runs 2-2.5x (K = 50) and 3-3.5x (K = 100) the plain float64 loop it replaced
    (``jobs/bench_lda_kernel.py --corpus reuters``).  Counts stay exact
    integers; only the weights are float32 (a draw's resolution is 2^-24 of
    the total).  Signature, arguments and return value as in
    :func:`sample_block`.
    """
    if doc_nz[0] == TABLE_LAYOUT:
        # row d: document d's K counts, then the next one's header (the entries end in one int of padding)
        n_docs, stride = doc_nz_ptr.shape[0] - 1, topic_totals.shape[0] + 1
        table = doc_nz[2:2 + n_docs * stride].reshape((n_docs, stride))
        return _dense_table_sweep(token_word, token_doc, token_topic, tok_lo, tok_hi, word_lo, word_topic_block,
                                  topic_totals, table, alpha, beta, vocab_size, rng_state)
    return _dense_lists_sweep(token_word, token_doc, token_topic, tok_lo, tok_hi, word_lo, word_topic_block,
                              topic_totals, doc_nz_ptr, doc_nz, alpha, beta, vocab_size, rng_state)


@njit(cache=True, nogil=True, fastmath=True)
def _dense_table_sweep(token_word, token_doc, token_topic, tok_lo, tok_hi, word_lo, word_topic_block,
                       topic_totals, table, alpha, beta, vocab_size, rng_state):
    # the dense sweep on the table layout: document d's counts in table[d, :K].  The row is taken
    # after the count update and the draw is written out as in _dense_lists_sweep: taking the row
    # first, or the draw as an inline helper, each cost 7-10 % at K = 20 on Reuters (the table's
    # stride and alignment measured level).
    n_topics = topic_totals.shape[0]
    v_beta = vocab_size * beta
    inv_denom = np.empty(n_topics, dtype=np.float64)  # 1 / (n_t + Vβ)
    q = np.empty(n_topics, dtype=np.float32)  # (n_wt + β) / (n_t + Vβ) of the current word
    weights = np.zeros(n_topics + DENSE_BLOCK, dtype=np.float32)  # padded: whole blocks
    alpha32 = alpha.astype(np.float32)
    n_blocks = (n_topics + DENSE_BLOCK - 1) // DENSE_BLOCK
    for t in range(n_topics):
        inv_denom[t] = 1.0 / (topic_totals[t] + v_beta)
    current_word = -1
    n_changed = 0
    for i in range(tok_lo, tok_hi):
        w = token_word[i] - word_lo
        if w != current_word:
            current_word = w
            for t in range(n_topics):
                q[t] = np.float32((word_topic_block[w, t] + beta) * inv_denom[t])
        d = token_doc[i]
        old = token_topic[i]
        c = word_topic_block[w, old] - 1
        word_topic_block[w, old] = c
        topic_totals[old] -= 1
        inv_denom[old] = 1.0 / (topic_totals[old] + v_beta)
        q[old] = np.float32((c + beta) * inv_denom[old])
        table[d, old] -= 1
        row = table[d]
        total = np.float32(0.0)
        for t in range(n_topics):
            x = (np.float32(row[t]) + alpha32[t]) * q[t]
            weights[t] = x
            total += x
        u = np.float32(uniform(rng_state)) * total
        b = 0
        while b < n_blocks - 1:
            block_sum = np.float32(0.0)
            for t in range(b * DENSE_BLOCK, (b + 1) * DENSE_BLOCK):
                block_sum += weights[t]
            if u < block_sum:
                break
            u -= block_sum
            b += 1
        hi = min((b + 1) * DENSE_BLOCK, n_topics)
        new = hi - 1  # rounding left u past the block's sum: its last topic
        for t in range(b * DENSE_BLOCK, hi):
            u -= weights[t]
            if u < 0.0:
                new = t
                break
        c = word_topic_block[w, new] + 1
        word_topic_block[w, new] = c
        topic_totals[new] += 1
        inv_denom[new] = 1.0 / (topic_totals[new] + v_beta)
        q[new] = np.float32((c + beta) * inv_denom[new])
        table[d, new] += 1
        token_topic[i] = new
        if new != old:
            n_changed += 1
    return n_changed


@njit(cache=True, nogil=True, fastmath=True)
def _dense_lists_sweep(token_word, token_doc, token_topic, tok_lo, tok_hi, word_lo, word_topic_block,
                       topic_totals, doc_nz_ptr, doc_nz, alpha, beta, vocab_size, rng_state):
    # the dense sweep on the default layout (each document's header says its form)
    n_topics = topic_totals.shape[0]
    v_beta = vocab_size * beta
    inv_denom = np.empty(n_topics, dtype=np.float64)  # 1 / (n_t + Vβ)
    q = np.empty(n_topics, dtype=np.float32)  # (n_wt + β) / (n_t + Vβ) of the current word
    weights = np.zeros(n_topics + DENSE_BLOCK, dtype=np.float32)  # padded: whole blocks
    alpha32 = alpha.astype(np.float32)
    n_blocks = (n_topics + DENSE_BLOCK - 1) // DENSE_BLOCK
    drop_doc_lists(doc_nz)
    for t in range(n_topics):
        inv_denom[t] = 1.0 / (topic_totals[t] + v_beta)
    current_word = -1
    n_changed = 0
    for i in range(tok_lo, tok_hi):
        w = token_word[i] - word_lo
        if w != current_word:
            current_word = w
            for t in range(n_topics):
                q[t] = np.float32((word_topic_block[w, t] + beta) * inv_denom[t])
        d = token_doc[i]
        old = token_topic[i]
        c = word_topic_block[w, old] - 1
        word_topic_block[w, old] = c
        topic_totals[old] -= 1
        inv_denom[old] = 1.0 / (topic_totals[old] + v_beta)
        q[old] = np.float32((c + beta) * inv_denom[old])
        p = doc_nz_ptr[d]
        dense_doc = doc_nz[p] == n_topics
        if dense_doc:  # its counts only (this sampler keeps no lists of non-zero topics)
            doc_nz[p + 1 + old] -= 1
        else:
            _doc_decrement(d, old, doc_nz_ptr, doc_nz, n_topics)
        total = np.float32(0.0)
        if dense_doc:  # a document in the dense form: its K counts in topic order
            for t in range(n_topics):
                x = (np.float32(doc_nz[p + 1 + t]) + alpha32[t]) * q[t]
                weights[t] = x
                total += x
        else:
            for t in range(n_topics):  # the prior's part α_t q_t, one vectorised pass
                x = alpha32[t] * q[t]
                weights[t] = x
                total += x
            m = doc_nz[p]  # the document's part n_dt q_t over its (t, n_dt) pairs (or hash slots)
            for j in range(1 << -m if m < 0 else m):
                t = doc_nz[p + 1 + 2 * j]
                if t >= 0:  # (a hashed document's empty slots: (-1, 0))
                    x = np.float32(doc_nz[p + 2 + 2 * j]) * q[t]
                    weights[t] += x
                    total += x
        u = np.float32(uniform(rng_state)) * total
        b = 0
        while b < n_blocks - 1:
            block_sum = np.float32(0.0)
            for t in range(b * DENSE_BLOCK, (b + 1) * DENSE_BLOCK):
                block_sum += weights[t]
            if u < block_sum:
                break
            u -= block_sum
            b += 1
        hi = min((b + 1) * DENSE_BLOCK, n_topics)
        new = hi - 1  # rounding left u past the block's sum: its last topic
        for t in range(b * DENSE_BLOCK, hi):
            u -= weights[t]
            if u < 0.0:
                new = t
                break
        c = word_topic_block[w, new] + 1
        word_topic_block[w, new] = c
        topic_totals[new] += 1
        inv_denom[new] = 1.0 / (topic_totals[new] + v_beta)
        q[new] = np.float32((c + beta) * inv_denom[new])
        if dense_doc:
            doc_nz[p + 1 + new] += 1
        else:
            _doc_increment(d, new, doc_nz_ptr, doc_nz, n_topics)
        token_topic[i] = new
        if new != old:
            n_changed += 1
    return n_changed


@njit(cache=True, nogil=True, inline="always")
def _sparse_move(word_topic_block, w, t, delta, topic_totals, inv_denom, alpha_inv_denom, v_beta, alpha,
                 beta, s_mass, q_mass):
    # Change n_wt and n_t by delta (+1 or -1): take topic t out of the s and q
    # sums, change its counts, 1 / (n_t + Vβ) and α_t / (n_t + Vβ), put it
    # back.  Returns the new n_wt and the two sums.
    c = word_topic_block[w, t]
    s_mass -= beta * alpha_inv_denom[t]
    q_mass -= c * alpha_inv_denom[t]
    c += delta
    word_topic_block[w, t] = c
    topic_totals[t] += delta
    inv = 1.0 / (topic_totals[t] + v_beta)
    inv_denom[t] = inv
    alpha_inv_denom[t] = alpha[t] * inv
    s_mass += beta * alpha_inv_denom[t]
    q_mass += c * alpha_inv_denom[t]
    return c, s_mass, q_mass


@njit(cache=True, nogil=True)
def sample_block_sparse(token_word, token_doc, token_topic, tok_lo, tok_hi, word_lo,
                        word_topic_block, topic_totals, doc_nz_ptr, doc_nz, doc_ptr,
                        doc_tokens, alpha, beta, vocab_size, rng_state):
    """SparseLDA bucket sweep, adapted to word-major order.

    Yao, Mimno & McCallum (2009) eq. 2-4, with word and document swapped::

        p(t) ∝ α_t β/(n_t+Vβ)           s: all K, sum kept up to date
             + α_t n_wt/(n_t+Vβ)        q: the word's non-zero topics, sum
                                           cached across the word's tokens
             + n_dt (n_wt+β)/(n_t+Vβ)   r: the document's non-zero topics,
                                           summed per token in O(K_d)

    With a per-topic α the s and q terms keep α_t / (n_t + Vβ) per topic
    (one array, updated with the topic's count), so an asymmetric prior
    costs what a symmetric one does.

    O(K) per distinct word (a scan of the row for non-zeros), O(K_d) per
    token, plus O(K_w) or O(K) in the rare draws that land in q or s.
    Signature, arguments and return value as in :func:`sample_block`.
    """
    n_topics = topic_totals.shape[0]
    keep_doc_lists(doc_nz_ptr, doc_nz, n_topics)
    v_beta = vocab_size * beta
    inv_denom = np.empty(n_topics, dtype=np.float64)  # 1 / (n_t + Vβ)
    alpha_inv_denom = np.empty(n_topics, dtype=np.float64)  # α_t / (n_t + Vβ)
    for t in range(n_topics):
        inv_denom[t] = 1.0 / (topic_totals[t] + v_beta)
        alpha_inv_denom[t] = alpha[t] * inv_denom[t]
    word_nz_topics = np.empty(n_topics, dtype=np.int32)
    word_nz_pos = np.full(n_topics, -1, dtype=np.int32)
    word_nz_count = 0
    doc_cumulative = np.empty(n_topics, dtype=np.float64)
    s_mass = 0.0
    for t in range(n_topics):
        s_mass += alpha_inv_denom[t]
    s_mass *= beta
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
                q_mass += word_topic_block[w, t] * alpha_inv_denom[t]
            if since_refresh >= n_topics:
                # s is updated incrementally; recompute it from scratch
                # every >= K tokens (amortised O(1)) to drop rounding drift.
                since_refresh = 0
                s_mass = 0.0
                for t in range(n_topics):
                    s_mass += alpha_inv_denom[t]
                s_mass *= beta
        since_refresh += 1
        d = token_doc[i]
        old = token_topic[i]

        # Remove the token from topic `old`.
        c, s_mass, q_mass = _sparse_move(word_topic_block, w, old, -1, topic_totals, inv_denom,
                                         alpha_inv_denom, v_beta, alpha, beta, s_mass, q_mass)
        if c == 0:
            word_nz_count = _word_nz_remove(word_nz_topics, word_nz_pos, word_nz_count, old)
        _doc_decrement(d, old, doc_nz_ptr, doc_nz, n_topics)

        # r bucket over the document's non-zero topics.
        p = doc_nz_ptr[d]
        dense_doc, n_nz = _doc_nonzero(doc_nz, p, n_topics)
        r_mass = 0.0
        for j in range(n_nz):
            t, c = _doc_entry(doc_nz, p, dense_doc, j, n_topics)
            r_mass += c * (word_topic_block[w, t] + beta) * inv_denom[t]
            doc_cumulative[j] = r_mass
        if q_mass < 0.0:  # rounding guard; the true value is >= 0
            q_mass = 0.0
        u = uniform(rng_state) * (r_mass + q_mass + s_mass)
        if u < r_mass:
            j = 0
            while j < n_nz - 1 and doc_cumulative[j] <= u:
                j += 1
            new = _doc_entry(doc_nz, p, dense_doc, j, n_topics)[0]
        elif u < r_mass + q_mass and word_nz_count > 0:
            u -= r_mass
            new = word_nz_topics[word_nz_count - 1]
            acc = 0.0
            for j in range(word_nz_count):
                t = word_nz_topics[j]
                acc += word_topic_block[w, t] * alpha_inv_denom[t]
                if u < acc:
                    new = t
                    break
        else:
            u = (u - r_mass - q_mass) / beta
            new = n_topics - 1
            acc = 0.0
            for t in range(n_topics):
                acc += alpha_inv_denom[t]
                if u < acc:
                    new = t
                    break

        # Add the token to topic `new`.
        c, s_mass, q_mass = _sparse_move(word_topic_block, w, new, 1, topic_totals, inv_denom,
                                         alpha_inv_denom, v_beta, alpha, beta, s_mass, q_mass)
        if c == 1:
            word_nz_count = _word_nz_add(word_nz_topics, word_nz_pos, word_nz_count, new)
        _doc_increment(d, new, doc_nz_ptr, doc_nz, n_topics)
        token_topic[i] = new
        if new != old:
            n_changed += 1
    return n_changed


# --------------------------------------------------------------------------
# The F+ tree samplers: "fplus" (on a row store, :mod:`.fplus_rows`) and "mh" (_mh_sweep)
# --------------------------------------------------------------------------

#: Metropolis-Hastings cycles (one document proposal + one word proposal
#: each) per token for the ``"mh"`` sampler; LDA*'s and WarpLDA's default.
MH_CYCLES = 2


@njit(cache=True, nogil=True)
def sample_block_fplus(token_word, token_doc, token_topic, tok_lo, tok_hi, word_lo,
                       word_topic_block, topic_totals, doc_nz_ptr, doc_nz, doc_ptr,
                       doc_tokens, alpha, beta, vocab_size, rng_state):
    """F+LDA word-by-word sweep (Yu et al. 2015; LDA* §3.1.1) on a dense block.

    With ``q_t = (n_wt + β) / (n_t + Vβ)`` and the F+ tree holding
    ``α_t q_t`` for the current word::

        p(t) ∝ α_t q_t        (tree: total in O(1), draw in O(log K))
             + n_dt q_t       (the document's non-zero topics, O(K_d);
                               q_t = leaf_t / α_t)

    The kernel is :func:`~.fplus_rows.sample_rows_fplus`, which samples a row store; the touched
    rows go through one here (an O(K) copy per row each way, which the LDA program avoids by
    sampling its runs' stores directly).  Signature, arguments and return value as in
    :func:`sample_block`.
    """
    ptr, used, topics, counts = block_row_store(word_topic_block, token_word, tok_lo, tok_hi, word_lo)
    changed = sample_rows_fplus(token_word, token_doc, token_topic, tok_lo, tok_hi, word_lo,
                                ptr, used, topics, counts, topic_totals, doc_nz_ptr, doc_nz, doc_ptr,
                                doc_tokens, alpha, beta, vocab_size, rng_state)
    store_into_block(ptr, used, topics, counts, word_topic_block)
    return changed


@njit(cache=True, nogil=True)
def sample_block_mh(token_word, token_doc, token_topic, tok_lo, tok_hi, word_lo,
                    word_topic_block, topic_totals, doc_nz_ptr, doc_nz, doc_ptr,
                    doc_tokens, alpha, beta, vocab_size, rng_state):
    """Metropolis-Hastings sweep with cycling doc / word proposals.

    LightLDA's cycle proposal (Yuan et al. 2015; LDA* §2.2 Algorithm 1,
    §3.1.2), for a token with current state ``x`` and counts ``¬``
    excluding the token:

    * document proposal ``q(t | x) ∝ n_dt¬ + [t = x] + α_t``, drawn in O(1)
      by taking the topic of a random token of the document (or, with
      probability ``Σα / (L_d + Σα)``, a topic drawn from α: uniform for a
      symmetric prior, by bisection of α's cumulative sums otherwise);
      acceptance ``min(1, q_w(t) / q_w(x))``;
    * word proposal ``α_t q_w(t)`` with ``q_w(t) ∝ (n_wt¬ + β) / (n_t¬ + Vβ)``,
      drawn in O(log K) from an F+ tree that is always current; acceptance
      ``min(1, (n_dt¬ / α_t + 1) / (n_dx¬ / α_x + 1))`` (that is
      ``(n_dt¬ + α) / (n_dx¬ + α)`` for a symmetric prior).

    Both are exact MH steps for the token's conditional (no stale tables).
    ``MH_CYCLES`` cycles per token; cost O(log K) per token, independent of
    the document's number of topics.  Signature, arguments and return value
    as in :func:`sample_block`.
    """
    return _mh_sweep(token_word, token_doc, token_topic, tok_lo, tok_hi, word_lo,
                     word_topic_block, topic_totals, doc_nz_ptr, doc_nz, doc_ptr,
                     doc_tokens, alpha, beta, vocab_size, rng_state)


@njit(cache=True, nogil=True)
def _mh_sweep(token_word, token_doc, token_topic, tok_lo, tok_hi, word_lo,
              word_topic_block, topic_totals, doc_nz_ptr, doc_nz, doc_ptr,
              doc_tokens, alpha, beta, vocab_size, rng_state):
    # The "mh" sampler's word-by-word sweep: the F+ tree holds α_t q_t = α_t (n_wt + β) / (n_t + Vβ)
    # of the current word and each count change of a token moves one leaf.
    # A plain (not inlined) kernel with both proposals written out: inlining it, or
    # the draws as inline helpers, left per-token reference counting on their
    # array arguments in the loop and cost 5-15 % (jobs/bench_lda_kernel.py).
    n_topics = topic_totals.shape[0]
    drop_doc_lists(doc_nz)  # its MH steps read counts only
    v_beta = vocab_size * beta
    current_word = -1
    n_changed = 0
    offset = _tree_leaf_offset(n_topics)
    depth = _tree_depth(offset)
    tree = np.zeros(2 * offset, dtype=np.float64)
    alpha_inv_denom = np.empty(n_topics, dtype=np.float64)  # α_t / (n_t + Vβ)
    inv_alpha = np.empty(n_topics, dtype=np.float64)  # 1 / α_t: leaf_t / α_t = q_t
    alpha_cumulative = np.empty(n_topics, dtype=np.float64)  # MH: draws from α
    alpha_sum = 0.0
    symmetric = True
    for t in range(n_topics):
        alpha_inv_denom[t] = alpha[t] / (topic_totals[t] + v_beta)
        inv_alpha[t] = 1.0 / alpha[t]
        tree[offset + t] = beta * alpha_inv_denom[t]  # no current word yet
        alpha_sum += alpha[t]
        alpha_cumulative[t] = alpha_sum
        symmetric = symmetric and alpha[t] == alpha[0]
    _tree_rebuild(tree, offset)
    word_nz_topics = np.empty(n_topics, dtype=np.int32)
    word_nz_pos = np.full(n_topics, -1, dtype=np.int32)
    word_nz_count = 0
    for i in range(tok_lo, tok_hi):
        w = token_word[i] - word_lo
        if w != current_word:
            current_word = w
            word_nz_count = _tree_switch_word(
                tree, offset, depth, word_topic_block[w], beta, alpha_inv_denom,
                word_nz_topics, word_nz_pos, word_nz_count)
        d = token_doc[i]
        old = token_topic[i]

        c = word_topic_block[w, old] - 1
        word_topic_block[w, old] = c
        if c == 0:
            word_nz_count = _word_nz_remove(word_nz_topics, word_nz_pos, word_nz_count, old)
        topic_totals[old] -= 1
        alpha_inv_denom[old] = alpha[old] / (topic_totals[old] + v_beta)
        _tree_set(tree, offset, old, (c + beta) * alpha_inv_denom[old])
        _doc_decrement(d, old, doc_nz_ptr, doc_nz, n_topics)

        # MH_CYCLES cycles of a document and a word proposal
        base = doc_ptr[d]
        doc_len = doc_ptr[d + 1] - base  # includes this token
        state = old
        for _ in range(MH_CYCLES):
            # Document proposal.
            u = uniform(rng_state) * (doc_len + alpha_sum)
            if u < doc_len:
                j = doc_tokens[base + np.int64(u)]
                cand = state if j == i else token_topic[j]
            elif symmetric:
                cand = np.int64((u - doc_len) * inv_alpha[0])
                if cand >= n_topics:
                    cand = n_topics - 1
            else:  # bisection: the first t with u - L_d < Σ_{s<=t} α_s
                u -= doc_len
                lo, hi = 0, n_topics - 1
                while lo < hi:
                    mid = (lo + hi) >> 1
                    if u < alpha_cumulative[mid]:
                        hi = mid
                    else:
                        lo = mid + 1
                cand = lo
            if cand != state:
                ratio = (tree[offset + cand] * inv_alpha[cand]) / (tree[offset + state] * inv_alpha[state])
                if ratio >= 1.0 or uniform(rng_state) < ratio:
                    state = cand
            # Word proposal.
            cand = _tree_sample(tree, offset, n_topics, uniform(rng_state) * tree[1])
            if cand != state:
                n_cand = _doc_count(d, cand, doc_nz_ptr, doc_nz, n_topics)
                n_state = _doc_count(d, state, doc_nz_ptr, doc_nz, n_topics)
                ratio = (n_cand * inv_alpha[cand] + 1.0) / (n_state * inv_alpha[state] + 1.0)
                if ratio >= 1.0 or uniform(rng_state) < ratio:
                    state = cand
        new = state

        c = word_topic_block[w, new] + 1
        word_topic_block[w, new] = c
        if c == 1:
            word_nz_count = _word_nz_add(word_nz_topics, word_nz_pos, word_nz_count, new)
        topic_totals[new] += 1
        alpha_inv_denom[new] = alpha[new] / (topic_totals[new] + v_beta)
        _tree_set(tree, offset, new, (c + beta) * alpha_inv_denom[new])
        _doc_increment(d, new, doc_nz_ptr, doc_nz, n_topics)
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
    "alias": sample_block_alias,
}


#: Sampler name -> its kernel on a row store (:mod:`.rowstore`), for the samplers whose cost
#: per word must follow the row's non-zeros, not K: the same arguments as in ``SAMPLERS``
#: with ``word_lo, word_topic_block`` replaced by ``row_lo, ptr, used, topics, counts``.
STORE_SAMPLERS = {
    "alias": sample_rows_alias,
    "fplus": sample_rows_fplus,
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


def sample_block(sampler, token_word, token_doc, token_topic, tok_lo, tok_hi, word_lo,
                 word_topic_block, topic_totals, doc_nz_ptr, doc_nz, doc_ptr,
                 doc_tokens, alpha, beta, vocab_size, rng_state):
    """Resample the topics of tokens ``[tok_lo, tok_hi)`` with a named sampler.

    Every kernel in ``SAMPLERS`` takes exactly the arguments after
    ``sampler``, in this order; call ``get_sampler(name)`` once and call
    the kernel directly in a loop to skip the lookup.

    Parameters
    ----------
    sampler : {"dense", "sparse", "fplus", "mh", "alias"}
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
    doc_nz_ptr, doc_nz
        The documents' topic counts (the fields of a :class:`DocCounts`, in
        order): each document's topics, ascending, with their counts; updated
        in place.
    doc_ptr : ndarray of int64, shape (n_docs + 1,)
    doc_tokens : ndarray of int32, shape (n,)
        From :func:`build_doc_tokens` (read only): each document's tokens.
    alpha : ndarray of float64, shape (K,)
        Dirichlet concentrations of the document-topic prior, one per topic
        (all > 0; a symmetric prior is a constant vector:
        :func:`~pystrads.kernels.lda.alpha_vector`).
    beta : float
        Symmetric Dirichlet concentration of the topic-word prior.
    vocab_size : int
        V, the global vocabulary size (normaliser ``n_t + Vβ``).
    rng_state : ndarray of uint64, shape (4,)
        From :func:`pystrads.kernels.random.new_state`; advanced in place.

    Returns
    -------
    int
        Number of tokens whose topic changed.
    """
    return get_sampler(sampler)(token_word, token_doc, token_topic, tok_lo, tok_hi, word_lo,
                                word_topic_block, topic_totals, doc_nz_ptr, doc_nz, doc_ptr,
                                doc_tokens, alpha, beta, vocab_size, rng_state)


def choose_sampler(n_topics, mean_doc_len):
    """Return the name of the recommended sampler for K and the mean doc length.

    ``"dense"`` when K <= ``DENSE_MAX_TOPICS`` (600), ``"fplus"`` up to
    ``ALIAS_MIN_TOPICS`` (50,000), ``"alias"`` from there on; the document
    length did not move the crossovers in any corpus measured (it is kept as
    an argument for the rule to come).  ``"mh"`` is never the default (see
    below).

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
    Measured with ``jobs/bench_lda_kernel.py --blocks 1 --corpus reuters`` and
    ``--corpus debian`` (the real training corpora of ``jobs/bench_lda.py``,
    alpha = 50/K, beta = 0.1, one sweep after 10 F+LDA burn-in sweeps, median
    of 3) on one core of the 2-core development VM (shared, +-20 %), F+LDA
    on a dense block before it sampled row stores.  Million tokens/s/core:

    ==============  =====  =====  ======  =====  ====
    corpus (L_d)    K      dense  sparse  fplus  mh
    ==============  =====  =====  ======  =====  ====
    Reuters (80)    20     17.8   10.3     7.5   3.0
    Reuters         50     13.3    5.5     5.8   2.1
    Reuters         100     9.0    4.4     3.3   1.7
    Reuters         200     7.0    3.4     2.5   1.7
    Reuters         500     3.5    2.1     1.9   --
    Reuters         1000    2.4    2.5     3.0   1.6
    Debian (short)  50      6.8    4.4     3.2   2.0
    Debian          200     4.5    2.1     2.0   1.7
    Debian          500     2.9    1.8     1.9   1.5
    Debian          1000    1.8    1.5     1.8   1.1
    ==============  =====  =====  ======  =====  ====

    The dense sampler (q cached per word, float32 weights summed in one
    vectorised pass, a blocked search) wins up to a few hundred topics whatever the document
    length; by K = 1000 F+LDA's O(K_d + log K) draw catches up with it (ahead
    on Reuters, level on the Debian descriptions) and its cost falls further
    as a fit converges and K_d shrinks.  On the synthetic Zipf corpus (the
    script's default) dense also leads through K = 1000 (2.0 vs 1.5 M
    tokens/s with 50-token documents).  ``mh`` (2 cycles per token) gains less per sweep: from a
    random start it needed 1.2-2.6x more time than ``fplus`` to reach the
    log-likelihood of its own 15th sweep in every synthetic cell measured;
    only with 5000-token documents and K = 4000 did it reach early levels 2x
    sooner, and ``fplus`` overtook it by its 6th sweep.  LDA* (§3.2) also
    places its switch at K > 600.

    ``fplus`` and ``alias`` sample row stores (nothing O(K) per word), so they
    are measured end to end, in StradsLDA fits on the synthetic Zipf(0.8)
    corpus of ``jobs/bench_scale.py --case lda-samplers`` (3 M tokens in
    200-token documents, α = 0.1, β = 0.01, the default shape of one worker
    with two threads): time per iteration (fits without the log-likelihood),
    and the time each sampler needed to reach ``fplus``'s log-likelihood of
    its 4th iteration (from fits that compute it every iteration)::

        V          K        fplus s/it   alias s/it   alias's iterations   alias's time
                                                      to fplus's 4th       / fplus's
        100,000    1,000    0.71         0.56         9                    1.57
        100,000    2,500    0.97         0.77         8                    1.58
        100,000    10,000   1.34         1.37         6                    1.55
        1,000,000  1,000    0.90         0.84         10                   1.94
        1,000,000  100,000  2.28         1.72         5                    0.93

    The alias sampler's MH steps gain less than half as much per iteration
    as an exact draw; its iterations are cheaper only where F+LDA's document
    walk reads a large tree at random (K = 100,000: 2 MiB of leaves), and
    there it reached the target 7 % sooner.  The switch sits between the two
    measured points.
    """
    if n_topics <= DENSE_MAX_TOPICS:
        return "dense"
    if n_topics < ALIAS_MIN_TOPICS:
        return "fplus"
    return "alias"


def doc_counts_layout(sampler, n_docs, n_topics):
    """The layout of :class:`DocCounts` in which the LDA program keeps ``sampler``'s document counts:
    ``"table"`` (a plain documents x K table), ``"hash"`` or ``"lists"`` (O(tokens) memory).

    The dense sampler the table always (it is O(K) a token, chosen only at small K); MH and alias
    the table while it takes at most ``TABLE_MAX_BYTES``, the hash layout beyond (their steps read
    ``n_dt`` of proposed topics: O(1) in either; in the sorted lists a bisection and a shift of the
    pairs when a topic comes or goes: one thread, V = 1 M, 3 M tokens, alias ran an iteration in
    4.3 s on the table, 3.5 s hashed and 4.9 s on the lists at K = 100,000, 2.4 / 2.4 / 3.9 s at
    K = 1,000); F+LDA and SparseLDA the lists (they walk each document's non-zero topics, which only
    that layout lists; there they also ran 30-60 % faster than on a dense table).
    """
    if sampler == "dense":
        return "table"
    if sampler in ("mh", "alias"):
        return "table" if 4 * int(n_docs) * int(n_topics) <= TABLE_MAX_BYTES else "hash"
    return "lists"
