"""Learned β: held-out perplexity of StradsLDA with a fixed and a learned topicConcentration.

    python jobs/bench_lda_priors.py [--corpora reuters,debian] [-k 50] [--iters 100] [--seeds 1,2,3]
                                    [--beta 0.1] [--quick]

Per corpus (Reuters-21578's ModApte split; the Debian package descriptions, a seeded 90/10
split; both tokenised as ``jobs/bench_lda.py`` does), StradsLDA at its defaults (learned α every
10 iterations) with ``topicConcentration=--beta`` fixed and learned
(``optimizeTopicConcentration=True``), one fit per seed each, interleaved; held-out
document-completion perplexity of each model with its own priors (``jobs/bench_lda.py``'s
``heldout_perplexity``), the learned β and the fit time.  Prints a table and writes JSON
(``--out``).  Reuters is research-only data: it is read from ``../shared/data``, never shipped.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def fit(df, k, beta, iters, seed, learn_beta):
    from pystrads.ml import StradsLDA

    t0 = time.perf_counter()
    model = StradsLDA(k=k, maxIter=iters, seed=seed, topicConcentration=beta,
                      optimizeTopicConcentration=learn_beta).fit(df)
    wall = time.perf_counter() - t0
    counts = model.topicsMatrix().toArray()
    learned = model.estimatedTopicConcentration()
    return counts + learned, model.estimatedDocConcentration().toArray(), learned, wall


def main(argv=None):
    p = argparse.ArgumentParser(description="StradsLDA with a fixed and a learned topicConcentration")
    p.add_argument("--corpora", default="reuters,debian")
    p.add_argument("-k", type=int, default=50)
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--beta", type=float, default=0.1, help="the fixed beta, and where the learned one starts")
    p.add_argument("--quick", action="store_true", help="2,000 training documents, 20 iterations, one seed")
    p.add_argument("--out", default="out/bench_lda_priors.json")
    args = p.parse_args(argv)
    if args.quick:
        args.iters, args.seeds = 20, "1"
    seeds = [int(s) for s in args.seeds.split(",")]
    from pyspark.ml.feature import StopWordsRemover

    from bench_lda import heldout_perplexity, spark_df, tokenize_corpus
    from bench_scoring import write_run
    from pystrads.session import spark_session

    spark = spark_session(app_name="bench_lda_priors", conf={"spark.driver.memory": "8g"})
    spark.sparkContext.setLogLevel("ERROR")
    stop = set(StopWordsRemover.loadDefaultStopWords("english"))
    results = []
    for corpus in [c.strip() for c in args.corpora.split(",") if c.strip()]:
        vocab, train_ids, test_ids = tokenize_corpus(corpus, stop, args.quick)
        df = spark_df(spark, vocab, train_ids)
        df.count()
        fit(df, args.k, args.beta, 2, 0, True)  # warm-up: kernels compiled, shards started
        runs = {"fixed": [], "learned": []}
        for seed in seeds:
            for variant in runs:
                phi, alpha, beta, wall = fit(df, args.k, args.beta, args.iters, seed, variant == "learned")
                perplexity = heldout_perplexity(phi, test_ids, alpha)
                runs[variant].append({"seed": seed, "heldout_perplexity": round(perplexity, 1),
                                      "beta": round(beta, 6), "wall_s": round(wall, 2)})
                print(f"  {corpus:<8} {variant:<8} seed {seed}: beta {beta:.4f}  perplexity {perplexity:8.1f}  "
                      f"{wall:6.1f} s", flush=True)
        row = {"corpus": corpus, "k": args.k, "iterations": args.iters, "documents": len(train_ids),
               "tokens": int(sum(len(d) for d in train_ids)), "vocabulary": len(vocab), "runs": runs}
        for variant, rs in runs.items():
            row[variant] = {key: statistics.median(r[key] for r in rs) for key in ("heldout_perplexity", "beta",
                                                                                  "wall_s")}
        row["perplexity_ratio"] = row["learned"]["heldout_perplexity"] / row["fixed"]["heldout_perplexity"]
        results.append(row)
        print(f"{corpus}: perplexity fixed {row['fixed']['heldout_perplexity']:.1f}, learned "
              f"{row['learned']['heldout_perplexity']:.1f} ({row['perplexity_ratio']:.3f}x), learned beta "
              f"{row['learned']['beta']:.4f}", flush=True)
        df.unpersist()
    return write_run("bench_lda_priors.py", argv, args.out, beta=args.beta, seeds=seeds, results=results)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
