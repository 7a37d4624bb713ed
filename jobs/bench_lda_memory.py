"""Memory per executor for StradsLDA with 1 vs 2 executors at a fixed model.

    python jobs/bench_lda_memory.py [--corpus reuters] [-k 100] [--iters 20]

Runs the same fit (same corpus, K, iterations, 2 workers) on
``local-cluster[1,2,2048]`` (one executor with 2 cores) and on
``local-cluster[2,1,2048]`` (two executors with 1 core each), each in a fresh
driver process, and reports per executor: the shard processes' resident
memory and the word-topic bytes they hold, and the Python workers' resident
memory (measured in the worker processes after the fit). The model's table
is split over the executors' shards, so per-executor shard memory should
about halve with two executors.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))


def child(master: str, corpus: str, k: int, iters: int) -> dict:
    import bench_lda as B
    from pystrads.ml.lda import StradsLDA
    from pystrads.ps import launcher
    from pystrads.session import spark_session

    spark = spark_session(master, "pystrads-lda-memory", {"spark.ui.enabled": "false",
                                                          "spark.executor.memory": "1500m"})
    spark.sparkContext.setLogLevel("ERROR")
    from pyspark.ml.feature import StopWordsRemover

    vocab, train, _ = B.tokenize_corpus(corpus, set(StopWordsRemover.loadDefaultStopWords("english")), False)
    df = B.spark_df(spark, vocab, train)
    model = StradsLDA(k=k, maxIter=iters, seed=1, numWorkers=2).fit(df)
    shards = model.summary.shards  # taken at the end of the fit, before its tables were dropped

    def worker_rss(_):
        with open("/proc/self/status") as fh:
            rss = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmRSS:"))
        yield launcher.executor_identity(), rss

    workers = spark.sparkContext.parallelize(range(8), 8).mapPartitions(worker_rss).collect()
    per_exec: dict = {}
    for s in shards:
        e = per_exec.setdefault(s["shard"].rsplit("#", 1)[0], {"shard_rss": 0, "shard_table_bytes": 0,
                                                                "python_worker_rss": {}})
        e["shard_rss"] += s["rss_bytes"]
        e["shard_table_bytes"] += s["table_bytes"]
    for executor, rss in workers:
        per_exec.setdefault(executor, {"shard_rss": 0, "shard_table_bytes": 0, "python_worker_rss": {}})
    out = {"master": master, "k": k, "vocab": len(vocab), "model_bytes": len(vocab) * k * 4,
           "executors": per_exec, "tokens": model.summary.numTokens,
           "worker_rss_max": max(r for _, r in workers)}
    spark.stop()
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--corpus", default="reuters", choices=["reuters", "debian"])
    p.add_argument("-k", type=int, default=100)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default="out/bench_lda_memory.json")
    args = p.parse_args(argv)
    if args.child:
        sys.path.insert(0, HERE)
        print("RESULT " + json.dumps(child(args.child, args.corpus, args.k, args.iters)), flush=True)
        return 0
    results = []
    for master in ("local-cluster[1,2,2048]", "local-cluster[2,1,2048]"):
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", master, "--corpus", args.corpus,
                               "-k", str(args.k), "--iters", str(args.iters)], capture_output=True, text=True,
                              env=dict(os.environ, PYSPARK_PYTHON=sys.executable))
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if not line:
            print(proc.stderr[-3000:])
            return 1
        results.append(json.loads(line[0][len("RESULT "):]))
    print(f"\nStradsLDA on {args.corpus}, K={args.k}, word-topic table "
          f"{results[0]['model_bytes'] / 2**20:.1f} MiB, 2 workers\n")
    print("| executors | executor | shard RSS MiB | word-topic MiB on its shard |")
    print("|---:|---|---:|---:|")
    for r in results:
        n = len(r["executors"])
        for name, e in sorted(r["executors"].items()):
            print(f"| {n} | {name} | {e['shard_rss'] / 2**20:.0f} | {e['shard_table_bytes'] / 2**20:.1f} |")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(results, fh, indent=2)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
