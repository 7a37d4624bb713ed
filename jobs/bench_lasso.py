"""Benchmark: StradsLasso schedules vs MLlib LinearRegression (OWL-QN) vs scikit-learn Lasso, same run.

    python3 jobs/bench_lasso.py                                   # STRADS generator 20K x 200K and 50K x 1M
    python3 jobs/bench_lasso.py --problems strads:2000x20000 --quick

Problems (objective ``1/(2n) ||y - X beta||^2 + lambda ||beta||_1``, no
intercept, no standardisation -- scikit-learn's ``Lasso(fit_intercept=False)``
and MLlib's ``LinearRegression(elasticNetParam=1, fitIntercept=False,
standardization=False)``), ``lambda = reg_ratio * lambda_max``:

* ``strads:NxJ`` -- the STRADS paper's generator (25 non-zeros per column,
  10 % of columns correlated with the previous one);
* ``uniform:NxJxNNZ`` -- non-zeros scattered uniformly.

``F*`` is the best objective any method reached (scikit-learn at tol 1e-10
when installed).  For every run: total fit time, time and coordinate updates
to a 1e-3 and a 1e-6 relative objective gap ``(F - F*) / F*``, final gap.
pystrads runs all use the same parallel width (``--width`` coefficients per
round); "rounds only" variants switch the driver's working-set tail off so
their updates are all parallel rounds over the data.  Writes
``<out>/bench_lasso.json`` and ``<out>/bench_lasso.png``.
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

from pystrads.datasets import synthetic  # noqa: E402
from pystrads.session import spark_session  # noqa: E402

GAPS = (1e-3, 1e-6)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--problems", default="strads:20000x200000,uniform:50000x1000000x5000000")
    p.add_argument("--reg-ratio", type=float, default=0.05)
    p.add_argument("--width", type=int, default=256, help="coefficients per round (L) for every schedule")
    p.add_argument("--rounds-max-iter", type=int, default=12, help="maxIter of the rounds-only variants")
    p.add_argument("--repeats", type=int, default=1, help="runs of the default pystrads fit and MLlib (median)")
    p.add_argument("--quick", action="store_true", help="skip the STRADS-priority and round-robin variants")
    p.add_argument("--skip-sklearn", action="store_true")
    p.add_argument("--skip-mllib", action="store_true")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default="out/bench_lasso")
    return p.parse_args(argv)


def make_problem(spec: str, seed: int):
    kind, _, shape = spec.partition(":")
    dims = [int(v) for v in shape.lower().split("x")]
    if kind == "strads":
        return synthetic.strads_lasso_problem(dims[0], dims[1], seed=seed)
    return synthetic.uniform_sparse_problem(dims[0], dims[1], dims[2], seed=seed)


def objective(prob, beta, lam) -> float:
    n = prob.shape[0]
    r = prob.y.copy()
    for i in range(n):  # X beta row by row (no scipy needed)
        a, b = prob.row_ptr[i], prob.row_ptr[i + 1]
        r[i] -= prob.vals[a:b] @ beta[prob.col_idx[a:b]]
    return 0.5 * float(r @ r) / n + lam * float(np.abs(beta).sum())


def run_sklearn(prob, lam, tol):
    from scipy import sparse
    from sklearn.linear_model import Lasso

    x = sparse.csr_matrix((prob.vals, prob.col_idx, prob.row_ptr), shape=prob.shape).tocsc()
    t0 = time.perf_counter()
    model = Lasso(alpha=lam, fit_intercept=False, tol=tol, max_iter=1000000, selection="cyclic").fit(x, prob.y)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "beta": model.coef_, "iterations": int(model.n_iter_)}


def run_pystrads(df, lam, width, seed, **params):
    from pystrads.ml import StradsLasso

    est = StradsLasso(regParam=lam, fitIntercept=False, standardization=False, coordinatesPerRound=width,
                      candidatesPerRound=2 * width, seed=seed, **params)
    t0 = time.perf_counter()
    model = est.fit(df)
    seconds = time.perf_counter() - t0
    hist = model.summary.iterations
    return {"seconds": seconds, "beta": model.coefficients.toArray(),
            "history": {"elapsed_s": hist["elapsed_s"].tolist(), "objective": hist["objective"].tolist(),
                        "updates": hist["updates"].tolist(), "round_updates": hist["round_updates"].tolist()},
            "iterations": model.summary.totalIterations, "stop": model.summary.stopReason,
            "timings_s": model.summary.timings}


def run_mllib(df, lam):
    from pyspark.ml.regression import LinearRegression

    t0 = time.perf_counter()
    model = LinearRegression(regParam=lam, elasticNetParam=1.0, fitIntercept=False, standardization=False).fit(df)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "beta": model.coefficients.toArray(), "iterations": model.summary.totalIterations}


def reach(run, best, gap):
    """(seconds, updates, round updates) when the relative gap first fell to ``gap``, or Nones."""
    h = run.get("history")
    if h is None:  # one point: the end of the run
        ok = (run["objective"] - best) <= gap * best
        return (run["seconds"], None, None) if ok else (None, None, None)
    for t, f, u, ru in zip(h["elapsed_s"], h["objective"], h["updates"], h["round_updates"]):
        if f - best <= gap * best:
            return t, int(u), int(ru)
    return None, None, None


def fmt(v, spec="{:.1f}"):
    return "—" if v is None else spec.format(v)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    spark = spark_session(None, "pystrads-bench-lasso", {"spark.ui.enabled": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    try:
        import sklearn  # noqa: F401
        have_sklearn = not args.skip_sklearn
    except ImportError:
        have_sklearn = False
        print("scikit-learn not installed: F* from the best pystrads / MLlib run (pip install scikit-learn)")
    report = {"args": vars(args), "problems": {}}
    os.makedirs(args.out, exist_ok=True)
    for spec in args.problems.split(","):
        prob = make_problem(spec, args.seed)
        lam = args.reg_ratio * synthetic.lambda_max(prob)
        n, J = prob.shape
        print(f"\n== {spec}: {n} x {J}, {prob.nnz} non-zeros, lambda = {args.reg_ratio} lambda_max = {lam:.4g}")
        df = prob.to_dataframe(spark, num_partitions=2).cache()
        df.count()
        runs = {}
        if have_sklearn:
            runs["scikit-learn Lasso (tol 1e-4)"] = run_sklearn(prob, lam, 1e-4)
            runs["scikit-learn Lasso (tol 1e-10)"] = run_sklearn(prob, lam, 1e-10)
        variants = [("pystrads dynamic (default)", {})]
        variants += [("pystrads shotgun, rounds only", {"schedule": "shotgun", "workingSetLimit": 0,
                                                         "maxIter": args.rounds_max_iter}),
                     ("pystrads dynamic, rounds only", {"workingSetLimit": 0, "maxIter": args.rounds_max_iter})]
        if not args.quick:
            variants += [
                ("pystrads STRADS priority (delta^2+eta), rounds only",
                 {"priority": "delta", "workingSetLimit": 0, "maxIter": args.rounds_max_iter}),
                ("pystrads round-robin, rounds only", {"schedule": "roundrobin", "workingSetLimit": 0,
                                                      "maxIter": args.rounds_max_iter}),
            ]
        for name, params in variants:
            repeats = args.repeats if name.endswith("(default)") else 1
            results = [run_pystrads(df, lam, args.width, args.seed, **params) for _ in range(repeats)]
            results.sort(key=lambda r: r["seconds"])
            runs[name] = dict(results[len(results) // 2], all_seconds=[r["seconds"] for r in results])
            print(f"  {name}: {runs[name]['seconds']:.1f} s")
        if not args.skip_mllib:
            results = sorted((run_mllib(df, lam) for _ in range(args.repeats)), key=lambda r: r["seconds"])
            runs["MLlib LinearRegression (OWL-QN, defaults)"] = dict(results[len(results) // 2],
                                                                   all_seconds=[r["seconds"] for r in results])
            print(f"  MLlib: {results[len(results) // 2]['seconds']:.1f} s")
        for run in runs.values():
            run["objective"] = objective(prob, run["beta"], lam)
        best = min(r["objective"] for r in runs.values())
        header = (f"{'method':<52} {'fit s':>7} {'s to 1e-3':>9} {'upd to 1e-3':>12} {'s to 1e-6':>9} "
                  f"{'upd to 1e-6':>12} {'final rel. gap':>14} {'non-zeros':>9}")
        print(f"\nF* = {best:.12g}\n" + header + "\n" + "-" * len(header))
        rows = {}
        for name, run in runs.items():
            (t3, u3, r3), (t6, u6, r6) = reach(run, best, 1e-3), reach(run, best, 1e-6)
            gap = (run["objective"] - best) / best
            rows[name] = {"fit_s": run["seconds"], "all_fit_s": run.get("all_seconds"), "objective": run["objective"],
                          "rel_gap": gap, "s_to_1e-3": t3, "updates_to_1e-3": u3, "round_updates_to_1e-3": r3,
                          "s_to_1e-6": t6, "updates_to_1e-6": u6, "round_updates_to_1e-6": r6,
                          "nonzeros": int(np.count_nonzero(run["beta"])), "iterations": run.get("iterations"),
                          "history": run.get("history"), "timings_s": run.get("timings_s")}
            print(f"{name:<52} {run['seconds']:>7.1f} {fmt(t3):>9} {fmt(u3, '{:,}'):>12} {fmt(t6):>9} "
                  f"{fmt(u6, '{:,}'):>12} {gap:>14.2e} {rows[name]['nonzeros']:>9}")
        ratios = {}
        mllib = rows.get("MLlib LinearRegression (OWL-QN, defaults)")
        ours = rows["pystrads dynamic (default)"]
        if mllib:
            ratios["fit time pystrads dynamic / MLlib"] = ours["fit_s"] / mllib["fit_s"]
        dyn = rows.get("pystrads dynamic, rounds only")
        shot = rows["pystrads shotgun, rounds only"]
        if dyn and dyn["round_updates_to_1e-3"] and shot["round_updates_to_1e-3"]:
            ratios["updates to 1e-3: shotgun / dynamic (rounds only)"] = (shot["round_updates_to_1e-3"]
                                                                        / dyn["round_updates_to_1e-3"])
        elif dyn and dyn["round_updates_to_1e-3"]:
            ratios["updates to 1e-3: shotgun / dynamic (rounds only)"] = (
                f"> {shot['history']['round_updates'][-1] / dyn['round_updates_to_1e-3']:.1f} (shotgun did not reach it)")
        sk = rows.get("scikit-learn Lasso (tol 1e-10)")
        if sk:
            ratios["relative objective difference pystrads dynamic vs scikit-learn (tol 1e-10)"] = (
                (ours["objective"] - sk["objective"]) / sk["objective"])
        for k, v in ratios.items():
            print(f"  {k}: {v:.3g}" if isinstance(v, float) else f"  {k}: {v}")
        report["problems"][spec] = {"shape": [n, J], "nnz": prob.nnz, "lambda": lam, "best_objective": best,
                                    "runs": rows, "ratios": ratios}
        df.unpersist()
    with open(os.path.join(args.out, "bench_lasso.json"), "w") as fh:
        json.dump(report, fh, indent=2, default=lambda v: None if v is None else float(v))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        specs = list(report["problems"])
        fig, axes = plt.subplots(1, len(specs), figsize=(6.5 * len(specs), 4.5), squeeze=False)
        for ax, spec in zip(axes[0], specs):
            pr = report["problems"][spec]
            for name, row in pr["runs"].items():
                best = pr["best_objective"]
                if row["history"]:
                    h = row["history"]
                    gaps = np.maximum((np.asarray(h["objective"]) - best) / best, 1e-12)
                    ax.semilogy(h["elapsed_s"], gaps, marker=".", label=name)
                else:
                    ax.semilogy([row["fit_s"]], [max(row["rel_gap"], 1e-12)], marker="s", linestyle="", label=name)
            ax.set_title(spec)
            ax.set_xlabel("seconds since fit() was called")
            ax.set_ylabel("(F - F*) / F*")
            ax.legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, "bench_lasso.png"), dpi=110)
    except ImportError:
        pass
    print(f"\nwrote {args.out}/bench_lasso.json and bench_lasso.png")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
