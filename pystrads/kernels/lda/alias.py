"""The ``"alias"`` sampler: LightLDA's alias-table Metropolis-Hastings, O(1) per token.

LightLDA (Yuan et al., "LightLDA: Big Topic Models on Modest Computer
Clusters", WWW 2015; LDA* §2.2) alternates two cheap proposals for a token
and corrects each with a Metropolis-Hastings test against the exact
collapsed conditional (LDA* eq. 1, ``¬`` = the token's own assignment
removed, all counts current)::

    π(t) ∝ (n_dt¬ + α_t) (n_wt¬ + β) / (n_t¬ + Vβ)

* **Word proposal**, from a *stale* table built when the sweep reaches a new
  word (tokens are word-major) and used for all of that word's tokens::

      g(t) = R_t / (T_t + Vβ)   +   β / (D_t + Vβ)
             sparse part:             dense part:
             the word's row R and     the topic totals D at the start of
             the totals T when the    the call, one alias table over K
             word's run began, an     shared by every word of the call
             alias table over its     (O(K) once per call)
             K_w non-zeros (O(K_w))

  drawn in O(1): pick the part by its mass, then one alias draw.
* **Document proposal**, as in the ``"mh"`` sampler: the topic of a uniformly
  drawn token of the document (the token itself reporting the current
  state), or with probability ``Σα / (L_d + Σα)`` a topic drawn from α;
  that is ``q(t | x) ∝ n_dt¬ + [t = x] + α_t``.

``ALIAS_MH_STEPS`` cycles (word step, then document step) per token.  Cost:
O(1) per token (O(mh_steps) draws and ratios, independent of K, K_d and
K_w), O(K_w) per distinct word of a call (its row's slots, in a row store of
:mod:`.rowstore`: the alias table and a topic -> slot map) and O(K) per call
(the dense table).  Nothing is O(K) per word, which is what keeps the cost per
token flat in K: with a dense block the row scans alone, memory bound at
~0.5 ns per topic, added 190 ns per token at K = 4000 and 11 tokens per
distinct word on the ``--quick`` corpus of ``jobs/bench_lda_kernel.py``,
against 45-60 ns for a cycle.  :func:`sample_rows_alias` samples a store;
:func:`sample_block_alias` (the samplers' common dense-block signature) copies
the touched rows into one and back.

Why the stale table still gives an exact MH step
-------------------------------------------------
The snapshot ``R, T, D`` contains the token itself at its topic ``z0`` when
the table was built (a token is visited once per call, so ``z0`` is also its
topic when its turn comes).  A proposal that depends on ``z0`` while the MH
state moves away from it across the cycles would not leave π invariant, so
the word step uses the proposal with the token's own count taken out of the
snapshot, ``g¬`` (``R, T, D`` each minus one at ``z0``)::

    g¬(t) = g(t)                                            t ≠ z0
    g¬(z0) = (R[z0] - 1)/(T[z0] - 1 + Vβ) + β/(D[z0] - 1 + Vβ)

which no longer depends on the token's state.  It is drawn exactly from the
tables by rejection: with ``M = max(1, g¬(z0) / g(z0))``, draw ``t`` from the
tables and keep it with probability ``g¬(t) / (M g(t))`` (that is 1 for
``t ≠ z0`` in the usual case ``g¬(z0) <= g(z0)``; the expected number of
extra draws per word step is ``M Σg / Σg¬ - 1``: 0.01-0.09 measured on the
synthetic corpora of ``jobs/bench_lda_kernel.py``, mostly for words with one
or two tokens in the call, where the token is much of its own row).
Being an independence proposal it is accepted from state ``x`` with::

    min(1, π(t) g¬(x) / (π(x) g¬(t)))

and the document step with (its proposal's ``α_t + n_dt¬`` cancels π's)::

    min(1, [(n_wt¬ + β) / (n_t¬ + Vβ)] / [(n_wx¬ + β) / (n_x¬ + Vβ)])

Each step is thus an exact MH step for the token's conditional given the
snapshot; a token alone in a call (or the first token of each word's run)
is sampled exactly.  (Leaving the own count in the table, as LightLDA is
usually written, is not exact even then: the stationary distribution of the
chain of ``test_sweeps_sample_the_exact_posterior`` is 0.02-0.06 away from
the posterior in total variation, 0.06 with one token per call.)

As in LightLDA, the snapshot also holds the *old* topics of the tokens
resampled earlier in the same call (earlier tokens of the word in ``R`` and
``T``, every earlier token in ``D``): the proposal is stale within a word's
run and the MH test against the current counts corrects for it step by step.
Strictly, a proposal that depends on other tokens' past topics is outside
the per-step argument, and the chain keeps a small bias: computed exactly
(transition matrices of the algorithm on the tiny chains of
``tests/test_kernels_lda.py``), a total variation of 0.003-0.004 from the
posterior on the 4-token test (0.006 with 1 step per token, 0.0008 with 4),
and 0.004 on the per-token marginals of the 6-token stale-table test, below
the Monte Carlo noise of both tests; it shrinks as counts grow relative to
the changes within one call.  ``"mh"`` (always-current F+ tree) has none.

Counts stay exact integers; the documents' counts are kept through
the :mod:`.counts` helpers per token.  Every array is allocated per call: the
kernel runs in several threads at once on disjoint rows and documents.
"""

import numpy as np
from numba import njit

from ..random import uniform
from .counts import _doc_count, _doc_decrement, _doc_increment, drop_doc_lists
from .rowstore import block_row_store, store_into_block

#: Metropolis-Hastings cycles (one word-proposal step + one document-proposal
#: step) per token of the ``"alias"`` sampler (LightLDA's default of 2).
ALIAS_MH_STEPS = 2


@njit(cache=True, nogil=True)
def _alias_build(weights, n, total, prob, alias, small, large):
    # Vose's alias table over weights[:n] (sum `total` > 0): column j keeps j
    # with probability prob[j] and otherwise gives alias[j] (a column index).
    # A draw: x = u * n for a uniform u, j = int(x), j if x - j < prob[j]
    # else alias[j].  O(n); small / large are work arrays of length >= n.
    scale = n / total
    n_small = 0
    n_large = 0
    for j in range(n):
        p = weights[j] * scale
        prob[j] = p
        alias[j] = j
        if p < 1.0:
            small[n_small] = j
            n_small += 1
        else:
            large[n_large] = j
            n_large += 1
    while n_small > 0 and n_large > 0:
        n_small -= 1
        s = small[n_small]
        big = large[n_large - 1]
        alias[s] = big
        p = (prob[big] + prob[s]) - 1.0  # big gave 1 - prob[s] to column s
        prob[big] = p
        if p < 1.0:
            n_large -= 1
            small[n_small] = big
            n_small += 1
    # Leftovers are 1 up to rounding.
    for k in range(n_large):
        prob[large[k]] = 1.0
    for k in range(n_small):
        prob[small[k]] = 1.0


@njit(cache=True, nogil=True)
def sample_block_alias(token_word, token_doc, token_topic, tok_lo, tok_hi, word_lo,
                       word_topic_block, topic_totals, doc_nz_ptr, doc_nz, doc_ptr,
                       doc_tokens, alpha, beta, vocab_size, rng_state):
    """LightLDA alias-table Metropolis-Hastings sweep on a dense block (the samplers' common
    signature, documented in :func:`~pystrads.kernels.lda.sample_block`).

    ``ALIAS_MH_STEPS`` cycles of a stale word proposal and a document proposal, each with its
    exact MH acceptance ratio; see :mod:`pystrads.kernels.lda.alias`.  The touched rows go
    through a row store (:func:`sample_rows_alias_steps`), an O(K) copy per row each way:
    the LDA program samples its runs' stores directly.
    """
    return sample_block_alias_steps(token_word, token_doc, token_topic, tok_lo, tok_hi, word_lo,
                                    word_topic_block, topic_totals, doc_nz_ptr, doc_nz, doc_ptr,
                                    doc_tokens, alpha, beta, vocab_size, rng_state,
                                    ALIAS_MH_STEPS)


@njit(cache=True, nogil=True)
def sample_block_alias_steps(token_word, token_doc, token_topic, tok_lo, tok_hi, word_lo,
                             word_topic_block, topic_totals, doc_nz_ptr, doc_nz, doc_ptr,
                             doc_tokens, alpha, beta, vocab_size, rng_state,
                             mh_steps):
    """:func:`sample_block_alias` with ``mh_steps`` (word + document) cycles per token."""
    ptr, used, topics, counts = block_row_store(word_topic_block, token_word, tok_lo, tok_hi, word_lo)
    changed = sample_rows_alias_steps(token_word, token_doc, token_topic, tok_lo, tok_hi, word_lo,
                                      ptr, used, topics, counts, topic_totals, doc_nz_ptr, doc_nz, doc_ptr,
                                      doc_tokens, alpha, beta, vocab_size, rng_state,
                                      mh_steps)
    store_into_block(ptr, used, topics, counts, word_topic_block)
    return changed


@njit(cache=True, nogil=True)
def sample_rows_alias(token_row, token_doc, token_topic, tok_lo, tok_hi, row_lo,
                      ptr, used, topics, counts, topic_totals, doc_nz_ptr, doc_nz, doc_ptr,
                      doc_tokens, alpha, beta, vocab_size, rng_state):
    """The ``"alias"`` sweep on a row store (:mod:`.rowstore`) with ``ALIAS_MH_STEPS`` cycles."""
    return sample_rows_alias_steps(token_row, token_doc, token_topic, tok_lo, tok_hi, row_lo,
                                   ptr, used, topics, counts, topic_totals, doc_nz_ptr, doc_nz, doc_ptr,
                                   doc_tokens, alpha, beta, vocab_size, rng_state,
                                   ALIAS_MH_STEPS)


@njit(cache=True, nogil=True)
def sample_rows_alias_steps(token_row, token_doc, token_topic, tok_lo, tok_hi, row_lo,
                            ptr, used, topics, counts, topic_totals, doc_nz_ptr, doc_nz, doc_ptr,
                            doc_tokens, alpha, beta, vocab_size, rng_state,
                            mh_steps):
    """The ``"alias"`` sweep of the tokens ``[tok_lo, tok_hi)`` (word-major; token ``i``'s row is
    ``token_row[i] - row_lo`` of the store ``ptr, used, topics, counts``, mutated, as are
    ``token_topic``, ``topic_totals`` and the documents' topic counts) with
    ``mh_steps`` cycles per token; returns the tokens that changed topic.

    O(1) per token and O(K_w) per word of the call (its slots: the alias table and a topic ->
    slot map); O(K) once per call (the dense proposal, the map).  The draws and the
    acceptance tests are written out in the token loop (no inline helpers with array
    arguments: see ``_mh_sweep`` in :mod:`.samplers` for their cost).
    """
    n_topics = topic_totals.shape[0]
    drop_doc_lists(doc_nz)  # its MH steps read counts only
    v_beta = vocab_size * beta

    # Dense part β / (D_t + Vβ) over the totals D at the start of the call.
    start_totals = topic_totals.copy()
    dense_w = np.empty(n_topics, dtype=np.float64)
    dense_mass = 0.0
    for t in range(n_topics):
        x = beta / (start_totals[t] + v_beta)
        dense_w[t] = x
        dense_mass += x
    small = np.empty(n_topics, dtype=np.int32)
    large = np.empty(n_topics, dtype=np.int32)
    dense_prob = np.empty(n_topics, dtype=np.float64)
    dense_alias = np.empty(n_topics, dtype=np.int32)
    _alias_build(dense_w, n_topics, dense_mass, dense_prob, dense_alias, small, large)
    dense_scale = n_topics / dense_mass

    # Document proposal: draws from α.
    alpha_cumulative = np.empty(n_topics, dtype=np.float64)
    alpha_sum = 0.0
    symmetric = True
    for t in range(n_topics):
        alpha_sum += alpha[t]
        alpha_cumulative[t] = alpha_sum
        symmetric = symmetric and alpha[t] == alpha[0]
    inv_alpha0 = 1.0 / alpha[0]

    # The current word: slot of each topic in its row (-1: none), and the sparse part
    # R_t / (T_t + Vβ) of its snapshot at its first token.
    slot = np.full(n_topics, -1, dtype=np.int64)
    sparse_w = np.zeros(n_topics, dtype=np.float64)  # by topic, 0 off the word's non-zeros
    sparse_list = np.empty(n_topics, dtype=np.float64)  # by position in nz_topics
    snap_row = np.zeros(n_topics, dtype=np.int32)  # R_t (valid on the non-zeros)
    snap_totals = np.zeros(n_topics, dtype=np.int64)  # T_t (valid on the non-zeros)
    nz_topics = np.empty(n_topics, dtype=np.int32)
    sparse_prob = np.empty(n_topics, dtype=np.float64)
    sparse_alias = np.empty(n_topics, dtype=np.int32)  # topics once built
    nnz = 0
    sparse_mass = 0.0
    sparse_scale = 0.0
    mass = dense_mass

    current_word = -1
    n_changed = 0
    for i in range(tok_lo, tok_hi):
        w = token_row[i] - row_lo
        if w != current_word:
            # New word: forget the last one, map the row's slots, alias table over its non-zeros.
            if current_word >= 0:
                for s in range(ptr[current_word], ptr[current_word] + used[current_word]):
                    slot[topics[s]] = -1
            for j in range(nnz):
                sparse_w[nz_topics[j]] = 0.0
            current_word = w
            nnz = 0
            sparse_mass = 0.0
            for s in range(ptr[w], ptr[w] + used[w]):
                t = topics[s]
                slot[t] = s
                c = counts[s]
                if c != 0:
                    tot = topic_totals[t]
                    x = c / (tot + v_beta)
                    nz_topics[nnz] = t
                    snap_row[t] = c
                    snap_totals[t] = tot
                    sparse_w[t] = x
                    sparse_list[nnz] = x
                    sparse_mass += x
                    nnz += 1
            if nnz > 0:
                _alias_build(sparse_list, nnz, sparse_mass, sparse_prob, sparse_alias, small, large)
                for j in range(nnz):
                    sparse_alias[j] = nz_topics[sparse_alias[j]]
                sparse_scale = nnz / sparse_mass
            mass = sparse_mass + dense_mass

        d = token_doc[i]
        old = token_topic[i]
        counts[slot[old]] -= 1
        topic_totals[old] -= 1
        _doc_decrement(d, old, doc_nz_ptr, doc_nz, n_topics)

        # g¬(z0) and the rejection step that turns draws of g into draws of g¬.
        g_old = sparse_w[old] + dense_w[old]
        g_old_own_removed = ((snap_row[old] - 1) / (snap_totals[old] - 1 + v_beta)
                             + beta / (start_totals[old] - 1 + v_beta))
        if g_old_own_removed <= g_old:
            keep_old = g_old_own_removed / g_old
            keep_other = 1.0
        else:
            keep_old = 1.0
            keep_other = g_old / g_old_own_removed

        base = doc_ptr[d]
        doc_len = doc_ptr[d + 1] - base  # includes this token
        state = old
        s_state = slot[state]
        n_state = counts[s_state]  # n_w,state¬ (the token's own count is out)
        nd_state = -1  # n_d,state¬, looked up when a word step first needs it
        for _ in range(mh_steps):
            # Word proposal: t ~ g¬, accept with π(t) g¬(x) / (π(x) g¬(t)).
            while True:
                u = uniform(rng_state) * mass
                if u < sparse_mass:
                    x = u * sparse_scale
                    j = np.int64(x)
                    if j >= nnz:
                        j = nnz - 1
                    cand = nz_topics[j] if x - j < sparse_prob[j] else sparse_alias[j]
                else:
                    x = (u - sparse_mass) * dense_scale
                    j = np.int64(x)
                    if j >= n_topics:
                        j = n_topics - 1
                    cand = j if x - j < dense_prob[j] else dense_alias[j]
                keep = keep_old if cand == old else keep_other
                if keep >= 1.0 or uniform(rng_state) < keep:
                    break
            if cand != state:
                s_cand = slot[cand]
                n_cand = counts[s_cand] if s_cand >= 0 else 0
                g_cand = g_old_own_removed if cand == old else sparse_w[cand] + dense_w[cand]
                g_state = g_old_own_removed if state == old else sparse_w[state] + dense_w[state]
                nd_cand = _doc_count(d, cand, doc_nz_ptr, doc_nz, n_topics)
                if nd_state < 0:
                    nd_state = _doc_count(d, state, doc_nz_ptr, doc_nz, n_topics)
                num = ((nd_cand + alpha[cand]) * (n_cand + beta)
                       * (topic_totals[state] + v_beta) * g_state)
                den = ((nd_state + alpha[state]) * (n_state + beta)
                       * (topic_totals[cand] + v_beta) * g_cand)
                if num >= den or uniform(rng_state) * den < num:
                    state = cand
                    n_state = n_cand
                    nd_state = nd_cand
            # Document proposal: n_dt¬ + [t = x] + α_t, accept with the word factors' ratio.
            u = uniform(rng_state) * (doc_len + alpha_sum)
            if u < doc_len:
                j = doc_tokens[base + np.int64(u)]
                cand = state if j == i else token_topic[j]
            elif symmetric:
                cand = np.int64((u - doc_len) * inv_alpha0)
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
                s_cand = slot[cand]
                n_cand = counts[s_cand] if s_cand >= 0 else 0
                num = (n_cand + beta) * (topic_totals[state] + v_beta)
                den = (n_state + beta) * (topic_totals[cand] + v_beta)
                if num >= den or uniform(rng_state) * den < num:
                    state = cand
                    n_state = n_cand
                    nd_state = -1  # looked up when a word step needs it

        new = state
        s_new = slot[new]
        if s_new < 0:  # a topic new to the row: its next free slot (the store has room)
            s_new = ptr[w] + used[w]
            used[w] += 1
            topics[s_new] = new
            counts[s_new] = 0
            slot[new] = s_new
        counts[s_new] += 1
        topic_totals[new] += 1
        _doc_increment(d, new, doc_nz_ptr, doc_nz, n_topics)
        token_topic[i] = new
        if new != old:
            n_changed += 1
    return n_changed
