"""Scoring benchmark: ``transform`` of pystrads' models against MLlib's on the same rows, same run.

    python jobs/bench_scoring.py [--rows 10000000] [--repeats 3] [--features 20] [--quick]
                                 [--cases linear,logistic,mf,lda]

Each case fits a pystrads model and its MLlib peer on the same small training set, then
times ``model.transform(rows)`` of both on the same rows, held in memory (cached and
counted first), every output materialised the same way (written to Spark's ``noop`` sink):
one warm-up call each, then ``--repeats`` calls each, interleaved; medians and their ratio
(pystrads / MLlib, target <= 2).

- **linear** / **logistic**: StradsLassoModel / StradsLogisticRegressionModel against
  LinearRegressionModel / LogisticRegressionModel on ``--rows`` rows of ``--features`` dense
  features (Spark's own random columns).  On this classic session pystrads scores through MLlib's
  own model made from its coefficients; the Arrow path that scores under Spark Connect is timed
  beside MLlib on ``--arrow-rows`` rows (``pystrads (Arrow)``).
- **mf**: StradsMFModel against ALSModel (rank 10, fitted on 1 M synthetic ratings of 50 k
  users and 10 k items) on ``--rows`` (user, item) pairs.
- **lda**: StradsLDAModel (K = 50, its default fold-in sweeps) against MLlib's online LDAModel
  (K = 50) on the Debian package descriptions (63 k documents; shipped with pystrads as a
  sample, read here from ``../shared/data``).

Prints a table and writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

SHARED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data")


def materialise(frame) -> float:
    """Seconds to compute ``frame`` and write it to Spark's ``noop`` sink."""
    t0 = time.perf_counter()
    frame.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - t0


def compare(systems: dict, rows, repeats: int) -> dict:
    """``systems``: name -> fn(rows) -> DataFrame.  One warm-up each, then ``repeats`` rounds,
    the systems interleaved in each; every time and the medians."""
    for fn in systems.values():
        materialise(fn(rows))
    times = {name: [] for name in systems}
    for _ in range(repeats):
        for name, fn in systems.items():
            times[name].append(round(materialise(fn(rows)), 3))
    return {"seconds": times, "median_s": {n: statistics.median(t) for n, t in times.items()}}


def linear_rows(spark, n: int, d: int, partitions: int):
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F

    return spark.range(n, numPartitions=partitions).select(
        array_to_vector(F.array(*[F.rand(seed=j) for j in range(d)])).alias("features"))


def linear_case(spark, args, logistic: bool) -> dict:
    from pyspark.ml.classification import LogisticRegression
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.regression import LinearRegression
    from pyspark.sql import functions as F

    from pystrads.ml import StradsLasso, StradsLogisticRegression

    d = args.features
    w = np.random.default_rng(0).standard_normal(d)
    arr = vector_to_array(F.col("features"))
    score = sum(arr[j] * float(w[j]) for j in range(d))
    train = linear_rows(spark, 20_000, d, 2).withColumn("margin", score + F.randn(seed=99))
    if logistic:
        train = train.withColumn("label", (F.col("margin") > float(w.sum() / 2)).cast("double"))
        ours = StradsLogisticRegression(regParam=0.001, elasticNetParam=1.0).fit(train.cache())
        theirs = LogisticRegression(regParam=0.001, elasticNetParam=1.0).fit(train)
    else:
        train = train.withColumn("label", F.col("margin"))
        ours = StradsLasso(regParam=0.001).fit(train.cache())
        theirs = LinearRegression(regParam=0.001, elasticNetParam=1.0).fit(train)
    rows = linear_rows(spark, args.rows, d, args.partitions).cache()
    rows.count()

    arrow_model = ours.copy()
    arrow_model._mllib_model = lambda dataset: None  # the path taken where no JVM model can be made (Connect)
    arrow = arrow_model.transform

    out = compare({"pystrads": ours.transform, "MLlib": theirs.transform}, rows, args.repeats)
    rows.unpersist()
    if args.arrow_rows:
        rows = linear_rows(spark, args.arrow_rows, d, args.partitions).cache()
        rows.count()
        arrow_out = compare({"pystrads (Arrow)": arrow, "MLlib": theirs.transform}, rows, args.repeats)
        rows.unpersist()
        m = arrow_out["median_s"]
        out["arrow"] = {"rows": args.arrow_rows, **arrow_out, "ratio": m["pystrads (Arrow)"] / m["MLlib"]}
        print(f"  Arrow path on {args.arrow_rows:,} rows: {m['pystrads (Arrow)']:.2f} s against MLlib's "
              f"{m['MLlib']:.2f} s ({out['arrow']['ratio']:.1f}x)", flush=True)
    return {"case": "logistic" if logistic else "linear", "rows": args.rows, "features": d,
            "peer": "LogisticRegressionModel" if logistic else "LinearRegressionModel", **out}


def mf_case(spark, args) -> dict:
    from pyspark.ml.recommendation import ALS
    from pyspark.sql import functions as F

    from pystrads.ml import StradsMF

    users, items, ratings = 50_000, 10_000, 1_000_000
    train = spark.range(ratings, numPartitions=2).select(
        (F.abs(F.xxhash64("id", F.lit(1))) % users).cast("int").alias("user"),
        (F.abs(F.xxhash64("id", F.lit(2))) % items).cast("int").alias("item"),
        (F.rand(seed=3) * 4 + 1).cast("float").alias("rating")).cache()
    params = dict(rank=10, maxIter=5, regParam=0.1, userCol="user", itemCol="item", ratingCol="rating", seed=1)
    ours = StradsMF(**params).fit(train)
    theirs = ALS(**params).fit(train)
    rows = spark.range(args.rows, numPartitions=args.partitions).select(
        (F.col("id") % users).cast("int").alias("user"), ((F.col("id") * 7919) % items).cast("int").alias("item"))
    rows = rows.cache()
    rows.count()
    out = compare({"pystrads": ours.transform, "MLlib": theirs.transform}, rows, args.repeats)
    rows.unpersist()
    train.unpersist()
    return {"case": "mf", "rows": args.rows, "rank": 10, "users": users, "items": items, "peer": "ALSModel", **out}


def lda_case(spark, args) -> dict:
    from pyspark.ml.clustering import LDA
    from pyspark.ml.feature import StopWordsRemover

    from bench_lda import spark_df, tokenize_corpus
    from pystrads.ml import StradsLDA

    stop = set(StopWordsRemover.loadDefaultStopWords("english"))
    vocab, train_ids, test_ids = tokenize_corpus("debian", stop, args.quick)
    docs = [d for d in train_ids + test_ids if d]
    frame = spark_df(spark, vocab, docs, args.partitions)
    frame.count()
    ours = StradsLDA(k=50, maxIter=50, seed=1).fit(frame)
    theirs = LDA(k=50, maxIter=10, seed=1, optimizer="online").fit(frame)
    out = compare({"pystrads": ours.transform, "MLlib": theirs.transform}, frame, args.repeats)
    frame.unpersist()
    return {"case": "lda", "rows": len(docs), "tokens": int(sum(len(d) for d in docs)), "k": 50,
            "fold_in_iterations": ours.getFoldInIterations(), "peer": "LDAModel (online)", **out}


def main(argv=None):
    p = argparse.ArgumentParser(description="transform of pystrads' models against MLlib's")
    p.add_argument("--rows", type=int, default=10_000_000, help="rows scored by the linear and MF cases")
    p.add_argument("--features", type=int, default=20)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--arrow-rows", type=int, default=1_000_000,
                   help="linear cases: also time the Arrow path (as under Spark Connect) on this many rows; 0: skip")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cases", default="linear,logistic,mf,lda")
    p.add_argument("--quick", action="store_true", help="100 k rows, 2,000 documents, 1 repeat")
    p.add_argument("--out", default="out/bench_scoring.json")
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.arrow_rows, args.repeats = 100_000, 100_000, 1
    from pystrads.session import spark_session

    spark = spark_session(app_name="bench_scoring", conf={"spark.driver.memory": "12g"})
    spark.sparkContext.setLogLevel("ERROR")
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    results = []
    for case in cases:
        if case in ("linear", "logistic"):
            r = linear_case(spark, args, case == "logistic")
        elif case == "mf":
            r = mf_case(spark, args)
        elif case == "lda":
            r = lda_case(spark, args)
        else:
            raise SystemExit(f"--cases: unknown case {case!r} (linear, logistic, mf, lda)")
        m = r["median_s"]
        r["ratio"] = {name: m[name] / m["MLlib"] for name in m if name != "MLlib"}
        results.append(r)
        print(f"{r['case']:>9} {r['rows']:>11,} rows: " + "  ".join(f"{n} {s:.2f} s" for n, s in m.items())
              + "  ratio " + ", ".join(f"{n} {x:.2f}x" for n, x in r["ratio"].items()), flush=True)
    return write_run("bench_scoring.py", argv, args.out, repeats=args.repeats, results=results)


def write_run(job: str, argv, out: str, **fields) -> dict:
    """The run's JSON (``--out``): the command that made it, the date, the machine, then ``fields``."""
    data = {"command": ("python3 jobs/" + job + " " + " ".join(argv if argv is not None else sys.argv[1:])).strip(),
            "date": datetime.date.today().isoformat(),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, **fields}
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1)
    print(f"wrote {out}")
    return data


if __name__ == "__main__":
    main()
