"""Matrix factorisation with StradsMF: ratings in; model, metrics, plot and sample recommendations out.

    spark-submit jobs/mf.py --input ratings.csv --user-col userId --item-col movieId --rank 10 --max-iter 15
    spark-submit jobs/mf.py --input ratings.parquet --test-fraction 0.1 --output out/mf
    spark-submit jobs/mf.py --input ratings.csv --algorithm sgd --step-size 0.05
    spark-submit jobs/mf.py --input plays.parquet --implicit-prefs --alpha 40 --rank 50

Input: CSV (with a header; .csv or .csv.gz) or Parquet with user, item and
rating columns (integer ids within int32, as ALS). With ``--implicit-prefs`` the
ratings are implicit feedback (counts, plays; ALS's implicit objective, confidence
1 + alpha |r|). With ``--test-fraction`` a random split is held out and its RMSE
(explicit ratings; cold starts dropped) reported. The model goes to
``<output>/model``, the history to ``<output>/metrics.json``, the training-RMSE
(or implicit objective) plot to ``<output>/convergence.png`` (with matplotlib)
and the top-N items of a few users to ``<output>/recommendations.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pystrads.session import spark_session  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Fit a StradsMF recommender (explicit ratings or implicit feedback).",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--input", required=True, help="CSV with a header, or Parquet")
    p.add_argument("--user-col", default="userId")
    p.add_argument("--item-col", default="movieId")
    p.add_argument("--rating-col", default="rating")
    p.add_argument("--rank", type=int, default=10)
    p.add_argument("--max-iter", type=int, default=15)
    p.add_argument("--reg-param", type=float, default=0.1)
    p.add_argument("--unscaled-reg", action="store_true",
                   help="regParam alone on every factor row (the implicit library's form), not scaled by the counts")
    p.add_argument("--inner-iterations", type=int, default=0, help="0 = automatic (1 with feature blocks)")
    p.add_argument("--feature-block-size", type=int, default=0, help="features per round; 0 = automatic, 1 = CCD++")
    p.add_argument("--algorithm", choices=["cd", "sgd"], default="cd",
                   help="cd: coordinate descent with W/H alternation (default); sgd: SGD with block rotation")
    p.add_argument("--step-size", type=float, default=0.05, help="SGD's initial step size (algorithm sgd)")
    p.add_argument("--nonnegative", action="store_true")
    p.add_argument("--implicit-prefs", action="store_true", help="implicit feedback (ALS's implicitPrefs)")
    p.add_argument("--alpha", type=float, default=1.0, help="confidence slope with --implicit-prefs")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--test-fraction", type=float, default=0.0)
    p.add_argument("--top-n", type=int, default=10)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--output", default="out/mf")
    p.add_argument("--master", default=None)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    from pyspark.ml.evaluation import RegressionEvaluator

    from pystrads.ml import StradsMF

    from pyspark.sql import SparkSession

    owned = SparkSession.getActiveSession() is None  # else a notebook's or a caller's: left running
    spark = spark_session(args.master, "pystrads-mf")
    spark.sparkContext.setLogLevel("WARN")
    name = args.input.lower()
    if name.endswith((".csv", ".csv.gz")):
        df = spark.read.option("header", True).option("inferSchema", True).csv(args.input)
    else:
        df = spark.read.parquet(args.input)
    train, test = (df.randomSplit([1 - args.test_fraction, args.test_fraction], seed=args.seed)
                   if args.test_fraction > 0 else (df, None))
    mf = StradsMF(userCol=args.user_col, itemCol=args.item_col, ratingCol=args.rating_col, rank=args.rank,
                  maxIter=args.max_iter, regParam=args.reg_param, innerIterations=args.inner_iterations,
                  featureBlockSize=args.feature_block_size, algorithm=args.algorithm, stepSize=args.step_size,
                  nonnegative=args.nonnegative, numWorkers=args.workers, seed=args.seed, coldStartStrategy="drop",
                  implicitPrefs=args.implicit_prefs, alpha=args.alpha, scaleRegParam=not args.unscaled_reg)
    t0 = time.perf_counter()
    model = mf.fit(train)
    fit_s = time.perf_counter() - t0
    history = model.summary.iterations
    column, label = ("objective", "objective") if args.implicit_prefs else ("train_rmse", "training RMSE")
    print(f"\niteration  {label}")
    for _, row in history.iterrows():
        print(f"{int(row['iteration']):>9}  {row[column]:.4f}")
    metrics = {"input": args.input, "rank": args.rank, "algorithm": args.algorithm, "fit_s": fit_s, "iterations": history.to_dict("records"),
               "steps": model.summary.steps.to_dict("records"), "fixed_s": model.summary.fixed}
    if test is not None and not args.implicit_prefs:
        metrics["test_rmse"] = RegressionEvaluator(labelCol=args.rating_col).evaluate(model.transform(test))
        print(f"test RMSE (cold starts dropped): {metrics['test_rmse']:.4f}")
    print(f"fit {fit_s:.1f} s")
    recs = model.recommendForAllUsers(args.top_n).orderBy(args.user_col).limit(5).collect()
    sample = {int(r[args.user_col]): [[int(x[args.item_col]), round(float(x.rating), 4)] for x in r.recommendations]
              for r in recs}
    for user, items in sample.items():
        print(f"user {user}: " + ", ".join(str(i) for i, _ in items))
    out = args.output
    model.write().overwrite().save(os.path.join(out, "model"))
    if "://" not in out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "metrics.json"), "w") as fh:
            json.dump(metrics, fh, indent=2, default=float)
        with open(os.path.join(out, "recommendations.json"), "w") as fh:
            json.dump(sample, fh, indent=2)
        try:
            from matplotlib.figure import Figure  # no pyplot: no backend switch, no figure left open in a caller

            fig = Figure(figsize=(6, 4))
            ax = fig.subplots()
            ax.plot(history["iteration"], history[column], marker=".")
            ax.set_xlabel("iteration")
            ax.set_ylabel(label)
            ax.set_title(f"StradsMF rank {args.rank}")
            fig.tight_layout()
            fig.savefig(os.path.join(out, "convergence.png"), dpi=100)
        except ImportError:
            pass
        print(f"wrote {out}/model, metrics.json, recommendations.json" + (", convergence.png"))
    if owned:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
