"""A driver on a local Spark Connect session (``SparkSession.builder.remote("local[2]")``),
run as a subprocess by ``test_connect.py`` so that its Connect server gets a JVM of its own.

Usage: ``python connect_driver.py OUT.json CASE [CASE ...]``; each case writes its results
(or its error) under its name.  Only the Connect session's API is used here: the classic
SparkContext that pyspark starts inside this process to host the local server is never
touched, so what passes here is what a remote Connect client gets.
"""

import json
import os
import sys
import time
import traceback

import numpy as np

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def rotation(spark):
    from pystrads.engine import Engine
    from pystrads.programs import examples as ex

    rng = np.random.default_rng(5)
    keys, vals = rng.integers(0, 300, 4000), rng.random(4000)
    df = spark.createDataFrame(list(zip(keys.tolist(), vals.tolist())), "key long, value double")
    engine = Engine(ex.RotationSum(300, iterations=3), df, seed=1,
                    export=lambda worker, data, state: float(data["local"].sum()))
    with engine.fit() as res:
        sums = res.read_table("sums")[:, 0]
        exports = res.exports
        steps = len(res.summary.rows)
    return {"error": float(np.abs(sums - 3 * np.bincount(keys, vals, 300)).max()), "workers": engine.num_workers,
            "exported": sum(exports), "expected_exported": float(vals.sum()), "steps": steps,
            "shards": [s.uri for s in engine.group.shards], "type": type(spark).__module__}


def refusals(spark):
    from pystrads.engine import Engine
    from pystrads.errors import ConfigurationError
    from pystrads.programs import examples as ex

    df = spark.range(10).selectExpr("id as key", "1.0 as value")
    out = {}
    for name, kwargs in (("keep_states", {"keep_states": True}), ("slots", {"num_workers": 3})):
        try:
            Engine(ex.RotationSum(10), df, **kwargs).fit()
            out[name] = "no error"
        except ConfigurationError as exc:
            out[name] = str(exc)
    return out


def lda(spark):
    """StradsLDA end to end: fit, transform, logPerplexity, describeTopics, save and load."""
    import tempfile

    from pyspark.ml.linalg import SparseVector, VectorUDT
    from pyspark.sql.types import LongType, StructField, StructType

    from pystrads.ml import StradsLDA, StradsLDAModel

    rng = np.random.default_rng(0)
    rows = []
    for i in range(300):  # two topics on disjoint halves of a 20-word vocabulary
        half = i % 2
        words = rng.integers(0, 10, 30) + 10 * half
        w, c = np.unique(words, return_counts=True)
        rows.append((i, SparseVector(20, w.tolist(), c.astype(float).tolist())))
    schema = StructType([StructField("id", LongType()), StructField("features", VectorUDT())])
    df = spark.createDataFrame(rows, schema)
    model = StradsLDA(k=2, maxIter=30, seed=3, numWorkers=2).fit(df)
    counts = model.topicsMatrix().toArray()  # the public API: the model may live on the executors
    top = [sorted(r["termIndices"]) for r in model.describeTopics(10).orderBy("topic").collect()]
    out = model.transform(df)
    theta = [(r["id"], r["topicDistribution"].toArray().tolist()) for r in out.collect()]
    path = tempfile.mkdtemp(prefix="pystrads-connect-") + "/lda"
    model.write().overwrite().save(path)
    loaded = StradsLDAModel.load(path)
    spark.conf.set("spark.pystrads.lda.localModelBytes", "0")  # the loaded model (no driver copy): the join
    joined_path = not loaded._fold_in(df)._local(df)
    joined = dict((r["id"], r["topicDistribution"].toArray().tolist()) for r in loaded.transform(df).collect())
    spark.conf.unset("spark.pystrads.lda.localModelBytes")
    return {"tokens": int(counts.sum()), "expected_tokens": 300 * 30, "top": top,
            "joined_equal": joined_path and joined == dict(theta),
            "theta_sum_range": [float(min(sum(t) for _, t in theta)), float(max(sum(t) for _, t in theta))],
            "rows": len(theta),
            "separated": float(np.mean([max(t) for _, t in theta])),
            "log_perplexity": model.logPerplexity(df), "loaded_equal": bool(np.array_equal(loaded.topicsMatrix().toArray(), counts)),
            "summary_iterations": model.summary.totalIterations}


def lasso(spark):
    """StradsLasso against MLlib's LinearRegression (L1), both through Connect; save and load."""
    import tempfile

    from pyspark.ml.linalg import Vectors
    from pyspark.ml.regression import LinearRegression

    from pystrads.ml import StradsLasso, StradsLassoModel

    rng = np.random.default_rng(1)
    X = rng.normal(size=(400, 12))
    beta = np.zeros(12)
    beta[[1, 4, 7]] = [2.0, -3.0, 1.5]
    y = X @ beta + 0.1 * rng.normal(size=400)
    df = spark.createDataFrame([(float(y[i]), Vectors.dense(X[i].tolist())) for i in range(400)], ["label", "features"])
    params = dict(regParam=0.05, elasticNetParam=1.0, maxIter=200, tol=1e-9)
    ours = StradsLasso(numWorkers=2, **params).fit(df)
    out = {"ours": ours.coefficients.toArray().tolist(), "ours_intercept": ours.intercept, "truth": beta.tolist()}
    try:
        mllib = LinearRegression(**params).fit(df)
        out["mllib"] = mllib.coefficients.toArray().tolist()
    except Exception as exc:  # noqa: BLE001 -- MLlib on Connect may be missing; say so
        out["mllib_error"] = str(exc).splitlines()[0][:500]
    pred = ours.transform(df).select("prediction").collect()
    out["rmse"] = float(np.sqrt(np.mean((np.array([r[0] for r in pred]) - y) ** 2)))
    path = tempfile.mkdtemp(prefix="pystrads-connect-") + "/lasso"
    ours.write().overwrite().save(path)
    loaded = StradsLassoModel.load(path)
    out["loaded_equal"] = loaded.coefficients.toArray().tolist() == out["ours"]
    return out


def mf(spark):
    """StradsMF: fit on planted low-rank ratings, transform, recommendForAllUsers, save and load."""
    import tempfile

    from pystrads.ml import StradsMF, StradsMFModel

    rng = np.random.default_rng(2)
    w, h = rng.normal(size=(60, 3)), rng.normal(size=(40, 3))
    pairs = [(u, i) for u in range(60) for i in range(40) if rng.random() < 0.5]
    rows = [(u, i, float(w[u] @ h[i])) for u, i in pairs]
    df = spark.createDataFrame(rows, "user int, item int, rating double")
    model = StradsMF(rank=3, maxIter=30, regParam=0.01, numWorkers=2, seed=1).fit(df)
    pred = model.transform(df).select("user", "item", "rating", "prediction").collect()
    rmse = float(np.sqrt(np.mean([(r["rating"] - r["prediction"]) ** 2 for r in pred])))
    recs = {r["user"]: [x["item"] for x in r["recommendations"]] for r in model.recommendForAllUsers(5).collect()}
    users = sorted((r["id"], r["features"]) for r in model.userFactors.collect())
    items = sorted((r["id"], r["features"]) for r in model.itemFactors.collect())
    scores = np.array([f for _, f in users], np.float32) @ np.array([f for _, f in items], np.float32).T
    brute = {u: [items[j][0] for j in np.lexsort((np.arange(len(items)), -scores[k]))[:5]]
             for k, (u, _) in enumerate(users)}
    path = tempfile.mkdtemp(prefix="pystrads-connect-") + "/mf"
    model.write().overwrite().save(path)
    loaded = StradsMFModel.load(path)
    return {"rmse": rmse, "predictions": len(pred), "ratings": len(rows), "recs_equal_brute_force": recs == brute,
            "users_recommended": len(recs), "loaded_equal": sorted(map(tuple, loaded.userFactors.collect())) == sorted(map(tuple, model.userFactors.collect()))}


CASES = {"rotation": rotation, "refusals": refusals, "lda": lda, "lasso": lasso, "mf": mf}


def main():
    out_path, cases = sys.argv[1], sys.argv[2:]
    from pyspark.sql import SparkSession

    t0 = time.time()
    spark = SparkSession.builder.remote("local[2]").appName("pystrads-connect-tests").getOrCreate()
    results = {"session_s": time.time() - t0}
    try:
        for case in cases:
            t0 = time.time()
            try:
                results[case] = CASES[case](spark)
            except Exception:  # noqa: BLE001 -- reported to the test
                results[case] = {"exception": traceback.format_exc()[-4000:]}
            results[case + "_s"] = time.time() - t0
            with open(out_path, "w") as fh:
                json.dump(results, fh)
    finally:
        from pystrads.ps import launcher

        launcher.shutdown()
        spark.stop()


if __name__ == "__main__":
    main()
