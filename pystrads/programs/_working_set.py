"""The Lasso's working-set solver on the driver, for :class:`~pystrads.programs.lasso.LassoProgram`.

While the support is small, the driver solves the Lasso restricted to a
working set exactly from its Gram matrix (celer / blitz style) instead of
running parallel rounds; :func:`working_set_step` is that step, which the
program's ``after_step`` and ``schedule`` call with the program (whose driver
state ``_d``, ``num_features``, ``gram_limit``, ``tol`` and ``duality_gap`` it reads).
"""

from __future__ import annotations

import threading

import numpy as np

from ..kernels import cd as K
from ..kernels.sets import union
from ._coef import BETA, CURV, DELTA, L2, MEAN, PEN


def _in_background(fn, *args):
    """``fn(*args)`` on a thread: ``(thread, errors)``, ``errors`` holding what it raised."""
    errors = []

    def run():
        try:
            fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the joiner
            errors.append(exc)

    thread = threading.Thread(target=run, name="pystrads-gram-clear", daemon=True)
    thread.start()
    return thread, errors


def _worst(ids, violation, count):
    """The ``count`` of ``ids`` with the largest ``violation`` (all of them if fewer), in no
    particular order: a selection, O(len(ids)), where a sort of the ~J candidates cost 20 ms a
    working set on 200 000 columns (ties at the boundary are broken deterministically)."""
    if count <= 0:
        return ids[:0]
    if count >= len(ids):
        return ids
    return ids[np.argpartition(-violation, count - 1)[:count]]


def working_set_step(program, ctx, step, objective) -> None:
    """The working-set solver's part of a step (:func:`_solve`); the Gram table is clean
    again (cleared in the background while the solve runs) before it returns."""
    clearing: list = []
    try:
        _solve(program, ctx, step, objective, clearing)
    finally:  # the Gram table is clean before any next step
        errors = [e for thread, errs in clearing if thread.join() is None for e in errs]
    if errors:
        raise errors[0]


def _solve(program, ctx, step, objective, clearing: list) -> None:
    """Working-set solver on the driver (celer / blitz style): while the non-zeros
    number at most ``3/4 gram_limit``, solve the Lasso restricted to a working
    set exactly on the driver from its Gram matrix (the workers send
    ``X_A' W X_A`` once per working set); the next sweep's gradient checks the
    rest and grows the set.  The set is the non-zeros plus the coefficients
    that violate the optimality conditions most (``|grad| / pen``), at least
    ``gram_limit / 2`` and twice the non-zeros, at most ``gram_limit``; it is
    taken right after the first sweep, and the inner solve stops well inside
    the whole problem's duality gap.  The parallel rounds run when the
    non-zeros exceed ``3/4 gram_limit`` (``workingSetLimit``)."""
    d = program._d
    coef = d["coef"]
    J = program.num_features
    live = coef[:J, PEN] >= 0
    nonzero = live & (coef[:J, BETA] != 0)
    active = np.flatnonzero(nonzero | (live & (step[:J] != 0)))
    fresh = "gram_rows" in d
    if fresh:  # a step just summed the Gram matrix of d["gram_set"] into the table: solve on it
        m = len(d["gram_set"])  # the shards send the non-zero entries only: O(nnz), never m^2, here
        gram = ctx.table("gram").read_entries(range(0, m * m))  # (width 1: an entry per non-zero key)
        keys, vals = gram.keys, gram.vals
        clearing.append(_in_background(ctx.table("gram").write, keys, np.zeros(len(keys))))  # clean for the
        # next working set, while the solve below runs (the kernel releases the GIL)
        rows, cols = np.divmod(keys, m)
        indptr = np.zeros(m + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=m), out=indptr[1:])
        d["gram"] = (indptr, cols, np.asarray(vals, dtype=np.float64))
        del d["gram_rows"]
    if np.count_nonzero(nonzero) > (3 * program.gram_limit) // 4 or len(active) == 0:
        d.pop("gram_set", None)
        d.pop("gram", None)
        return
    stale = d.get("gram_set") is None or "gram" not in d or not np.all(np.isin(active, d["gram_set"]))
    if stale and not fresh:  # (a fresh Gram is solved on first: the set was chosen from this gradient)
        nz = np.flatnonzero(nonzero)
        size = min(program.gram_limit, max(program.gram_limit // 2, 2 * len(nz), len(active) + len(active) // 4 + 64))
        rest = np.flatnonzero(live & ~nonzero)
        d["gram_set"] = union(nz, _worst(rest, np.abs(d["grad"][rest]) / np.maximum(coef[rest, PEN], 1e-300),
                                         size - len(nz))).astype(np.int64)
        d["need_gram"] = d["gram_set"]
        d.pop("gram", None)
        return
    gs = d["gram_set"]
    beta = coef[gs, BETA].copy()
    grad = d["grad"][gs].copy()
    # stop the inner solve well inside the outer test; while the whole problem's duality
    # gap is still large (the set will change), well inside that gap (celer's rule)
    gap = program.duality_gap(coef, d["grad"], d["sums"])
    tol = 1e-6 * np.sqrt(program.tol * max(abs(objective), 1e-300))
    if np.isfinite(gap) and gap > 1e3 * program.tol * max(abs(objective), 1e-300):
        tol = max(tol, 1e-2 * np.sqrt(gap / len(gs)))
    indptr, cols, vals = d["gram"]
    l2 = coef[gs, L2].copy()
    curv = np.where(coef[gs, CURV] > 0, coef[gs, CURV] + l2, 0.0)
    d["updates"] += int(K.gram_lasso(indptr, cols, vals, curv, coef[gs, MEAN].copy(), grad, beta,
                                     coef[gs, PEN].copy(), l2, 100000, tol))
    rows = coef[gs].copy()
    rows[:, DELTA] = beta - rows[:, BETA]
    rows[:, BETA] = beta
    ctx.table("coef").write(gs, rows)
    d["pending"] = gs
