"""MF benchmark: StradsMF vs MLlib ALS on MovieLens latest-small, fixed 90/10 split, same run.

    python jobs/bench_mf.py [--ranks 10,50] [--reg 0.1] [--iters 15] [--repeats 3] [--high-rank 500]
                            [--sgd-step 0.05]
    python jobs/bench_mf.py --implicit [--ranks 10,50] [--alphas 1,40] [--repeats 3]
    python jobs/bench_mf.py --recommend-only [--recommend-repeats 5]

``recommendForAllUsers(10)`` of StradsMFModel (factors as DataFrames, blocked distributed
top-k) against ALSModel's on the same machine, from models of the first ``--ranks`` rank on all
ratings: one warm-up call each, then ``--recommend-repeats`` calls each, interleaved, every
output materialised the same way (written to Spark's ``noop`` sink); medians and their ratio
(target <= 1).  Run with every benchmark, or alone with ``--recommend-only``.

``--implicit``: implicit feedback (ratings >= 4 as interactions, a seeded per-user 80/20 split);
StradsMF(implicitPrefs=True) and ALS(implicitPrefs=True) with ALS's params, plus the
``implicit`` library's conjugate-gradient ALS where it installs (its own regularisation,
unscaled by the counts); precision@10 and NDCG@10 (pyspark's RankingEvaluator) of every
system's top 10 unseen items, computed from its factors by one shared function.

StradsMF with both algorithms (coordinate descent, the default, and SGD with
block rotation) and ALS run in one ``local[2]`` session without ``spark.task.cpus``, so
StradsMF's default is its default shape (one worker computing with both cores); coordinate
descent also runs with ``numWorkers=2`` (``--workers``: single-threaded workers, one per
slot) for the comparison of the two shapes. All get ALS's own params (rank, regParam, maxIter, seed); test RMSE with
cold starts dropped (RegressionEvaluator); fit time from ``fit`` to factors
materialised. Medians of ``--repeats`` fits each, interleaved. A high-rank
StradsMF run (``--high-rank``) reports the shards' memory. Prints a table,
writes JSON and a plot. MovieLens is non-commercial data: it is read from
``../shared/data``, never shipped.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

SHARED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data")


def main(argv=None):
    p = argparse.ArgumentParser(description="StradsMF vs MLlib ALS on MovieLens")
    p.add_argument("--ranks", default="10,50")
    p.add_argument("--reg", type=float, default=0.1)
    p.add_argument("--iters", type=int, default=15)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--inner", type=int, default=None, help="StradsMF innerIterations (default: the estimator's)")
    p.add_argument("--blocks", default="0",
                   help="StradsMF featureBlockSize values to compare (0 = the automatic default, 1 = CCD++)")
    p.add_argument("--sgd-step", type=float, default=0.05, help="StradsMF(algorithm='sgd') stepSize; 0 to skip SGD")
    p.add_argument("--high-rank", type=int, default=500, help="0 to skip")
    p.add_argument("--workers", type=int, default=2,
                   help="also time StradsMF (coordinate descent) with numWorkers set to this (single-threaded "
                        "workers, one per task slot) against the default shape (one worker with every core); 0: skip")
    p.add_argument("--out", default=None, help="JSON path (default out/bench_mf.json, out/bench_mf_implicit.json)")
    p.add_argument("--implicit", action="store_true", help="the implicit-feedback benchmark instead")
    p.add_argument("--alphas", default="1,40", help="--implicit: confidence slopes alpha")
    p.add_argument("--per-iteration", action="store_true",
                   help="--implicit: per-iteration time against the implicit library from two fit lengths "
                        "(--iter-pair), on --datasets, at --ranks (default 64), --alpha, --reg unscaled")
    p.add_argument("--datasets", default="movielens,synthetic:100000x20000x5000000",
                   help="--per-iteration: movielens and/or synthetic:USERSxITEMSxINTERACTIONS")
    p.add_argument("--iter-pair", default="3,8", help="--per-iteration: the two fit lengths n1,n2")
    p.add_argument("--alpha", type=float, default=10.0, help="--per-iteration: confidence slope")
    p.add_argument("--test-users", type=int, default=5000, help="--per-iteration: test users ranked (a sample)")
    p.add_argument("--recommend-repeats", type=int, default=5, help="timed recommendForAllUsers(10) calls each")
    p.add_argument("--recommend-only", action="store_true", help="only the recommendForAllUsers(10) timing")
    args = p.parse_args(argv)
    args.argv = argv
    if args.implicit and args.per_iteration:
        from bench_mf_implicit import per_iteration_benchmark

        if args.ranks == p.get_default("ranks"):
            args.ranks = "64"
        return per_iteration_benchmark(args)
    if args.implicit:
        from bench_mf_implicit import implicit_benchmark

        return implicit_benchmark(args)
    args.out = args.out or "out/bench_mf.json"
    import pandas as pd
    from pyspark.ml.evaluation import RegressionEvaluator
    from pyspark.ml.recommendation import ALS

    from pystrads.ml import StradsMF
    from pystrads.session import spark_session

    ratings = pd.read_csv(os.path.join(SHARED, "movielens-latest-small", "ratings.csv.gz"))
    test_mask = np.random.default_rng(42).random(len(ratings)) < 0.1
    cols = ["userId", "movieId", "rating"]

    # the default session: spark.task.cpus unset, so StradsMF's default shape is one worker computing with
    # both cores (the estimators' default), and every other stage (ALS's, the scans) has both slots
    spark = spark_session("local[2]", "pystrads-bench-mf", {"spark.ui.enabled": "false",
                                                            "spark.driver.memory": "8g",
                                                            # ALS's 15 iterations without a checkpoint
                                                            # directory deserialise a deep lineage: room
                                                            # for it (a StackOverflowError otherwise)
                                                            "spark.driver.extraJavaOptions": "-Xss16m"})
    spark.sparkContext.setLogLevel("ERROR")
    train = spark.createDataFrame(ratings[~test_mask][cols]).repartition(2).cache()
    test = spark.createDataFrame(ratings[test_mask][cols]).cache()
    print(f"MovieLens latest-small: {train.count()} training / {test.count()} test ratings")
    ev = RegressionEvaluator(labelCol="rating", predictionCol="prediction")
    common = dict(userCol="userId", itemCol="movieId", ratingCol="rating", regParam=args.reg, maxIter=args.iters,
                  seed=1, coldStartStrategy="drop")
    results = []
    recommend = recommend_timing(train, common, int(args.ranks.split(",")[0]), args.recommend_repeats)
    if args.recommend_only:
        spark.stop()
        return recommend

    def run(system, rank, est):
        t0 = time.perf_counter()
        model = est.fit(train)
        model.userFactors.count()
        wall = time.perf_counter() - t0
        rmse = ev.evaluate(model.transform(test))
        row = {"system": system, "rank": rank, "fit_s": round(wall, 2), "test_rmse": round(rmse, 4)}
        if system.startswith("pystrads"):
            row["fixed_s"] = {k: round(v, 3) for k, v in model.summary.fixed.items()}
            row["workers"], row["threads"] = int(model.summary.fixed["workers"]), int(model.summary.fixed["threads"])
            row["steps"] = len(model.summary.steps)
            row["train_rmse"] = model.summary.trainRmseHistory[-1]
        results.append(row)
        print(f"  {system:<9} rank {rank:>4}: test RMSE {rmse:.4f}  fit {wall:6.2f} s", flush=True)
        return model

    # warm-up: JVM JIT for ALS; shard start and kernel compilation for pystrads
    ALS(**dict(common, rank=5, maxIter=2)).fit(train).userFactors.count()
    StradsMF(**dict(common, rank=2, maxIter=1)).fit(train)
    StradsMF(**dict(common, rank=2, maxIter=1, algorithm="sgd")).fit(train)
    blocks = [int(b) for b in args.blocks.split(",")]

    def label(b):
        return "pystrads" if b == 0 else f"pystrads b={b}"

    spread = f"pystrads numWorkers={args.workers}"
    if args.workers:
        StradsMF(**dict(common, rank=2, maxIter=1, numWorkers=args.workers)).fit(train)
    for rank in [int(r) for r in args.ranks.split(",")]:
        for _ in range(args.repeats):
            for b in blocks:
                mf = StradsMF(**dict(common, rank=rank, featureBlockSize=b))
                if args.inner:
                    mf.setInnerIterations(args.inner)
                model = run(label(b), rank, mf)
                if b == 0:  # the default shape of a local[2] session without spark.task.cpus
                    assert (model.summary.fixed["workers"], model.summary.fixed["threads"]) == (1, 2), \
                        model.summary.fixed
            if args.workers:
                model = run(spread, rank, StradsMF(**dict(common, rank=rank, numWorkers=args.workers)))
                assert model.summary.fixed["threads"] == 1, model.summary.fixed
            if args.sgd_step > 0:
                run("pystrads sgd", rank, StradsMF(**dict(common, rank=rank, algorithm="sgd", stepSize=args.sgd_step)))
            run("ALS", rank, ALS(**dict(common, rank=rank)))
    high = None
    if args.high_rank:
        from pystrads.ps import launcher

        high = {"rank": args.high_rank, "iterations": min(args.iters, 5)}
        algorithms = [("pystrads", "cd")] + ([("pystrads sgd", "sgd")] if args.sgd_step > 0 else [])
        for system, algorithm in algorithms:
            mf = StradsMF(**dict(common, rank=args.high_rank, maxIter=min(args.iters, 5), algorithm=algorithm,
                                 stepSize=args.sgd_step or 0.05))
            model = run(system, args.high_rank, mf)
            manager = next(iter(launcher._MANAGERS.values()))
            stats = manager.group.broadcast("stats")
            high[algorithm] = {"shard_rss_bytes": [s["rss_bytes"] for s in stats],
                               "item_factor_cells": args.high_rank * model.itemFactors.count()}
            print(f"  {system} rank {args.high_rank}: shard RSS "
                  f"{[round(s['rss_bytes'] / 2**20) for s in stats]} MiB")

    summary = {}
    print("\n| system | rank | fit s (median) | test RMSE (median) |")
    print("|---|---:|---:|---:|")
    systems = [label(b) for b in blocks] + ([spread] if args.workers else []) + \
        (["pystrads sgd"] if args.sgd_step > 0 else []) + ["ALS"]
    for rank in sorted({r["rank"] for r in results}):
        for system in systems:
            rows = [r for r in results if r["system"] == system and r["rank"] == rank]
            if rows:
                fit = float(np.median([r["fit_s"] for r in rows]))
                rmse = float(np.median([r["test_rmse"] for r in rows]))
                summary[f"{system}_rank{rank}"] = {"fit_s": fit, "test_rmse": rmse}
                print(f"| {system} | {rank} | {fit:.2f} | {rmse:.4f} |")
    threads_vs_workers = {}  # rank -> the default shape (1 worker x 2 threads) against numWorkers single-threaded
    for rank in [int(r) for r in args.ranks.split(",")]:
        for system in systems[:-1]:
            a, b = summary.get(f"{system}_rank{rank}"), summary.get(f"ALS_rank{rank}")
            if a and b:
                print(f"rank {rank}, {system}: RMSE difference {a['test_rmse'] - b['test_rmse']:+.4f} "
                      f"(target <= +0.005), time ratio {a['fit_s'] / b['fit_s']:.2f} (target <= 1)")
        a, b = summary.get(f"pystrads_rank{rank}"), summary.get(f"{spread}_rank{rank}")
        if a and b:
            threads_vs_workers[rank] = {"time_ratio": a["fit_s"] / b["fit_s"],
                                        "rmse_difference": a["test_rmse"] - b["test_rmse"]}
            print(f"rank {rank}, the default (1 worker x 2 threads) vs {args.workers} workers: time ratio "
                  f"{a['fit_s'] / b['fit_s']:.2f} (target <= 1.05), RMSE difference "
                  f"{a['test_rmse'] - b['test_rmse']:+.4f} (target within 0.001)")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"results": results, "summary": summary, "threads_vs_workers": threads_vs_workers,
                   "workers": args.workers, "high_rank": high, "recommend": recommend,
                   "reg": args.reg, "iters": args.iters,
                   "sgd_step": args.sgd_step,
                   "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}}, fh, indent=2)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for system, marker in zip(systems, "o^vDxP*s"[:len(systems) - 1] + "s"):
            pts = [(r["fit_s"], r["test_rmse"]) for r in results if r["system"] == system]
            if pts:
                ax.scatter(*zip(*pts), marker=marker, label=system)
        ax.set_xlabel("fit time (s)")
        ax.set_ylabel("test RMSE")
        ax.set_title("MovieLens latest-small, 90/10")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.splitext(args.out)[0] + ".png", dpi=100)
    except ImportError:
        pass
    print(f"wrote {args.out}")
    spark.stop()


def recommend_timing(train, common, rank, repeats):
    """Median seconds of ``recommendForAllUsers(10)`` for StradsMF's and ALS's models (see the
    module docstring); prints them and their ratio."""
    from pyspark.ml.recommendation import ALS

    from pystrads.ml import StradsMF

    params = dict(common, rank=rank)
    models = {"pystrads": StradsMF(**params).fit(train), "ALS": ALS(**params).fit(train)}

    def call(model):
        t0 = time.perf_counter()
        model.recommendForAllUsers(10).write.format("noop").mode("overwrite").save()
        return time.perf_counter() - t0

    for model in models.values():  # warm-up: Python workers, JIT, the factors' first read
        call(model)
    times = {name: [] for name in models}
    for _ in range(repeats):
        for name, model in models.items():
            times[name].append(call(model))
    medians = {name: float(np.median(t)) for name, t in times.items()}
    ratio = medians["pystrads"] / medians["ALS"]
    print(f"recommendForAllUsers(10), rank {rank}, {train.select(common['userCol']).distinct().count()} users: "
          f"pystrads {medians['pystrads']:.3f} s, ALS {medians['ALS']:.3f} s (medians of {repeats}), "
          f"ratio {ratio:.2f} (target <= 1)", flush=True)
    return {"rank": rank, "repeats": repeats, "times_s": times, "median_s": medians, "ratio": ratio}


if __name__ == "__main__":
    main()
