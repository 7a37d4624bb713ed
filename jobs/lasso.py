"""Sparse L1 models with StradsLasso / StradsLogisticRegression: data in; model, metrics and plot out.

    spark-submit jobs/lasso.py --input data.libsvm --reg-param 0.01
    spark-submit jobs/lasso.py --input data.parquet --features-col features --label-col label --family binomial
    spark-submit jobs/lasso.py --generate strads:20000x200000 --reg-ratio 0.05     # the STRADS generator

Input: libsvm text (``.libsvm`` / ``.svm`` / ``.txt``; one-based indices, as
Spark's libsvm reader) or Parquet with a vector features column and a
numeric label column, or ``--generate strads:NxJ`` / ``uniform:NxJxNNZ``
(synthetic, see :mod:`pystrads.datasets.synthetic`). ``--reg-ratio r``
sets ``regParam = r * lambda_max`` (the smallest value giving an all-zero
model). The model goes to ``<output>/model``, the history to
``<output>/metrics.json``, the convergence plot to
``<output>/convergence.png`` (with matplotlib) and the largest
coefficients to ``<output>/coefficients.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pystrads.session import spark_session  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Fit a StradsLasso (gaussian) or StradsLogisticRegression (binomial).",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--input", help="libsvm text or Parquet")
    src.add_argument("--generate", help="strads:NxJ or uniform:NxJxNNZ (synthetic problem)")
    p.add_argument("--features-col", default="features")
    p.add_argument("--label-col", default="label")
    p.add_argument("--weight-col", default=None)
    p.add_argument("--family", choices=["gaussian", "binomial"], default="gaussian")
    reg = p.add_mutually_exclusive_group()
    reg.add_argument("--reg-param", type=float, default=None)
    reg.add_argument("--reg-ratio", type=float, default=None, help="regParam as a fraction of lambda_max")
    p.add_argument("--no-intercept", action="store_true")
    p.add_argument("--no-standardization", action="store_true")
    p.add_argument("--schedule", choices=["dynamic", "shotgun", "roundrobin"], default="dynamic")
    p.add_argument("--max-iter", type=int, default=100)
    p.add_argument("--tol", type=float, default=1e-6)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--output", default="out/lasso")
    p.add_argument("--master", default=None)
    return p.parse_args(argv)


def load(spark, args):
    if args.generate:
        from pystrads.datasets import synthetic

        kind, _, shape = args.generate.partition(":")
        dims = [int(v) for v in shape.lower().split("x")]
        if kind == "strads" and len(dims) == 2:
            prob = synthetic.strads_lasso_problem(dims[0], dims[1], seed=args.seed)
        elif kind == "uniform" and len(dims) == 3:
            prob = synthetic.uniform_sparse_problem(dims[0], dims[1], dims[2], seed=args.seed)
        else:
            raise SystemExit(f"--generate {args.generate!r}: use strads:NxJ or uniform:NxJxNNZ")
        if args.family == "binomial":
            prob.y = (prob.y > np.median(prob.y)).astype(float)
        return prob.to_dataframe(spark, label=args.label_col, features=args.features_col)
    name = args.input.lower()
    if name.endswith((".libsvm", ".svm", ".txt")) or "libsvm" in name:
        return spark.read.format("libsvm").load(args.input).withColumnRenamed("label", args.label_col) \
            .withColumnRenamed("features", args.features_col)
    return spark.read.parquet(args.input)


def lambda_max(df, args, fit_intercept: bool, standardization: bool) -> float:
    """Smallest regParam with an all-zero model (MLlib's scaling), from one pass over the data."""
    from pyspark.ml.stat import Summarizer

    fcol, lcol = args.features_col, args.label_col
    stats = df.select(Summarizer.metrics("mean", "variance", "count").summary(df[fcol]).alias("s"),
                      __import__("pyspark.sql.functions", fromlist=["mean"]).mean(lcol).alias("ybar")).first()
    ybar = float(stats["ybar"]) if fit_intercept else 0.0
    mean = stats["s"]["mean"].toArray()
    std = np.sqrt(stats["s"]["variance"].toArray())
    n = float(stats["s"]["count"])
    if args.family == "binomial":
        ybar = ybar if fit_intercept else 0.5

    def seq(acc, row):
        x, y = row
        if hasattr(x, "indices"):
            acc[x.indices] += x.values * (y - ybar)
        else:
            acc += x.toArray() * (y - ybar)
        return acc

    g = df.select(fcol, lcol).rdd.treeAggregate(np.zeros(len(mean)), seq, lambda a, b: a + b)
    scale = np.where(std > 0, std, np.inf) if standardization else np.where(std > 0, 1.0, np.inf)
    return float(np.max(np.abs(g) / n / scale))


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    from pystrads.ml import StradsLasso, StradsLogisticRegression

    from pyspark.sql import SparkSession

    owned = SparkSession.getActiveSession() is None  # else a notebook's or a caller's: left running
    spark = spark_session(args.master, "pystrads-lasso")
    spark.sparkContext.setLogLevel("WARN")
    df = load(spark, args).cache()
    fit_intercept, standardization = not args.no_intercept, not args.no_standardization
    if args.reg_ratio is not None:
        lam = args.reg_ratio * lambda_max(df, args, fit_intercept, standardization)
    else:
        lam = args.reg_param if args.reg_param is not None else 0.0
    cls = StradsLasso if args.family == "gaussian" else StradsLogisticRegression
    est = cls(featuresCol=args.features_col, labelCol=args.label_col, regParam=lam, fitIntercept=fit_intercept,
              standardization=standardization, schedule=args.schedule, maxIter=args.max_iter, tol=args.tol,
              numWorkers=args.workers, seed=args.seed)
    if args.weight_col:
        est.setWeightCol(args.weight_col)
    t0 = time.perf_counter()
    model = est.fit(df)
    fit_s = time.perf_counter() - t0
    s = model.summary
    print(f"\nregParam {lam:.6g}, {s.numInstances} rows, {model.numFeatures} features, {s.numNonZeros} non-zeros")
    print(f"{'iteration':>9}  {'objective':>16}  {'updates':>10}  {'duality gap':>12}")
    for _, row in s.iterations.iterrows():
        print(f"{int(row['iteration']):>9}  {row['objective']:>16.10g}  {int(row['updates']):>10}  "
              f"{row.get('gap', float('nan')):>12.3g}")
    coef = model.coefficients.toArray()
    nz = np.flatnonzero(coef)
    print(f"fit {fit_s:.1f} s ({s.stopReason}); {len(nz)} non-zero coefficients, intercept {model.intercept:.6g}")
    top = nz[np.argsort(-np.abs(coef[nz]))][:20]
    metrics = {"input": args.input or args.generate, "family": args.family, "regParam": lam, "fit_s": fit_s,
               "stop_reason": s.stopReason, "iterations": s.iterations.to_dict("records"),
               "steps": s.steps.to_dict("records"), "timings_s": s.timings, "nonzeros": int(len(nz)),
               "intercept": model.intercept}
    out = args.output
    model.write().overwrite().save(os.path.join(out, "model"))
    if "://" not in out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "metrics.json"), "w") as fh:
            json.dump(metrics, fh, indent=2, default=float)
        with open(os.path.join(out, "coefficients.json"), "w") as fh:
            json.dump({int(j): float(coef[j]) for j in top}, fh, indent=2)
        try:
            from matplotlib.figure import Figure  # no pyplot: no backend switch, no figure left open in a caller

            fig = Figure(figsize=(6, 4))
            ax = fig.subplots()
            s.plot(ax=ax)
            ax.set_title(f"{cls.__name__} ({args.schedule})")
            fig.tight_layout()
            fig.savefig(os.path.join(out, "convergence.png"), dpi=100)
        except ImportError:
            pass
        print(f"wrote {out}/model, metrics.json, coefficients.json, convergence.png")
    if owned:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
