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



# ------------------------------------------------------------------ per iteration, against `implicit`

def synthetic_interactions(num_users: int, num_items: int, interactions: int, seed: int = 7, clusters: int = 50):
    """About ``interactions`` distinct (user, item) interactions with a taste structure and a long
    tail, as a pandas frame (``userId, movieId, rating`` = 1): item popularity ``(rank + 1)^-0.7``,
    items in ``clusters`` taste groups, each user with two groups it draws 70 % of its items from
    (the rest by popularity), user activity log-normal; duplicates dropped."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    pop = rng.permutation((np.arange(num_items) + 1.0) ** -0.7)
    group = rng.integers(0, clusters, num_items)
    activity = rng.lognormal(0.0, 1.0, num_users)
    per_user = np.clip(np.round(activity / activity.sum() * interactions * 1.16), 2, num_items // 4).astype(np.int64)
    users = np.repeat(np.arange(num_users), per_user)
    # per group, the items and their cumulative popularity laid end to end: group g's CDF runs over [g, g + 1)
    order = np.argsort(group, kind="stable")
    starts = np.searchsorted(group[order], np.arange(clusters + 1))
    cdf = np.empty(num_items)
    for g in range(clusters):
        w = pop[order[starts[g]:starts[g + 1]]]
        cdf[starts[g]:starts[g + 1]] = g + np.cumsum(w) / w.sum()
    tastes = rng.integers(0, clusters, (num_users, 2))
    chosen = tastes[users, rng.integers(0, 2, len(users))]
    in_group = order[np.minimum(np.searchsorted(cdf, chosen + rng.random(len(users)) * (1 - 1e-12)), num_items - 1)]
    global_cdf = np.cumsum(pop) / pop.sum()
    by_pop = np.minimum(np.searchsorted(global_cdf, rng.random(len(users))), num_items - 1)
    items = np.where(rng.random(len(users)) < 0.7, in_group, by_pop)
    pairs = np.unique(users * np.int64(num_items) + items)
    return pd.DataFrame({"userId": (pairs // num_items).astype(np.int64), "movieId": (pairs % num_items).astype(np.int64),
                         "rating": np.ones(len(pairs))})


def dataset(name: str):
    """(label, training interactions, test interactions) of ``movielens`` or
    ``synthetic:USERSxITEMSxINTERACTIONS``, split per user 80/20 as :func:`split_interactions`."""
    import pandas as pd

    if name == "movielens":
        ratings = pd.read_csv(os.path.join(SHARED, "movielens-latest-small", "ratings.csv.gz"))
        return ("MovieLens latest-small (ratings >= 4)",) + split_interactions(ratings)
    if name.startswith("synthetic:"):
        nu, ni, nn = (int(float(x)) for x in name.split(":", 1)[1].split("x"))
        frame = synthetic_interactions(nu, ni, nn)
        return (f"synthetic {nu:,} users x {ni:,} items",) + split_interactions(frame.assign(rating=4.0))
    raise SystemExit(f"--datasets: {name!r} is neither 'movielens' nor 'synthetic:USERSxITEMSxINTERACTIONS'")


def per_iteration_benchmark(args):
    """Per-iteration time of StradsMF(implicitPrefs=True) and of the ``implicit`` library on the
    same objective: confidence ``1 + alpha r`` on both sides (the library gets the confidences as
    its matrix, its own ``alpha`` 1) and regParam unscaled (``scaleRegParam=False``, the library's
    form).  Each system fits ``n1`` and ``n2`` iterations, interleaved, ``--repeats`` times; its
    per-iteration time is ``(median t(n2) - median t(n1)) / (n2 - n1)``, so the fixed costs (Spark's
    input scan, the shards, the library's transposes) drop out; precision@10 of the ``n2``-iteration
    fits on (a sample of) the test users, by the same function for both."""
    import scipy.sparse as sp
    from threadpoolctl import threadpool_limits

    import implicit
    from pystrads.ml import StradsMF
    from pystrads.session import spark_session

    from _bench import argv_of, record  # noqa: E402 -- jobs/ is on the path when run as a script

    n1, n2 = (int(x) for x in args.iter_pair.split(","))
    spark = spark_session("local[2]", "pystrads-bench-mf-implicit-iteration",
                          {"spark.ui.enabled": "false", "spark.driver.memory": "8g"})
    spark.sparkContext.setLogLevel("ERROR")
    rows, rng = [], np.random.default_rng(0)
    for name in args.datasets.split(","):
        label, train_pd, test_pd = dataset(name)
        train_pd = train_pd.assign(rating=1.0)
        train = spark.createDataFrame(train_pd).repartition(2).cache()
        print(f"{label}: {train.count():,} training / {len(test_pd):,} test interactions", flush=True)
        users, u = np.unique(train_pd["userId"].to_numpy(), return_inverse=True)
        items, i = np.unique(train_pd["movieId"].to_numpy(), return_inverse=True)
        test_users = sorted(test_pd["userId"].unique())
        if len(test_users) > args.test_users:
            test_users = sorted(rng.choice(test_users, args.test_users, replace=False).tolist())
        test_sample = test_pd[test_pd["userId"].isin(set(test_users))]
        for rank in [int(r) for r in args.ranks.split(",")]:
            alpha, reg = args.alpha, args.reg
            confidence = sp.csr_matrix((1.0 + alpha * train_pd["rating"].to_numpy(), (u, i)),
                                       shape=(len(users), len(items)))

            def strads(iters, seed):
                est = StradsMF(userCol="userId", itemCol="movieId", ratingCol="rating", rank=rank, maxIter=iters,
                               regParam=reg, alpha=alpha, implicitPrefs=True, scaleRegParam=False, seed=seed)
                t0 = time.perf_counter()
                model = est.fit(train)
                model.userFactors.count()
                wall = time.perf_counter() - t0
                steps = model.summary.steps
                in_steps.setdefault(iters, []).append(float(steps["seconds"].sum()) / iters)
                return wall, factors_of(model)

            def library(iters, seed):
                t0 = time.perf_counter()
                with threadpool_limits(1, "blas"):
                    model = implicit.cpu.als.AlternatingLeastSquares(
                        factors=rank, regularization=reg, alpha=1.0, iterations=iters, random_state=seed,
                        num_threads=2, use_cg=True)
                    model.fit(confidence, show_progress=False)
                wall = time.perf_counter() - t0
                return wall, (users, np.asarray(model.user_factors), items, np.asarray(model.item_factors))

            in_steps = {}  # StradsMF: the steps' own seconds per iteration (no fixed costs), by fit length
            systems = {"pystrads": strads, "implicit": library}
            for fn in systems.values():  # warm-up: JIT, shard start, kernel compilation
                fn(1, 0)
            times = {(s, n): [] for s in systems for n in (n1, n2)}
            quality = {s: [] for s in systems}
            for seed in range(1, args.repeats + 1):
                for n in (n1, n2):
                    for system, fn in systems.items():
                        wall, factors = fn(n, seed)
                        times[(system, n)].append(wall)
                        if n == n2:
                            recs = top_unseen(*factors, train_pd, test_users)
                            quality[system].append(ranking_metrics(spark, recs, test_sample))
                        print(f"  {system:<9} rank {rank} {n:>3} iterations: {wall:7.2f} s", flush=True)
            for system in systems:
                t1, t2 = (float(np.median(times[(system, n)])) for n in (n1, n2))
                q = {k: float(np.median([m[k] for m in quality[system]])) for k in ("precision@10", "ndcg@10")}
                rows.append(dict(dataset=name, label=label, system=system, rank=rank, alpha=alpha, reg=reg,
                                 train=int(len(train_pd)), users=int(len(users)), items=int(len(items)),
                                 n1=n1, n2=n2, t1=[round(x, 3) for x in times[(system, n1)]],
                                 t2=[round(x, 3) for x in times[(system, n2)]],
                                 per_iteration_s=round((t2 - t1) / (n2 - n1), 4), fit_s=round(t2, 3),
                                 steps_per_iteration_s=(round(float(np.median(in_steps[n2])), 4)
                                                        if system == "pystrads" else None),
                                 **{k: round(v, 5) for k, v in q.items()}))
        train.unpersist()
    print("\n| data | rank | system | s / iteration | × implicit | in the steps | fit s | precision@10 | vs implicit |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        peer = next(p for p in rows if p["system"] == "implicit" and (p["dataset"], p["rank"]) == (r["dataset"], r["rank"]))
        steps = "—" if r["steps_per_iteration_s"] is None else f"{r['steps_per_iteration_s']:.3f}"
        print(f"| {r['dataset']} | {r['rank']} | {r['system']} | {r['per_iteration_s']:.3f} | "
              f"{r['per_iteration_s'] / peer['per_iteration_s']:.2f} | {steps} | {r['fit_s']:.2f} | "
              f"{r['precision@10']:.4f} | {r['precision@10'] - peer['precision@10']:+.4f} |")
    record("jobs/bench_mf.py", argv_of(args.argv), args.out or "out/bench_mf_implicit_iteration.json",
           {"results": rows, "repeats": args.repeats})
    spark.stop()
