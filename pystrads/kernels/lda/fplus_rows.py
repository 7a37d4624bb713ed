"""The ``"fplus"`` sampler on a row store: F+LDA with no O(K) cost per word.

F+LDA word by word (:func:`~.samplers.sample_block_fplus`) keeps an F+ tree of
``α_t (n_wt + β) / (n_t + Vβ)`` for the current word and walks the document's
non-zero topics for the rest of the conditional.  On a dense block each word
also costs O(K) outside the draw: the block's row filled from the shards'
entries and diffed against them afterwards, and the row scanned for its
non-zero topics when the tree switches to it.  With ~4 tokens a distinct word
(V = 1 M, 3 M tokens, K = 1,000) those costs were about half of an
iteration.  Here the word's row is its ``(topic, count)`` slots in a row
store (:mod:`.rowstore`), so a word costs O(K_w log K) (its leaves set when
its run starts and reset to ``β α_t / (n_t + Vβ)`` when it ends) and a token
what it costs in F+LDA: O(K_d + log K).  The draws are F+LDA's, exact.
"""

import numpy as np
from numba import njit

from ..random import uniform
from .counts import _doc_decrement, _doc_entry, _doc_increment, _doc_nonzero, keep_doc_lists
from .fplus_tree import _tree_depth, _tree_leaf_offset, _tree_rebuild, _tree_sample, _tree_set


@njit(cache=True, nogil=True)
def sample_rows_fplus(token_row, token_doc, token_topic, tok_lo, tok_hi, row_lo,
                      ptr, used, topics, counts, topic_totals, doc_nz_ptr, doc_nz, doc_ptr,
                      doc_tokens, alpha, beta, vocab_size, rng_state):
    """The ``"fplus"`` sweep of the tokens ``[tok_lo, tok_hi)`` (word-major; token ``i``'s row is
    ``token_row[i] - row_lo`` of the store ``ptr, used, topics, counts``, mutated, as are
    ``token_topic``, ``topic_totals`` and the documents' topic counts); returns the tokens that
    changed topic.  The arguments of :data:`~.samplers.STORE_SAMPLERS`' kernels.

    With ``q_t = (n_wt + β) / (n_t + Vβ)`` and the tree holding ``α_t q_t``::

        p(t) ∝ α_t q_t (tree, O(log K)) + n_dt q_t (the document's non-zero topics, O(K_d))

    O(K) once per call (the tree and a topic -> slot map), O(K_w log K) per word of the call.
    """
    n_topics = topic_totals.shape[0]
    keep_doc_lists(doc_nz_ptr, doc_nz, n_topics)
    v_beta = vocab_size * beta
    offset = _tree_leaf_offset(n_topics)
    depth = _tree_depth(offset)
    tree = np.zeros(2 * offset, dtype=np.float64)
    alpha_inv_denom = np.empty(n_topics, dtype=np.float64)  # α_t / (n_t + Vβ)
    inv_alpha = np.empty(n_topics, dtype=np.float64)
    symmetric = True
    for t in range(n_topics):
        alpha_inv_denom[t] = alpha[t] / (topic_totals[t] + v_beta)
        inv_alpha[t] = 1.0 / alpha[t]
        tree[offset + t] = beta * alpha_inv_denom[t]  # no current word yet
        symmetric = symmetric and alpha[t] == alpha[0]
    _tree_rebuild(tree, offset)
    slot = np.full(n_topics, -1, dtype=np.int64)  # the current word's slot of each topic, -1: none
    doc_cumulative = np.empty(n_topics, dtype=np.float64)

    current_word = -1
    n_changed = 0
    for i in range(tok_lo, tok_hi):
        w = token_row[i] - row_lo
        if w != current_word:
            # Leaves outside a word's topics are β α_t / (n_t + Vβ) whatever the word: reset the
            # last word's, set the new one's (or rebuild every leaf when that is cheaper).
            n_old = used[current_word] if current_word >= 0 else 0
            n_new = used[w]
            full = (n_old + n_new) * depth >= n_topics
            if current_word >= 0:
                for s in range(ptr[current_word], ptr[current_word] + n_old):
                    t = topics[s]
                    slot[t] = -1
                    if full:
                        tree[offset + t] = beta * alpha_inv_denom[t]
                    else:
                        _tree_set(tree, offset, t, beta * alpha_inv_denom[t])
            current_word = w
            for s in range(ptr[w], ptr[w] + n_new):
                t = topics[s]
                slot[t] = s
                if full:
                    tree[offset + t] = (counts[s] + beta) * alpha_inv_denom[t]
                else:
                    _tree_set(tree, offset, t, (counts[s] + beta) * alpha_inv_denom[t])
            if full:
                _tree_rebuild(tree, offset)

        d = token_doc[i]
        old = token_topic[i]
        s_old = slot[old]
        c = counts[s_old] - 1
        counts[s_old] = c
        topic_totals[old] -= 1
        alpha_inv_denom[old] = alpha[old] / (topic_totals[old] + v_beta)
        _tree_set(tree, offset, old, (c + beta) * alpha_inv_denom[old])
        _doc_decrement(d, old, doc_nz_ptr, doc_nz, n_topics)

        # p(t) ∝ n_dt q_t (the document's non-zero topics) + α_t q_t (tree)
        p = doc_nz_ptr[d]
        dense_doc, n_nz = _doc_nonzero(doc_nz, p, n_topics)
        doc_mass = 0.0
        if symmetric:  # q_t = leaf_t / α: sum n_dt leaf_t and divide once
            for j in range(n_nz):
                t, n_dt = _doc_entry(doc_nz, p, dense_doc, j, n_topics)
                doc_mass += n_dt * tree[offset + t]
                doc_cumulative[j] = doc_mass
            doc_scale = inv_alpha[0]
        else:
            for j in range(n_nz):
                t, n_dt = _doc_entry(doc_nz, p, dense_doc, j, n_topics)
                doc_mass += n_dt * tree[offset + t] * inv_alpha[t]
                doc_cumulative[j] = doc_mass
            doc_scale = 1.0
        doc_mass *= doc_scale
        u = uniform(rng_state) * (doc_mass + tree[1])
        if u < doc_mass:
            u /= doc_scale  # back to doc_cumulative's scale
            j = 0
            while j < n_nz - 1 and doc_cumulative[j] <= u:
                j += 1
            new = _doc_entry(doc_nz, p, dense_doc, j, n_topics)[0]
        else:
            new = _tree_sample(tree, offset, n_topics, u - doc_mass)

        s_new = slot[new]
        if s_new < 0:  # a topic new to the row: its next free slot (the store has room)
            s_new = ptr[w] + used[w]
            used[w] += 1
            topics[s_new] = new
            counts[s_new] = 0
            slot[new] = s_new
        c = counts[s_new] + 1
        counts[s_new] = c
        topic_totals[new] += 1
        alpha_inv_denom[new] = alpha[new] / (topic_totals[new] + v_beta)
        _tree_set(tree, offset, new, (c + beta) * alpha_inv_denom[new])
        _doc_increment(d, new, doc_nz_ptr, doc_nz, n_topics)
        token_topic[i] = new
        if new != old:
            n_changed += 1
    return n_changed
