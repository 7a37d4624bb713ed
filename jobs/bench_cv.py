"""Concurrent fits: CrossValidator over StradsMF with parallelism 2 against parallelism 1, same run.

    python jobs/bench_cv.py [--repeats 3] [--folds 2] [--rank 10] [--iters 10] [--regs 0.01,0.05,0.1,0.3]

MovieLens latest-small (read from ``../shared/data``, never shipped), 4 param maps (``regParam``),
``RegressionEvaluator`` RMSE with cold starts dropped, on ``local[2]``:

- **sequential**: ``CrossValidator(parallelism=1)`` with ``numWorkers`` at its default (one worker
  computing with both cores);
- **parallel**: ``CrossValidator(parallelism=2)`` with ``numWorkers=1``: two fits at once, each
  with one worker, stepping side by side on the same shards.

Both are warmed up once, then timed ``--repeats`` times, interleaved; medians and their ratio
(target <= 0.7). The two runs' ``avgMetrics`` are compared with those of sequential fits of the
parallel run's settings (``numWorkers=1``, ``parallelism=1``): concurrent fits must not change a
fit. Prints a table and writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _bench import argv_of, record  # noqa: E402

SHARED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--folds", type=int, default=2)
    p.add_argument("--rank", type=int, default=10)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--regs", default="0.01,0.05,0.1,0.3", help="regParam of the param maps")
    p.add_argument("--out", default="out/bench_cv.json")
    args = p.parse_args(argv)

    import pandas as pd
    from pyspark.ml.evaluation import RegressionEvaluator
    from pyspark.ml.tuning import CrossValidator, ParamGridBuilder

    from pystrads.ml import StradsMF
    from pystrads.session import spark_session

    spark = spark_session("local[2]", "pystrads-bench-cv", {"spark.ui.enabled": "false", "spark.driver.memory": "8g"})
    spark.sparkContext.setLogLevel("ERROR")
    frame = pd.read_csv(os.path.join(SHARED, "movielens-latest-small", "ratings.csv.gz"))
    ratings = spark.createDataFrame(frame[["userId", "movieId", "rating"]]).repartition(2).cache()
    print(f"MovieLens latest-small: {ratings.count()} ratings; {args.folds}-fold CV over regParam {args.regs}")
    est = StradsMF(userCol="userId", itemCol="movieId", ratingCol="rating", rank=args.rank, maxIter=args.iters,
                   seed=1, coldStartStrategy="drop")
    grid = ParamGridBuilder().addGrid(est.regParam, [float(r) for r in args.regs.split(",")]).build()
    evaluator = RegressionEvaluator(labelCol="rating")

    def cv(parallelism: int, workers: int):
        t0 = time.perf_counter()
        fitted = CrossValidator(estimator=est.copy({est.numWorkers: workers}), estimatorParamMaps=grid,
                                evaluator=evaluator, numFolds=args.folds, parallelism=parallelism,
                                seed=7).fit(ratings)
        return time.perf_counter() - t0, [float(m) for m in fitted.avgMetrics]

    fixed = est.fit(ratings).summary.fixed  # the shape a fit without numWorkers gets
    default_shape = f"{fixed['workers']} worker{'s' if fixed['workers'] > 1 else ''} × {fixed['threads']} threads"
    setups = {"sequential": (1, 0), "parallel": (2, 1)}
    for parallelism, workers in setups.values():  # warm-up: shards, kernels, Python workers
        cv(parallelism, workers)
    times = {name: [] for name in setups}
    metrics = {}
    for _ in range(args.repeats):
        for name, (parallelism, workers) in setups.items():
            seconds, metrics[name] = cv(parallelism, workers)
            times[name].append(seconds)
            print(f"  {name:<10}: {seconds:6.2f} s  avgMetrics {np.round(metrics[name], 5).tolist()}", flush=True)
    _, reference = cv(1, 1)  # the parallel run's fits, one after another
    median = {name: float(np.median(v)) for name, v in times.items()}
    ratio = median["parallel"] / median["sequential"]
    same = bool(np.allclose(metrics["parallel"], reference, rtol=1e-9, atol=0))
    print(f"\nmedian: sequential (parallelism 1, default workers) {median['sequential']:.2f} s, parallel "
          f"(parallelism 2, numWorkers=1) {median['parallel']:.2f} s, ratio {ratio:.2f} (target <= 0.7); "
          f"parallel metrics equal sequential fits of its settings: {same}")
    result = record("jobs/bench_cv.py", argv_of(argv), args.out, {
        "rank": args.rank, "iters": args.iters, "folds": args.folds, "regs": args.regs, "repeats": args.repeats,
        "default_shape": default_shape,
        "seconds": times, "median_s": median, "ratio": ratio, "avg_metrics": metrics,
        "reference_metrics": reference, "metrics_equal": same})
    spark.stop()
    return result


if __name__ == "__main__":
    main()
