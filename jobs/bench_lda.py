"""LDA benchmark: StradsLDA vs tomotopy (C++ collapsed Gibbs) vs MLlib online and EM LDA, same run.

    python jobs/bench_lda.py                                   # Reuters-21578, K = 50
    python jobs/bench_lda.py --corpus debian --skip-em         # Debian package descriptions
    python jobs/bench_lda.py --quick                           # a small smoke run

Every system gets the same tokens (lowercase ``[a-z]+`` words of 2+ letters,
Spark's English stop words removed, words in at least 2 training documents)
and the same symmetric priors alpha, beta (MLlib EM is given alpha + 1 and
beta + 1: its MAP convention).  Held-out perplexity is computed by ONE
evaluator for all systems from their topic-word matrices: document
completion (Wallach et al. 2009) -- theta fitted by Gibbs fold-in on the first
half of each held-out document with the topics fixed, the second half scored
(``pystrads.kernels.lda.document_completion_log_likelihood``).  Each system's
topics are its own point estimate of phi, smoothing included: collapsed Gibbs
(pystrads, tomotopy) ``(n_wk + beta) / (n_k + V beta)``; MLlib online the mean
of its variational Dirichlet ``lambda``; MLlib EM the MAP estimate
``(N_wk + eta - 1) / (N_k + V (eta - 1))`` with eta = beta + 1 -- exactly what
MLlib's own ``DistributedLDAModel.logLikelihood`` uses.  (``topicsMatrix()``
of an EM model is the raw expected counts ``N_wk`` without that smoothing;
scored raw, EM looks 4 % better than its own model -- the figure is reported
as ``heldout_perplexity_raw_counts`` for comparison.)

Timing protocol (the same rule for every system):

* Warm-up.  Every system gets ONE short untimed fit before any timed run
  (JVM class loading and JIT, numba compilation, shard start, library
  loading and thread pools are paid there, not in the table): StradsLDA a
  2-iteration fit (2 workers) on the benchmark DataFrame; tomotopy a
  5-iteration train of a small model (the first 200 training documents);
  MLlib online and MLlib EM each a ``maxIter=2`` fit on the benchmark
  DataFrame (topics read back); the learned-alpha variants of StradsLDA and
  tomotopy the same fits with an alpha update every iteration.  Their times are printed and written to the
  JSON as ``warmup_s``.
* Repeats.  Every system is timed ``--repeats`` times (default 3; seeds 1,
  2, ...) and the table shows medians, with the number of runs each median
  is over in its ``runs`` column.  The one exception is MLlib EM, timed
  ``--em-repeats`` times (default 1: one 60-iteration EM fit takes ~340 s
  on the 2-core development machine).  The timed runs of StradsLDA (2 and
  1 workers), tomotopy and MLlib online are interleaved round by round;
  then the StradsLDA ladder (one fit per length, for time-to-quality; warm,
  after the warm-ups); MLlib EM's runs come last so that its cached graph
  never sits under another system's timing.
* Columns.  ``prep s`` is the system's own data preparation: tomotopy's
  model construction and ``add_doc`` loop (timed apart from ``train``);
  StradsLDA's input scan and data load to the workers (``scan_s`` +
  ``load_s`` of ``model.summary.fixed``, measured inside its ``fit``);
  MLlib's preparation happens inside ``fit`` and cannot be separated
  (shown as "inside fit", counted in ``train s``).  ``train s`` is the rest:
  for tomotopy ``train`` (its first call also assigns the initial topics,
  like StradsLDA's init step) and reading the topics back; for StradsLDA
  the shard check, table creation, init, the steps and reading the model
  back; for MLlib ``fit`` plus ``topicsMatrix()``.  ``wall s`` =
  ``prep s`` + ``train s``: everything from the start of the system's data
  preparation to its topic matrix in hand.  Shared inputs are excluded for everyone and reported
  once: the tokenisation, the cached Spark DataFrame of term-count vectors
  (the input of StradsLDA and both MLlib optimizers) and tomotopy's word
  lists.  ``tokens/s`` = tokens x iterations / ``wall s``.

Learned priors: StradsLDA with ``optimizeDocConcentration`` and tomotopy with
its ``optim_interval`` (both every ``--optimize-interval`` iterations, default
10, from the same symmetric start) learn an asymmetric alpha; their rows
("... learned alpha") are warmed up and repeated as the others, interleaved in
the same rounds, and each model is scored with ITS OWN alpha (the evaluator's
fold-in and theta use the learned vector).  The learned vectors are printed
(sorted) and written to the JSON (``learned_alpha`` of each run).

Also reports StradsLDA with 1 and 2 workers and StradsLDA's time to reach
MLlib EM's perplexity (the ladder: fits of increasing length).  Prints a
table, writes JSON (every run in ``results``, the medians in ``table``) and
a plot.  The data (``../shared/data``) is not shipped with pystrads: Reuters
is for research use.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import re
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

SHARED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data")


def tokenize_corpus(name, stop_words, quick):
    from pystrads.datasets import read_reuters21578

    if name == "reuters":
        docs = read_reuters21578(os.path.join(SHARED, "reuters21578"))
        train = [t for _, split, t in docs if split == "TRAIN"]
        test = [t for _, split, t in docs if split == "TEST"]
    else:
        with gzip.open(os.path.join(SHARED, "debian_descriptions.jsonl.gz"), "rt") as fh:
            texts = [json.loads(line)["text"] for line in fh]
        rng = np.random.default_rng(0)
        order = rng.permutation(len(texts))
        cut = int(0.9 * len(texts))
        train = [texts[i] for i in order[:cut]]
        test = [texts[i] for i in order[cut:]]
    if quick:
        train, test = train[:2000], test[:300]
    word = re.compile(r"[a-z]{2,}")

    def toks(t):
        return [w for w in word.findall(t.lower()) if w not in stop_words]

    train_tok = [toks(t) for t in train]
    df = {}
    for doc in train_tok:
        for w in set(doc):
            df[w] = df.get(w, 0) + 1
    vocab = sorted(w for w, c in df.items() if c >= 2)
    index = {w: i for i, w in enumerate(vocab)}
    train_ids = [[index[w] for w in doc if w in index] for doc in train_tok]
    test_ids = [[index[w] for w in toks(t) if w in index] for t in test]
    train_ids = [d for d in train_ids if d]
    test_ids = [d for d in test_ids if len(d) >= 2]
    return vocab, train_ids, test_ids


def heldout_perplexity(phi, test_ids, alpha, seed=0):
    """Document-completion perplexity of the held-out docs under topics phi (V x K) and the
    document-topic prior alpha (a number, or one value per topic)."""
    from pystrads.kernels import lda as K
    from pystrads.kernels.random import new_state

    words = np.concatenate([np.asarray(d, dtype=np.int64) for d in test_ids])
    ptr = np.concatenate([[0], np.cumsum([len(d) for d in test_ids])]).astype(np.int64)
    phi = np.ascontiguousarray(phi / phi.sum(axis=0, keepdims=True))
    ll, n = K.document_completion_log_likelihood(words, ptr, phi, alpha, 50, new_state(seed, 0))
    return float(np.exp(-ll / n))


def run_tomotopy(vocab, train_words, k, alpha, beta, iters, seed, workers, optim_interval=0, burn_in=0):
    """One tomotopy fit: (phi, prep_s, train_s, init_s, alpha).

    prep = model construction + the ``add_doc`` loop (the word lists are built
    once, outside every timing); train = ``train(0)`` (tomotopy's prepare: its
    vocabulary arrays and the random initial topics, reported as init_s) +
    ``train(iters)`` + reading the topics back.  ``optim_interval`` 0 keeps
    alpha fixed (tomotopy's default re-estimates it every 10 iterations, from
    iteration ``burn_in`` on); alpha is the model's final one."""
    import tomotopy as tp

    t0 = time.perf_counter()
    model = tp.LDAModel(k=k, alpha=alpha, eta=beta, seed=seed)
    model.optim_interval = optim_interval
    model.burn_in = burn_in
    for words in train_words:
        model.add_doc(words)
    prep_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    model.train(0, workers=workers)  # prepare: corpus arrays and the initial topic assignment
    init_s = time.perf_counter() - t0
    model.train(iters, workers=workers)
    topics = [model.get_topic_word_dist(t) for t in range(k)]
    train_s = time.perf_counter() - t0
    index = {w: i for i, w in enumerate(vocab)}
    phi = np.zeros((len(vocab), k))
    rows = np.array([index[w] for w in model.used_vocabs])
    for t in range(k):
        phi[rows, t] = topics[t]
    return phi, prep_s, train_s, init_s, np.asarray(model.alpha, dtype=np.float64)


def spark_df(spark, vocab, ids, partitions=2):
    from pyspark.ml.linalg import SparseVector
    from pyspark.sql.types import LongType, StructField, StructType

    from pyspark.ml.linalg import VectorUDT

    rows = []
    for i, d in enumerate(ids):
        w, c = np.unique(np.asarray(d), return_counts=True)
        rows.append((i, SparseVector(len(vocab), w.tolist(), c.astype(float).tolist())))
    schema = StructType([StructField("id", LongType()), StructField("features", VectorUDT())])
    return spark.createDataFrame(rows, schema).repartition(partitions).cache()


def run_strads(df, k, alpha, beta, iters, seed, workers, optimize_interval=0, burn_in=0):
    """One StradsLDA fit: (phi, wall_s, prep_s, summary, alpha); prep = input scan + data load (from the
    summary); ``optimize_interval`` > 0 learns alpha (optimizeDocConcentration) every that many iterations."""
    from pystrads.ml import StradsLDA

    t0 = time.perf_counter()
    lda = StradsLDA(k=k, maxIter=iters, seed=seed, docConcentration=[alpha], topicConcentration=beta,
                    numWorkers=workers, logLikelihoodEvery=max(1, iters // 10), optimizeDocConcentration=False)
    if optimize_interval:
        lda.setOptimizeDocConcentration(True).setOptimizeInterval(optimize_interval).setOptimizeBurnIn(burn_in)
    model = lda.fit(df)
    wall = time.perf_counter() - t0
    wt = model.topicsMatrix().toArray()  # V x K counts (float64)
    phi = wt + beta
    s = model.summary
    prep = float(s.fixed.get("scan_s", 0.0)) + float(s.fixed.get("load_s", 0.0))
    return phi, wall, prep, s, model.estimatedDocConcentration().toArray()


def run_mllib(df, k, alpha, beta, iters, seed, optimizer):
    from pyspark.ml.clustering import LDA

    if optimizer == "em":
        lda = LDA(k=k, maxIter=iters, seed=seed, optimizer="em", docConcentration=[alpha + 1.0],
                  topicConcentration=beta + 1.0, checkpointInterval=-1)
    else:
        lda = LDA(k=k, maxIter=iters, seed=seed, optimizer="online", docConcentration=[alpha],
                  topicConcentration=beta)
    t0 = time.perf_counter()
    model = lda.fit(df)  # MLlib's data preparation happens in here: not separable
    topics = model.topicsMatrix().toArray()  # V x K
    wall = time.perf_counter() - t0
    del model
    return topics, wall


def em_map_topics(expected_counts, beta):
    """MLlib EM's MAP topics: its expected counts plus (topicConcentration - 1) = beta, as its logLikelihood does."""
    return expected_counts + beta


#: the rows of the systems that learn alpha carry this suffix
LEARNED = ", learned alpha"

# table order: StradsLDA (a default session's shape, 1 worker x 2 threads, 2 workers, 1 worker, the ladder),
# tomotopy, the learned-alpha rows, MLlib online, MLlib EM
DEFAULT = "pystrads default"
THREADED = "pystrads 1 worker x 2 threads"
SYSTEM_ORDER = [DEFAULT, THREADED, "pystrads 2 workers", "pystrads 1 worker", "pystrads 2 workers (ladder)", "tomotopy 2 threads",
                "pystrads 2 workers" + LEARNED, "tomotopy 2 threads" + LEARNED, "MLlib online", "MLlib EM"]


def median_table(results, tokens):
    """One row per (system, iterations, ladder): medians over its runs, each column its own median."""
    groups = {}
    for r in results:
        groups.setdefault((r["system"], r["iterations"], bool(r.get("ladder"))), []).append(r)

    def med(rs, key):
        vals = [r.get(key) for r in rs]
        return float(np.median(vals)) if vals and all(v is not None for v in vals) else None

    rows = []
    for (system, iters, ladder), rs in groups.items():
        wall = med(rs, "wall_s")
        row = {"system": system, "iterations": iters, "ladder": ladder, "runs": len(rs),
               "prep_s": med(rs, "prep_s"), "train_s": med(rs, "train_s"), "wall_s": wall,
               "tokens_per_s": round(tokens * iters / wall) if wall else None,
               "heldout_perplexity": round(med(rs, "heldout_perplexity"), 1)}
        if rs[0].get("workers") is not None:  # the fit's shape (the default row: the one pystrads picked)
            row["workers"], row["threads"] = rs[0]["workers"], rs[0]["threads"]
        if system == "MLlib EM":
            row["heldout_perplexity_raw_counts"] = round(med(rs, "heldout_perplexity_raw_counts"), 1)
        if rs[0].get("learned_alpha") is not None:  # the run of median perplexity: its alpha
            chosen = sorted(rs, key=lambda r: r["heldout_perplexity"])[(len(rs) - 1) // 2]
            row["learned_alpha_sum"] = round(float(np.sum(chosen["learned_alpha"])), 4)
            row["learned_alpha"] = chosen["learned_alpha"]
        rows.append(row)
    def order(r):
        name = r["system"] + (" (ladder)" if r["ladder"] else "")
        return SYSTEM_ORDER.index(name) if name in SYSTEM_ORDER else -1  # other thread counts first
    rows.sort(key=lambda r: (order(r), r["iterations"]))
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description="StradsLDA vs tomotopy vs MLlib LDA")
    p.add_argument("--corpus", choices=["reuters", "debian"], default="reuters")
    p.add_argument("-k", type=int, default=50)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--em-iters", type=int, default=60)
    p.add_argument("--online-iters", type=int, default=60)
    p.add_argument("--alpha", type=float, default=None, help="default 50/k")
    p.add_argument("--beta", type=float, default=0.1)
    p.add_argument("--repeats", type=int, default=3, help="timed runs per system (medians); MLlib EM: --em-repeats")
    p.add_argument("--em-repeats", type=int, default=1,
                   help="timed MLlib EM runs (default 1: one 60-iteration fit is ~340 s on 2 cores)")
    p.add_argument("--skip-em", action="store_true")
    p.add_argument("--skip-online", action="store_true")
    p.add_argument("--ladder", default="10,25,35,50,100",
                   help="StradsLDA fit lengths for time-to-quality (one fit each)")
    p.add_argument("--optimize-interval", type=int, default=10,
                   help="iterations between alpha updates of the learned-alpha rows (tomotopy's optim_interval)")
    p.add_argument("--optimize-burn-in", type=int, default=0,
                   help="iterations before the first alpha update (StradsLDA's optimizeBurnIn, tomotopy's burn_in)")
    p.add_argument("--skip-learned", action="store_true", help="no learned-alpha rows")
    p.add_argument("--skip-fixed", action="store_true",
                   help="only the learned-alpha rows (e.g. to compare --optimize-burn-in values)")
    p.add_argument("--threads", type=int, default=2,
                   help="also time StradsLDA as one worker with this many threads, in a second Spark session "
                        "with spark.task.cpus set to it (interleaved with tomotopy again); 0: skip")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.quick:
        args.iters, args.em_iters, args.online_iters, args.repeats, args.em_repeats, args.ladder = \
            30, 10, 10, 1, 1, "10"
    if args.repeats < 1 or args.em_repeats < 1:
        p.error("--repeats and --em-repeats must be at least 1")
    alpha = args.alpha if args.alpha is not None else 50.0 / args.k
    out_path = args.out or f"out/bench_lda_{args.corpus}.json"

    from pystrads.session import spark_session

    def session(task_cpus=None):
        """local[2]; ``task_cpus`` set explicitly (else Spark's default, as a user's session has it)."""
        conf = {"spark.ui.enabled": "false", "spark.driver.memory": "8g"}
        if task_cpus:
            conf["spark.task.cpus"] = str(task_cpus)
        spark = spark_session("local[2]", "pystrads-bench-lda", conf)
        spark.sparkContext.setLogLevel("ERROR")
        return spark

    spark = session()
    from pyspark.ml.feature import StopWordsRemover

    stop = set(StopWordsRemover.loadDefaultStopWords("english"))
    t0 = time.perf_counter()
    vocab, train_ids, test_ids = tokenize_corpus(args.corpus, stop, args.quick)
    tokenize_s = time.perf_counter() - t0
    tokens = sum(len(d) for d in train_ids)
    print(f"{args.corpus}: {len(train_ids)} training docs, {tokens} tokens, V={len(vocab)}, {len(test_ids)} held-out "
          f"docs; K={args.k}, alpha={alpha:.4g}, beta={args.beta}  (tokenisation {tokenize_s:.1f} s)")
    # shared inputs, built once and excluded from every system's timing
    t0 = time.perf_counter()
    df = spark_df(spark, vocab, train_ids)
    df.count()
    spark_input_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    train_words = [[vocab[i] for i in d] for d in train_ids]
    tomotopy_words_s = time.perf_counter() - t0
    print(f"  shared inputs (untimed for every system): cached Spark DataFrame {spark_input_s:.1f} s, "
          f"tomotopy word lists {tomotopy_words_s:.1f} s")
    results = []

    def record(system, iters, prep, train, phi, extra=None, own_alpha=None):
        """own_alpha: the learned prior the model is scored with (None: the symmetric alpha)."""
        perp = heldout_perplexity(phi, test_ids, alpha if own_alpha is None else own_alpha)
        wall = round((prep or 0.0) + train, 3)
        row = {"system": system, "iterations": iters, "prep_s": round(prep, 3) if prep is not None else None,
               "train_s": round(train, 3), "wall_s": wall,
               "tokens_per_s": round(tokens * iters / wall) if wall else None,
               "train_tokens_per_s": round(tokens * iters / train) if train else None,
               "heldout_perplexity": round(perp, 1)}
        if own_alpha is not None:
            row["learned_alpha"] = [round(float(a), 6) for a in own_alpha]
        row.update(extra or {})
        results.append(row)
        prep_txt = f"{prep:6.1f}" if prep is not None else "  (in)"
        print(f"  {system:<24} {iters:>4} it  prep {prep_txt} + train {train:7.1f} = {wall:7.1f} s  "
              f"{row['tokens_per_s'] or 0:>12,} tok/s  perplexity {perp:8.1f}", flush=True)
        return row

    def strads(workers, iters, seed, extra=None, learned=False, threads=1):
        phi, wall, prep, s, own = run_strads(df, args.k, alpha, args.beta, iters, seed, workers,
                                             args.optimize_interval if learned else 0, args.optimize_burn_in)
        name = f"pystrads {workers} worker{'s' if workers > 1 else ''}" + (LEARNED if learned else "")
        if not workers:  # numWorkers unset in a session without settings: the shape pystrads picks
            name = DEFAULT
        elif threads > 1:
            assert s.fixed["threads"] == threads, s.fixed
            name = f"pystrads {workers} worker x {threads} threads"
        info = {"sampler": s.sampler, "threads": s.fixed["threads"], "workers": s.fixed["workers"], "fixed_s": {k: round(v, 3) for k, v in s.fixed.items()},
                "steps": len(s.steps), "outside_rounds_s": round(float(s.steps["outside_rounds_s"].sum()), 2),
                "steps_s": round(float(s.steps["seconds"].sum()), 2),
                # the engine's fit outside the workers' rounds (shard set-up, job launch, data load,
                # init, per-step scheduling, commits, snapshots, driver hooks, finish), as a fraction of the fit
                "rounds_s": round(float(s.steps["round_s"].sum()), 2),
                "outside_rounds_fraction": round(1.0 - float(s.steps["round_s"].sum()) / s.fixed["total_s"], 4)
                if s.fixed.get("total_s") else None,
                "outside_rounds_fraction_after_load": round(
                    1.0 - float(s.steps["round_s"].sum()) / (s.fixed["total_s"] - s.fixed.get("load_s", 0.0)), 4)
                if s.fixed.get("total_s") else None,
                "train_loglik": s.logLikelihoodHistory[-1] if s.logLikelihoodHistory else None,
                "s_error_last": float(s.iterations["s_error"].iloc[-1])}
        info.update(extra or {})
        return record(name, iters, prep, wall - prep, phi, info, own if learned else None)

    def tomotopy(iters, seed, extra=None, learned=False):
        phi, prep, train, init, own = run_tomotopy(vocab, train_words, args.k, alpha, args.beta, iters, seed, 2,
                                                   args.optimize_interval if learned else 0, args.optimize_burn_in)
        return record("tomotopy 2 threads" + (LEARNED if learned else ""), iters, prep, train, phi,
                      dict(extra or {}, init_s=round(init, 3)), own if learned else None)

    def mllib(optimizer, iters, seed, extra=None):
        topics, wall = run_mllib(df, args.k, alpha, args.beta, iters, seed, optimizer)
        if optimizer == "em":
            raw = heldout_perplexity(topics, test_ids, alpha)  # EM's expected counts scored without its smoothing
            extra = dict(extra or {}, heldout_perplexity_raw_counts=round(raw, 1))
            return record("MLlib EM", iters, None, wall, em_map_topics(topics, args.beta), extra)
        return record("MLlib online", iters, None, wall, topics, extra)

    # warm-up: one short untimed fit per system, all before any timed run
    warm = {}
    t0 = time.perf_counter()
    run_strads(df, args.k, alpha, args.beta, 2, 0, 2)
    warm["pystrads"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    run_tomotopy(vocab, train_words[:200], args.k, alpha, args.beta, 5, 0, 2)
    warm["tomotopy"] = time.perf_counter() - t0
    if not args.skip_learned:  # the learned-alpha paths too (an update in each warm-up fit)
        t0 = time.perf_counter()
        run_strads(df, args.k, alpha, args.beta, 2, 0, 2, optimize_interval=1)
        warm["pystrads_learned_alpha"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        run_tomotopy(vocab, train_words[:200], args.k, alpha, args.beta, 5, 0, 2, optim_interval=1)
        warm["tomotopy_learned_alpha"] = time.perf_counter() - t0
    if not args.skip_online:
        t0 = time.perf_counter()
        run_mllib(df, args.k, alpha, args.beta, 2, 0, "online")
        warm["mllib_online"] = time.perf_counter() - t0
    if not args.skip_em:
        t0 = time.perf_counter()
        run_mllib(df, args.k, alpha, args.beta, 2, 0, "em")
        warm["mllib_em"] = time.perf_counter() - t0
    print("  warm-up fits, untimed (StradsLDA 2 it incl. kernel compile and shard start; tomotopy 5 it on 200 docs; "
          "their learned-alpha variants the same with an update every iteration; MLlib maxIter=2): "
          + ", ".join(f"{k} {v:.1f} s" for k, v in warm.items()))

    # timed runs: interleaved rounds, then the ladder, then MLlib EM (last: its cached graph stays behind)
    for rep in range(args.repeats):
        if not args.skip_fixed:
            strads(0, args.iters, rep + 1, {"repeat": rep})
            strads(2, args.iters, rep + 1, {"repeat": rep})
            tomotopy(args.iters, rep + 1, {"repeat": rep})
            strads(1, args.iters, rep + 1, {"repeat": rep})
        if not args.skip_learned:
            strads(2, args.iters, rep + 1, {"repeat": rep}, learned=True)
            tomotopy(args.iters, rep + 1, {"repeat": rep}, learned=True)
        if not args.skip_online:
            mllib("online", args.online_iters, rep + 1, {"repeat": rep})
    for iters in [int(x) for x in args.ladder.split(",") if x]:
        strads(2, iters, 1, {"ladder": True})
    if not args.skip_em:
        for rep in range(args.em_repeats):
            mllib("em", args.em_iters, rep + 1, {"repeat": rep})
    if args.threads > 1 and not args.skip_fixed:
        # one worker with every core: spark.task.cpus is fixed per application, so a session of its own
        # (the same DataFrame built again, untimed, with one partition per worker as in the first session),
        # warmed up the same way, interleaved with tomotopy again
        spark.stop()
        spark = session(args.threads)
        df = spark_df(spark, vocab, train_ids, partitions=1)
        df.count()
        t0 = time.perf_counter()
        run_strads(df, args.k, alpha, args.beta, 2, 0, 1)
        warm[f"pystrads_{args.threads}_threads"] = time.perf_counter() - t0
        for rep in range(args.repeats):
            strads(1, args.iters, rep + 1, {"repeat": rep}, threads=args.threads)
            tomotopy(args.iters, rep + 1, {"repeat": rep, "session": "threads"})

    table = median_table(results, tokens)

    def main_row(system):
        return next((r for r in table if r["system"] == system and not r["ladder"]), None)

    summary = {}
    s2, s1, tt = main_row("pystrads 2 workers"), main_row("pystrads 1 worker"), main_row("tomotopy 2 threads")
    if s2 and tt:
        summary["perplexity_vs_tomotopy"] = s2["heldout_perplexity"] / tt["heldout_perplexity"] - 1
        summary["throughput_vs_tomotopy"] = tt["wall_s"] / s2["wall_s"]
        summary["throughput_vs_tomotopy_train_only"] = tt["train_s"] / s2["train_s"]
    if s1 and s2:
        summary["one_vs_two_workers"] = s1["heldout_perplexity"] / s2["heldout_perplexity"] - 1
    threaded = next((r for r in table if r["system"].endswith(f"x {args.threads} threads")), None)
    if threaded and tt:
        summary["threads_throughput_vs_tomotopy"] = tt["wall_s"] / threaded["wall_s"]
        summary["threads_perplexity_vs_tomotopy"] = threaded["heldout_perplexity"] / tt["heldout_perplexity"] - 1
    if threaded and s2:
        summary["threads_vs_two_workers_wall"] = threaded["wall_s"] / s2["wall_s"]
    default = main_row(DEFAULT)
    shapes = [r for r in (threaded, s2, s1) if r]
    if default and shapes:  # a default session against the best explicit shape of the same run
        best = min(shapes, key=lambda r: r["wall_s"])
        summary["default_shape"] = f"{default['workers']} worker(s) x {default['threads']} threads"
        summary["best_explicit_shape"] = best["system"]
        summary["default_vs_best_shape_wall"] = default["wall_s"] / best["wall_s"]
    if default and tt:
        summary["default_throughput_vs_tomotopy"] = tt["wall_s"] / default["wall_s"]
        summary["default_perplexity_vs_tomotopy"] = default["heldout_perplexity"] / tt["heldout_perplexity"] - 1
    s2l, ttl = main_row("pystrads 2 workers" + LEARNED), main_row("tomotopy 2 threads" + LEARNED)
    if s2l and ttl:  # learned alpha: perplexity and wall time against tomotopy's learned alpha
        summary["learned_perplexity_vs_tomotopy_learned"] = s2l["heldout_perplexity"] / ttl["heldout_perplexity"] - 1
        summary["learned_wall_vs_tomotopy_learned"] = s2l["wall_s"] / ttl["wall_s"]
    if s2l and s2:
        summary["pystrads_learned_vs_fixed_perplexity"] = s2l["heldout_perplexity"] / s2["heldout_perplexity"] - 1
        summary["pystrads_learned_vs_fixed_wall"] = s2l["wall_s"] / s2["wall_s"]
    em = main_row("MLlib EM")
    if em:
        target = em["heldout_perplexity"]
        reach = sorted((r["wall_s"], r["iterations"]) for r in table
                       if r["system"] == "pystrads 2 workers" and r["heldout_perplexity"] <= target)
        summary["mllib_em_perplexity"] = target
        summary["mllib_em_wall_s"] = em["wall_s"]
        summary["mllib_em_runs"] = em["runs"]
        if reach:
            summary["pystrads_time_to_em_perplexity_s"] = reach[0][0]
            summary["pystrads_iterations_to_em_perplexity"] = reach[0][1]
            summary["speedup_to_em_perplexity"] = em["wall_s"] / reach[0][0]

    def fmt(v, spec=".1f"):
        return "inside fit" if v is None else format(v, spec)

    print("\n| system | iterations | runs | prep s | train s | wall s (= prep + train) | tokens/s (wall) "
          "| held-out perplexity |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in table:
        perp = f"{r['heldout_perplexity']}"
        if "heldout_perplexity_raw_counts" in r:
            perp += f" (raw counts: {r['heldout_perplexity_raw_counts']})"
        print(f"| {r['system']}{' (ladder)' if r['ladder'] else ''} | {r['iterations']} | {r['runs']} | "
              f"{fmt(r['prep_s'])} | {fmt(r['train_s'])} | {fmt(r['wall_s'])} | {r['tokens_per_s'] or 0:,} | "
              f"{perp} |")
    for r in table:
        if "learned_alpha" in r:
            a = np.sort(r["learned_alpha"])
            print(f"{r['system']} (median run): learned alpha sum {a.sum():.3f}, min {a[0]:.4f}, median "
                  f"{np.median(a):.4f}, max {a[-1]:.4f} (symmetric start: {args.k} x {alpha:.4g} = "
                  f"{args.k * alpha:.3g}); sorted: " + " ".join(f"{x:.3g}" for x in a))
    em_rule = "" if args.skip_em else f"; MLlib EM over --em-repeats={args.em_repeats}"
    print(f"\nMedians over `runs` timed fits (every system --repeats={args.repeats}{em_rule}; ladder: one fit per "
          "length), each column its own median; every system warmed up by one short untimed fit first. prep s: the "
          "system's own data preparation (tomotopy: model construction + add_doc; StradsLDA: input scan + data load, "
          "inside its fit; MLlib: inside fit, not separable, counted in train s). train s: the rest, up to the topic "
          "matrix in hand. wall s = prep s + train s for every system. Shared inputs excluded for all: tokenisation "
          f"{tokenize_s:.1f} s, cached Spark DataFrame {spark_input_s:.1f} s, tomotopy word lists "
          f"{tomotopy_words_s:.1f} s.")
    print("\n" + "\n".join(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}" for k, v in summary.items()))
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    payload = {"corpus": args.corpus, "k": args.k, "alpha": alpha, "beta": args.beta,
               "optimize_interval": None if args.skip_learned else args.optimize_interval,
               "optimize_burn_in": None if args.skip_learned else args.optimize_burn_in, "train_docs": len(train_ids),
               "tokens": tokens, "vocab": len(vocab), "heldout_docs": len(test_ids),
               "protocol": {"repeats": args.repeats, "em_repeats": args.em_repeats, "iters": args.iters,
                            "online_iters": args.online_iters, "em_iters": args.em_iters, "ladder": args.ladder,
                            "wall": "prep_s + train_s; prep_s None = inside fit (MLlib)"},
               "shared_inputs_s": {"tokenise": round(tokenize_s, 3), "spark_dataframe": round(spark_input_s, 3),
                                   "tomotopy_word_lists": round(tomotopy_words_s, 3)},
               "warmup_s": {k: round(v, 3) for k, v in warm.items()},
               "table": table, "results": results, "summary": summary,
               "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}}
    with open(out_path, "w") as fh:
        json.dump(payload, fh, indent=2)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for system, marker in [(THREADED, "*"), ("pystrads 2 workers", "o"), ("tomotopy 2 threads", "s"), ("MLlib online", "^"),
                               ("MLlib EM", "v"), ("pystrads 1 worker", "x"), ("pystrads 2 workers" + LEARNED, "P"),
                               ("tomotopy 2 threads" + LEARNED, "D")]:
            pts = [(r["wall_s"], r["heldout_perplexity"]) for r in results if r["system"] == system]
            if pts:
                ax.scatter(*zip(*pts), marker=marker, label=system)
        ax.set_xscale("log")
        ax.set_xlabel("wall time (prep + train, s, log; each run)")
        ax.set_ylabel("held-out perplexity (document completion)")
        ax.set_title(f"LDA on {args.corpus}, K={args.k}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.splitext(out_path)[0] + ".png", dpi=100)
    except ImportError:
        pass
    print(f"wrote {out_path}")
    spark.stop()


if __name__ == "__main__":
    main()
