"""Implicit-feedback MF benchmark: StradsMF(implicitPrefs=True) vs ALS(implicitPrefs=True) vs the
``implicit`` library on MovieLens latest-small, ratings >= 4 as interactions, a seeded per-user
80/20 split.  Run by ``python jobs/bench_mf.py --implicit``: bench_mf.py parses the arguments (its
docstring lists them) and calls :func:`implicit_benchmark`; this module imports nothing from it.

Every system gets the same warm-up (one small fit), the same number of interleaved runs (run r
seeds every system with r: the rankings depend on the random start) and the same timer (``fit``
until the factors are materialised); the medians are reported.  Rankings:
each test user's 10 best-scored items among those not in its training interactions, from the
factors, by one function for all systems; precision@10 and NDCG@10 by pyspark's RankingEvaluator.
MovieLens is non-commercial data: it is read from ``../shared/data``, never shipped.
"""

from __future__ import annotations

import json
import os
import platform
import time

import numpy as np

SHARED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data")


def split_interactions(ratings, seed: int = 42, test_share: float = 0.2):
    """Ratings >= 4 as interactions (strength 1); per user, a seeded ``test_share`` of them to the
    test set (users with fewer than 2 interactions keep all in training)."""
    pos = ratings[ratings["rating"] >= 4.0][["userId", "movieId"]].copy()
    pos["rating"] = 1.0
    rng = np.random.default_rng(seed)
    key = rng.random(len(pos))
    pos["rank_in_user"] = pos.assign(key=key).groupby("userId")["key"].rank(method="first")
    counts = pos.groupby("userId")["movieId"].transform("size")
    test_mask = (pos["rank_in_user"] <= np.floor(test_share * counts)) & (counts >= 2)
    cols = ["userId", "movieId", "rating"]
    return pos[~test_mask][cols].reset_index(drop=True), pos[test_mask][cols].reset_index(drop=True)


def top_unseen(user_ids, user_f, item_ids, item_f, train, users, k: int = 10):
    """``{user: [k item ids]}``: the best-scored items of each user in ``users`` that are not among
    its training interactions."""
    uindex = {u: n for n, u in enumerate(user_ids)}
    iindex = {i: n for n, i in enumerate(item_ids)}
    seen = train.groupby("userId")["movieId"].apply(list).to_dict()
    out = {}
    for u in users:
        if u not in uindex:
            out[u] = []
            continue
        scores = item_f @ user_f[uindex[u]]
        scores[[iindex[i] for i in seen.get(u, []) if i in iindex]] = -np.inf
        best = np.argpartition(-scores, k)[:k]
        out[u] = [int(item_ids[j]) for j in best[np.argsort(-scores[best])]]
    return out


def ranking_metrics(spark, recs, test):
    from pyspark.ml.evaluation import RankingEvaluator

    truth = test.groupby("userId")["movieId"].apply(list).to_dict()
    rows = [([float(x) for x in recs[u]], [float(x) for x in truth[u]]) for u in truth]
    df = spark.createDataFrame(rows, "prediction array<double>, label array<double>")
    return {name: RankingEvaluator(metricName=metric, k=10).evaluate(df)
            for name, metric in (("precision@10", "precisionAtK"), ("ndcg@10", "ndcgAtK"))}


def factors_of(model):
    """(ids, matrix) of a fitted ALSModel / StradsMFModel's user and item factors."""
    def side(df):
        rows = sorted((r.id, r.features) for r in df.collect())
        return np.array([r[0] for r in rows]), np.array([np.asarray(r[1], dtype=np.float64) for r in rows])

    return side(model.userFactors) + side(model.itemFactors)


def implicit_library(train, rank, alpha, reg, iters, seed=1):
    """A fit function of the ``implicit`` library's CG ALS on the same interactions, or None."""
    try:
        import implicit
        import scipy.sparse as sp
        from threadpoolctl import threadpool_limits
    except ImportError:
        return None
    user_ids, u = np.unique(train["userId"].to_numpy(), return_inverse=True)
    item_ids, i = np.unique(train["movieId"].to_numpy(), return_inverse=True)
    matrix = sp.csr_matrix((train["rating"].to_numpy(), (u, i)), shape=(len(user_ids), len(item_ids)))

    def fit():
        with threadpool_limits(1, "blas"):
            model = implicit.cpu.als.AlternatingLeastSquares(factors=rank, regularization=reg, alpha=alpha,
                                                             iterations=iters, random_state=seed, num_threads=2,
                                                             use_cg=True)
            model.fit(matrix, show_progress=False)
        return user_ids, np.asarray(model.user_factors), item_ids, np.asarray(model.item_factors)

    return fit


def implicit_benchmark(args):
    import pandas as pd
    from pyspark.ml.recommendation import ALS

    from pystrads.ml import StradsMF
    from pystrads.session import spark_session

    out_path = args.out or "out/bench_mf_implicit.json"
    spark = spark_session("local[2]", "pystrads-bench-mf-implicit",
                          {"spark.ui.enabled": "false", "spark.driver.memory": "8g"})
    spark.sparkContext.setLogLevel("ERROR")
    ratings = pd.read_csv(os.path.join(SHARED, "movielens-latest-small", "ratings.csv.gz"))
    train_pd, test_pd = split_interactions(ratings)
    train = spark.createDataFrame(train_pd).repartition(2).cache()
    print(f"MovieLens latest-small, ratings >= 4: {train.count()} training / {len(test_pd)} test interactions, "
          f"{test_pd['userId'].nunique()} test users")
    common = dict(userCol="userId", itemCol="movieId", ratingCol="rating", regParam=args.reg, maxIter=args.iters,
                  seed=1, implicitPrefs=True)
    test_users = sorted(test_pd["userId"].unique())
    results = []

    def record(system, rank, alpha, wall, factors):
        recs = top_unseen(*factors, train_pd, test_users)
        metrics = ranking_metrics(spark, recs, test_pd)
        row = dict(system=system, rank=rank, alpha=alpha, fit_s=round(wall, 3),
                   **{k: round(v, 5) for k, v in metrics.items()})
        results.append(row)
        print(f"  {system:<9} rank {rank:>3} alpha {alpha:>4g}: P@10 {metrics['precision@10']:.4f}  "
              f"NDCG@10 {metrics['ndcg@10']:.4f}  fit {wall:6.2f} s", flush=True)

    def spark_fit(est):
        t0 = time.perf_counter()
        model = est.fit(train)
        model.userFactors.count()
        return time.perf_counter() - t0, factors_of(model)

    # the same warm-up for every system: one small fit (JIT, shard start, kernel compilation)
    spark_fit(ALS(**dict(common, rank=4, maxIter=2)))
    spark_fit(StradsMF(**dict(common, rank=4, maxIter=2)))
    warm = implicit_library(train_pd, 4, 1.0, args.reg, 2)
    if warm:
        warm()
    systems = ["pystrads", "ALS"] + (["implicit"] if warm else [])
    alphas = [float(a) for a in args.alphas.split(",")]
    for rank in [int(r) for r in args.ranks.split(",")]:
        for alpha in alphas:
            for seed in range(1, args.repeats + 1):  # run r: seed r for every system (rankings vary by start)
                params = dict(common, rank=rank, alpha=alpha, seed=seed)
                record("pystrads", rank, alpha, *spark_fit(StradsMF(**params)))
                record("ALS", rank, alpha, *spark_fit(ALS(**params)))
                lib = implicit_library(train_pd, rank, alpha, args.reg, args.iters, seed)
                if lib:
                    t0 = time.perf_counter()
                    factors = lib()
                    record("implicit", rank, alpha, time.perf_counter() - t0, factors)

    summary = {}
    print("\n| system | rank | alpha | fit s (median) | P@10 (median) | NDCG@10 (median) |")
    print("|---|---:|---:|---:|---:|---:|")
    configs = sorted({(r["rank"], r["alpha"]) for r in results})
    for rank, alpha in configs:
        for system in systems:
            rows = [r for r in results if (r["system"], r["rank"], r["alpha"]) == (system, rank, alpha)]
            med = {k: float(np.median([r[k] for r in rows])) for k in ("fit_s", "precision@10", "ndcg@10")}
            summary[f"{system}_rank{rank}_alpha{alpha:g}"] = med
            print(f"| {system} | {rank} | {alpha:g} | {med['fit_s']:.2f} | {med['precision@10']:.4f} | "
                  f"{med['ndcg@10']:.4f} |")
    for rank, alpha in configs:
        a, b = summary[f"pystrads_rank{rank}_alpha{alpha:g}"], summary[f"ALS_rank{rank}_alpha{alpha:g}"]
        print(f"rank {rank}, alpha {alpha:g}: P@10 {a['precision@10'] - b['precision@10']:+.4f}, "
              f"NDCG@10 {a['ndcg@10'] - b['ndcg@10']:+.4f} (targets >= -0.005), "
              f"time ratio {a['fit_s'] / b['fit_s']:.2f} (target <= 1)")
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    with open(out_path, "w") as fh:
        json.dump({"results": results, "summary": summary, "reg": args.reg, "iters": args.iters,
                   "repeats": args.repeats, "command": "python jobs/bench_mf.py --implicit",
                   "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}}, fh, indent=2)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for system, marker in zip(systems, "osv"):
            pts = [(r["fit_s"], r["ndcg@10"]) for r in results if r["system"] == system]
            ax.scatter(*zip(*pts), marker=marker, label=system)
        ax.set_xlabel("fit time (s)")
        ax.set_ylabel("NDCG@10")
        ax.set_title("MovieLens latest-small, implicit (ratings >= 4), 80/20 per user")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.splitext(out_path)[0] + ".png", dpi=100)
    except ImportError:
        pass
    print(f"wrote {out_path}")
    spark.stop()

