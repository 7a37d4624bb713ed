"""Benchmark: multinomial StradsLogisticRegression against MLlib's LogisticRegression, same run, same target.

    python3 jobs/bench_multinomial.py --repeats 3                  # 200 K rows x 50 K features, 10 classes
    python3 jobs/bench_multinomial.py --rows 20000 --features 5000 --repeats 1    # a small check

The problem: sparse features (``--nnz`` non-zeros per row, feature frequencies Zipf-like as in text
and click data), labels the argmax of ``K`` noisy linear class scores over ``--informative`` features.
Both systems fit MLlib's objective (``family="multinomial"``, ``elasticNetParam`` ``--alpha``,
``regParam`` ``--reg``, with standardization and an intercept: every default of MLlib's but the
penalty), evaluated for each by :func:`objective` on its own coefficients.

Target and timing (one rule for both):

* MLlib runs first to convergence (``tol=1e-12``, ``maxIter`` ``--mllib-max-iter``); ``F_M`` is its
  final objective and the target is ``F_M (1 + 1e-6)``: MLlib's converged optimum.
* MLlib's time: its iterates do not depend on ``maxIter``, so the first iterate that reaches the
  target is found from its ``objectiveHistory``, and the fit with that ``maxIter`` is run again
  and timed whole (``fit()`` call to return; its objective recomputed and checked).
* pystrads' time: its fit (``tol`` ``--tol``) records the objective and the seconds since the call of
  ``fit()`` after every iteration; its time is that of the first iteration at or below the target.
  Its final objective is recomputed from the model's coefficients and checked too.
* Warm-up: each system fits once for a few iterations on the same (cached) DataFrame first.
  ``--repeats`` timed runs of each, interleaved; medians and their ratio (target <= 0.5).

Prints a table and writes JSON (``--out``; ``docs/bench-data/multinomial.json`` feeds
docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _bench import argv_of, record  # noqa: E402


def _csr(indptr, indices, values, features):
    import scipy.sparse

    return scipy.sparse.csr_matrix((values, indices, indptr), shape=(len(indptr) - 1, features))


def generate(rows: int, features: int, classes: int, nnz: int, informative: int, seed: int):
    """CSR arrays ``(indptr, indices, values)`` and labels of the benchmark problem."""
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, features + 1, dtype=np.float64)
    freq = ranks ** -0.7
    freq /= freq.sum()
    counts = rng.poisson(nnz, rows).clip(1, features)
    row_of = np.repeat(np.arange(rows, dtype=np.int64), counts)
    cols = rng.choice(features, size=len(row_of), p=freq)  # frequent features more often
    key = np.unique(row_of * features + cols)  # distinct features per row, in row order
    row_of, indices = key // features, key % features
    counts = np.bincount(row_of, minlength=rows)
    indptr = np.concatenate([[0], np.cumsum(counts)])
    values = rng.lognormal(0.0, 0.5, len(indices))
    order = rng.permutation(features)[:informative]  # informative features, spread over the frequencies
    true = np.zeros((features, classes))
    true[order] = rng.standard_normal((informative, classes)) * 1.5
    scores = _csr(indptr, indices, values, features) @ true + rng.gumbel(size=(rows, classes))
    return indptr, indices, values, scores.argmax(axis=1).astype(np.float64)


def objective(indptr, indices, values, y, matrix, intercepts, reg, alpha, std):
    """MLlib's multinomial objective (unit weights, standardization) at ``(matrix, intercepts)``."""
    rows = len(y)
    margins = _csr(indptr, indices, values, matrix.shape[1]) @ matrix.T + intercepts
    top = margins.max(axis=1)
    lse = top + np.log(np.exp(margins - top[:, None]).sum(axis=1))
    loss = float(np.mean(lse - margins[np.arange(rows), y.astype(int)]))
    return loss + reg * (alpha * float((np.abs(matrix) * std).sum())
                         + (1 - alpha) / 2 * float(((matrix * std) ** 2).sum()))


def column_std(indptr, indices, values, features):
    rows = len(indptr) - 1
    s1 = np.bincount(indices, weights=values, minlength=features)
    s2 = np.bincount(indices, weights=values * values, minlength=features)
    mean = s1 / rows
    return np.sqrt(np.maximum(s2 - rows * mean * mean, 0.0) / (rows - 1))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--features", type=int, default=50_000)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--nnz", type=int, default=40, help="mean non-zeros per row")
    p.add_argument("--informative", type=int, default=2000)
    p.add_argument("--reg", type=float, default=0.002)
    p.add_argument("--alpha", type=float, default=1.0, help="elasticNetParam")
    p.add_argument("--tol", type=float, default=1e-9, help="pystrads' tol")
    p.add_argument("--max-iter", type=int, default=200, help="pystrads' maxIter")
    p.add_argument("--mllib-max-iter", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--params", default="{}", help="more StradsLogisticRegression params, as JSON")
    p.add_argument("--out", default="out/bench_multinomial.json")
    args = p.parse_args(argv)

    from pyspark.ml.classification import LogisticRegression
    from pyspark.ml.linalg import Vectors

    from pystrads.ml import StradsLogisticRegression
    from pystrads.session import spark_session

    spark = spark_session("local[2]", "pystrads-bench-multinomial",
                          {"spark.ui.enabled": "false", "spark.driver.memory": "8g"})
    spark.sparkContext.setLogLevel("ERROR")
    t0 = time.perf_counter()
    indptr, indices, values, y = generate(args.rows, args.features, args.classes, args.nnz, args.informative,
                                          args.seed)
    counts = np.bincount(y.astype(int), minlength=args.classes)
    print(f"problem: {args.rows} rows x {args.features} features, {len(values)} non-zeros, {args.classes} classes "
          f"(smallest {counts.min()}, largest {counts.max()} rows); generated in {time.perf_counter() - t0:.1f} s")
    data = [(float(y[i]), Vectors.sparse(args.features, indices[indptr[i]:indptr[i + 1]].tolist(),
                                         values[indptr[i]:indptr[i + 1]].tolist())) for i in range(args.rows)]
    df = spark.createDataFrame(data, ["label", "features"]).repartition(2).cache()
    del data
    df.count()
    std = column_std(indptr, indices, values, args.features)
    common = dict(regParam=args.reg, elasticNetParam=args.alpha, family="multinomial")
    extra = json.loads(args.params)

    def score(model):
        return objective(indptr, indices, values, y, model.coefficientMatrix.toArray(),
                         model.interceptVector.toArray(), args.reg, args.alpha, std)

    def mllib(max_iter, tol=0.0):
        start = time.perf_counter()
        model = LogisticRegression(maxIter=max_iter, tol=tol, **common).fit(df)
        return time.perf_counter() - start, model

    def ours():
        start = time.perf_counter()
        model = StradsLogisticRegression(maxIter=args.max_iter, tol=args.tol, seed=1, **common, **extra).fit(df)
        return time.perf_counter() - start, model

    mllib(5)  # warm-up
    StradsLogisticRegression(maxIter=2, seed=1, **common).fit(df)
    seconds, converged = mllib(args.mllib_max_iter, 1e-12)
    f_m = score(converged)
    history = converged.summary.objectiveHistory
    target = f_m * (1 + 1e-6)
    offset = f_m - history[-1]  # MLlib's history in its own float order: shift it onto objective()
    k = next(i for i, v in enumerate(history) if v + offset <= target)
    print(f"MLlib converged: {len(history) - 1} iterations in {seconds:.1f} s, objective {f_m:.10f} "
          f"(its history's last {history[-1]:.10f}); the target {target:.10f} is reached at iteration {k}")
    times = {"pystrads": [], "mllib": []}
    reached = {}
    for rep in range(args.repeats):
        s, m = mllib(k)
        f = score(m)
        if f > target * (1 + 1e-9):
            raise SystemExit(f"MLlib with maxIter={k} ended at {f:.10f}, above the target {target:.10f}")
        times["mllib"].append(s)
        s, model = ours()
        it = model.summary.iterations
        hit = it[it["objective"] <= target]
        final = score(model)
        if abs(final - model.summary.objectiveHistory[-1]) > 1e-9 * final:
            raise SystemExit(f"pystrads' summary objective {model.summary.objectiveHistory[-1]} != {final}")
        if hit.empty:
            raise SystemExit(f"pystrads ended at {final:.10f} above the target {target:.10f}")
        times["pystrads"].append(float(hit["elapsed_s"].iloc[0]))
        reached = {"iteration": int(hit["iteration"].iloc[0]), "fit_s": s, "final_objective": final,
                   "iterations": model.summary.totalIterations, "stop": model.summary.stopReason,
                   "nonzeros": int(np.count_nonzero(model.coefficientMatrix.toArray()))}
        print(f"  run {rep + 1}: MLlib (maxIter={k}) {times['mllib'][-1]:.1f} s; pystrads reaches the target at "
              f"iteration {reached['iteration']} after {times['pystrads'][-1]:.1f} s (whole fit {s:.1f} s, "
              f"{reached['iterations']} iterations, final {final:.10f})", flush=True)
    median = {name: float(np.median(v)) for name, v in times.items()}
    ratio = median["pystrads"] / median["mllib"]
    print(f"\nmedian time to MLlib's converged objective: pystrads {median['pystrads']:.1f} s, MLlib "
          f"{median['mllib']:.1f} s, ratio {ratio:.2f} (target <= 0.5)")
    result = record("jobs/bench_multinomial.py", argv_of(argv), args.out, {
        "problem": {"rows": args.rows, "features": args.features, "classes": args.classes,
                    "nonzeros": int(len(values)), "informative": args.informative, "seed": args.seed},
        "params": common, "pystrads_params": extra, "target": target,
        "mllib_converged": {"objective": f_m, "iterations": len(history) - 1, "seconds": seconds},
        "mllib_iterations_to_target": k, "pystrads": reached, "seconds": times, "median_s": median,
        "ratio": ratio})
    spark.stop()
    return result


if __name__ == "__main__":
    main()
