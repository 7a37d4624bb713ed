"""Runtime demo: the four program shapes of the Program API on one Spark session.

    spark-submit jobs/runtime_demo.py            # or: python jobs/runtime_demo.py

Runs each example program of ``pystrads.programs.examples`` on a small
synthetic problem with a known answer, prints the answer's error and the
runtime's figures (rounds/s, time split), and writes them as JSON.
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

from pystrads.engine import Engine  # noqa: E402
from pystrads.programs import examples as ex  # noqa: E402
from pystrads.session import spark_session  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--master", default=None, help="Spark master (default: local[2] or spark-submit's)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default="out/runtime_demo.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spark = spark_session(args.master, "pystrads-runtime-demo")
    spark.sparkContext.setLogLevel("WARN")
    sc, U = spark.sparkContext, args.workers
    results = []

    def report(name, shape, got, expected, summary):
        err = float(np.max(np.abs(np.asarray(got) - np.asarray(expected))))
        row = {"program": name, "shape": shape, "max_abs_error": err, "steps": len(summary.rows),
               "rounds": summary.total_rounds, "seconds": round(summary.total_seconds, 3),
               "shard_start_s": round(summary.fixed.get("shard_start_s", 0.0), 3)}
        results.append(row)
        print(f"{name:<18} {shape:<24} max |error| = {err:.2e}  steps={row['steps']:<4} "
              f"rounds={row['rounds']:<5} {row['seconds']:.2f} s")

    rng = np.random.default_rng(0)
    keys, vals = rng.integers(0, 1000, 20000), rng.random(20000)
    with Engine(ex.RotationSum(1000, iterations=4), sc.parallelize(list(zip(keys.tolist(), vals.tolist())), U)
                ).fit() as res:
        report("RotationSum", "static rotation", res.read_table("sums")[:, 0],
               4 * np.bincount(keys, vals, 1000), res.summary)

    a, b, groups = ex.orthogonal_groups_problem(600, 4, 5, seed=1)
    with Engine(ex.BlockLeastSquares(a.shape[1], groups, max_sweeps=200),
                sc.parallelize(ex.as_records(a, b), U)).fit() as res:
        report("BlockLeastSquares", "alternating k-partite", res.read_table("x")[:, 0],
               np.linalg.lstsq(a, b, rcond=None)[0], res.summary)

    a = rng.standard_normal((300, 16))
    b = a @ np.r_[2.0, -1.0, 0, 0, 1.5, np.zeros(11)] + 0.1 * rng.standard_normal(300)
    lam = 0.1 * np.abs(a.T @ b).max()
    with Engine(ex.PriorityLasso(16, lam, np.corrcoef(a.T), coords_per_round=3, pipeline_depth=50,
                                 max_rounds=3000), sc.parallelize(ex.as_records(a, b), U), seed=2).fit() as res:
        report("PriorityLasso", "dynamic, pipelined", res.read_table("x")[:, 0], ex.lasso_reference(a, b, lam),
               res.summary)

    a = rng.standard_normal((400, 6))
    w = rng.standard_normal(6)
    lr = 0.5 / np.linalg.eigvalsh(a.T @ a / 400).max()
    with Engine(ex.DataParallelSGD(6, 400, lr, rounds=500, staleness=2),
                sc.parallelize(ex.as_records(a, a @ w), U)).fit() as res:
        report("DataParallelSGD", "data-parallel, SSP s=2", res.read_table("w")[:, 0], w, res.summary)

    t0 = time.perf_counter()
    with Engine(ex.EmptyProgram(2000, rounds_per_step=500), sc.parallelize(range(U), U)).fit() as res:
        rows = res.summary.rows
        rate = sum(r["rounds"] for r in rows) / sum(r["step_s"] for r in rows)
    print(f"{'EmptyProgram':<18} {'runtime cost':<24} {rate:.0f} rounds/s at U={U} "
          f"({time.perf_counter() - t0:.2f} s)")
    results.append({"program": "EmptyProgram", "rounds_per_s": rate, "workers": U})
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(results, fh, indent=2)
    print(f"wrote {args.out}")
    bad = [r for r in results if r.get("max_abs_error", 0) > 1e-5]
    spark.stop()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
