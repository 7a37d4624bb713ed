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

Reports wall time (everything included), tokens/s, and held-out perplexity;
StradsLDA with 1 and 2 workers; StradsLDA's time to reach MLlib EM's
perplexity (fits of increasing length).  Prints a table, writes JSON and a
plot.  The data (``../shared/data``) is not shipped with pystrads: Reuters is
for research use.
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
    """Document-completion perplexity of the held-out docs under topics phi (V x K)."""
    from pystrads.kernels import lda as K
    from pystrads.kernels.random import new_state

    words = np.concatenate([np.asarray(d, dtype=np.int64) for d in test_ids])
    ptr = np.concatenate([[0], np.cumsum([len(d) for d in test_ids])]).astype(np.int64)
    phi = np.ascontiguousarray(phi / phi.sum(axis=0, keepdims=True))
    ll, n = K.document_completion_log_likelihood(words, ptr, phi, alpha, 50, new_state(seed, 0))
    return float(np.exp(-ll / n))


def run_tomotopy(vocab, train_ids, k, alpha, beta, iters, seed, workers):
    import tomotopy as tp

    model = tp.LDAModel(k=k, alpha=alpha, eta=beta, seed=seed)
    model.optim_interval = 0  # keep alpha fixed: tomotopy re-estimates it every 10 iterations by default
    for d in train_ids:
        model.add_doc([vocab[i] for i in d])
    t0 = time.perf_counter()
    model.train(0, workers=workers)  # builds the corpus structures
    setup = time.perf_counter() - t0
    t0 = time.perf_counter()
    model.train(iters, workers=workers)
    train_s = time.perf_counter() - t0
    index = {w: i for i, w in enumerate(vocab)}
    phi = np.zeros((len(vocab), k))
    used = list(model.used_vocabs)
    rows = np.array([index[w] for w in used])
    for t in range(k):
        phi[rows, t] = model.get_topic_word_dist(t)
    return phi, setup + train_s, train_s


def spark_df(spark, vocab, ids):
    from pyspark.ml.linalg import SparseVector
    from pyspark.sql.types import LongType, StructField, StructType

    from pyspark.ml.linalg import VectorUDT

    rows = []
    for i, d in enumerate(ids):
        w, c = np.unique(np.asarray(d), return_counts=True)
        rows.append((i, SparseVector(len(vocab), w.tolist(), c.astype(float).tolist())))
    schema = StructType([StructField("id", LongType()), StructField("features", VectorUDT())])
    return spark.createDataFrame(rows, schema).repartition(2).cache()


def run_strads(df, k, alpha, beta, iters, seed, workers):
    from pystrads.ml import StradsLDA

    t0 = time.perf_counter()
    model = StradsLDA(k=k, maxIter=iters, seed=seed, docConcentration=[alpha], topicConcentration=beta,
                      numWorkers=workers, logLikelihoodEvery=max(1, iters // 10)).fit(df)
    wall = time.perf_counter() - t0
    wt = model._word_topic.astype(np.float64)
    phi = wt + beta
    s = model.summary
    return phi, wall, s


def run_mllib(df, k, alpha, beta, iters, seed, optimizer):
    from pyspark.ml.clustering import LDA

    if optimizer == "em":
        lda = LDA(k=k, maxIter=iters, seed=seed, optimizer="em", docConcentration=[alpha + 1.0],
                  topicConcentration=beta + 1.0, checkpointInterval=-1)
    else:
        lda = LDA(k=k, maxIter=iters, seed=seed, optimizer="online", docConcentration=[alpha],
                  topicConcentration=beta)
    t0 = time.perf_counter()
    model = lda.fit(df)
    topics = model.topicsMatrix().toArray()  # V x K
    wall = time.perf_counter() - t0
    return topics, wall


def em_map_topics(expected_counts, beta):
    """MLlib EM's MAP topics: its expected counts plus (topicConcentration - 1) = beta, as its logLikelihood does."""
    return expected_counts + beta


def main(argv=None):
    p = argparse.ArgumentParser(description="StradsLDA vs tomotopy vs MLlib LDA")
    p.add_argument("--corpus", choices=["reuters", "debian"], default="reuters")
    p.add_argument("-k", type=int, default=50)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--em-iters", type=int, default=60)
    p.add_argument("--online-iters", type=int, default=60)
    p.add_argument("--alpha", type=float, default=None, help="default 50/k")
    p.add_argument("--beta", type=float, default=0.1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip-em", action="store_true")
    p.add_argument("--skip-online", action="store_true")
    p.add_argument("--ladder", default="10,25,35,50,100", help="StradsLDA fit lengths for time-to-quality")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.quick:
        args.iters, args.em_iters, args.online_iters, args.repeats, args.ladder = 30, 10, 10, 1, "10"
    alpha = args.alpha if args.alpha is not None else 50.0 / args.k
    out_path = args.out or f"out/bench_lda_{args.corpus}.json"

    from pystrads.session import spark_session

    spark = spark_session("local[2]", "pystrads-bench-lda", {"spark.ui.enabled": "false",
                                                             "spark.driver.memory": "8g"})
    spark.sparkContext.setLogLevel("ERROR")
    from pyspark.ml.feature import StopWordsRemover

    stop = set(StopWordsRemover.loadDefaultStopWords("english"))
    t0 = time.perf_counter()
    vocab, train_ids, test_ids = tokenize_corpus(args.corpus, stop, args.quick)
    tokens = sum(len(d) for d in train_ids)
    print(f"{args.corpus}: {len(train_ids)} training docs, {tokens} tokens, V={len(vocab)}, {len(test_ids)} held-out "
          f"docs; K={args.k}, alpha={alpha:.4g}, beta={args.beta}  (prep {time.perf_counter() - t0:.1f} s)")
    df = spark_df(spark, vocab, train_ids)
    df.count()
    results = []

    def record(system, iters, wall, phi, extra=None):
        perp = heldout_perplexity(phi, test_ids, alpha)
        row = {"system": system, "iterations": iters, "wall_s": round(wall, 2),
               "tokens_per_s": round(tokens * iters / wall) if wall else None, "heldout_perplexity": round(perp, 1)}
        row.update(extra or {})
        results.append(row)
        print(f"  {system:<24} {iters:>4} it  {wall:8.1f} s  {row['tokens_per_s'] or 0:>12,} tok/s  "
              f"perplexity {perp:8.1f}", flush=True)
        return row

    # warm-up: numba compile and shard start are fixed costs reported separately
    t0 = time.perf_counter()
    run_strads(df, args.k, alpha, args.beta, 2, 0, 2)
    warm = time.perf_counter() - t0
    print(f"  (StradsLDA warm-up fit incl. kernel compile and shard start: {warm:.1f} s)")
    for rep in range(args.repeats):
        phi, wall, s = run_strads(df, args.k, alpha, args.beta, args.iters, rep + 1, 2)
        record("pystrads 2 workers", args.iters, wall, phi, {
            "repeat": rep, "sampler": s.sampler, "fixed_s": {k: round(v, 3) for k, v in s.fixed.items()},
            "steps": len(s.steps), "spark_s": round(float(s.steps["spark_s"].sum()), 2),
            "steps_s": round(float(s.steps["seconds"].sum()), 2),
            "train_loglik": s.logLikelihoodHistory[-1] if s.logLikelihoodHistory else None,
            "s_error_last": float(s.iterations["s_error"].iloc[-1])})
        phi, wall, tt = run_tomotopy(vocab, train_ids, args.k, alpha, args.beta, args.iters, rep + 1, 2)
        record("tomotopy 2 threads", args.iters, wall, phi, {"repeat": rep, "train_only_s": round(tt, 2)})
    phi, wall, s = run_strads(df, args.k, alpha, args.beta, args.iters, 1, 1)
    record("pystrads 1 worker", args.iters, wall, phi, {"sampler": s.sampler})
    for iters in [int(x) for x in args.ladder.split(",") if x]:
        phi, wall, s = run_strads(df, args.k, alpha, args.beta, iters, 1, 2)
        record("pystrads 2 workers", iters, wall, phi, {"ladder": True})
    if not args.skip_online:
        topics, wall = run_mllib(df, args.k, alpha, args.beta, args.online_iters, 1, "online")
        record("MLlib online", args.online_iters, wall, topics)
    if not args.skip_em:
        topics, wall = run_mllib(df, args.k, alpha, args.beta, args.em_iters, 1, "em")
        record("MLlib EM", args.em_iters, wall, em_map_topics(topics, args.beta),
               {"heldout_perplexity_raw_counts": round(heldout_perplexity(topics, test_ids, alpha), 1)})

    def median(system, key, iters=args.iters):
        vals = [r[key] for r in results if r["system"] == system and r["iterations"] == iters and not r.get("ladder")]
        return float(np.median(vals)) if vals else None

    summary = {}
    sp, tp = median("pystrads 2 workers", "heldout_perplexity"), median("tomotopy 2 threads", "heldout_perplexity")
    sw, tw = median("pystrads 2 workers", "wall_s"), median("tomotopy 2 threads", "wall_s")
    p1 = median("pystrads 1 worker", "heldout_perplexity")
    summary["perplexity_vs_tomotopy"] = sp / tp - 1 if sp and tp else None
    summary["throughput_vs_tomotopy"] = tw / sw if sw and tw else None
    summary["one_vs_two_workers"] = p1 / sp - 1 if p1 and sp else None
    em = [r for r in results if r["system"] == "MLlib EM"]
    if em:
        target = em[0]["heldout_perplexity"]
        reach = sorted((r["wall_s"], r["iterations"]) for r in results
                       if r["system"] == "pystrads 2 workers" and r["heldout_perplexity"] <= target)
        summary["mllib_em_perplexity"] = target
        summary["mllib_em_wall_s"] = em[0]["wall_s"]
        if reach:
            summary["pystrads_time_to_em_perplexity_s"] = reach[0][0]
            summary["speedup_to_em_perplexity"] = em[0]["wall_s"] / reach[0][0]
    print("\n| system | iterations | wall s | tokens/s | held-out perplexity |")
    print("|---|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['system']}{' (ladder)' if r.get('ladder') else ''} | {r['iterations']} | {r['wall_s']} | "
              f"{r['tokens_per_s'] or 0:,} | {r['heldout_perplexity']} |")
    print("\n" + "\n".join(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}" for k, v in summary.items()))
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    payload = {"corpus": args.corpus, "k": args.k, "alpha": alpha, "beta": args.beta, "train_docs": len(train_ids),
               "tokens": tokens, "vocab": len(vocab), "heldout_docs": len(test_ids), "results": results,
               "summary": summary, "warmup_s": warm,
               "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}}
    with open(out_path, "w") as fh:
        json.dump(payload, fh, indent=2)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for system, marker in [("pystrads 2 workers", "o"), ("tomotopy 2 threads", "s"), ("MLlib online", "^"),
                               ("MLlib EM", "v"), ("pystrads 1 worker", "x")]:
            pts = [(r["wall_s"], r["heldout_perplexity"]) for r in results if r["system"] == system]
            if pts:
                ax.scatter(*zip(*pts), marker=marker, label=system)
        ax.set_xscale("log")
        ax.set_xlabel("wall time (s, log)")
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
