"""A driver on a local Spark Connect session (``SparkSession.builder.remote("local[2]")``),
run as a subprocess by ``test_connect_remote.py`` so that its Connect server gets a JVM of its own.

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
    return {"tokens": int(counts.sum()), "expected_tokens": 300 * 30, "top": top, "counts": counts.astype(int).tolist(),
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
    from pyspark.ml.regression import LinearRegressionSummary, LinearRegressionTrainingSummary

    evaluation = ours.evaluate(df)  # MLlib's own summary on a classic session, LassoEvaluation under Connect
    out.update(evaluation_is_mllib=isinstance(evaluation, LinearRegressionSummary), r2=evaluation.r2,
               eval_rmse=evaluation.rootMeanSquaredError, deviance=evaluation.devianceResiduals,
               summary_is_mllib=isinstance(ours.summary, LinearRegressionTrainingSummary),
               summary_r2=ours.summary.r2, summary_rows=ours.summary.numInstances)
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
    return {"users": [list(f) for _, f in users], "items": [list(f) for _, f in items],
            "rmse": rmse, "predictions": len(pred), "ratings": len(rows), "recs_equal_brute_force": recs == brute,
            "users_recommended": len(recs), "loaded_equal": sorted(map(tuple, loaded.userFactors.collect())) == sorted(map(tuple, model.userFactors.collect()))}


def _slow_rotation(num_keys, iterations, pause):
    """RotationSum whose rounds take ``pause`` seconds and which reports its progress."""
    from pystrads.programs import examples as ex

    class SlowRotation(ex.RotationSum):
        def push(self, ctx, data, state, block):
            time.sleep(pause)
            return super().push(ctx, data, state, block)

        def after_step(self, ctx, metrics):
            super().after_step(ctx, metrics)
            done = (ctx.rounds_done + len(metrics.rounds)) // ctx.num_workers
            ctx.progress(done, self.iterations, "iterations")

    return SlowRotation(num_keys, iterations)


class _Lines:
    """The progress lines this process shows, with the time each arrived."""

    def __enter__(self):
        import logging

        self.lines = []
        outer = self

        class Handler(logging.Handler):
            def emit(self, record):
                outer.lines.append((time.time(), record.getMessage()))

        self.handler = Handler()
        self.logger = logging.getLogger("pystrads.progress")
        self.logger.addHandler(self.handler)
        self.level = self.logger.level
        self.logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc):
        self.logger.removeHandler(self.handler)
        self.logger.setLevel(self.level)


def progress(spark):
    """A 60 s fit on one worker (a task slot stays free): the progress lines reaching this process."""
    from pystrads.engine import Engine

    df = spark.range(3000).selectExpr("id % 100 as key", "1.0 as value")
    engine = Engine(_slow_rotation(100, 200, 0.3), df, num_workers=1, seed=1,
                    config={"step.targetSeconds": 2.0, "progress.pollSeconds": 2.0})
    with _Lines() as lines:
        t0 = time.time()
        with engine.fit() as res:
            t1 = time.time()
            sums = res.read_table("sums")[:, 0]
    return {"start": t0, "end": t1, "times": [t for t, _ in lines.lines], "lines": [m for _, m in lines.lines],
            "error": float(np.abs(sums - 200 * 30.0).max())}


def interrupt(spark):
    """spark.interruptAll() while a long fit runs: how the fit ends."""
    import threading

    from pystrads.engine import Engine

    df = spark.range(3000).selectExpr("id % 100 as key", "1.0 as value")
    engine = Engine(_slow_rotation(100, 100000, 0.2), df, num_workers=1, seed=1)
    out = {}

    def run():
        try:
            engine.fit()
            out["ended"] = "no error"
        except BaseException as exc:  # noqa: BLE001 -- what the user sees
            out["ended"] = f"{type(exc).__name__}: {exc}"[:2000]
        out["returned"] = time.time()

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(15)
    out["interrupted"] = time.time()
    spark.interruptAll()
    thread.join(120)
    out["alive"] = thread.is_alive()
    return out


def fault(spark):
    """A worker's task fails once mid-fit: the fit's job is relaunched from the coordinator's state."""
    import tempfile

    from pystrads.engine import Engine
    from pystrads.programs import examples as ex

    marker = os.path.join(tempfile.mkdtemp(prefix="pystrads-connect-fault-"), "struck")

    class FailOnce(ex.RotationSum):
        def push(self, ctx, data, state, block):
            if ctx.worker == 1 and ctx.round >= 5 and not os.path.exists(marker):
                open(marker, "w").close()
                os._exit(3)  # the task's process dies (a lost executor; a raised error would be the program's)
            return super().push(ctx, data, state, block)

        def schedule(self, ctx):
            U = ctx.num_workers
            n = min(ctx.rounds_this_step(self.iterations * U, U), U)  # an iteration a step
            return ex.Schedule.per_worker([[(p + r) % U for p in range(U)] for r in range(n)]) if n else None

    rng = np.random.default_rng(8)
    keys, vals = rng.integers(0, 100, 2000), rng.random(2000)
    df = spark.createDataFrame(list(zip(keys.tolist(), vals.tolist())), "key long, value double")
    engine = Engine(FailOnce(100, iterations=5), df, num_workers=2, seed=1)
    with engine.fit() as res:
        sums = res.read_table("sums")[:, 0]
        return {"struck": os.path.exists(marker), "recoveries": res.summary.fixed.get("recoveries", 0),
                "error": float(np.abs(sums - 5 * np.bincount(keys, vals, 100)).max()),
                "steps": [row["step"] for row in res.summary.rows]}


def implicit(spark):
    """StradsMF with implicit feedback: fit, the factors (compared with local mode's), transform,
    save twice (the second an overwrite) and load."""
    import tempfile

    from pystrads.ml import StradsMF, StradsMFModel

    rng = np.random.default_rng(4)
    rows = [(u, i, float(rng.integers(1, 5))) for u in range(50) for i in range(30) if rng.random() < 0.3]
    df = spark.createDataFrame(rows, "user int, item int, rating double")
    model = StradsMF(rank=3, maxIter=10, regParam=0.1, implicitPrefs=True, alpha=2.0, numWorkers=2, seed=3).fit(df)
    scores = sorted((r["user"], r["item"], r["prediction"]) for r in model.transform(df).collect())
    path = tempfile.mkdtemp(prefix="pystrads-connect-") + "/implicit"
    model.write().overwrite().save(path)
    model.write().overwrite().save(path)  # over the first copy
    loaded = StradsMFModel.load(path)
    loaded_scores = sorted((r["user"], r["item"], r["prediction"]) for r in loaded.transform(df).collect())
    return {"items": sorted((r["id"], list(r["features"])) for r in model.itemFactors.collect()),
            "users": sorted((r["id"], list(r["features"])) for r in model.userFactors.collect()),
            "scored": len(scores), "rows": len(rows), "loaded_equal": loaded_scores == scores}


def logistic(spark):
    """StradsLogisticRegression: fit, transform, save and load."""
    import tempfile

    from pyspark.ml.linalg import Vectors

    from pystrads.ml import StradsLogisticRegression, StradsLogisticRegressionModel

    rng = np.random.default_rng(6)
    X = rng.normal(size=(400, 8))
    y = (X @ np.array([2.0, -1.0, 0, 0, 1.5, 0, 0, 0]) + 0.3 * rng.normal(size=400) > 0).astype(float)
    df = spark.createDataFrame([(float(y[i]), Vectors.dense(X[i].tolist())) for i in range(400)], ["label", "features"])
    model = StradsLogisticRegression(regParam=0.01, elasticNetParam=1.0, maxIter=100, tol=1e-9, numWorkers=2).fit(df)
    pred = np.array([r["prediction"] for r in model.transform(df).select("prediction").collect()])
    path = tempfile.mkdtemp(prefix="pystrads-connect-") + "/logistic"
    model.write().overwrite().save(path)
    loaded = StradsLogisticRegressionModel.load(path)
    from pyspark.ml.classification import BinaryLogisticRegressionSummary, BinaryLogisticRegressionTrainingSummary

    evaluation = model.evaluate(df)
    return {"coef": model.coefficients.toArray().tolist(), "intercept": model.intercept,
            "accuracy": float((pred == y).mean()), "loaded_equal": loaded.coefficients.toArray().tolist()
            == model.coefficients.toArray().tolist(),
            "evaluation_is_mllib": isinstance(evaluation, BinaryLogisticRegressionSummary),
            "eval_accuracy": evaluation.accuracy, "auc": evaluation.areaUnderROC,
            "summary_is_mllib": isinstance(model.summary, BinaryLogisticRegressionTrainingSummary),
            "summary_accuracy": model.summary.accuracy}


def tuning(spark):
    """A Pipeline (VectorAssembler, StradsLasso) and a CrossValidator over it (parallelism 1)."""
    from pyspark.ml import Pipeline
    from pyspark.ml.evaluation import RegressionEvaluator
    from pyspark.ml.feature import VectorAssembler
    from pyspark.ml.tuning import CrossValidator, ParamGridBuilder

    from pystrads.ml import StradsLasso

    rng = np.random.default_rng(7)
    X = rng.normal(size=(300, 5))
    y = X @ np.array([1.0, 0.0, -2.0, 0.0, 0.5]) + 0.1 * rng.normal(size=300)
    df = spark.createDataFrame([tuple(X[i].tolist()) + (float(y[i]),) for i in range(300)],
                               [f"x{j}" for j in range(5)] + ["label"])
    lasso = StradsLasso(elasticNetParam=1.0, maxIter=100, tol=1e-9, numWorkers=2)
    pipeline = Pipeline(stages=[VectorAssembler(inputCols=[f"x{j}" for j in range(5)], outputCol="features"), lasso])
    fitted = pipeline.fit(df)
    coef = fitted.stages[-1].coefficients.toArray().tolist()
    grid = ParamGridBuilder().addGrid(lasso.regParam, [0.01, 0.5]).build()
    cv = CrossValidator(estimator=pipeline, estimatorParamMaps=grid, evaluator=RegressionEvaluator(),
                        numFolds=2, parallelism=1, seed=1)
    cv_model = cv.fit(df)
    return {"coef": coef, "avg_metrics": list(cv_model.avgMetrics),
            "best_coef": cv_model.bestModel.stages[-1].coefficients.toArray().tolist()}


CASES = {"rotation": rotation, "refusals": refusals, "lda": lda, "lasso": lasso, "mf": mf, "progress": progress,
         "interrupt": interrupt, "fault": fault, "implicit": implicit, "logistic": logistic, "tuning": tuning}


def main():
    out_path, cases = sys.argv[1], sys.argv[2:]
    from pyspark.sql import SparkSession

    remote = os.environ.get("PYSTRADS_TEST_REMOTE")  # sc://host:port of a server elsewhere
    opened = []  # every Flight connection this process opens (a remote client must open none)
    if remote:
        import pyarrow.flight as flight

        class CountedClient(flight.FlightClient):
            def __init__(self, location, *args, **kwargs):
                opened.append(str(location))
                super().__init__(location, *args, **kwargs)

        flight.FlightClient = CountedClient
    t0 = time.time()
    if os.environ.get("PYSTRADS_TEST_CLASSIC"):  # the same cases on a classic local session, for comparison
        spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false") \
            .config("spark.pystrads.scheduler.location", "driver").getOrCreate()
    else:
        spark = SparkSession.builder.remote(remote or "local[2]").appName("pystrads-connect-tests").getOrCreate()
    results = {"session_s": time.time() - t0, "flight_connections": opened}
    if os.environ.get("PYSTRADS_TEST_LOCATION"):  # to watch the remote test fail with the scheduler here
        spark.conf.set("spark.pystrads.scheduler.location", os.environ["PYSTRADS_TEST_LOCATION"])
    unreachable = os.environ.get("PYSTRADS_TEST_UNREACHABLE")  # host:port the client must not reach
    if unreachable:
        import socket

        host, port = unreachable.rsplit(":", 1)
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
            results["reached_server_network"] = "connected"
        except OSError as exc:
            results["reached_server_network"] = f"{type(exc).__name__}: {exc}"
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
