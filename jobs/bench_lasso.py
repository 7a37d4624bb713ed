"""Benchmark: StradsLasso vs MLlib LinearRegression (OWL-QN) vs scikit-learn / celer / skglm Lasso, one rule.

    python3 jobs/bench_lasso.py --quick --repeats 3                # STRADS generator 20K x 200K (docs/benchmarks.md)
    python3 jobs/bench_lasso.py --problems strads:2000x20000 --quick --repeats 1 --tight   # small check
    python3 jobs/bench_lasso.py --problems strads:20000x200000,uniform:50000x1000000x5000000

Problems (objective ``F(b) = 1/(2n) ||y - X b||^2 + lambda ||b||_1``, no
intercept, no standardisation -- scikit-learn's / celer's / skglm's
``Lasso(alpha=lambda, fit_intercept=False)`` and MLlib's
``LinearRegression(regParam=lambda, elasticNetParam=1, fitIntercept=False,
standardization=False)`` all minimise exactly this), ``lambda = reg_ratio *
lambda_max``:

* ``strads:NxJ`` -- the STRADS paper's generator (25 non-zeros per column,
  10 % of columns correlated with the previous one);
* ``uniform:NxJxNNZ`` -- non-zeros scattered uniformly (optional, not in the
  default run: it adds roughly 10-15 minutes);
* ``reuters-earn`` -- a real sparse problem with the log-loss: "earn" against
  the rest on Reuters-21578's training split (``LEWISSPLIT="TRAIN"``, from
  ``../shared/data``; research use only, never shipped), TF-IDF features
  (scikit-learn's ``TfidfVectorizer``, its defaults), objective ``F(b) = 1/n
  sum log(1 + exp(-s_i x_i b)) + lambda ||b||_1`` (``s = +-1``, no intercept):
  pystrads' ``StradsLogisticRegression`` against skglm's
  ``SparseLogisticRegression``, celer's ``LogisticRegression`` and
  scikit-learn's liblinear (``C = 1 / (n lambda)``); MLlib is not run on it.

Every system's objective is computed by :func:`objective` from its
coefficients.  ``F*`` is the best objective any run reached (pystrads'
default fit, which runs to a duality gap of ~1e-15, is run first; with
``--tight`` every ladder also continues to a 1e-9 gap).

Timing rule (the same for every system; ``RULE`` below, printed under the
table and stored in the JSON).  *Time to a gap g* is the wall time from the
call of ``fit()`` until the first iterate whose relative objective gap
``(F - F*) / F*`` is ``<= g``.  For the Spark systems that time includes
everything ``fit()`` does: reading the (cached) DataFrame, pystrads' input
scan, shard start and load; the in-memory peers start from a scipy CSC
matrix already in memory (what a user whose data fits the driver has).

* pystrads records a history row (objective, ``elapsed_s`` since the start
  of ``fit()``) after every step: its time to g is ``elapsed_s`` of the
  first row with gap <= g (reading the coefficients back after the fit, a
  fraction of a second, printed separately, is not in it).
* Systems without a timed history run a *ladder*: complete, separate fits
  with a growing iteration budget, each timed whole; time to g is the wall
  time of the first rung whose final coefficients reach gap <= g.
  scikit-learn, celer and skglm: their own stopping tolerance in
  half-decade steps (``tol`` = 1e-1, 3.2e-2, 1e-2, ...; ``max_iter`` large
  so tol binds).  MLlib: ``maxIter`` with ``tol=0`` (maxIter binds).
  MLlib's iterates do not depend on ``maxIter`` (the fit with ``maxIter=k``
  ends at the k-th iterate of any longer fit; checked on every run), so its
  rungs are every ``maxIter`` 1, 2, 3, ...: exploratory fits of growing
  ``maxIter`` find the first ``k`` whose iterate reaches g from MLlib's own
  ``objectiveHistory`` (scaled to ``objective`` by a constant), then the fit
  with ``maxIter=k`` is run and timed whole and its objective recomputed.
* Warm-up: every system gets untimed warm-up fits first (pystrads: a
  2-iteration default fit and a 1-iteration rounds-only fit on the same
  DataFrame; MLlib: ``maxIter=5`` on the same DataFrame; the in-memory peers:
  a fit to tol 1e-8 of a small problem of the same kind, which compiles
  skglm's numba code).
* Repeats: ``--repeats`` applies to every system: each pystrads variant is
  fitted that many times (median of its times to g); for ladders the rungs
  that decide a time to g are re-run and re-timed that many times (median).
  A run that reaches neither gap is not repeated.

Fixed cost: every problem also times pystrads' default fit with ``maxIter=0``
(the input scan, the shards, the workers' launch and load, the init step and
reading the model: what a fit costs before its first step), median of
``--repeats``.

Columns: time to 1e-3 and to 1e-6 ("not reached" when the run never got
there), their ratios to MLlib's and to skglm's (1e-6), the final gap (last iterate for pystrads,
tightest rung run for a ladder), the wall time of that run, coordinate
updates to 1e-3 (pystrads) and non-zeros.  pystrads variants all use the
same parallel width (``--width`` coefficients per round, ``auto`` by
default: chosen from the data), and the dynamic rounds-only fit runs once
more at each width of ``--widths`` and once with its schedules not
pipelined (``scheduler.planAhead`` off: the workers wait for each step's
schedule); "rounds only"
(``workingSetLimit=0``) switches the driver's working-set solver off so
every update is a parallel round over the data (the STRADS algorithm
proper); its dynamic-schedule variant runs to a duality gap of
``--rounds-tol`` (at most ``--rounds-max-iter`` steps) so its time to 1e-6 is
measured.  Writes ``<out>/bench_lasso.json`` and ``<out>/bench_lasso.png``
(gap against time: pystrads histories as lines, ladder rungs as points).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pystrads.datasets import synthetic  # noqa: E402
from pystrads.session import spark_session  # noqa: E402

GAPS = (1e-3, 1e-6)


def lab(g: float) -> str:
    """1e-3 -> "1e-3" (JSON keys)."""
    return f"{g:.0e}".replace("e-0", "e-")


MLLIB = "MLlib LinearRegression (OWL-QN)"
DEFAULT = "pystrads StradsLasso (defaults)"
LOGISTIC_DEFAULT = "pystrads StradsLogisticRegression (defaults, tol 1e-9)"
ROUNDS = "pystrads dynamic, rounds only"
RULE = ("Time to gap g = wall time from the call of fit() (the Spark systems' read of the cached DataFrame, "
        "pystrads' input scan, shard start and load included; the in-memory peers start from a CSC matrix in "
        "memory) to the first iterate with (F - F*)/F* <= g, F from the bench's own objective(), F* the best "
        "objective any run reached. pystrads: elapsed_s of the first history row (one per step) with gap <= g. "
        "MLlib, scikit-learn, celer, skglm: a ladder of complete fits with growing budget (MLlib maxIter with "
        "tol=0, its first reaching iterate found from its objectiveHistory; the others tol in half-decades), "
        "each timed whole; time to g = wall time of the first rung reaching g. Every system has an untimed "
        "warm-up fit first; medians of --repeats fits (ladders: of the deciding rungs).")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--problems", default="strads:20000x200000",
                   help="comma-separated; add uniform:50000x1000000x5000000 for the uniform design "
                        "(docs/benchmarks.md)")
    p.add_argument("--reg-ratio", type=float, default=0.05)
    p.add_argument("--width", default="auto",
                   help="coefficients per round (L) of every variant that does not set its own ('auto': the default)")
    p.add_argument("--widths", default="256",
                   help="comma-separated L: a rounds-only variant at each (beside the default 'auto'), to see "
                        "which width the data favours ('': none)")
    p.add_argument("--rounds-max-iter", type=int, default=60,
                   help="maxIter of the dynamic rounds-only variant (it should reach a 1e-6 gap before)")
    p.add_argument("--rounds-tol", type=float, default=1e-7,
                   help="tol of the dynamic rounds-only variant (below 1e-6 so it runs past a 1e-6 gap)")
    p.add_argument("--schedule-max-iter", type=int, default=12,
                   help="maxIter of the shotgun / round-robin / STRADS-priority rounds-only variants")
    p.add_argument("--repeats", type=int, default=1, help="fits per pystrads variant and per deciding ladder rung "
                                                          "(median)")
    p.add_argument("--quick", action="store_true", help="skip the STRADS-priority and round-robin variants")
    p.add_argument("--tight", action="store_true",
                   help="continue every ladder to a 1e-9 gap (checks that every system reaches the same F*)")
    p.add_argument("--mllib-first-rung", type=int, default=50, help="maxIter of MLlib's first exploratory fit")
    p.add_argument("--mllib-max-iter", type=int, default=5000, help="largest maxIter MLlib's ladder tries")
    p.add_argument("--mllib-budget-s", type=float, default=900.0,
                   help="cap on MLlib's total seconds (exploration, timed rungs, repeats); past it, coarser rungs "
                        "or fewer repeats are used and said so")
    p.add_argument("--skip-sklearn", action="store_true")
    p.add_argument("--skip-celer", action="store_true")
    p.add_argument("--skip-skglm", action="store_true")
    p.add_argument("--skip-mllib", action="store_true")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default="out/bench_lasso")
    return p.parse_args(argv)


SHARED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data")


def reuters_earn_problem(directory: str):
    """Reuters-21578's training split as TF-IDF rows (CSR), label 1 for "earn", else 0."""
    import gzip
    import re

    from sklearn.feature_extraction.text import TfidfVectorizer

    from pystrads.datasets import read_reuters21578

    names = sorted(n for n in os.listdir(directory) if re.match(r"reut2-\d+\.sgm(\.gz)?$", n))
    earn = set()
    for name in names:  # the topics of each document (read_reuters21578 gives the text)
        opener = gzip.open if name.endswith(".gz") else open
        with opener(os.path.join(directory, name), "rt", encoding="latin-1") as fh:
            for attrs, body in re.findall(r"<REUTERS([^>]*)>(.*?)</REUTERS>", fh.read(), re.S):
                topics = re.search(r"<TOPICS>(.*?)</TOPICS>", body, re.S)
                if topics and "earn" in re.findall(r"<D>(.*?)</D>", topics.group(1)):
                    earn.add(int(re.search(r'NEWID="(\d+)"', attrs).group(1)))
    docs = [(newid, text) for newid, split, text in read_reuters21578(directory) if split == "TRAIN"]
    x = TfidfVectorizer().fit_transform([t for _, t in docs]).tocsr()
    x.sort_indices()
    y = np.array([1.0 if newid in earn else 0.0 for newid, _ in docs])
    return synthetic.SparseProblem(x.indptr.astype(np.int64), x.indices.astype(np.int64), x.data.astype(np.float64),
                                   y, np.zeros(x.shape[1]))


def is_logistic(spec: str) -> bool:
    return spec.startswith("reuters")


def make_problem(spec: str, seed: int):
    if spec == "reuters-earn":
        return reuters_earn_problem(os.path.join(SHARED, "reuters21578"))
    kind, _, shape = spec.partition(":")
    dims = [int(v) for v in shape.lower().split("x")]
    if kind == "strads":  # strads:NxJ, or strads:NxJxK with K non-zeros a column (25 by default)
        return synthetic.strads_lasso_problem(dims[0], dims[1], *dims[2:3], seed=seed)
    return synthetic.uniform_sparse_problem(dims[0], dims[1], dims[2], seed=seed)


def objective(prob, beta, lam, logistic: bool = False) -> float:
    n = prob.shape[0]
    margin = np.add.reduceat(prob.vals * beta[prob.col_idx], prob.row_ptr[:-1]) if prob.nnz else np.zeros(n)
    margin[np.diff(prob.row_ptr) == 0] = 0.0  # (reduceat gives an empty row its next row's value)
    if logistic:  # mean log-loss, labels 0 / 1
        signed = np.where(prob.y > 0, margin, -margin)
        return float(np.logaddexp(0.0, -signed).mean()) + lam * float(np.abs(beta).sum())
    r = prob.y - margin
    return 0.5 * float(r @ r) / n + lam * float(np.abs(beta).sum())


def logistic_lambda_max(prob) -> float:
    """Smallest L1 weight with an all-zero solution of the mean log-loss (no intercept)."""
    n, J = prob.shape
    s = np.where(prob.y > 0, 1.0, -1.0)
    g = np.bincount(prob.col_idx, weights=prob.vals * np.repeat(s, np.diff(prob.row_ptr)), minlength=J)
    return float(np.abs(g).max() / (2 * n))


class Best:
    """The best objective seen so far (F* once every run is done)."""

    def __init__(self):
        self.value, self.by = math.inf, None

    def update(self, f: float, by: str) -> None:
        if f < self.value:
            self.value, self.by = f, by

    def gap(self, f: float) -> float:
        return (f - self.value) / self.value


def median(values):
    return float(np.median(values)) if values else None


# ---------------------------------------------------------------------------------------------- pystrads
def run_pystrads(df, lam, width, seed, logistic=False, **params):
    from pystrads import config
    from pystrads.ml import StradsLasso, StradsLogisticRegression

    params = dict(params)
    width = params.pop("coordinatesPerRound", width)  # a variant may set its own L (and L' = 2L)
    widths = {} if width == "auto" else {"coordinatesPerRound": width, "candidatesPerRound": 2 * width}
    ahead = params.pop("planAhead", True)
    if logistic:
        est = StradsLogisticRegression(regParam=lam, elasticNetParam=1.0, fitIntercept=False, standardization=False,
                                       seed=seed, **widths, **params)
    else:
        est = StradsLasso(regParam=lam, fitIntercept=False, standardization=False, seed=seed, **widths, **params)
    before = config.DEFAULTS["scheduler.planAhead"]
    config.DEFAULTS["scheduler.planAhead"] = ahead  # this process runs the scheduler (a classic session)
    try:
        t0 = time.perf_counter()
        model = est.fit(df)
        seconds = time.perf_counter() - t0
    finally:
        config.DEFAULTS["scheduler.planAhead"] = before
    steps = model.summary.steps
    hist = model.summary.iterations
    return {"seconds": seconds, "beta": model.coefficients.toArray(),
            "history": {"elapsed_s": hist["elapsed_s"].tolist(), "objective": hist["objective"].tolist(),
                        "updates": hist["updates"].tolist(), "round_updates": hist["round_updates"].tolist()},
            "iterations": model.summary.totalIterations, "stop": model.summary.stopReason,
            "timings_s": model.summary.timings,
            "width": (int(steps["coordinates_per_round"].dropna().iloc[0]) if "coordinates_per_round" in steps
                      else width)}


def history_reach(h, best: Best, gap):
    """(seconds, updates, round updates) at the first history row with gap <= ``gap``, or Nones."""
    for t, f, u, ru in zip(h["elapsed_s"], h["objective"], h["updates"], h["round_updates"]):
        if best.gap(f) <= gap:
            return t, int(u), int(ru)
    return None, None, None


def fixed_cost(df, lam, args, logistic):
    """The default fit with ``maxIter=0``: seconds, median of ``--repeats``."""
    times = [run_pystrads(df, lam, args.width, args.seed, logistic, maxIter=0)["seconds"]
             for _ in range(args.repeats)]
    print(f"  pystrads fit of zero iterations (fixed cost): {', '.join(f'{t:.2f}' for t in times)} s", flush=True)
    return {"fixed_s": median(times), "all_fixed_s": times}


def pystrads_variant(name, df, prob, lam, args, best, params, logistic=False):
    runs = []
    for rep in range(args.repeats):
        run = run_pystrads(df, lam, args.width, args.seed, logistic, **params)
        run["objective"] = objective(prob, run["beta"], lam, logistic)
        best.update(run["objective"], name)
        runs.append(run)
        reached = [g for g in GAPS if history_reach(run["history"], best, g)[0] is not None]
        print(f"  {name}: fit {run['seconds']:.1f} s, {run['iterations']} it. ({run['stop']}), "
              f"gap {best.gap(run['objective']):.2e}", flush=True)
        if not reached:
            break  # nothing to time: not repeated
    return {"kind": "history", "runs": runs}


# ---------------------------------------------------------------------------------------------- in-memory peers
def csc_of(prob):
    from scipy import sparse

    return sparse.csr_matrix((prob.vals, prob.col_idx, prob.row_ptr), shape=prob.shape).tocsc()


def logistic_solvers(args, n):
    """name -> factory(lambda, tol) of the L1-logistic peers (labels +-1, no intercept)."""
    solvers = {}
    if not args.skip_sklearn:
        from sklearn.linear_model import LogisticRegression as SkLogistic

        solvers["scikit-learn LogisticRegression (liblinear, 1 core, in memory)"] = lambda a, tol: SkLogistic(
            penalty="l1", solver="liblinear", C=1.0 / (n * a), fit_intercept=False, tol=tol, max_iter=100_000)
    if not args.skip_celer:
        from celer import LogisticRegression as CelerLogistic

        solvers["celer LogisticRegression (1 core, in memory)"] = lambda a, tol: CelerLogistic(
            C=1.0 / (n * a), fit_intercept=False, tol=tol, max_iter=10_000, max_epochs=10_000_000)
    if not args.skip_skglm:
        from skglm import SparseLogisticRegression

        solvers["skglm SparseLogisticRegression (1 core, in memory)"] = lambda a, tol: SparseLogisticRegression(
            alpha=a, fit_intercept=False, tol=tol, max_iter=10_000, max_epochs=10_000_000)
    return solvers


def inmemory_solvers(args):
    """name -> factory(alpha, tol) for the installed in-memory peers; prints why one is skipped."""
    solvers = {}
    if not args.skip_sklearn:
        try:
            from sklearn.linear_model import Lasso as SkLasso

            solvers["scikit-learn Lasso (CD, 1 core, in memory)"] = lambda a, tol: SkLasso(
                alpha=a, fit_intercept=False, tol=tol, max_iter=10_000_000, selection="cyclic")
        except ImportError as exc:
            print(f"scikit-learn skipped: {exc} (pip install scikit-learn)")
    if not args.skip_celer:
        try:
            from celer import Lasso as CelerLasso

            solvers["celer Lasso (1 core, in memory)"] = lambda a, tol: CelerLasso(
                alpha=a, fit_intercept=False, tol=tol, max_iter=10_000, max_epochs=10_000_000)
        except ImportError as exc:
            print(f"celer skipped: {exc} (pip install celer)")
    if not args.skip_skglm:
        try:
            from skglm import Lasso as SkglmLasso

            solvers["skglm Lasso (1 core, in memory)"] = lambda a, tol: SkglmLasso(
                alpha=a, fit_intercept=False, tol=tol, max_iter=10_000, max_epochs=10_000_000)
        except ImportError as exc:
            print(f"skglm skipped: {exc} (pip install skglm)")
    return solvers


def fit_inmemory(factory, lam, tol, x, y):
    est = factory(lam, tol)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning on the loose rungs
        t0 = time.perf_counter()
        est.fit(x, y)
        seconds = time.perf_counter() - t0
    return seconds, np.asarray(est.coef_, dtype=np.float64).ravel()


def warm_up_inmemory(solvers, kind, seed):
    small = make_problem("strads:500x5000" if kind in ("strads", "reuters-earn") else "uniform:1000x10000x20000",
                         seed + 1)
    x, lam = csc_of(small), 0.05 * synthetic.lambda_max(small)
    y = small.y
    if kind == "reuters-earn":  # the same small problem with +-1 labels for the logistic solvers
        y = np.where(small.y > np.median(small.y), 1.0, -1.0)
        lam = 0.05 * float(np.abs(x.T @ y).max() / (2 * len(y)))
    for name, factory in solvers.items():
        t0 = time.perf_counter()
        fit_inmemory(factory, lam, 1e-8, x, y)
        print(f"  ({name} warm-up: {time.perf_counter() - t0:.1f} s)", flush=True)


TOL_LADDER = [10.0 ** (-k / 2) for k in range(2, 25)]  # 1e-1, 3.2e-2, ..., 1e-12


def inmemory_ladder(name, factory, x, prob, lam, args, best, stop_gap, logistic=False):
    rungs = []
    y = np.where(prob.y > 0, 1.0, -1.0) if logistic else prob.y
    for tol in TOL_LADDER:
        seconds, beta = fit_inmemory(factory, lam, tol, x, y)
        f = objective(prob, beta, lam, logistic)
        best.update(f, name)
        rungs.append({"param": tol, "seconds": [seconds], "objective": f,
                      "nonzeros": int(np.count_nonzero(beta))})
        if best.gap(f) <= stop_gap:
            break
    retime(rungs, args.repeats, best, lambda r: fit_inmemory(factory, lam, r["param"], x, y)[0])
    desc = ", ".join(f"tol {r['param']:.1e}: {r['seconds'][0]:.2f} s gap {best.gap(r['objective']):.1e}"
                     for r in rungs)
    print(f"  {name}: {desc}", flush=True)
    return {"kind": "ladder", "param": "tol", "rungs": rungs}


def deciding_rungs(rungs, best):
    """The first rung reaching each gap (those are re-timed for the median)."""
    out = []
    for g in GAPS:
        r = next((r for r in rungs if best.gap(r["objective"]) <= g), None)
        if r is not None and all(r is not o for o in out):
            out.append(r)
    return out


def retime(rungs, repeats, best, fit, budget=None):
    for r in deciding_rungs(rungs, best):
        while len(r["seconds"]) < repeats:
            if budget is not None and not budget(median(r["seconds"])):
                r["note"] = "fewer repeats (--mllib-budget-s)"
                break
            r["seconds"].append(fit(r))


# ---------------------------------------------------------------------------------------------- MLlib
def fit_mllib(df, lam, max_iter):
    from pyspark.ml.regression import LinearRegression

    est = LinearRegression(regParam=lam, elasticNetParam=1.0, fitIntercept=False, standardization=False,
                           maxIter=max_iter, tol=0.0, solver="l-bfgs")
    t0 = time.perf_counter()
    model = est.fit(df)
    seconds = time.perf_counter() - t0
    return seconds, model.coefficients.toArray(), np.asarray(model.summary.objectiveHistory), \
        int(model.summary.totalIterations)


def mllib_ladder(df, prob, lam, args, best, stop_gap):
    """maxIter ladder; see the module docstring.  Returns the ladder record."""
    spent = [0.0]

    def fit(k):
        seconds, beta, hist, iters = fit_mllib(df, lam, k)
        spent[0] += seconds
        f = objective(prob, beta, lam)
        best.update(f, MLLIB)
        return {"param": k, "seconds": [seconds], "objective": f, "nonzeros": int(np.count_nonzero(beta)),
                "iterations": iters, "hist": hist}

    def affordable(seconds):
        return spent[0] + seconds <= args.mllib_budget_s

    fit_mllib(df, lam, 5)  # warm-up, untimed
    rungs, path, mismatch, notes = {}, None, 0.0, []
    k = args.mllib_first_rung
    while True:
        r = fit(k)
        rungs[k] = r
        scale = r["objective"] / r["hist"][-1]  # MLlib's objectiveHistory is F over a constant (label scaling)
        cal = scale * r["hist"]
        for k2, r2 in rungs.items():  # the path does not depend on maxIter: earlier rungs lie on it
            if k2 < len(cal):
                mismatch = max(mismatch, abs(cal[k2] - r2["objective"]) / r2["objective"])
        path = cal if path is None or len(cal) > len(path) else path
        stopped_itself = r["iterations"] < k
        print(f"    MLlib maxIter {k}: {r['seconds'][0]:.1f} s, {r['iterations']} it., "
              f"gap {best.gap(r['objective']):.2e}", flush=True)
        if best.gap(r["objective"]) <= stop_gap:
            break
        if stopped_itself:
            notes.append(f"MLlib stopped by itself after {r['iterations']} iterations")
            break
        if k >= args.mllib_max_iter:
            notes.append(f"--mllib-max-iter {args.mllib_max_iter} reached")
            break
        k_next = next_rung(k, path, best, stop_gap, args.mllib_max_iter)
        if not affordable(r["seconds"][0] * k_next / k):
            notes.append(f"--mllib-budget-s {args.mllib_budget_s:.0f} reached before maxIter {k_next}")
            break
        k = k_next
    exact = mismatch <= 1e-9
    if not exact:
        notes.append(f"MLlib's path depended on maxIter (mismatch {mismatch:.1e}): coarse rungs only")
    per_iter = max(r["seconds"][0] / max(r["iterations"], 1) for r in rungs.values())
    for g in GAPS:  # the first iterate reaching g gets its own timed rung
        if not exact:
            break
        gaps = (path - best.value) / best.value
        hits = np.nonzero(gaps <= g)[0]
        if not len(hits):
            continue
        k = int(hits[0])
        for _ in range(3):  # the scaled history is exact to ~1e-15; step on if a rung lands just above g
            if k in rungs or k == 0:
                break
            if not affordable(per_iter * k + 2.0):
                notes.append(f"--mllib-budget-s: no timed rung at maxIter {k} (gap {g:g}); coarse rung used")
                break
            rungs[k] = fit(k)
            print(f"    MLlib maxIter {k} (first iterate at {g:g}): {rungs[k]['seconds'][0]:.1f} s, "
                  f"gap {best.gap(rungs[k]['objective']):.2e}", flush=True)
            if best.gap(rungs[k]["objective"]) <= g:
                break
            k += 1
    ordered = [rungs[k] for k in sorted(rungs)]
    retime(ordered, args.repeats, best, lambda r: fit(r["param"])["seconds"][0],
           budget=lambda s: affordable(s))
    for r in ordered:
        r.pop("hist", None)
    for n in notes:
        print(f"    ({n})")
    return {"kind": "ladder", "param": "maxIter", "rungs": ordered, "path_mismatch": mismatch,
            "path_objective": path.tolist(), "total_s": spent[0], "notes": notes}


def next_rung(k, path, best, goal, cap):
    """Next exploratory maxIter: the log-linear extrapolation of the last half of the path to ``goal``, +15 %,
    between 1.15 k and 4 k (only where the next fits go; what is timed does not depend on it)."""
    gaps = np.maximum((path - best.value) / best.value, 1e-300)
    last, mid = len(path) - 1, (len(path) - 1) // 2
    slope = (math.log(gaps[last]) - math.log(gaps[mid])) / max(last - mid, 1)
    pred = last + (math.log(goal) - math.log(gaps[last])) / slope if slope < 0 else math.inf
    return int(min(cap, 4 * k, max(1.15 * k, 1.15 * pred)))


# ---------------------------------------------------------------------------------------------- report
def summarise(name, rec, best):
    """Row of the table (and JSON) for one system, against the final F*."""
    row = {"rule": rec["kind"]}
    if rec["kind"] == "history":
        runs = rec["runs"]
        reach = [{g: history_reach(r["history"], best, g) for g in GAPS} for r in runs]
        for g in GAPS:
            times = [x[g][0] for x in reach]
            row[f"s_to_{lab(g)}"] = median(times) if all(t is not None for t in times) else None
            row[f"all_s_to_{lab(g)}"] = times
            row[f"updates_to_{lab(g)}"] = reach[0][g][1]
            row[f"round_updates_to_{lab(g)}"] = reach[0][g][2]
        order = sorted(range(len(runs)), key=lambda i: runs[i]["seconds"])
        mid = runs[order[len(order) // 2]]
        row.update(fit_s=median([r["seconds"] for r in runs]), all_fit_s=[r["seconds"] for r in runs],
                   objective=mid["objective"], final_gap=best.gap(mid["objective"]),
                   nonzeros=int(np.count_nonzero(mid["beta"])), iterations=mid["iterations"], stop=mid["stop"],
                   history=mid["history"], timings_s=mid["timings_s"],
                   read_model_s=median([r["timings_s"].get("read_model_s", 0.0) for r in runs]),
                   schedule_s=median([r["timings_s"].get("schedule_s", 0.0) for r in runs]),
                   schedule_wait_s=median([r["timings_s"].get("schedule_wait_s", 0.0) for r in runs]),
                   width=mid.get("width"))
    else:
        rungs = rec["rungs"]
        for g in GAPS:
            r = next((r for r in rungs if best.gap(r["objective"]) <= g), None)
            row[f"s_to_{lab(g)}"] = median(r["seconds"]) if r else None
            row[f"all_s_to_{lab(g)}"] = r["seconds"] if r else None
            row[f"rung_to_{lab(g)}"] = r["param"] if r else None
        last = max(rungs, key=lambda r: (r["param"] if rec["param"] == "maxIter" else -r["param"]))
        row.update(fit_s=median(last["seconds"]), objective=last["objective"], final_gap=best.gap(last["objective"]),
                   nonzeros=last["nonzeros"], ladder_param=rec["param"],
                   rungs=[dict(r, s=median(r["seconds"]), gap=best.gap(r["objective"])) for r in rungs],
                   ladder_total_s=sum(sum(r["seconds"]) for r in rungs),
                   **{k: rec[k] for k in ("path_mismatch", "notes") if k in rec})
    return row


def fmt(v, spec="{:.1f}", missing="not reached"):
    return missing if v is None else spec.format(v)


def fmt_s(v):
    return fmt(v, "{:.2f}" if v is None or v >= 1 else "{:.3f}")


def print_table(rows, best, fixed):
    mllib = rows.get(MLLIB)
    skglm = next((row for name, row in rows.items() if name.startswith("skglm")), None)
    for row in rows.values():
        ours, ref = row["s_to_1e-6"], skglm["s_to_1e-6"] if skglm else None
        row["ratio_to_skglm_1e-6"] = ours / ref if ours is not None and ref else None
    header = (f"{'system':<50} {'s to 1e-3':>11} {'s to 1e-6':>11} {'x MLlib 1e-3':>12} {'x MLlib 1e-6':>12} "
              f"{'final gap':>9} {'fit s':>7} {'upd to 1e-3':>11} {'non-zeros':>9}")
    print(f"\nF* = {best.value:.12g} (reached by {best.by})\n" + header + "\n" + "-" * len(header))
    for name, row in rows.items():
        ratios = []
        for g in GAPS:
            ours, ref = row[f"s_to_{lab(g)}"], mllib[f"s_to_{lab(g)}"] if mllib else None
            row[f"ratio_to_mllib_{lab(g)}"] = ours / ref if ours is not None and ref else None
            ratio = row[f"ratio_to_mllib_{lab(g)}"]
            ratios.append(fmt(ratio, "{:.2f}" if ratio is None or ratio >= 0.1 else "{:.4f}", "—"))
        upd = row.get("updates_to_1e-3")
        print(f"{name:<50} {fmt_s(row['s_to_1e-3']):>11} {fmt_s(row['s_to_1e-6']):>11} "
              f"{ratios[0]:>12} {ratios[1]:>12} {max(row['final_gap'], 0.0):>9.1e} {row['fit_s']:>7.1f} "
              f"{fmt(upd, '{:,}', '—'):>11} {row['nonzeros']:>9}")
    print("\nRule: " + RULE)
    for name, row in rows.items():
        if row["rule"] == "ladder":
            rungs = ", ".join(f"{row['ladder_param']} {r['param']:{'d' if row['ladder_param'] == 'maxIter' else '.2g'}}: {fmt_s(r['s'])} s ({len(r['seconds'])}x) "
                              f"gap {max(r['gap'], 0):.1e}" for r in row["rungs"])
            print(f"  {name} rungs: {rungs}; ladder total {row['ladder_total_s']:.1f} s")
    for name, row in rows.items():
        if row.get("schedule_s") is not None:
            print(f"  {name}: L = {row['width']}, schedule {row['schedule_s']:.2f} s, of which the workers waited "
                  f"{row['schedule_wait_s']:.2f} s")
    print(f"  pystrads' fixed cost (the default fit with maxIter=0): {fixed['fixed_s']:.2f} s")
    for name, row in rows.items():
        if row["ratio_to_skglm_1e-6"] is not None:
            print(f"  {name}: {row['ratio_to_skglm_1e-6']:.2f}x skglm's time to 1e-6")
    reads = [row["read_model_s"] for row in rows.values() if row.get("read_model_s") is not None]
    if reads:
        print(f"  pystrads: reading the coefficients back after a fit (not in its times to g): "
              f"{min(reads):.2f}-{max(reads):.2f} s")


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    spark = spark_session(None, "pystrads-bench-lasso", {"spark.ui.enabled": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    solvers = inmemory_solvers(args)
    report = {"args": vars(args), "rule": RULE, "problems": {}}
    os.makedirs(args.out, exist_ok=True)
    stop_gap = 1e-9 if args.tight else min(GAPS)
    for spec in args.problems.split(","):
        t_problem = time.perf_counter()
        prob = make_problem(spec, args.seed)
        logistic = is_logistic(spec)
        lam = args.reg_ratio * (logistic_lambda_max(prob) if logistic else synthetic.lambda_max(prob))
        n, J = prob.shape
        print(f"\n== {spec}: {n} x {J}, {prob.nnz} non-zeros, lambda = {args.reg_ratio} lambda_max = {lam:.4g}"
              + (f", {int(prob.y.sum())} positives" if logistic else ""), flush=True)
        df = prob.to_dataframe(spark, num_partitions=2).cache()
        df.count()
        best = Best()
        records = {}
        # pystrads first: its default fit is exact (~1e-15), so the ladders below stop against a true F*
        args.width = args.width if args.width == "auto" else int(args.width)
        run_pystrads(df, lam, args.width, args.seed, logistic, maxIter=2)  # warm-up, untimed
        if not logistic:
            run_pystrads(df, lam, args.width, args.seed, workingSetLimit=0, maxIter=1)
        fixed = fixed_cost(df, lam, args, logistic)
        if logistic:  # one pystrads fit: the log-loss has no working-set solver (its rounds are the default)
            for name, params in ((LOGISTIC_DEFAULT, {"maxIter": 1000, "tol": 1e-9}),):  # (its F* reference)
                records[name] = pystrads_variant(name, df, prob, lam, args, best, params, logistic=True)
            x = csc_of(prob)
            solvers = logistic_solvers(args, n)
            warm_up_inmemory(solvers, spec, args.seed)
            for name, factory in solvers.items():
                records[name] = inmemory_ladder(name, factory, x, prob, lam, args, best, stop_gap, logistic=True)
            del x
            rows = {name: summarise(name, rec, best) for name, rec in records.items()}
            print_table(rows, best, fixed)
            wall = time.perf_counter() - t_problem
            report["problems"][spec] = {"shape": [n, J], "nnz": prob.nnz, "lambda": lam, "loss": "logistic",
                                        "positives": int(prob.y.sum()), "best_objective": best.value,
                                        "best_by": best.by, "runs": rows, "ratios": {}, "wall_s": wall, **fixed}
            df.unpersist()
            continue
        rounds = {"workingSetLimit": 0, "maxIter": args.rounds_max_iter, "tol": args.rounds_tol}
        variants = [(DEFAULT, {}),
                    (ROUNDS, rounds),
                    (f"{ROUNDS}, schedules not pipelined", dict(rounds, planAhead=False)),
                    ("pystrads shotgun, rounds only", {"schedule": "shotgun", "workingSetLimit": 0,
                                                       "maxIter": args.schedule_max_iter})]
        for k, w in enumerate(int(v) for v in args.widths.split(",") if v.strip()):
            variants.insert(3 + k, (f"{ROUNDS} (L = {w})", dict(rounds, coordinatesPerRound=w)))
        if not args.quick:
            variants += [
                ("pystrads STRADS priority (delta^2+eta), rounds only",
                 {"priority": "delta", "workingSetLimit": 0, "maxIter": args.schedule_max_iter}),
                ("pystrads round-robin, rounds only", {"schedule": "roundrobin", "workingSetLimit": 0,
                                                      "maxIter": args.schedule_max_iter}),
            ]
        for name, params in variants:
            records[name] = pystrads_variant(name, df, prob, lam, args, best, params)
        if solvers:
            x = csc_of(prob)
            warm_up_inmemory(solvers, spec.partition(":")[0], args.seed)
            for name, factory in solvers.items():
                records[name] = inmemory_ladder(name, factory, x, prob, lam, args, best, stop_gap)
            del x
        if not args.skip_mllib:
            records[MLLIB] = mllib_ladder(df, prob, lam, args, best, stop_gap)
        rows = {name: summarise(name, rec, best) for name, rec in records.items()}
        print_table(rows, best, fixed)
        ratios = {}
        dyn, shot = rows.get(ROUNDS), rows.get("pystrads shotgun, rounds only")
        if dyn and shot and dyn["round_updates_to_1e-3"] and shot["round_updates_to_1e-3"]:
            ratios["updates to 1e-3: shotgun / dynamic (rounds only)"] = (shot["round_updates_to_1e-3"]
                                                                        / dyn["round_updates_to_1e-3"])
        elif dyn and shot and dyn["round_updates_to_1e-3"]:
            ratios["updates to 1e-3: shotgun / dynamic (rounds only)"] = (
                f"> {shot['history']['round_updates'][-1] / dyn['round_updates_to_1e-3']:.1f} "
                f"(shotgun did not reach it)")
        for k, v in ratios.items():
            print(f"  {k}: {v:.3g}" if isinstance(v, float) else f"  {k}: {v}")
        wall = time.perf_counter() - t_problem
        print(f"  (this problem: {wall / 60:.1f} min wall)")
        report["problems"][spec] = {"shape": [n, J], "nnz": prob.nnz, "lambda": lam, "loss": "squared",
                                    "best_objective": best.value, "best_by": best.by, "runs": rows, "ratios": ratios,
                                    "wall_s": wall, **fixed}
        df.unpersist()
    with open(os.path.join(args.out, "bench_lasso.json"), "w") as fh:
        json.dump(report, fh, indent=2, default=lambda v: None if v is None else float(v))
    plot(report, args.out)
    print(f"\nwrote {args.out}/bench_lasso.json and bench_lasso.png")
    spark.stop()
    return 0


def plot(report, out):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    specs = list(report["problems"])
    fig, axes = plt.subplots(1, len(specs), figsize=(7 * len(specs), 5), squeeze=False)
    for ax, spec in zip(axes[0], specs):
        pr = report["problems"][spec]
        best = pr["best_objective"]
        for name, row in pr["runs"].items():
            if row["rule"] == "history":
                h = row["history"]
                gaps = np.maximum((np.asarray(h["objective"]) - best) / best, 1e-16)
                ax.semilogy(h["elapsed_s"], gaps, marker=".", label=name)
            else:
                pts = sorted((r["s"], max(r["gap"], 1e-16)) for r in row["rungs"])
                ax.semilogy([p[0] for p in pts], [p[1] for p in pts], marker="s", linestyle=":",
                            label=f"{name} (one point per rung)")
        for g in (1e-3, 1e-6):
            ax.axhline(g, color="grey", linewidth=0.6, linestyle="--")
        ax.set_title(f"{spec}  (F* = {best:.10g})")
        ax.set_xlabel("seconds since fit() was called")
        ax.set_ylabel("(F - F*) / F*")
        ax.set_xscale("symlog", linthresh=1.0)
        ax.set_xlim(left=0)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "bench_lasso.png"), dpi=110)


if __name__ == "__main__":
    sys.exit(main())
