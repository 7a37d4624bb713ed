"""The LDA program on the runtime (local[2]): count invariants, learning, failures."""

import os
import sys
import tempfile

import numpy as np
import pytest
from pyspark import cloudpickle

from pystrads.engine import Engine
from pystrads.kernels import lda as K
from pystrads.programs.lda import DocBlock, LDAProgram, _documents
from pystrads.ps.partition import range_bounds

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def synthetic_corpus(n_docs=300, vocab=400, topics=5, doc_len=60, seed=0):
    """Documents drawn from a true LDA model with well separated topics."""
    rng = np.random.default_rng(seed)
    phi = rng.dirichlet(np.full(vocab, 0.05), size=topics)
    docs = []
    for d in range(n_docs):
        theta = rng.dirichlet(np.full(topics, 0.2))
        z = rng.choice(topics, size=doc_len, p=theta)
        words = np.array([rng.choice(vocab, p=phi[t]) for t in z])
        uniq, counts = np.unique(words, return_counts=True)
        docs.append((d, uniq, counts))
    return docs, phi


def make_program(docs, vocab, workers, iterations, cls=LDAProgram, **kw):
    weights = np.zeros(vocab)
    for _, w, c in docs:
        np.add.at(weights, w, c)
    bounds = range_bounds(vocab, workers, weights)
    return cls(num_topics=5, vocab_size=vocab, num_workers=workers, block_bounds=bounds, alpha=0.5, beta=0.1,
               max_iter=iterations, sampler=kw.pop("sampler", "fplus"), seed=3, word_weights=weights, **kw)


def recount(result, vocab, k):
    """Word-topic counts recomputed from every worker's token topics."""
    def count(worker, data, state):
        out = np.zeros((vocab, k), dtype=np.int64)
        for b, words in enumerate(data.block_words):
            lo, hi = data.block_tok[b], data.block_tok[b + 1]
            np.add.at(out, (words[data.token_row[lo:hi]], state.token_topic[lo:hi]), 1)
        return out
    return sum(result.map_states(count))


@pytest.fixture(scope="module")
def corpus():
    return synthetic_corpus()


def test_counts_are_exact_and_likelihood_rises(sc, corpus):
    docs, _ = corpus
    tokens = sum(int(c.sum()) for _, _, c in docs)
    program = make_program(docs, 400, 2, iterations=15)
    with Engine(program, sc.parallelize(docs, 2), seed=1).fit() as res:
        word_topic = res.read_table("word_topic")
        totals = res.read_table("topic_totals")[0]
        assert word_topic.sum() == tokens
        assert np.array_equal(totals, word_topic.sum(axis=0))
        assert np.array_equal(word_topic, recount(res, 400, 5))
        its = res.summary.iterations
    assert [r["iteration"] for r in its] == list(range(1, 16))
    assert all(r["tokens"] == tokens for r in its)
    ll = [r["log_likelihood"] for r in its]
    assert ll[-1] > ll[0] + 0.05 * abs(ll[0]), ll
    assert 0 <= its[-1]["s_error"] < 0.05


def test_log_likelihood_matches_a_direct_recount(sc, corpus):
    docs, _ = corpus
    program = make_program(docs, 400, 2, iterations=3)
    with Engine(program, sc.parallelize(docs, 2), seed=1).fit() as res:
        word_topic = res.read_table("word_topic")
        totals = res.read_table("topic_totals")[0]
        doc_parts = res.map_states(lambda w, data, state: K.doc_log_likelihood(
            K.count_doc_topic(data.token_doc, state.token_topic, len(data.doc_ids), 5), data.doc_lengths, 0.5))
        reported = res.summary.iterations[-1]["log_likelihood"]
    direct = sum(doc_parts) + K.word_log_likelihood_rows(word_topic, 0.1) + \
        K.topic_totals_log_likelihood(totals, 0.1, 400)
    assert reported == pytest.approx(direct, rel=1e-12)


@pytest.mark.parametrize("sampler", ["dense", "fplus", "alias"])
def test_a_round_read_in_row_chunks_samples_as_one_read(sc, corpus, sampler):
    """A worker reads its block's rows ``rows_per_fetch`` at a time (its memory bound for a large V x K),
    or in ``pipeline_pieces`` runs of equal token mass, the next run read while one is sampled; the
    counts stay exact, and with the dense sampler (no state kept across words) the chain is the
    very same as a whole-block read's."""
    docs, _ = corpus
    tokens = sum(int(c.sum()) for _, _, c in docs)
    models = []
    for rows_bytes, pieces in ((None, 1), (4 * 5 * 7, 1), (None, 3)):  # whole blocks; 7 rows; 3 runs
        program = make_program(docs, 400, 2, iterations=4, sampler=sampler)
        program.pipeline_pieces = pieces
        if pieces > 1:
            data = program.load(None, docs[:20])
            runs = list(program._row_chunks(data, 0, pieces))
            assert len(runs) == pieces and runs[0][2] == data.block_tok[0] and runs[-1][3] == data.block_tok[1]
            assert all(r[1] == s[0] and r[3] == s[2] for r, s in zip(runs, runs[1:]))  # contiguous
        if rows_bytes:
            program.round_rows_bytes = rows_bytes
            assert program.rows_per_fetch == 7
        with Engine(program, sc.parallelize(docs, 2), seed=1).fit() as res:
            word_topic = res.read_table("word_topic")
            assert word_topic.sum() == tokens
            assert np.array_equal(res.read_table("topic_totals")[0], word_topic.sum(axis=0))
            assert np.array_equal(word_topic, recount(res, 400, 5))
            models.append(word_topic)
    if sampler == "dense":
        assert np.array_equal(models[0], models[1])


@pytest.mark.parametrize("sampler", ["dense", "alias"])  # a dense block kept, and a row store's entries
def test_a_lone_worker_keeps_its_rows_between_rounds_and_samples_the_same_chain(sc, corpus, tmp_path, sampler):
    """With U = 1 nobody else reads or writes the block, so the worker keeps its rows and the
    totals from one round to the next within a step, and sends its changes only at the step's
    last round and at the rounds whose log-likelihood the shards compute: the same chain and the
    same log-likelihoods as reading and writing every round, far fewer bytes either way, and exact
    counts after a failure in the middle of a step (the restored state has nothing kept)."""
    docs, _ = corpus
    tokens = sum(int(c.sum()) for _, _, c in docs)
    tables, read, written, lls = [], [], [], []
    for keep in (False, True):
        program = make_program(docs, 400, 1, iterations=12, sampler=sampler, log_likelihood_every=3)
        program.keep_rows = keep
        with Engine(program, sc.parallelize(docs, 1), seed=1, config={"step.targetSeconds": 60}).fit() as res:
            word_topic = res.read_table("word_topic")
            assert word_topic.sum() == tokens
            assert np.array_equal(res.read_table("topic_totals")[0], word_topic.sum(axis=0))
            assert np.array_equal(word_topic, recount(res, 400, 5))
            tables.append(word_topic)
            read.append(sum(row["bytes_out"] for row in res.summary.rows))
            written.append(sum(row["bytes_in"] - row["snapshot_bytes"] for row in res.summary.rows[1:]))
            lls.append([(r["iteration"], r["log_likelihood"]) for r in res.summary.iterations
                        if "log_likelihood" in r])
            assert len(res.summary.rows) >= 2 and res.summary.rows[-1]["rounds"] >= 4
    assert np.array_equal(tables[0], tables[1])
    assert [i for i, _ in lls[1]] == [3, 6, 9, 12] and lls[0] == lls[1]
    assert read[1] < 0.6 * read[0], read
    assert written[1] < 0.6 * written[0], written  # 4 writes in 11 rounds (plus the ticks)
    # the failure comes in step 2's sixth round: after the write of its fifth (a log-likelihood
    # round), with that round's changes still held back
    program = make_program(docs, 400, 1, iterations=12, cls=FailingLDA, marker=str(tmp_path / "failed"),
                           sampler=sampler, log_likelihood_every=3, fail_round=5)
    with Engine(program, sc.parallelize(docs, 1), seed=1, config={"step.targetSeconds": 60}).fit() as res:
        assert (tmp_path / "failed").exists()
        word_topic = res.read_table("word_topic")
        assert np.array_equal(word_topic, recount(res, 400, 5))
        assert np.array_equal(word_topic, tables[0])  # the retried step resumed the same chain


@pytest.mark.parametrize("workers", [1, 2])
def test_the_log_likelihood_comes_every_so_many_iterations_and_at_the_last(sc, corpus, workers):
    """``log_likelihood_every=3`` over 7 iterations: the log-likelihood at iterations 3, 6 and 7
    (the last, though not a multiple), each the very figure a fit computing it every iteration
    reports (the same chain)."""
    docs, _ = corpus
    lls = []
    for every in (1, 3):
        program = make_program(docs, 400, workers, iterations=7, sampler="dense", log_likelihood_every=every)
        with Engine(program, sc.parallelize(docs, workers), seed=1).fit() as res:
            lls.append({int(r["iteration"]): r["log_likelihood"] for r in res.summary.iterations
                        if "log_likelihood" in r})
    assert sorted(lls[0]) == list(range(1, 8)) and sorted(lls[1]) == [3, 6, 7], lls
    assert all(lls[1][i] == lls[0][i] for i in (3, 6, 7)), lls


class SkewedLDA(LDAProgram):
    """One worker starts every round late (``slow``), so the other's end-of-round writes land
    before the late worker reads the topic totals."""

    def __init__(self, *args, slow=0, **kw):
        super().__init__(*args, **kw)
        self.slow = slow

    def push(self, ctx, data, state, block):
        if ctx.worker == self.slow:
            import time

            time.sleep(0.05)
        return super().push(ctx, data, state, block)


def test_the_chain_is_a_function_of_the_seed_whatever_the_workers_timing(sc, corpus):
    """The topic totals change only at the round's clock (contributions, summed by ``pull``):
    with either worker started late in every round, one seed gives the very same counts.  (A
    direct ``inc`` of the totals at the end of a push let the fast worker's write reach the
    slow one's read, and the two fits differed.)"""
    docs, _ = corpus
    tables = []
    for slow in (0, 1):
        program = make_program(docs, 400, 2, iterations=3, cls=SkewedLDA, slow=slow, sampler="dense")
        with Engine(program, sc.parallelize(docs, 2), seed=1).fit() as res:
            word_topic = res.read_table("word_topic")
            assert np.array_equal(res.read_table("topic_totals")[0], word_topic.sum(axis=0))
            tables.append(word_topic)
    assert np.array_equal(tables[0], tables[1])


class _TotalsReadsCounted:
    """A worker's context whose reads of ``topic_totals`` are counted (everything else as is)."""

    def __init__(self, ctx):
        self._ctx, self.reads = ctx, 0

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    def table(self, name):
        table, outer = self._ctx.table(name), self
        if name != "topic_totals":
            return table

        class Counted:
            def __getattr__(self, attr):
                return getattr(table, attr)

            def read(self, *args, **kw):
                outer.reads += 1
                return table.read(*args, **kw)

        return Counted()


class CountingLDA(LDAProgram):
    """Reports how often each round read the topic totals off the shard (``totals_reads`` in the
    steps' summary rows)."""

    def push(self, ctx, data, state, block):
        counted = _TotalsReadsCounted(ctx)
        state = super().push(counted, data, state, block)
        ctx.report(totals_reads=counted.reads)
        return state

    def after_step(self, ctx, metrics):
        ctx.record(totals_reads=metrics.total("totals_reads"))
        return super().after_step(ctx, metrics)


class ReadingLDA(CountingLDA):
    """Reads the topic totals at the start of every round (as before they came with the tick)."""

    def apply(self, ctx, data, state, block):
        return state


def test_the_totals_the_tick_brings_back_are_the_ones_a_read_gets(sc, corpus):
    """Each round's tick brings the committed topic totals back for the next round: the same chain
    as reading them at the start of every round, one read fewer per worker and round.  (Counted
    where the reads happen: the shards' request counters also count heartbeats and the workers'
    waits for the next step, which vary with the machine's speed.)"""
    docs, _ = corpus
    tables, reads = [], []
    for cls in (CountingLDA, ReadingLDA):
        program = make_program(docs, 400, 2, iterations=8, cls=cls, sampler="dense")
        # steps of 4 rounds whatever the machine's speed, so that both runs split the same way
        config = {"step.targetSeconds": 600, "step.maxRounds": 4}
        with Engine(program, sc.parallelize(docs, 2), seed=1, config=config).fit() as res:
            tables.append(res.read_table("word_topic"))
            assert np.array_equal(res.read_table("topic_totals")[0], tables[-1].sum(axis=0))
            steps = res.summary.rows[1:]
            reads.append(([int(r["totals_reads"]) for r in steps], [r["rounds"] for r in steps]))
    assert np.array_equal(tables[0], tables[1])
    (fused, rounds), (read, rounds2) = reads
    assert rounds == rounds2 and sum(rounds) >= 8 and len(rounds) >= 3, reads
    # reading: every round of every step, on each of the two workers; with the tick's totals
    # only a step's first round reads them (nothing came back before it)
    assert read == [2 * n for n in rounds], reads
    assert fused == [2 if n else 0 for n in rounds], reads


class FailingLDA(LDAProgram):
    def __init__(self, *args, marker=None, fail_round=1, **kw):
        super().__init__(*args, **kw)
        self.marker = marker
        self.fail_round = fail_round

    def push(self, ctx, data, state, block):
        state = super().push(ctx, data, state, block)
        if ctx.step == 2 and ctx.worker == 0 and ctx.local_round == self.fail_round \
                and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os._exit(3)  # the task's process dies mid-iteration (a raised error would be the program's own)
        return state


def test_counts_stay_exact_after_an_injected_task_failure(sc, corpus):
    docs, _ = corpus
    tokens = sum(int(c.sum()) for _, _, c in docs)
    marker = os.path.join(tempfile.mkdtemp(), "failed")
    program = make_program(docs, 400, 2, iterations=6, cls=FailingLDA, marker=marker)
    engine = Engine(program, sc.parallelize(docs, 2), seed=1, config={"step.targetSeconds": 0.01})
    with engine.fit() as res:
        assert os.path.exists(marker)
        word_topic = res.read_table("word_topic")
        assert word_topic.sum() == tokens
        assert np.array_equal(word_topic, recount(res, 400, 5))
        assert np.array_equal(res.read_table("topic_totals")[0], word_topic.sum(axis=0))
        assert res.summary.iterations[-1]["iteration"] == 6


# --------------------------------------------------------------------------
# learned alpha (optimize_alpha)
# --------------------------------------------------------------------------

TRUE_ALPHA = np.array([0.02, 0.05, 0.1, 0.4, 1.5])


@pytest.fixture(scope="module")
def skewed_corpus():
    """Documents whose topic mixtures come from an asymmetric Dir(TRUE_ALPHA)."""
    rng = np.random.default_rng(5)
    phi = rng.dirichlet(np.full(400, 0.05), size=5)
    docs = []
    for d in range(400):
        z = rng.choice(5, size=60, p=rng.dirichlet(TRUE_ALPHA))
        uniq, counts = np.unique([rng.choice(400, p=phi[t]) for t in z], return_counts=True)
        docs.append((d, uniq, counts))
    return docs


def histograms_of_states(result, program):
    """Every worker's document-topic histograms recomputed from its token topics, summed."""
    def hist(worker, data, state):
        doc_topic = K.count_doc_topic(data.token_doc, state.token_topic, len(data.doc_ids), program.num_topics)
        out = np.zeros((program.num_topics + 1, program.histogram_length + 1))
        for k in range(program.num_topics):
            np.add.at(out[k], np.minimum(doc_topic[:, k], program.histogram_length), 1)
        np.add.at(out[-1], np.minimum(data.doc_lengths, program.histogram_length), 1)
        out[:-1, 0] = 0
        return out
    return sum(result.map_states(hist))


def test_learned_alpha_moves_toward_the_generating_prior(sc, skewed_corpus, corpus):
    tokens = sum(int(c.sum()) for _, _, c in skewed_corpus)
    program = make_program(skewed_corpus, 400, 2, iterations=60, optimize_alpha=True, optimize_interval=5,
                           optimize_burn_in=10, max_doc_length=60)
    start = program.alpha.copy()
    with Engine(program, sc.parallelize(skewed_corpus, 2), seed=1).fit() as res:
        word_topic = res.read_table("word_topic")
        assert word_topic.sum() == tokens and np.array_equal(word_topic, recount(res, 400, 5))
        # the shards hold the workers' summed histograms of the last update (iteration 60)
        np.testing.assert_array_equal(res.read_table("doc_topic_hist"), histograms_of_states(res, program))
        rows = res.summary.iterations
    assert [r["iteration"] for r in rows if "alpha_sum" in r] == list(range(10, 61, 5))
    assert np.all(start == 0.5) and program.alpha.shape == (5,)
    learned = np.sort(program.alpha)
    # symmetric start (0.5 each) -> spread like the generating prior (0.02 .. 1.5): measured
    # [0.16 0.33 0.45 0.50 1.25]; serial chains of the kernels alone end between
    # [0.05 0.12 0.44 0.69 1.3] and [0.16 0.25 0.45 0.94 1.0] (Gibbs's local modes)
    assert learned[0] < 0.25 and learned[-1] > 0.9 and learned[-1] / learned[0] > 4, learned
    assert rows[-1]["alpha_sum"] == pytest.approx(program.alpha.sum())
    # control: documents drawn from a symmetric Dir(0.2) keep a nearly symmetric learned prior
    program = make_program(corpus[0], 400, 2, iterations=60, optimize_alpha=True, optimize_interval=5,
                           optimize_burn_in=10, max_doc_length=60)
    with Engine(program, sc.parallelize(corpus[0], 2), seed=1).fit():
        pass
    assert program.alpha.max() / program.alpha.min() < 2, program.alpha


class AlphaRecordingLDA(LDAProgram):
    """Records (iteration, alpha) at every schedule call, on the driver (not checkpointed)."""

    checkpoint_ignore = tuple(LDAProgram.checkpoint_ignore) + ("seen",)

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.seen = []

    def schedule(self, ctx):
        self.seen.append((ctx.rounds_done // self.num_workers, self.alpha.copy()))
        return super().schedule(ctx)


def test_the_learned_alpha_is_checkpointed_and_resumed(sc, skewed_corpus):
    """A fit stopped after 3 steps resumes from its checkpoint with the alpha it had learned
    (not the starting one), and goes on learning."""
    def fit(config, max_steps=None):
        program = make_program(skewed_corpus, 400, 2, iterations=12, cls=AlphaRecordingLDA, optimize_alpha=True,
                               optimize_interval=2, max_doc_length=60)
        engine = Engine(program, sc.parallelize(skewed_corpus, 2), seed=1,
                        config=dict({"step.targetSeconds": 1000, "progress": "off"}, **config))
        with engine.fit(max_steps):
            return program, engine.summary

    config = {"checkpoint.dir": tempfile.mkdtemp(), "checkpoint.interval": 1}
    stopped, first = fit(config, max_steps=3)  # the init step and two steps of 2 iterations
    assert first.iterations[-1]["iteration"] == 4 and not np.allclose(stopped.alpha, 0.5)
    resumed, second = fit(config)
    assert second.fixed["resumed_from_step"] == 3
    iteration, alpha = resumed.seen[0]
    assert iteration == 4
    np.testing.assert_array_equal(alpha, stopped.alpha)
    assert [r["iteration"] for r in second.iterations if "alpha_sum" in r] == [2, 4, 6, 8, 10, 12]
    assert not np.array_equal(resumed.alpha, stopped.alpha)


def test_doc_blocks_and_tuples_load_as_the_same_documents_in_id_order():
    """A columnar decode hands ``load`` DocBlocks; tuples, blocks or both, in any order, give the
    same documents in id order (a worker's tokens must not depend on the delivery order)."""
    import pyarrow as pa

    from pystrads.ml._lda_data import DOC_RECORD_SCHEMA, doc_blocks

    rng = np.random.default_rng(2)
    docs = [(int(d), np.sort(rng.choice(50, rng.integers(1, 6), replace=False)), rng.integers(1, 4, 6))
            for d in rng.permutation(40) * 7 - 100]
    docs = [(d, t, c[:len(t)]) for d, t, c in docs]
    want = sorted(docs, key=lambda r: r[0])
    names = [f.split()[0] for f in DOC_RECORD_SCHEMA.split(", ")]
    batch = pa.RecordBatch.from_arrays([pa.array([d for d, _, _ in docs], pa.int64()),
                                        pa.array([t.tolist() for _, t, _ in docs], pa.list_(pa.int64())),
                                        pa.array([c.tolist() for _, _, c in docs], pa.list_(pa.int64()))], names)
    mixed = doc_blocks(batch.slice(25)) + docs[10:25][::-1] + doc_blocks(batch.slice(0, 10)) + doc_blocks(batch[:0])
    for records in (docs, doc_blocks(batch), mixed):
        got = _documents(records)
        assert got.docs.tolist() == [d for d, _, _ in want]
        assert got.lengths.tolist() == [len(t) for _, t, _ in want]
        assert np.array_equal(got.terms, np.concatenate([t for _, t, _ in want]))
        assert np.array_equal(got.counts, np.concatenate([c for _, _, c in want]))
    assert len(_documents([]).docs) == 0
    # ids that do not compare keep the input order
    odd = [("b", [3], [2]), (1, [1, 2], [1, 1])]
    assert _documents(odd).terms.tolist() == [3, 1, 2] and isinstance(_documents(odd), DocBlock)
    # string and tuple ids sort as Python sorts them, into arrays whose bytes are the ids (the
    # checkpoint fingerprint hashes them)
    named = _documents([("b", [3], [2]), ("a", [1], [1])])
    assert named.docs.tolist() == ["a", "b"] and named.docs.dtype.kind == "U" and named.terms.tolist() == [1, 3]
    pairs = _documents([((1, 2), [3], [2]), ((0, 5), [1], [1])])
    assert pairs.docs.tolist() == [[0, 5], [1, 2]] and pairs.terms.tolist() == [1, 3]



@pytest.mark.parametrize("workers,threads,sampler", [(1, 2, "dense"), (2, 2, "fplus"), (1, 3, "mh"),
                                                     (2, 2, "alias")])
def test_a_workers_threads_keep_the_counts_exact_and_learn_as_one_thread_does(sc, workers, threads, sampler):
    """T threads per worker (tomotopy's partitioned scheme inside the worker): document parts x
    row parts, each thread with its own copy of the totals merged after every sub-round. Counts
    stay exact, the chain is another one than a single thread's (the threads ran), and it learns
    as well."""
    # documents of 100 tokens: chains from any start reach the same mode within 40 iterations (the
    # fault suite's corpus), so the threads' final likelihood is comparable with one thread's
    docs, _ = synthetic_corpus(n_docs=240, vocab=300, topics=5, doc_len=100, seed=4)
    tokens = sum(int(c.sum()) for _, _, c in docs)
    final = {}
    for t in (1, threads):
        program = make_program(docs, 300, workers, iterations=40, sampler=sampler)
        with Engine(program, sc.parallelize(docs, workers), seed=1, config={"worker.threads": t}).fit() as res:
            word_topic = res.read_table("word_topic")
            assert word_topic.sum() == tokens
            assert np.array_equal(res.read_table("topic_totals")[0], word_topic.sum(axis=0))
            assert np.array_equal(word_topic, recount(res, 300, 5))
            assert res.summary.fixed["threads"] == t
            ll = [r["log_likelihood"] for r in res.summary.iterations]
            final[t] = (word_topic, ll)
    assert not np.array_equal(final[1][0], final[threads][0])
    ll1, llt = final[1][1], final[threads][1]
    assert llt[-1] > llt[0] + 0.05 * abs(llt[0]), llt
    assert abs(llt[-1] - ll1[-1]) <= 0.01 * abs(ll1[-1]), (ll1[-1], llt[-1])


class _DocCountsChecked(LDAProgram):
    """LDAProgram that checks, after every push, the worker's document counts against a recount of
    its token topics and their memory against its tokens (a failure fails the fit)."""

    def push(self, ctx, data, state, block):
        state = super().push(ctx, data, state, block)
        ptr, entries = state.doc_counts
        n_docs, k = len(data.doc_ids), self.num_topics
        layout = state.doc_counts.layout
        assert layout == K.doc_counts_layout(self.sampler, n_docs, k)
        if layout != "table":
            per_token = 32 if layout == "hash" else 12
            assert entries.nbytes <= per_token * int(data.doc_ptr[-1]) + 8 * n_docs + 8, entries.nbytes
        for d in range(n_docs):
            lo, hi = data.doc_ptr[d], data.doc_ptr[d + 1]
            topics, counts = np.unique(state.token_topic[data.doc_tokens[lo:hi]], return_counts=True)
            if layout == "table":
                row = entries[ptr[d] + 1:ptr[d] + 1 + k]
                kept = np.c_[np.flatnonzero(row), row[row > 0]]
            elif layout == "hash":  # the occupied slots, in topic order
                slots = entries[ptr[d] + 1:ptr[d + 1]].reshape(-1, 2)
                assert entries[ptr[d]] == -int(np.log2(len(slots))) and len(slots) >= 2 * (hi - lo)
                kept = slots[slots[:, 0] >= 0]
                kept = kept[np.argsort(kept[:, 0])]
            else:
                m = entries[ptr[d]]
                kept = entries[ptr[d] + 1:ptr[d] + 1 + 2 * m].reshape(-1, 2)
            assert kept.tolist() == np.c_[topics, counts].tolist(), (d, kept, topics, counts)
        return state


@pytest.mark.parametrize("sampler,threads,n_docs", [("alias", 2, 1400), ("alias", 1, 60), ("fplus", 1, 1400)])
def test_counts_stay_exact_at_a_hundred_thousand_topics(sc, sampler, threads, n_docs):
    """K = 100,000 (the alias sampler is auto's pick there): after three iterations the shards'
    word-topic rows and the topic totals match a recount of the token topics, and after every
    round each worker's document counts match a recount in the layout the rule gives: with 700
    documents a worker (a documents x K table would be 267 MiB) alias's hash layout and F+LDA's
    O(tokens) lists, with 30 the table."""
    k, vocab = 100_000, 60
    assert K.choose_sampler(k, 40) == "alias"
    expected = "table" if n_docs == 60 else {"fplus": "lists", "alias": "hash"}[sampler]
    assert K.doc_counts_layout(sampler, n_docs // 2, k) == expected
    rng = np.random.default_rng(11)  # Zipf-like words: some rows fill up, most stay sparse
    docs = [(d, *np.unique(np.minimum(rng.zipf(1.3, 40) - 1, vocab - 1), return_counts=True)) for d in range(n_docs)]
    tokens = sum(int(c.sum()) for _, _, c in docs)
    weights = np.zeros(vocab)
    for _, w, c in docs:
        np.add.at(weights, w, c)
    program = _DocCountsChecked(num_topics=k, vocab_size=vocab, num_workers=2,
                                block_bounds=range_bounds(vocab, 2, weights), alpha=0.1, beta=0.01, max_iter=3,
                                sampler=sampler, seed=3, word_weights=weights)
    with Engine(program, sc.parallelize(docs, 2), seed=1, config={"worker.threads": threads}).fit() as res:
        word_topic = res.read_table("word_topic")
        assert word_topic.shape == (vocab, k) and word_topic.sum() == tokens
        assert np.array_equal(res.read_table("topic_totals")[0], word_topic.sum(axis=0))
        wt = np.zeros((vocab, k), dtype=np.int64)  # recount() is sized for a handful of topics; the same sum
        for part in res.map_states(lambda worker, data, state: [
                (words[data.token_row[data.block_tok[b]:data.block_tok[b + 1]]],
                 state.token_topic[data.block_tok[b]:data.block_tok[b + 1]])
                for b, words in enumerate(data.block_words)]):
            for w, z in part:
                np.add.at(wt, (w, z), 1)
        assert np.array_equal(word_topic, wt)
        assert res.summary.fixed["threads"] == threads
        assert res.summary.iterations[-1]["iteration"] == 3


# learned beta (optimize_beta)
# --------------------------------------------------------------------------

def test_learned_beta_is_minkas_fixed_point_of_the_counts_and_the_shards_use_it(sc, corpus):
    """Every optimize_interval iterations beta is Minka's fixed point from the word-topic counts
    the shards summarised; the shards' log-likelihood uses the beta in effect (the program they
    run follows the driver's); beta moves from 0.1 to near the generating 0.05."""
    docs, _ = corpus
    program = make_program(docs, 400, 2, iterations=12, optimize_beta=True, optimize_interval=4)
    with Engine(program, sc.parallelize(docs, 2), seed=1).fit() as res:
        word_topic = res.read_table("word_topic")
        totals = res.read_table("topic_totals")[0]
        doc_parts = res.map_states(lambda w, data, state: K.doc_log_likelihood(
            K.count_doc_topic(data.token_doc, state.token_topic, len(data.doc_ids), 5), data.doc_lengths, 0.5))
        rows = res.summary.iterations
    betas = [(r["iteration"], r["beta"]) for r in rows if "beta" in r]
    assert [i for i, _ in betas] == [4, 8, 12]
    in_effect = betas[1][1]  # iterations 9 .. 12 sampled with the beta of the update after iteration 8
    expected = K.beta_fixed_point(in_effect, K.word_topic_count_summary(word_topic), totals, 400)
    assert program.beta == betas[-1][1] == pytest.approx(expected, rel=1e-12)
    direct = sum(doc_parts) + K.word_log_likelihood_rows(word_topic, in_effect) + \
        K.topic_totals_log_likelihood(totals, in_effect, 400)
    assert rows[-1]["log_likelihood"] == pytest.approx(direct, rel=1e-12)
    # measured 0.117, 0.067, 0.049: from a random start the counts first look flatter than they end
    assert 0.03 < betas[-1][1] < 0.07 and betas[-1][1] < betas[1][1] < betas[0][1], betas
    assert all(not any(k.startswith("beta_summary") for k in r) for r in rows)  # the summaries stay internal
    # without the log-likelihood the shards still summarise the counts at the updates: the same chain, same betas
    quiet = make_program(docs, 400, 2, iterations=12, optimize_beta=True, optimize_interval=4, log_likelihood_every=0)
    with Engine(quiet, sc.parallelize(docs, 2), seed=1).fit() as res:
        assert [(r["iteration"], r["beta"]) for r in res.summary.iterations if "beta" in r] == betas
