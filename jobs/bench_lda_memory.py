"""Memory per executor for StradsLDA with 1 vs 2 executors at a fixed model; the driver's memory for a big model.

    python jobs/bench_lda_memory.py [--corpus reuters] [-k 100] [--iters 20]
    python jobs/bench_lda_memory.py --driver [--vocab 500000 -k 200 --tokens 2000000]

Runs the same fit (same corpus, K, iterations, 2 workers) on
``local-cluster[1,2,2048]`` (one executor with 2 cores) and on
``local-cluster[2,1,2048]`` (two executors with 1 core each), each in a fresh
driver process, and reports per executor: the shard processes' resident
memory and the word-topic bytes they hold, and the Python workers' resident
memory (measured in the worker processes after the fit). The model's table
is split over the executors' shards, so per-executor shard memory should
about halve with two executors.

``--driver`` measures the driver's memory instead: a StradsLDA model of
``vocab`` x ``k`` (default 500,000 x 200: 400 MB as int32) on a synthetic Zipf
corpus generated on the executors is fitted (2 iterations), described, applied
to documents (transform and logPerplexity), saved and loaded (and applied
again), in a fresh ``local[2]`` driver after a warm-up fit of a tiny model (so
one-off imports and JIT compilation are not counted). It reports each phase's
time, the Python driver's peak RSS growth (``/proc/self/status`` VmHWM, reset
after the warm-up) and its peak traced allocations (tracemalloc, numpy
included), and fails unless the RSS growth is at most 25 % of the int32 model.
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


def driver_child(vocab: int, k: int, tokens: int, doc_len: int) -> dict:
    import tempfile
    import time
    import tracemalloc

    import numpy as np
    import pyarrow as pa
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import to_arrow_type

    from pystrads.ml import StradsLDA, StradsLDAModel
    from pystrads.session import spark_session

    spark = spark_session("local[2]", "pystrads-lda-driver-memory", {"spark.ui.enabled": "false",
                                                                     "spark.driver.memory": "1g"})
    spark.sparkContext.setLogLevel("ERROR")
    schema = T.StructType([T.StructField("id", T.LongType()), T.StructField("features", VectorUDT())])

    def corpus(num_docs, size):
        def make(batches):  # Zipf(0.8) words over the whole vocabulary, made on the executors
            weights = np.arange(1, size + 1, dtype=np.float64) ** -0.8
            weights /= weights.sum()
            vector_type = to_arrow_type(VectorUDT().sqlType())
            for batch in batches:
                ids = batch.column(0).to_numpy()
                rows = []
                for d in ids:
                    w, c = np.unique(np.random.default_rng(int(d)).choice(size, size=doc_len, p=weights),
                                     return_counts=True)
                    rows.append({"type": 0, "size": size, "indices": w.tolist(), "values": c.astype(float).tolist()})
                yield pa.RecordBatch.from_arrays([pa.array(ids), pa.array(rows, type=vector_type)], ["id", "features"])
        return spark.range(0, num_docs, 1, 2).mapInArrow(make, schema)

    def status(key):
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) * 1024 for line in fh if line.startswith(key))

    def run_all(df, kk, path, timings=None):
        def timed(name, fn):
            t0 = time.perf_counter()
            out = fn()
            if timings is not None:
                timings[name] = round(time.perf_counter() - t0, 1)
            return out
        model = timed("fit", lambda: StradsLDA(k=kk, maxIter=2, seed=1, numWorkers=2,
                                               optimizeDocConcentration=False).fit(df))
        timed("describeTopics", lambda: model.describeTopics(10).collect())
        sample = df.limit(2000)
        timed("transform", lambda: model.transform(sample).select("id", "topicDistribution").count())
        timed("logPerplexity", lambda: model.logPerplexity(sample))
        timed("save", lambda: model.write().overwrite().save(path))
        loaded = timed("load", lambda: StradsLDAModel.load(path))
        timed("transform_loaded", lambda: loaded.transform(sample).select("id", "topicDistribution").count())
        return model

    tmp = tempfile.mkdtemp(prefix="pystrads-lda-driver-")
    run_all(corpus(40, 200), 2, tmp + "/warm")  # imports, numba compilation, first Arrow jobs
    df = corpus(tokens // doc_len, vocab).cache()
    df.count()
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # resets VmHWM to the current RSS
    rss0 = status("VmRSS:")
    tracemalloc.start()
    timings: dict = {}
    model = run_all(df, k, tmp + "/big", timings)
    traced_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    out = {"vocab": vocab, "k": k, "model_bytes": vocab * k * 4, "tokens": model.summary.numTokens,
           "model_rows": model._topics.frame.count(), "seconds": timings,
           "driver_rss_before": rss0, "driver_peak_rss_growth": status("VmHWM:") - rss0,
           "driver_traced_peak": traced_peak}
    spark.stop()
    return out


def driver_main(args) -> int:
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--driver-child", "--vocab", str(args.vocab),
                           "-k", str(args.k), "--tokens", str(args.tokens), "--doc-len", str(args.doc_len)],
                          capture_output=True, text=True, env=dict(os.environ, PYSPARK_PYTHON=sys.executable))
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if not line:
        print(proc.stderr[-3000:])
        return 1
    r = json.loads(line[0][len("RESULT "):])
    mib = 2 ** 20
    print(f"\nStradsLDA {r['vocab']:,} x {r['k']} ({r['model_bytes'] / mib:.0f} MiB as int32, {r['model_rows']:,} "
          f"rows with tokens), {r['tokens']:,} tokens, local[2]\n")
    print("| phase | seconds |\n|---|---:|")
    for name, seconds in r["seconds"].items():
        print(f"| {name} | {seconds} |")
    growth = r["driver_peak_rss_growth"]
    print(f"\nPython driver: peak RSS grew {growth / mib:.0f} MiB ({growth / r['model_bytes']:.1%} of the model), "
          f"peak traced allocations {r['driver_traced_peak'] / mib:.1f} MiB")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(r, fh, indent=2)
    print(f"wrote {args.out}")
    if growth > 0.25 * r["model_bytes"]:
        print(f"FAILED: the driver grew by more than 25 % of the model ({0.25 * r['model_bytes'] / mib:.0f} MiB)")
        return 1
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--corpus", default="reuters", choices=["reuters", "debian"])
    p.add_argument("-k", type=int, default=None, help="topics (default 100; --driver: 200)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--driver", action="store_true", help="the driver's memory for one big model")
    p.add_argument("--vocab", type=int, default=500_000, help="--driver: vocabulary size")
    p.add_argument("--tokens", type=int, default=2_000_000, help="--driver: corpus tokens")
    p.add_argument("--doc-len", type=int, default=200, help="--driver: tokens per document")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--driver-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help="JSON result (default out/bench_lda_memory[_driver].json)")
    args = p.parse_args(argv)
    args.k = args.k or (200 if args.driver or args.driver_child else 100)
    if args.driver_child:
        print("RESULT " + json.dumps(driver_child(args.vocab, args.k, args.tokens, args.doc_len)), flush=True)
        return 0
    if args.driver:
        args.out = args.out or "out/bench_lda_memory_driver.json"
        return driver_main(args)
    args.out = args.out or "out/bench_lda_memory.json"
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
