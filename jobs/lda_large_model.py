"""A big-model LDA run: V = 1,000,000 words x K = 100 topics (10^8 counts) on one machine.

    python jobs/lda_large_model.py [--vocab 1000000 --topics 100 --tokens 6000000 --iters 3]

The corpus is generated on the executors (Zipf word frequencies over the
whole vocabulary, so every shard range is used); the word-topic table lives
on two shards; the driver never holds it: the job reports the driver's peak
resident memory next to the table's size, and each shard's memory.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def peak_rss_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vocab", type=int, default=1_000_000)
    p.add_argument("--topics", type=int, default=100)
    p.add_argument("--tokens", type=int, default=6_000_000)
    p.add_argument("--doc-len", type=int, default=200)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--out", default="out/lda_large_model.json")
    args = p.parse_args(argv)

    from pystrads.engine import Engine
    from pystrads.programs.lda import LDAProgram
    from pystrads.ps.partition import range_bounds
    from pystrads.session import spark_session

    spark = spark_session("local[2]", "pystrads-lda-large", {
        "spark.ui.enabled": "false", "spark.pystrads.shard.perExecutor": "2", "spark.driver.memory": "4g"})
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    V, K = args.vocab, args.topics
    n_docs = args.tokens // args.doc_len
    ranks = np.arange(1, V + 1, dtype=np.float64)
    weights = ranks ** -0.8
    weights /= weights.sum()

    def generate(index, _):
        rng = np.random.default_rng(index)
        for d in range(index, n_docs, 2):
            words = rng.choice(V, size=args.doc_len, p=weights)
            uniq, counts = np.unique(words, return_counts=True)
            yield (d, uniq, counts)

    docs = sc.parallelize(range(2), 2).mapPartitionsWithIndex(generate)
    expected_tokens = weights * args.tokens  # partition weights: expected token mass per word
    bounds = range_bounds(V, 2, expected_tokens)
    program = LDAProgram(K, V, 2, bounds, alpha=50.0 / K, beta=0.01, max_iter=args.iters, sampler="fplus",
                         seed=1, word_weights=expected_tokens)
    rss0 = peak_rss_bytes()
    t0 = time.perf_counter()
    with Engine(program, docs, num_workers=2, seed=1).fit() as result:
        fit_s = time.perf_counter() - t0
        rss_peak = peak_rss_bytes()
        stats = result.engine.group.broadcast("stats")
        totals = result.table("topic_totals").read()[0]
        iters = result.summary.iterations
        steps = result.summary.to_pandas()
    table_bytes = V * K * 4
    out = {
        "vocab": V, "topics": K, "cells": V * K, "table_bytes": table_bytes, "tokens": int(totals.sum()),
        "iterations": args.iters, "fit_s": round(fit_s, 1),
        "driver_peak_rss_bytes_before": rss0, "driver_peak_rss_bytes_after": rss_peak,
        "driver_peak_rss_growth_bytes": rss_peak - rss0,
        "shards": [{"shard": s["shard"], "table_bytes": s["table_bytes"], "rss_bytes": s["rss_bytes"]} for s in stats],
        "log_likelihood": [r.get("log_likelihood") for r in iters],
        "seconds_per_iteration": round(float(steps["seconds"].sum()) / args.iters, 2),
    }
    print(json.dumps(out, indent=2))
    print(f"\nV={V:,} x K={K} = {V * K:,} counts ({table_bytes / 2**20:.0f} MiB) on {len(stats)} shards; "
          f"driver peak RSS grew {out['driver_peak_rss_growth_bytes'] / 2**20:.0f} MiB during the fit "
          f"(peak {rss_peak / 2**20:.0f} MiB); {out['seconds_per_iteration']} s per iteration")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=2)
    spark.stop()
    # the run is right only if the topic totals count every generated token once, the likelihood
    # is a number, and the driver stayed far below the table's size
    failures = []
    if out["tokens"] != n_docs * args.doc_len:
        failures.append(f"topic totals count {out['tokens']:,} tokens, the corpus has {n_docs * args.doc_len:,}")
    likelihoods = [v for v in out["log_likelihood"] if v is not None]
    if not likelihoods or not all(np.isfinite(likelihoods)):
        failures.append(f"log-likelihood not finite: {out['log_likelihood']}")
    if out["driver_peak_rss_growth_bytes"] >= table_bytes / 2:
        failures.append(f"driver peak RSS grew {out['driver_peak_rss_growth_bytes'] / 2**20:.0f} MiB, at least half "
                        f"the table's {table_bytes / 2**20:.0f} MiB")
    for failure in failures:
        print("FAILED:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
