"""LDA scale-out shape: StradsLDA's throughput at U = 1, 2 and 4 workers.

    python jobs/bench_lda_scaleout.py                 # Reuters, K = 50, 100 iterations, 2 timed fits each
    python jobs/bench_lda_scaleout.py --quick         # 2,000 documents, 20 iterations, 1 fit: checks the job

Each configuration runs in a fresh driver process: U = 1 and U = 2 on
``local[2]`` (one executor, one shard), U = 4 on ``local-cluster[4,1,1536]``
(four executors of one core each, one shard each), U = 2 on
``local-cluster[2,1,1536]`` too (two executors: the shape of a real cluster,
where every worker's executor has its own shard). Every configuration gets the
same warm-up (one untimed 2-iteration fit: numba's cache, the shards, the
Python workers) and the same number of timed fits; the table reports medians.

Columns: wall s (the whole ``fit``, its input scan and data load included),
tokens/s on the wall clock, the speed-up over U = 1, the per-worker
efficiency (speed-up / U) and the efficiency against the cores there are
(speed-up / min(U, cores)); the sampler's own rate per worker
(``sample_s`` in the summary) shows how much of a round is sampling.
The machine has few cores: past ``cores`` workers, the workers, the shards
and the JVMs share them, and the U = 4 row measures that sharing, not a
cluster's scale-out. Writes JSON and a plot.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))

CONFIGS = [("local[2]", 1), ("local[2]", 2), ("local-cluster[2,1,1536]", 2), ("local-cluster[4,1,1536]", 4)]


def child(master: str, workers: int, corpus: str, k: int, iters: int, repeats: int, quick: bool) -> dict:
    import bench_lda as B
    from pystrads.ml import StradsLDA
    from pystrads.session import spark_session

    spark = spark_session(master, "pystrads-bench-lda-scaleout", {"spark.ui.enabled": "false",
                                                                   "spark.executor.memory": "1g"})
    spark.sparkContext.setLogLevel("ERROR")
    from pyspark.ml.feature import StopWordsRemover

    vocab, train, _ = B.tokenize_corpus(corpus, set(StopWordsRemover.loadDefaultStopWords("english")), quick)
    df = B.spark_df(spark, vocab, train)
    df.count()
    tokens = sum(len(d) for d in train)

    def fit(n):
        t0 = time.perf_counter()
        model = StradsLDA(k=k, maxIter=n, seed=1, docConcentration=[50.0 / k], topicConcentration=0.1,
                          numWorkers=workers, logLikelihoodEvery=max(1, n // 10),
                          optimizeDocConcentration=False).fit(df)
        wall = time.perf_counter() - t0
        s = model.summary
        steps = s.steps
        sample_s = float(steps["sample_s"].sum()) if "sample_s" in steps else float("nan")
        last = s.iterations["log_perplexity"].dropna().tolist() if "log_perplexity" in s.iterations else []
        return {"wall_s": wall, "total_s": float(s.fixed.get("total_s", 0.0)), "sample_s": sample_s,
                "rounds_s": float(steps["round_s"].sum()),
                "log_perplexity": float(last[-1]) if last else float("nan")}

    fit(2)  # warm-up, untimed
    runs = [fit(iters) for _ in range(repeats)]
    spark.stop()
    return {"master": master, "workers": workers, "tokens": tokens, "iterations": iters, "runs": runs}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--corpus", default="reuters", choices=["reuters", "debian"])
    p.add_argument("-k", type=int, default=50)
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--repeats", type=int, default=2, help="timed fits per configuration (median)")
    p.add_argument("--quick", action="store_true", help="2,000 documents, 20 iterations, one fit")
    p.add_argument("--out", default="out/bench_lda_scaleout.json")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--workers", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.iters, args.repeats = 20, 1
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.workers, args.corpus, args.k, args.iters, args.repeats,
                                           args.quick)), flush=True)
        return 0
    cores = os.cpu_count() or 1
    results = []
    for master, workers in CONFIGS:
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", master, "--workers", str(workers),
                               "--corpus", args.corpus, "-k", str(args.k), "--iters", str(args.iters),
                               "--repeats", str(args.repeats)] + (["--quick"] if args.quick else []),
                              capture_output=True, text=True, env=dict(os.environ, PYSPARK_PYTHON=sys.executable))
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not line:
            print(f"{master} U={workers} failed:\n{proc.stderr[-3000:]}")
            return 1
        r = json.loads(line[0][len("RESULT "):])
        print(f"  {master:<26} U={workers}: {len(r['runs'])} fits in {time.perf_counter() - t0:.0f} s "
              f"(walls {', '.join('%.1f' % x['wall_s'] for x in r['runs'])} s)", flush=True)
        results.append(r)

    rows = []
    for r in results:
        med = {key: statistics.median(x[key] for x in r["runs"]) for key in r["runs"][0]}
        work = r["tokens"] * r["iterations"]
        rows.append({"master": r["master"], "workers": r["workers"], "runs": len(r["runs"]),
                     "wall_s": round(med["wall_s"], 2), "tokens_per_s": round(work / med["wall_s"]),
                     # the summary's sample_s and round_s are means over the workers
                     "sampler_tokens_per_s_per_worker": round(work / r["workers"] / med["sample_s"])
                     if med["sample_s"] > 0 else None,
                     "sampling_share_of_rounds": round(med["sample_s"] / med["rounds_s"], 3),
                     "log_perplexity": round(med["log_perplexity"], 4)})
    base = next(row for row in rows if row["workers"] == 1)
    for row in rows:
        speedup = row["tokens_per_s"] / base["tokens_per_s"]
        row["speedup"] = round(speedup, 3)
        row["efficiency_per_worker"] = round(speedup / row["workers"], 3)
        row["efficiency_per_core"] = round(speedup / min(row["workers"], cores), 3)

    print(f"\nStradsLDA on {args.corpus}, K={args.k}, {args.iters} iterations, {results[0]['tokens']:,} tokens; "
          f"medians of {args.repeats} fit(s) after one warm-up fit; {cores} cores\n")
    print("| master | workers | wall s | tokens/s (wall) | speed-up vs U = 1 | per worker | per core "
          "| sampler tokens/s per worker | sampling share of rounds | log perplexity (train) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        sampler = row["sampler_tokens_per_s_per_worker"]
        print(f"| {row['master']} | {row['workers']} | {row['wall_s']:.1f} | {row['tokens_per_s'] / 1e6:.2f} M | "
              f"{row['speedup']:.2f}× | {row['efficiency_per_worker']:.0%} | {row['efficiency_per_core']:.0%} | "
              f"{(sampler or 0) / 1e6:.2f} M | {row['sampling_share_of_rounds']:.0%} | {row['log_perplexity']} |")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)) or ".", exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"corpus": args.corpus, "k": args.k, "iterations": args.iters, "repeats": args.repeats,
                   "cores": cores, "tokens": results[0]["tokens"], "table": rows, "results": results}, fh, indent=2)
    print(f"wrote {args.out}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not installed: no plot)")
        return 0
    fig, ax = plt.subplots(figsize=(6.5, 4))
    labels = [f"U={row['workers']}\n{row['master']}" for row in rows]
    ax.bar(range(len(rows)), [row["tokens_per_s"] / 1e6 for row in rows], color="#4878a8")
    ax.axhline(base["tokens_per_s"] / 1e6 * cores, color="grey", ls="--", lw=1, label=f"{cores} × U = 1")
    ax.set_xticks(range(len(rows)), labels, fontsize=8)
    ax.set_ylabel("tokens/s (M, wall clock)")
    ax.set_title(f"StradsLDA scale-out, {args.corpus} K={args.k}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.splitext(args.out)[0] + ".png", dpi=100)
    return 0


if __name__ == "__main__":
    sys.exit(main())
