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
``DocCounts``
    document-topic counts of the worker's documents (mutated), as each
    document's non-zero topics: see below.

In a round the worker samples the tokens ``[tok_lo, tok_hi)`` whose words lie
in the block ``[word_lo, word_hi)``.  It holds ``word_topic_block``
int32[word_hi - word_lo, K] (row ``i`` is word ``word_lo + i``) and
``topic_totals`` int64[K], a local copy of the global topic totals that the
caller re-syncs every round (the copy drifts within a round: the STRADS
supplement's s-error).  A sampler moves every reassigned token from its old
topic to its new one in all three count structures at once.

Per-document structures (built by :func:`build_doc_tokens` and
:meth:`DocCounts.from_tokens`, shared by every sampler so samplers are
interchangeable at any time, the table and hash layouts by the dense, MH and
alias samplers only):

``doc_ptr`` int64[n_docs + 1]
    CSR offsets: document ``d`` owns slots ``doc_ptr[d]:doc_ptr[d + 1]``
    (its number of tokens on this worker) in the arrays below.
``doc_tokens`` int32[n]
    token indices of each document (immutable; MH doc proposals).
``doc_nz_ptr`` int64[n_docs + 1], ``doc_nz`` int32[m]
    the document-topic counts, O(tokens) whatever K (a :class:`DocCounts`):
    per document a header, then the ``(t, n_dt)`` pairs of its non-zero
    topics, ascending, if it is short (``2 L_d < K``; ``n_dt`` by bisection,
    O(K_d) when a topic appears or leaves), or, if it is long, its K counts
    in topic order (O(1), like a dense row) and its non-zero topics beside
    them.  A dense documents x K table would take 4 K bytes a document (3 GB
    a worker at 7,500 documents and K = 100,000).  Its **table** layout is
    that table (every document's K counts at one stride, no lists), its
    **hash** layout keeps a short document's pairs in an open-addressing
    table of ``2^b >= 2 L_d`` slots (``n_dt`` and its updates O(1)
    expected, no lists): the LDA program builds the table for the samplers
    that read counts by topic while it is small and the hash layout beyond
    (:func:`doc_counts_layout`), where each is their fastest.

Samplers (all with the signature documented in :func:`sample_block`)
---------------------------------------------------------------------
``"dense"``
    The O(K) conditional, vectorised: the word's part cached across its
    tokens, the weights summed in float32 in one SIMD pass, a blocked search;
    the fastest up to a few hundred topics.
``"sparse"``
    SparseLDA's s/r/q buckets (Yao, Mimno & McCallum, KDD 2009, the sampler
    STRADS used), with the roles of word and document swapped for the
    word-major order: the word bucket is cached across a word's tokens, the
    document bucket is summed over the document's non-zero topics.
``"fplus"``
    F+LDA word-by-word (Yu et al., WWW 2015; LDA* §3.1.1): the dense word
    part sits in an F+ (sum) tree over K, updated in O(log K) per count
    change, the document part runs over the document's non-zero topics.
    It samples a row store (``STORE_SAMPLERS``, :mod:`.fplus_rows`): a
    word's tree leaves are set when its run starts and reset when it ends,
    O(K_w log K) a distinct word, nothing O(K) per word.
``"mh"``
    Metropolis-Hastings in the LightLDA / WarpLDA family (LDA* §2.2, §3.1.2):
    alternating O(1) document proposals (a random token of the document)
    and O(log K) word proposals (drawn from the same F+ tree), ``MH_CYCLES``
    cycles per token.  Exact MH for each token given the others.
``"alias"``
    LightLDA's alias-table Metropolis-Hastings (Yuan et al., WWW 2015;
    :mod:`.alias`): ``ALIAS_MH_STEPS`` cycles per token of a word proposal
    ``∝ (n_wt + β) / (n_t + Vβ)`` drawn in O(1) from *stale* alias tables (the
    word's non-zeros, rebuilt in O(K_w) when the word changes, plus β over K,
    built once per call) and the ``"mh"`` sampler's document proposal, each
    accepted with its exact MH ratio against the current counts.  O(1) per
    token whatever K, K_d and K_w, O(K_w) per distinct word on a row store
    (``STORE_SAMPLERS``; through the common dense-block signature the rows
    are copied into one and back, O(K) per row); the proposal is stale within
    a word's run, the MH test makes each step exact for the token's
    conditional.

:func:`choose_sampler` returns the recommended one for K and the mean
document length (dense for K <= 600, F+LDA below 2000, alias from there on),
from the measurements recorded in its docstring.

Equations (LDA* eq. 1; Griffiths & Steyvers 2004), with ``¬`` meaning the
token's own assignment removed from the counts::

    p(z = t | rest) ∝ (n_dt¬ + α_t) (n_wt¬ + β) / (n_t¬ + V β)

with one concentration α_t per topic (``alpha`` float64[K]; a symmetric
prior is a constant vector, :func:`alpha_vector`).  :mod:`.priors` learns an
asymmetric α from the document-topic counts (Minka's fixed point).

Kernels never validate their input; callers do.

Modules
-------
:mod:`.counts`
    Initial topics, the three count tables, the per-document token index
    and the document's / current word's non-zero-topic lists.
:mod:`.fplus_tree`
    The F+ sum tree over K shared by the ``"fplus"`` and ``"mh"`` samplers.
:mod:`.samplers`
    The dense, sparse, F+ and MH samplers, ``SAMPLERS``, :func:`get_sampler`,
    :func:`sample_block` and :func:`choose_sampler`.
:mod:`.alias`
    The ``"alias"`` sampler (LightLDA's alias tables + MH).
:mod:`.fplus_rows`
    The ``"fplus"`` sampler on a row store.
:mod:`.rowstore`
    A run's rows as their non-zeros with room for the sweep's changes (the
    store the ``STORE_SAMPLERS`` sample), its entries and its delta.
:mod:`.likelihood`
    log p(w, z) in parts that add up across workers and shards; fold-in
    and document completion for held-out documents.
:mod:`.priors`
    Learned α: per-worker document-topic histograms and Minka's fixed point.

Every public name is re-exported here: import from ``pystrads.kernels.lda``.

numba's on-disk cache checks only the file that defines a kernel, not the
files of the helpers and kernels compiled into it: after editing
:mod:`.counts`, :mod:`.fplus_tree`, :mod:`.fplus_rows`, :mod:`.rowstore` (or
:mod:`pystrads.kernels.random`), clear the cache (the ``*.nbi`` / ``*.nbc`` files in ``__pycache__`` or
``NUMBA_CACHE_DIR``) or touch the modules that call them.
"""

from .alias import ALIAS_MH_STEPS, sample_block_alias, sample_block_alias_steps, sample_rows_alias, sample_rows_alias_steps
from .fplus_rows import sample_rows_fplus
from .counts import (
    DocCounts,
    build_doc_tokens,
    count_doc_topic,
    count_topic_totals,
    count_word_topic,
    random_topics,
)
from .likelihood import (
    doc_log_likelihood,
    doc_states,
    document_completion_log_likelihood,
    fold_in,
    joint_log_likelihood,
    topic_totals_log_likelihood,
    word_log_likelihood_rows,
)
from .priors import (MIN_ALPHA, MIN_BETA, alpha_vector, beta_fixed_point, doc_topic_histograms, minka_fixed_point,
                     word_topic_count_summary)
from .rowstore import count_word_topic_entries, row_store, row_store_delta, row_store_entries, run_row_tokens
from .samplers import (
    MH_CYCLES,
    SAMPLERS,
    STORE_SAMPLERS,
    TABLE_MAX_BYTES,
    choose_sampler,
    doc_counts_layout,
    get_sampler,
    sample_block,
    sample_block_dense,
    sample_block_fplus,
    sample_block_mh,
    sample_block_sparse,
)

__all__ = [
    "ALIAS_MH_STEPS",
    "MH_CYCLES",
    "MIN_ALPHA",
    "MIN_BETA",
    "DocCounts",
    "SAMPLERS",
    "STORE_SAMPLERS",
    "TABLE_MAX_BYTES",
    "alpha_vector",
    "beta_fixed_point",
    "build_doc_tokens",
    "choose_sampler",
    "doc_counts_layout",
    "count_doc_topic",
    "count_topic_totals",
    "count_word_topic_entries",
    "count_word_topic",
    "doc_log_likelihood",
    "doc_states",
    "doc_topic_histograms",
    "document_completion_log_likelihood",
    "fold_in",
    "get_sampler",
    "joint_log_likelihood",
    "minka_fixed_point",
    "random_topics",
    "row_store",
    "row_store_delta",
    "row_store_entries",
    "run_row_tokens",
    "sample_block",
    "sample_block_alias",
    "sample_block_alias_steps",
    "sample_block_dense",
    "sample_block_fplus",
    "sample_block_mh",
    "sample_block_sparse",
    "sample_rows_alias",
    "sample_rows_alias_steps",
    "sample_rows_fplus",
    "topic_totals_log_likelihood",
    "word_log_likelihood_rows",
    "word_topic_count_summary",
]
