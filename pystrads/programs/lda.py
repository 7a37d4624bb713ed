"""LDA by model-parallel collapsed Gibbs sampling with word rotation (STRADS LDA).

Tables
    ``word_topic``  (V x K int32): word-topic counts, rows range-partitioned
    over the shards by word id, cut so every shard holds about the same
    token mass, stored sparse (each row as its non-zero (topic, count) pairs,
    dense once a quarter full: ``Table(storage="sparse")``); ``topic_totals`` (1 x K int64): the column sums, on one shard;
    with a learned α, ``doc_topic_hist`` ((K + 1) x (L + 1) float64, one
    shard): the corpus's histograms of document-topic counts (row k) and
    document lengths (row K), replaced at every α update.

Worker data (immutable, cached)
    the worker's tokens sorted by word (word-major), their documents, the
    vocabulary blocks' token ranges and, per block, the distinct words the
    worker has (it fetches only those rows).

Worker state (carried between steps)
    the token topics ``z``, the RNG state and the last local copy of the
    topic totals; the doc-topic counts (each document's non-zero topics:
    O(tokens) memory whatever K) are rebuilt from ``z`` at the start of each
    step (cheaper than carrying them).

Schedule
    the vocabulary is cut into U blocks of about equal token mass; in round
    r worker p samples the tokens whose word is in block (p + r) mod U, so
    every token is sampled exactly once per iteration (U rounds) and no two
    workers touch the same ``word_topic`` rows in a round.  ``topic_totals``
    is re-read every round; each worker's change to it is a contribution,
    summed into the table at the round's clock (``pull``), so every read sees
    the totals as the previous round left them whatever the timing (the chain
    is a function of the seed).  The drift of each worker's local copy within
    a round is the STRADS supplement's s-error (eq. 1), reported per
    iteration.

Learned α (``optimize_alpha``)
    after every ``optimize_interval``-th iteration (from iteration
    ``optimize_burn_in`` on) each worker contributes the histograms of its
    documents' topic counts in that iteration's last round; ``pull`` sums
    them into ``doc_topic_hist``; the step ends there (``schedule`` cuts it)
    and ``after_step`` updates ``alpha`` on the driver by Minka's fixed point
    (:func:`pystrads.kernels.lda.minka_fixed_point`).  The changed program
    reaches the workers with the next step; ``alpha`` is a program attribute,
    so checkpoints save it and a resumed fit restores it.

Learned β (``optimize_beta``)
    at the same iterations, the shards summarise their ``word_topic`` rows in
    the iteration's last round (``shard_metrics``: the histogram of the counts
    and the logs and inverses of the large ones,
    :func:`pystrads.kernels.lda.word_topic_count_summary`), and ``after_step``
    updates the symmetric ``beta`` by Minka's fixed point
    (:func:`pystrads.kernels.lda.beta_fixed_point`) with the topic totals.
    The workers and the shards (whose log-likelihood uses β) get the changed
    program with the next step.

Metrics per iteration: the joint log-likelihood log p(w, z) -- the document
part computed by the workers, the word part by the shards over their rows
(a consistent snapshot at the iteration's last round) -- tokens sampled and
the s-error.
"""

from __future__ import annotations

import time
from typing import Any, Dict, NamedTuple, Optional

import numpy as np

from ..engine.program import Program, RowEntries, Schedule, Table, split_ranges
from ..engine.program.stopping import EarlyStopping
from ..kernels.sets import unique

#: shard metrics named this plus an index carry the learned β's count summary (word_topic_count_summary)
BETA_SUMMARY = "beta_summary/"
#: The learned α's histograms hold at most this many cells ((K + 1) x (L + 1) float64, 32 MB):
#: documents longer than HISTOGRAM_MAX_CELLS / (K + 1) tokens have their counts clipped.
HISTOGRAM_MAX_CELLS = 1 << 22
#: bytes of word_topic rows in one run of a round (rows_per_fetch; a worker holds up to three runs at
#: once: one sampled, the next arriving, the last leaving); with V = 10^6 and
#: K = 1000 a whole block would be 2 GB, read, copied and diffed
ROUND_ROWS_BYTES = 64 << 20
#: runs of rows a round's block is at least cut into (LDAProgram.pipeline_pieces; more when a block
#: exceeds ROUND_ROWS_BYTES). Reuters, K = 50, 2 workers: reading a block took 4.7 ms, writing it
#: 4.4 ms, sampling it 24.5 ms; cutting it into 2 or 4 runs to overlap them was slower on 2 cores
#: (more calls, the sampler preempted), so one run, its writes in the background
PIPELINE_PIECES = 1
#: bytes of φ rows (distinct words x K float64) a worker builds at once to score its validation
#: documents: they are folded in runs of documents of at most this much φ, as the model's fold-in
VALIDATION_PHI_BYTES = 32 << 20


class DocBlock(NamedTuple):
    """Many ``(doc id, term indices, term counts)`` records at once, as CSR arrays: what a columnar
    decode (``Engine(decode_batch=...)``) hands :meth:`LDAProgram.load` instead of a tuple per document."""

    docs: np.ndarray  # (n_docs,) ids
    lengths: np.ndarray  # (n_docs,) terms per document
    terms: np.ndarray  # (sum(lengths),) term indices, document after document
    counts: np.ndarray  # (sum(lengths),) their counts
    validation: Optional[np.ndarray] = None  # (n_docs,) bool: held out for validation (None: none is)

    def select(self, keep: np.ndarray) -> "DocBlock":
        """The documents where ``keep`` (bool, one per document) holds, in order, without flags."""
        lengths = np.asarray(self.lengths, np.int64)
        per_term = np.repeat(keep, lengths)
        return DocBlock(self.docs[keep], lengths[keep], self.terms[per_term], self.counts[per_term])

    def split(self) -> "tuple[DocBlock, DocBlock]":
        """``(training documents, validation documents)``."""
        held = np.zeros(len(self.docs), bool) if self.validation is None else np.asarray(self.validation, bool)
        return self.select(~held), self.select(held)


def _documents(records):
    """Records (tuples ``(id, terms, counts[, validation])`` or :class:`DocBlock` s) as one
    DocBlock in document-id order, with its validation flags: the worker's data (and so its
    state's token order) must not depend on the order a recomputed partition delivers its records
    in (checkpoint restore).  Ids that do not compare keep the input order."""
    blocks, rows = [], []
    for rec in records:
        (blocks if isinstance(rec, DocBlock) else rows).append(rec)
    if rows:
        terms = [np.asarray(r[1], dtype=np.int64) for r in rows]
        ids = np.asarray([r[0] for r in rows])
        if ids.dtype.kind not in "iuf" or ids.ndim != 1:  # compared as Python compares them
            ids = np.empty(len(rows), dtype=object)
            for j, r in enumerate(rows):
                ids[j] = r[0]
        blocks.append(DocBlock(ids, np.array([len(t) for t in terms], np.int64),
                               np.concatenate(terms), np.concatenate([np.asarray(r[2], np.int64) for r in rows]),
                               np.array([len(r) > 3 and bool(r[3]) for r in rows], bool)))
    del rows
    if not blocks:
        return DocBlock(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64),
                        np.zeros(0, bool))
    docs = np.concatenate([b.docs for b in blocks])
    lengths = np.concatenate([np.asarray(b.lengths, np.int64) for b in blocks])
    terms = np.concatenate([np.asarray(b.terms, np.int64) for b in blocks])
    counts = np.concatenate([np.asarray(b.counts, np.int64) for b in blocks])
    held = np.concatenate([np.zeros(len(b.docs), bool) if b.validation is None else np.asarray(b.validation, bool)
                           for b in blocks])
    try:
        order = np.argsort(docs, kind="stable")
    except TypeError:  # ids of mixed types: no order
        return DocBlock(_plain(docs), lengths, terms, counts, held)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))[order]
    lengths = lengths[order]
    ends = np.cumsum(lengths)
    # each ordered document's terms: its old start plus the position within it
    take = np.repeat(starts - (ends - lengths), lengths) + np.arange(int(ends[-1]) if len(ends) else 0)
    return DocBlock(_plain(docs[order]), lengths, terms[take], counts[take], held[order])


class _HeldOut:
    """A worker's validation documents, scored after every iteration as the fitted model's
    ``logPerplexity`` scores documents: Gibbs fold-in with the topics fixed (each document's
    random stream seeded by the fit's seed and its id, the content hash), then
    ``log p(w | theta_d, phi)``.  Their tokens are document after document; the documents are cut
    into runs of at most :data:`VALIDATION_PHI_BYTES` of φ rows, each run with its distinct words
    and its tokens as rows of them."""

    def __init__(self, docs: DocBlock, num_topics: int):
        lengths = np.asarray(docs.lengths, np.int64)
        term_doc = np.repeat(np.arange(len(lengths)), lengths)
        self.words = np.repeat(docs.terms, docs.counts).astype(np.int64)
        self.doc_ptr = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(np.bincount(term_doc, weights=docs.counts, minlength=len(lengths)).astype(np.int64),
                  out=self.doc_ptr[1:])
        ids = np.asarray(docs.docs)
        self.streams = ids.astype(np.int64).view(np.uint64) if ids.dtype.kind in "iu" else \
            np.array([hash(str(d)) & ((1 << 64) - 1) for d in ids], np.uint64)
        budget, cuts, used = max(1, VALIDATION_PHI_BYTES // (8 * num_topics)), [0], 0
        for d, distinct in enumerate(lengths.tolist()):  # a document's distinct terms bound its run's
            if used and used + distinct > budget:
                cuts.append(d)
                used = 0
            used += distinct
        cuts.append(len(lengths))
        self.runs = []  # (first document, end document, distinct words, tokens as rows of them)
        for d0, d1 in zip(cuts[:-1], cuts[1:]):
            if d1 > d0:
                words, rows = np.unique(self.words[self.doc_ptr[d0]:self.doc_ptr[d1]], return_inverse=True)
                self.runs.append((d0, d1, words, rows.astype(np.int64)))

    @property
    def num_tokens(self) -> int:
        return int(self.doc_ptr[-1])

    def log_likelihood(self, word_topic, totals: np.ndarray, alpha: np.ndarray, beta: float, vocab_size: int,
                       n_iter: int, seed: int) -> float:
        """Σ over the documents' tokens of log Σ_t θ_dt φ_tw, with φ from the ``word_topic`` table
        handle and ``totals``, θ from each document's fold-in."""
        from ..kernels import lda as K
        from ..kernels.rows import csr_into

        ll = 0.0
        denominator = totals.astype(np.float64) + vocab_size * beta
        for d0, d1, words, rows in self.runs:
            counts = np.empty((len(words), len(alpha)))
            csr_into(*word_topic.read_entries(words).csr, counts, 0)
            phi = (counts + beta) / denominator
            del counts
            ptr = self.doc_ptr[d0:d1 + 1] - self.doc_ptr[d0]
            z = K.fold_in(rows, ptr, phi, alpha, n_iter, K.doc_states(seed, self.streams[d0:d1]))
            theta = (z + alpha) / (np.diff(ptr) + alpha.sum())[:, None]
            token_doc = np.repeat(np.arange(d1 - d0), np.diff(ptr))
            for a in range(0, len(rows), 1 << 16):  # bounded temporaries
                b = a + (1 << 16)
                ll += float(np.log(np.einsum("nk,nk->n", phi[rows[a:b]], theta[token_doc[a:b]])).sum())
        return ll


def _plain(ids: np.ndarray) -> np.ndarray:
    """Ids as numpy makes them of a list (strings as ``<U``): an object array's bytes are pointers,
    and the data's checkpoint fingerprint hashes the bytes."""
    return np.asarray(ids.tolist()) if ids.dtype == object else ids


class _Run(NamedTuple):
    """A run of a block's rows sampled with one read: rows ``[rows_lo, rows_hi)`` of the block's
    words and their tokens ``[tok_lo, tok_hi)``; ``cells[s, t]`` = ``(lo, hi)``, the tokens of
    the run's row part ``s`` in document part ``t`` (``threads x threads x 2``; one cell, the
    whole run, with one thread)."""

    rows_lo: int
    rows_hi: int
    tok_lo: int
    tok_hi: int
    cells: np.ndarray


class _WorkerData:
    """Immutable per-worker token data (see the module docstring)."""

    def __init__(self, doc_ids, doc_lengths, token_row, token_doc, block_tok, block_words, doc_ptr, doc_tokens,
                 runs=None, threads=1):
        self.doc_ids = doc_ids
        self.doc_lengths = doc_lengths
        self.token_row = token_row
        self.token_doc = token_doc
        self.block_tok = block_tok
        self.block_words = block_words
        self.doc_ptr = doc_ptr
        self.doc_tokens = doc_tokens
        self.runs = runs  # per block, its _Run s
        self.threads = threads  # the threads the runs are cut for

    @property
    def num_tokens(self) -> int:
        return len(self.token_row)

    @property
    def max_run_rows(self) -> int:
        """Rows of the longest run: the size of the worker's reusable row blocks."""
        return max([run.rows_hi - run.rows_lo for runs in self.runs or [] for run in runs] + [0])


class _Ready:
    """A finished "background read" (rows already in hand)."""

    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


def _entries(rows: np.ndarray):
    """A block's non-zero entries (offsets as int64), as :meth:`TableHandle.read_entries` gives them."""
    from ..kernels.rows import to_csr

    offsets, cols, vals = to_csr(rows)
    return offsets.astype(np.int64), cols, vals


class _Kept(NamedTuple):
    """What a lone worker holds between the rounds of a step: its block's rows and the topic
    totals as sampled so far, and both as the shards last received them (``base``: the rows'
    entries)."""

    step: int
    block: int
    rows: np.ndarray
    base: Any
    totals: np.ndarray
    base_totals: np.ndarray


class _WorkerState:
    """Token topics + RNG, carried between steps; doc structures are rebuilt."""

    def __init__(self, token_topic: np.ndarray, rng_state: np.ndarray, thread_rng=()):
        self.token_topic = token_topic
        self.rng_state = rng_state
        self.thread_rng = list(thread_rng)  # the RNG states of the worker's threads past the first
        self.last_totals: Optional[np.ndarray] = None
        self.doc_counts = None  # the documents' topic counts (kernels.lda.DocCounts), rebuilt from token_topic
        # a lone worker's _Kept block between the rounds of a step (never pickled: a restored state
        # reads the rows again)
        self.kept_rows = None
        # (step, round, totals): the topic totals the round's tick brought back for the next
        # round (its pull applied), so that round need not read them (never pickled either)
        self.next_totals = None
        self.asked_totals = False
        # two row blocks reused run after run (one sampled, the next arriving; never pickled): a
        # fresh 64 MB block per run paid its page faults every time (~0.15 s per run here)
        self.blocks = None

    def __getstate__(self):
        return {"token_topic": self.token_topic, "rng_state": self.rng_state, "thread_rng": self.thread_rng,
                "last_totals": self.last_totals}

    def __setstate__(self, d):
        self.__init__(d["token_topic"], d["rng_state"], d.get("thread_rng", ()))
        self.last_totals = d["last_totals"]


class LDAProgram(Program):
    """Collapsed Gibbs LDA on the Program API.

    Parameters
    ----------
    num_topics : int
        K.
    vocab_size : int
        V (word ids are ``0 .. V-1``).
    num_workers : int
        U; the vocabulary is cut into U blocks.
    block_bounds : array of int, shape (U + 1,)
        Word-id bounds of the rotation blocks (about equal token mass).
    word_weights : array, shape (V,), optional
        Token count per word; balances the shards' ``word_topic`` ranges, and (as a bound of a
        word's non-zero topics, ``min(K, count)``) sizes the runs of rows the row-store
        samplers read at once by their entries instead of by K.
    alpha : float or array of float, shape (K,)
        Dirichlet concentrations of the doc-topic prior (a number: symmetric);
        the starting point when learned.
    beta : float
        Symmetric Dirichlet concentration of the topic-word prior.
    max_iter : int
        Iterations (full rotations) to run.
    sampler : str
        A name in :data:`pystrads.kernels.lda.SAMPLERS`.
    seed : int
    log_likelihood_every : int
        Compute log p(w, z) every this many iterations and at the last one (0 = never).
    optimize_alpha : bool
        Learn an asymmetric ``alpha`` (see the module docstring).
    optimize_interval : int
        Iterations between two prior updates (tomotopy's ``optim_interval``).
    optimize_burn_in : int
        No prior update before this iteration.
    optimize_beta : bool
        Learn the symmetric ``beta`` (see the module docstring).
    max_doc_length : int
        Tokens of the longest document (needed with ``optimize_alpha``): the
        histograms' length, capped at :data:`HISTOGRAM_MAX_CELLS` / (K + 1)
        columns (longer counts are clipped into the last column).
    early_stopping : EarlyStopping, optional
        The stop rule on the held-out log-perplexity of the records marked
        ``validation`` (never sampled into the counts): after every iteration
        each worker folds its validation documents in (``fold_in_iterations``
        sweeps) and scores them as the fitted model's ``logPerplexity`` would
        (``validation_log_perplexity`` in the history).
    fold_in_iterations : int
        Gibbs sweeps of that fold-in.
    """

    def __init__(self, num_topics: int, vocab_size: int, num_workers: int, block_bounds, alpha,
                 beta: float, max_iter: int, sampler: str = "fplus", seed: int = 0,
                 word_weights: Optional[np.ndarray] = None, log_likelihood_every: int = 1,
                 optimize_alpha: bool = False, optimize_interval: int = 10, optimize_burn_in: int = 0,
                 max_doc_length: int = 0, optimize_beta: bool = False,
                 early_stopping: Optional[EarlyStopping] = None, fold_in_iterations: int = 20):
        from ..kernels.lda.priors import alpha_vector

        self.num_topics = int(num_topics)
        self.vocab_size = int(vocab_size)
        self.num_workers = int(num_workers)
        self.block_bounds = np.asarray(block_bounds, dtype=np.int64)
        self.alpha = alpha_vector(alpha, self.num_topics).copy()  # learned: replaced by after_step
        self.beta = float(beta)
        self.max_iter = int(max_iter)
        self.sampler = sampler
        self.seed = int(seed)
        self.word_weights = word_weights
        # each word's row holds at most min(K, its tokens) non-zeros: that bound as a power of two
        # (ceil log2, one byte a word) travels to the workers to cut their runs of rows by entries
        self.row_bound_log2 = None if word_weights is None else \
            np.ceil(np.log2(np.clip(np.ceil(np.asarray(word_weights, dtype=np.float64)), 1,
                                    self.num_topics))).astype(np.uint8)
        self.log_likelihood_every = int(log_likelihood_every)
        self.optimize_alpha = bool(optimize_alpha)
        self.optimize_interval = int(optimize_interval)
        self.optimize_burn_in = int(optimize_burn_in)
        self.optimize_beta = bool(optimize_beta)
        if self.optimize_beta and self.optimize_interval < 1:
            raise ValueError(f"optimize_beta needs optimize_interval >= 1 (got {optimize_interval})")
        # shard metrics on (shard_metrics_due names the rounds): the log-likelihood's, the learned β's
        self.shard_metrics_every = self.num_workers * (self.log_likelihood_every
                                                       or (self.optimize_interval if self.optimize_beta else 0))
        if self.optimize_alpha and (max_doc_length < 1 or self.optimize_interval < 1):
            raise ValueError(f"optimize_alpha needs max_doc_length >= 1 (got {max_doc_length}) and "
                             f"optimize_interval >= 1 (got {optimize_interval})")
        self.histogram_length = int(min(max_doc_length, max(1, HISTOGRAM_MAX_CELLS // (self.num_topics + 1))))
        self.early_stopping = early_stopping
        self.fold_in_iterations = int(fold_in_iterations)

    #: bytes of word_topic rows a worker reads, samples and sends back at once within a round
    round_rows_bytes = ROUND_ROWS_BYTES
    #: the shards store word_topic rows as their non-zero entries (dense once a quarter full:
    #: Table(storage="sparse")), so their memory follows the corpus's distinct (word, topic) pairs
    word_topic_storage = "sparse"
    #: a lone worker (U = 1) keeps its block's rows from one round to the next within a step instead
    #: of reading them again: nobody else writes them (its own changes are still written every round)
    keep_rows = True
    #: a round's block is sampled in at least this many runs of rows; reading the next run and
    #: writing the last one overlap sampling
    pipeline_pieces = PIPELINE_PIECES

    @property
    def rows_per_fetch(self) -> int:
        return max(1, self.round_rows_bytes // (4 * self.num_topics))

    def __getstate__(self):
        d = dict(self.__dict__)
        d["word_weights"] = None  # only the driver needs them (shard layout)
        return d

    def __repr__(self) -> str:
        lo, hi = float(self.alpha.min()), float(self.alpha.max())
        alpha = f"{lo:.4g}" if lo == hi else f"[{lo:.4g} .. {hi:.4g}]"
        priors = " and ".join(n for n, on in (("alpha", self.optimize_alpha), ("beta", self.optimize_beta)) if on)
        learned = f", learned {priors} every {self.optimize_interval} iterations from {self.optimize_burn_in}" \
            if priors else ""
        return (f"LDAProgram(K={self.num_topics}, V={self.vocab_size}, U={self.num_workers}, alpha={alpha}, "
                f"beta={self.beta}, iterations={self.max_iter}, sampler={self.sampler!r}{learned})")

    def alpha_update_due(self, iteration: int) -> bool:
        """Whether α is updated after iteration ``iteration`` (counted from 1)."""
        return self.optimize_alpha and self._update_iteration(iteration)

    def beta_update_due(self, iteration: int) -> bool:
        """Whether β is updated after iteration ``iteration`` (counted from 1)."""
        return getattr(self, "optimize_beta", False) and self._update_iteration(iteration)

    def _update_iteration(self, iteration: int) -> bool:
        return iteration >= self.optimize_burn_in and iteration % self.optimize_interval == 0

    # ------------------------------------------------------------------ tables
    def _shard_weights(self) -> Optional[np.ndarray]:
        """Half token mass (sampling work), half rows (memory): with Zipf word
        frequencies pure token mass would put most rows on one shard."""
        if self.word_weights is None:
            return None
        mass = np.asarray(self.word_weights, dtype=np.float64)
        total = mass.sum()
        return (mass / total if total > 0 else 0.0) + 1.0 / self.vocab_size

    def tables(self):
        tables = [Table("word_topic", self.vocab_size, self.num_topics, "int32", weights=self._shard_weights(),
                        storage=self.word_topic_storage),
                  Table("topic_totals", 1, self.num_topics, "int64", single_shard=True,
                        contrib_width=self.num_topics)]
        if self.optimize_alpha:
            tables.append(Table("doc_topic_hist", self.num_topics + 1, self.histogram_length + 1, "float64",
                                single_shard=True))
        return tables

    # ------------------------------------------------------------------ worker side
    def load(self, ctx, records) -> _WorkerData:
        from ..kernels import lda as K

        training, held = _documents(records).split()
        doc_ids, per_doc, terms, counts, _ = training
        n_docs = len(doc_ids)
        term_doc = np.repeat(np.arange(n_docs), per_doc)
        words, docs = np.repeat(terms, counts), np.repeat(term_doc, counts)
        lengths = np.bincount(term_doc, weights=counts, minlength=n_docs).astype(np.int64)
        order = np.argsort(words, kind="stable")
        token_word = words[order]
        token_doc = docs[order].astype(np.int32)
        block_tok = np.searchsorted(token_word, self.block_bounds).astype(np.int64)
        token_row = np.empty(len(token_word), dtype=np.int32)
        block_words = []
        for b in range(self.num_workers):
            lo, hi = block_tok[b], block_tok[b + 1]
            uniq, inverse = np.unique(token_word[lo:hi], return_inverse=True)
            token_row[lo:hi] = inverse
            block_words.append(uniq.astype(np.int64))
        threads = ctx.threads if ctx is not None else 1
        data = _WorkerData(np.asarray(doc_ids), lengths, token_row, token_doc, block_tok, block_words, None, None,
                           threads=threads)
        doc_part = np.zeros(n_docs, dtype=np.int64)  # documents cut into `threads` parts of about equal tokens
        for t, docs_of_part in enumerate(split_ranges(np.concatenate(([0], np.cumsum(lengths))), threads)):
            doc_part[docs_of_part.start:docs_of_part.stop] = t
        data.runs = [[self._cells(data, run, doc_part, threads)
                      for run in list(self._row_chunks(data, b, self.pipeline_pieces))]
                     for b in range(self.num_workers)]
        data.doc_ptr, data.doc_tokens = K.build_doc_tokens(data.token_doc, n_docs)
        data.validation = _HeldOut(held, self.num_topics) if getattr(self, "early_stopping", None) else None
        return data

    @staticmethod
    def _cells(data: _WorkerData, run, doc_part: np.ndarray, threads: int) -> _Run:
        """The run ``(a, b, t_lo, t_hi)`` cut for ``threads`` threads (tomotopy's partitioned
        scheme inside a worker): its rows into ``threads`` parts of about equal tokens, its
        documents by ``doc_part``; the run's tokens are reordered in place by (row part, document
        part), word-major within each cell, so a cell is a contiguous token range."""
        a, b, t_lo, t_hi = run
        if threads == 1:
            return _Run(a, b, t_lo, t_hi, np.array([[[t_lo, t_hi]]], dtype=np.int64))
        rows = data.token_row[t_lo:t_hi]
        mass = np.concatenate(([0], np.cumsum(np.bincount(rows - a, minlength=b - a))))
        row_parts = split_ranges(mass, threads)
        row_cuts = np.array([a + r.stop for r in row_parts[:-1]], dtype=np.int64)
        key = np.searchsorted(row_cuts, rows, side="right") * threads + doc_part[data.token_doc[t_lo:t_hi]]
        order = np.argsort(key, kind="stable")
        data.token_row[t_lo:t_hi] = rows[order]
        data.token_doc[t_lo:t_hi] = data.token_doc[t_lo:t_hi][order]
        bounds = t_lo + np.searchsorted(key[order], np.arange(threads * threads + 1))
        cells = np.stack([bounds[:-1], bounds[1:]], axis=1).reshape(threads, threads, 2)
        return _Run(a, b, t_lo, t_hi, cells.astype(np.int64))

    def init_state(self, ctx, data: _WorkerData) -> _WorkerState:
        from ..kernels import lda as K
        from ..kernels.random import new_state

        rng = new_state(self.seed, ctx.worker)
        token_topic = K.random_topics(data.num_tokens, self.num_topics, rng)
        for block in range(self.num_workers):  # the initial counts, run by run, as entries (every
            words = data.block_words[block]  # row of a block has tokens on this worker)
            for a, b, t_lo, t_hi, _ in data.runs[block]:
                ctx.table("word_topic").add(words[a:b], RowEntries(*K.count_word_topic_entries(
                    data.token_row, token_topic, t_lo, t_hi, a, b - a, self.num_topics), self.num_topics))
        totals = K.count_topic_totals(token_topic, self.num_topics)
        ctx.table("topic_totals").add([0], totals.reshape(1, -1))
        ctx.report(tokens=data.num_tokens, docs=len(data.doc_ids))
        # threads past the first draw from streams of their own (the first keeps the worker's)
        return _WorkerState(token_topic, rng, [new_state(self.seed, ctx.worker + (t << 40))
                                               for t in range(1, data.threads)])

    def _doc_structures(self, data: _WorkerData, state: _WorkerState) -> None:
        from ..kernels import lda as K

        layout = K.doc_counts_layout(self.sampler, len(data.doc_ids), self.num_topics)
        state.doc_counts = K.DocCounts.from_tokens(state.token_topic, data.doc_ptr, data.doc_tokens, self.num_topics,
                                                   layout=layout)

    def _row_chunks(self, data: _WorkerData, block: int, pieces: int = 1):
        """``(a, b, t_lo, t_hi)``: the worker's rows ``[a, b)`` of ``block``'s words in at least
        ``pieces`` runs of about equal token mass, each of at most ``round_rows_bytes`` of rows, and
        their tokens ``[t_lo, t_hi)`` (tokens are word-major, so a run of rows is a run of tokens): a
        worker holds at most that many rows at once, whatever V x K.  A dense block's row takes
        4 K bytes (``rows_per_fetch`` rows a run); a row store's row at most 8 bytes a non-zero
        topic, bounded by the word's tokens (``row_bound_log2``), so at large K a run holds many
        more of the rare words' rows."""
        lo, hi = int(data.block_tok[block]), int(data.block_tok[block + 1])
        n = len(data.block_words[block])
        if hi <= lo:
            return
        rows = data.token_row[lo:hi]
        from ..kernels import lda as K

        bound_log2 = getattr(self, "row_bound_log2", None)  # (a program pickled before it had one)
        if self.sampler in K.STORE_SAMPLERS and bound_log2 is not None:
            bound = np.minimum(self.num_topics, 1 << bound_log2[data.block_words[block]].astype(np.int64))
            mass = np.cumsum(8 * bound + 16)
            limit = np.searchsorted(mass, np.arange(1, mass[-1] // self.round_rows_bytes + 1) * self.round_rows_bytes,
                                    side="right")
        else:
            limit = np.arange(0, n, self.rows_per_fetch) if n > self.rows_per_fetch else np.zeros(0, np.int64)
        # row cuts: token quantiles (whole rows), then no run over round_rows_bytes
        cuts = unique(np.concatenate((
            [0, n], rows[(np.arange(1, pieces) * (hi - lo)) // pieces], limit)).astype(np.int64))
        for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
            yield a, b, lo + int(np.searchsorted(rows, a)), lo + int(np.searchsorted(rows, b))

    def push(self, ctx, data: _WorkerData, state: _WorkerState, block: int) -> _WorkerState:
        from ..kernels import lda as K
        from ..kernels.rows import csr_delta

        if state.doc_counts is None:
            self._doc_structures(data, state)
        lo, hi = int(data.block_tok[block]), int(data.block_tok[block + 1])
        words = data.block_words[block]
        word_topic = ctx.table("word_topic")
        totals_table = ctx.table("topic_totals")
        chunks = data.runs[block]
        # a lone worker holds its block and the totals between the rounds of a step: nobody else
        # reads or writes them, so it reads them once a step and sends its changes only where they
        # are read -- at the step's last round (after_step, the snapshot) and at the rounds whose
        # word log-likelihood the shards compute
        hold = self.keep_rows and self.num_workers == 1 and len(chunks) == 1
        kept, state.kept_rows = state.kept_rows, None
        if not (hold and kept is not None and (kept.step, kept.block) == (ctx.step, block)):
            kept = None
        write = not hold or ctx.last_round or ctx.rounds_in_step is None or self.shard_metrics_due(ctx.round) \
            or self.validation_due(ctx.round)
        # the totals as the last round's clock committed them: every worker's change to them is a
        # contribution summed at the clock (pull), so no worker's read can see another's write of
        # this round (a direct inc raced with the reads, and one seed gave two chains)
        if kept is not None:
            totals = kept.totals
        elif state.next_totals is not None and state.next_totals[:2] == (ctx.step, ctx.round):
            totals = state.next_totals[2]
        else:
            totals = totals_table.read(range(0, 1))[0]
        state.next_totals, state.asked_totals = None, False
        # reads, writes and sampling overlap (background Flight calls, a nogil kernel): the next
        # run of rows arrives and the last one's deltas leave while a run is sampled
        stored = self.sampler in K.STORE_SAMPLERS  # the runs' rows as row stores, never dense
        if chunks and not stored and (state.blocks is None or
                                      state.blocks[0].shape != (data.max_run_rows, self.num_topics)):
            state.blocks = [np.empty((data.max_run_rows, self.num_topics), dtype=np.int32) for _ in range(2)]

        def read(j):
            run = chunks[j]
            keys = words[run.rows_lo:run.rows_hi]
            if stored:
                return ctx.background(self._read_store, word_topic, keys, data, run)
            return ctx.background(self._read_rows, word_topic, keys, state.blocks[j % 2])

        if chunks:
            reading = read(0) if kept is None else \
                _Ready((self._store(kept.rows, data, chunks[0]) if stored else kept.rows, kept.base))
        if state.last_totals is not None:  # s-error of the previous round (supplement eq. 1)
            ctx.report(s_error_l1=float(np.abs(state.last_totals - totals).sum()))
        if chunks:
            sampler = K.STORE_SAMPLERS[self.sampler] if stored else K.get_sampler(self.sampler)
            before_totals = kept.base_totals if kept is not None else totals.copy()
            sample_s, changed = 0.0, 0
            for j, run in enumerate(chunks):
                a, b = run.rows_lo, run.rows_hi
                rows, before = reading.result()  # the rows, and their entries as the shards hold them
                if j + 1 < len(chunks):
                    reading = read(j + 1)
                t0 = time.perf_counter()
                changed += self._sample_run(ctx, sampler, data, state, run, rows, totals)
                sample_s += time.perf_counter() - t0
                if write:  # the run's change, as entries of the rows that changed
                    touched, d_offsets, d_cols, d_vals = K.row_store_delta(*rows, *before, self.num_topics) \
                        if stored else csr_delta(rows, *before)
                    if len(touched):
                        ctx.background(word_topic.add, words[a:b][touched], RowEntries(d_offsets, d_cols, d_vals, self.num_topics))
                if hold and not ctx.last_round:
                    now = K.row_store_entries(*rows) if stored else rows
                    state.kept_rows = _Kept(ctx.step, block, now, (now if stored else _entries(rows)) if write
                                            else before, totals, totals.copy() if write else before_totals)
                del rows, before
            ctx.report(sample_s=sample_s, changed=changed)
        if write:
            # the change (even none) goes with the round's tick, which brings the committed totals
            # back for the next round (apply)
            delta_totals = totals - before_totals if chunks else np.zeros_like(totals)
            ctx.contribute("topic_totals", [0], delta_totals.reshape(1, -1).astype(np.float64), read_back=True)
            state.asked_totals = True
        state.last_totals = totals
        ctx.report(tokens=hi - lo)
        if self.shard_metrics_due(ctx.round):
            ctx.report(ll_doc=K.doc_log_likelihood(state.doc_counts, data.doc_lengths, self.alpha))
        if (ctx.round + 1) % self.num_workers == 0 and self.alpha_update_due((ctx.round + 1) // self.num_workers):
            # this worker's documents are final for the iteration: their histograms, for the driver's α update
            hist = K.doc_topic_histograms(state.doc_counts, data.doc_lengths, self.num_topics, self.histogram_length)
            ctx.contribute("doc_topic_hist", range(0, len(hist)), hist.astype(np.float64))
        return state

    @staticmethod
    def _read_rows(word_topic, keys: np.ndarray, block: np.ndarray):
        """``(rows, entries)``: the word_topic rows of ``keys`` as a dense block for the samplers (the
        first rows of ``block``), and the entries they were made from (what
        :func:`~pystrads.kernels.rows.csr_delta` diffs against)."""
        from ..kernels.rows import csr_into

        entries = word_topic.read_entries(keys).csr
        rows = block[:len(keys)]
        csr_into(*entries, rows, 0)
        return rows, entries

    def _store(self, entries, data: _WorkerData, run: _Run):
        """The run's rows, given as CSR entries, as a row store with room for its tokens."""
        from ..kernels import lda as K

        tokens = K.run_row_tokens(data.token_row, run.tok_lo, run.tok_hi, run.rows_lo, run.rows_hi - run.rows_lo)
        return K.row_store(*entries, tokens, self.num_topics)

    def _read_store(self, word_topic, keys: np.ndarray, data: _WorkerData, run: _Run):
        """``(store, entries)``: the word_topic rows of ``keys`` (the run's) as a row store for the
        store samplers, and the entries it was made from."""
        entries = word_topic.read_entries(keys).csr
        return self._store(entries, data, run), entries

    def _sample_run(self, ctx, sampler, data: _WorkerData, state: _WorkerState, run: _Run, rows: np.ndarray,
                    totals: np.ndarray) -> int:
        """Sample the run's tokens into ``rows`` and ``totals`` (both in place); returns the tokens
        that changed topic.  With T threads (tomotopy's partitioned scheme): T sub-rounds, in
        sub-round j thread t samples the tokens of document part t whose words lie in row part
        (t + j) mod T, so no two threads touch the same row of ``rows`` or the same document; each
        thread samples against its own copy of the totals, and their changes are summed into
        ``totals`` after every sub-round (exact counts)."""
        rows = rows if isinstance(rows, tuple) else (rows,)  # a row store's four arrays, or a dense block

        def sample(lo, hi, local_totals, rng_state):
            return sampler(data.token_row, data.token_doc, state.token_topic, int(lo), int(hi), run.rows_lo, *rows,
                           local_totals, *state.doc_counts, data.doc_ptr, data.doc_tokens, self.alpha, self.beta, self.vocab_size,
                           rng_state)

        threads = run.cells.shape[0]
        if threads == 1:
            return sample(run.tok_lo, run.tok_hi, totals, state.rng_state)
        rngs = [state.rng_state, *state.thread_rng]
        changed = 0
        for shift in range(threads):
            start = totals.copy()
            local = [totals.copy() for _ in range(threads)]

            def cell(t, shift=shift, local=local):
                lo, hi = run.cells[(t + shift) % threads, t]
                return sample(lo, hi, local[t], rngs[t]) if hi > lo else 0

            changed += sum(ctx.parallel(cell, range(threads)))
            for t in range(threads):
                totals += local[t] - start
        return changed

    def apply(self, ctx, data: _WorkerData, state: _WorkerState, block: int) -> _WorkerState:
        if state.asked_totals:  # the totals as this round's clock committed them: the next round's
            state.next_totals = (ctx.step, ctx.round + 1, np.array(ctx.pulled("topic_totals")[0]))
        if self.validation_due(ctx.round):  # every worker's writes of the iteration are in: score
            held = data.validation
            totals = state.next_totals[2] if state.asked_totals else ctx.table("topic_totals").read(range(0, 1))[0]
            ll = held.log_likelihood(ctx.table("word_topic"), totals, self.alpha, self.beta, self.vocab_size,
                                     self.fold_in_iterations, self.seed) if held.num_tokens else 0.0
            ctx.report(val_ll=ll, val_tokens=held.num_tokens)
        return state

    def validation_due(self, round_index: int) -> bool:
        """Whether the workers score their validation documents once round ``round_index`` is
        committed: the last round of every iteration, with a validation set."""
        return getattr(self, "early_stopping", None) is not None and (round_index + 1) % self.num_workers == 0

    def shard_metrics_due(self, round_index: int) -> bool:
        """The log-likelihood's rounds: the last of every ``log_likelihood_every``-th iteration,
        and of the fit's last iteration (so the final figure is always there)."""
        U, every = self.num_workers, self.log_likelihood_every
        if (round_index + 1) % U:
            return False
        iteration = (round_index + 1) // U
        if self.beta_update_due(iteration):  # the shards summarise the counts for the β update
            return True
        return bool(every) and (iteration % every == 0 or iteration == self.max_iter)

    def pull(self, table: str, keys: np.ndarray, partials: np.ndarray, current: np.ndarray) -> np.ndarray:
        if table == "topic_totals":  # the round's summed changes (exact in float64 below 2^53)
            return current + np.rint(partials).astype(current.dtype)
        # doc_topic_hist: the workers' summed histograms replace the previous update's
        return partials

    def shard_metrics(self, table: str, rows: np.ndarray, row_start: int) -> Dict[str, float]:
        from ..kernels import lda as K

        if table == "word_topic":
            if isinstance(rows, RowEntries):  # both sums are over the non-zero counts only
                rows = rows.vals.reshape(1, -1)
            out = {"ll_word": K.word_log_likelihood_rows(rows, self.beta)}
            if getattr(self, "optimize_beta", False):
                summary = K.word_topic_count_summary(rows)
                out.update((f"{BETA_SUMMARY}{i}", float(summary[i])) for i in np.flatnonzero(summary))
            return out
        if table == "topic_totals":
            return {"ll_totals": K.topic_totals_log_likelihood(rows[0], self.beta, self.vocab_size)}
        return {}

    # ------------------------------------------------------------------ driver side
    def schedule(self, ctx) -> Optional[Schedule]:
        U = self.num_workers
        done, iterations = ctx.rounds_done // U, ctx.rounds_this_step(self.max_iter * U, U) // U
        if not iterations:
            return None
        stopping = getattr(self, "early_stopping", None)
        if stopping is not None and stopping.stops:  # end the step at every iteration: its metric may stop the fit
            iterations = 1
        if self.optimize_alpha or getattr(self, "optimize_beta", False):  # end the step at the next prior
            # update: after_step makes it
            iterations = next((i for i in range(1, iterations)
                               if self.alpha_update_due(done + i) or self.beta_update_due(done + i)), iterations)
        return Schedule.per_worker([[(p + r) % U for p in range(U)] for r in range(iterations * U)])

    def _update_alpha(self, ctx) -> Dict[str, float]:
        """Minka's fixed point on the histograms the workers just contributed; returns the
        new α's summary for the iteration's row."""
        from ..kernels.lda.priors import minka_fixed_point

        histograms = ctx.table("doc_topic_hist").read(range(0, self.num_topics + 1))
        self.alpha = minka_fixed_point(self.alpha, histograms)
        return {"alpha_sum": float(self.alpha.sum()), "alpha_min": float(self.alpha.min()),
                "alpha_max": float(self.alpha.max())}

    def _update_beta(self, ctx, last_round: Dict[str, float]) -> Dict[str, float]:
        """Minka's fixed point for β on the shards' summaries of the word-topic counts (in the
        metrics of the iteration's last round) and the topic totals; returns the new β for the
        iteration's row."""
        from ..kernels.lda.priors import BETA_EXACT_COUNTS, beta_fixed_point

        summary = np.zeros(BETA_EXACT_COUNTS + 4)
        for key, value in last_round.items():
            if key.startswith(BETA_SUMMARY):
                summary[int(key[len(BETA_SUMMARY):])] = value
        totals = ctx.table("topic_totals").read(range(0, 1))[0]
        self.beta = beta_fixed_point(self.beta, summary, totals, self.vocab_size)
        return {"beta": self.beta}

    def after_step(self, ctx, metrics) -> None:
        U = self.num_workers
        tokens_total = metrics.total("tokens")
        last_iteration = (ctx.rounds_done + len(metrics.rounds)) // U
        ctx.record(iteration=last_iteration, tokens=tokens_total, sample_s=metrics.total("sample_s") / U)
        updated = self._update_alpha(ctx) if metrics.rounds and self.alpha_update_due(last_iteration) else {}
        if metrics.rounds and self.beta_update_due(last_iteration):
            updated.update(self._update_beta(ctx, metrics.rounds[-1]))
        start = 0
        last_row: Dict[str, Any] = {}
        for r in range(len(metrics.rounds)):
            global_round = ctx.rounds_done + r
            if (global_round + 1) % U:
                continue
            rounds = metrics.rounds[start:r + 1]
            start = r + 1
            row: Dict[str, Any] = {"iteration": (global_round + 1) // U, "step": ctx.step,
                                   "tokens": float(sum(x.get("tokens", 0.0) for x in rounds))}
            errors = [x["s_error_l1"] for x in rounds if "s_error_l1" in x]
            if errors and row["tokens"]:
                row["s_error"] = float(np.mean(errors)) / (U * row["tokens"])
            last = metrics.rounds[r]
            if "ll_doc" in last and "ll_word" in last:
                row["log_likelihood"] = last["ll_doc"] + last["ll_word"] + last.get("ll_totals", 0.0)
                row["log_perplexity"] = -row["log_likelihood"] / row["tokens"] if row["tokens"] else float("nan")
            if "val_tokens" in last:
                row["validation_log_perplexity"] = -last["val_ll"] / last["val_tokens"] if last["val_tokens"] \
                    else float("nan")
                self.early_stopping.observe(ctx, row["iteration"], row["validation_log_perplexity"])
            if row["iteration"] == last_iteration:
                row.update(updated)
            ctx.record_row(**row)
            last_row = row
        shown = {"tokens_per_s": tokens_total / max(metrics.total("_compute_s") / U + metrics.total("_sync_s") / U,
                                                     1e-9)}
        if start and "log_likelihood" in last_row:
            shown = {"log_likelihood": last_row["log_likelihood"], **shown}
        if start and "validation_log_perplexity" in last_row:
            shown = {"validation_log_perplexity": last_row["validation_log_perplexity"], **shown}
        ctx.progress((ctx.rounds_done + len(metrics.rounds)) // U, self.max_iter, "iteration", **shown)
