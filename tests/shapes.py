"""The four program shapes on small problems with known answers.

Shared by the local tests (``test_programs_local.py``) and the driver script
the multi-executor tests run against a standalone cluster
(``cluster_driver.py``); each runner returns ``(result, known answer, summary)``.
"""

import numpy as np

from pystrads.engine import Engine
from pystrads.programs import examples as ex


def run_rotation(sc, num_workers=2):
    rng = np.random.default_rng(0)
    keys, vals = rng.integers(0, 300, 5000), rng.random(5000)
    rdd = sc.parallelize(list(zip(keys.tolist(), vals.tolist())), num_workers)
    with Engine(ex.RotationSum(300, iterations=3), rdd, seed=1).fit() as res:
        got = res.read_table("sums")[:, 0]
        summary = res.summary
    return got, 3 * np.bincount(keys, vals, 300), summary


def run_block_lstsq(sc, num_workers=2):
    a, b, groups = ex.orthogonal_groups_problem(400, 3, 4, seed=2)
    rdd = sc.parallelize(ex.as_records(a, b), num_workers)
    with Engine(ex.BlockLeastSquares(a.shape[1], groups, max_sweeps=300), rdd).fit() as res:
        x = res.read_table("x")[:, 0]
        summary = res.summary
    return x, np.linalg.lstsq(a, b, rcond=None)[0], summary


def lasso_problem():
    rng = np.random.default_rng(5)
    a = rng.standard_normal((200, 12))
    a[:, 1] = a[:, 0] + 0.3 * rng.standard_normal(200)  # one strongly dependent pair
    b = a @ np.r_[3.0, 0, -2.0, 0, 0, 1.5, np.zeros(6)] + 0.1 * rng.standard_normal(200)
    lam = 0.1 * np.abs(a.T @ b).max()
    corr = np.corrcoef(a.T)
    return a, b, lam, corr


def run_priority_lasso(sc, num_workers=2):
    a, b, lam, corr = lasso_problem()
    program = ex.PriorityLasso(a.shape[1], lam, corr, coords_per_round=3, candidates=8, rho=0.5,
                               pipeline_depth=40, max_rounds=4000)
    rdd = sc.parallelize(ex.as_records(a, b), num_workers)
    with Engine(program, rdd, seed=3).fit() as res:
        x = res.read_table("x")[:, 0]
        summary = res.summary
    return x, ex.lasso_reference(a, b, lam), summary, (a, b, lam)


def run_sgd(sc, num_workers=2):
    rng = np.random.default_rng(7)
    a = rng.standard_normal((300, 5))
    w_true = rng.standard_normal(5)
    b = a @ w_true
    lr = 1.0 / np.linalg.eigvalsh(a.T @ a / 300).max()
    program = ex.DataParallelSGD(5, 300, lr=0.5 * lr, rounds=400, staleness=2)
    rdd = sc.parallelize(ex.as_records(a, b), num_workers)
    with Engine(program, rdd).fit() as res:
        w = res.read_table("w")[:, 0]
        summary = res.summary
    return w, w_true, summary


# ------------------------------------------------------------------ the three estimators, small


def estimator_data(spark):
    """Small inputs for one fit of each estimator: (documents, ratings, regression rows)."""
    from pyspark.ml.linalg import Vectors

    from pystrads.datasets.synthetic import strads_lasso_problem

    rng = np.random.default_rng(11)
    docs = []
    for i in range(60):
        lo = 0 if i % 2 == 0 else 15
        idx, cnt = np.unique(rng.integers(lo, lo + 15, size=25), return_counts=True)
        docs.append((i, Vectors.sparse(30, idx.tolist(), cnt.astype(float).tolist())))
    truth = rng.random((30, 3)) @ rng.random((3, 20)) + 1.0
    ratings = [(u, i, float(truth[u, i])) for u in range(30) for i in range(20) if rng.random() < 0.6]
    p = strads_lasso_problem(200, 40, nnz_per_col=20, seed=4)
    x = p.dense()
    rows = [(float(p.y[i]), Vectors.sparse(40, np.flatnonzero(x[i]).tolist(), x[i][x[i] != 0].tolist()))
            for i in range(len(p.y))]
    return (spark.createDataFrame(docs, ["id", "features"]).repartition(2),
            spark.createDataFrame(ratings, ["user", "item", "rating"]).repartition(2),
            spark.createDataFrame(rows, ["label", "features"]).repartition(2))


def run_estimators(spark):
    """One fit of StradsLDA, StradsMF and StradsLasso on 2 workers: the numbers to compare."""
    from pystrads.ml import StradsLasso, StradsLDA, StradsMF

    docs, ratings, rows = estimator_data(spark)
    lda = StradsLDA(k=3, maxIter=10, seed=1, numWorkers=2).fit(docs)
    mf = StradsMF(rank=3, maxIter=5, regParam=0.05, seed=1, numWorkers=2).fit(ratings)
    lasso = StradsLasso(regParam=0.02, tol=1e-10, seed=1, numWorkers=2).fit(rows)
    users = sorted((r[0], list(r[1])) for r in mf.userFactors.collect())
    items = sorted((r[0], list(r[1])) for r in mf.itemFactors.collect())
    return {"lda_topics": lda.topicsMatrix().toArray().tolist(),
            "lda_log_likelihood": float(lda.logLikelihood(docs)),
            "mf_users": users, "mf_items": items,
            "lasso_coefficients": lasso.coefficients.toArray().tolist(), "lasso_intercept": lasso.intercept}
