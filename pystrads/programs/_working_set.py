"""The Lasso's working-set solver on the driver, for :class:`~pystrads.programs.lasso.LassoProgram`.

While the support is small, the driver solves the Lasso restricted to a
working set exactly (celer / skglm style) instead of running parallel rounds:
on the set's columns over every row (sparse data: the workers send them with
their rows' residuals) or on its Gram matrix (dense data, where the columns
would outweigh the ``m x m`` Gram, which the workers sum); :func:`working_set_step`
is that step, which the program's ``after_step`` and ``schedule`` call with the
program (whose driver state ``_d``, ``num_features``, ``gram_limit``, ``tol`` and
``duality_gap`` it reads).
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


#: the columns travel instead of the Gram matrix while their non-zeros are at most this share of
#: the Gram's ``m * m`` entries (a pass over the columns costs their non-zeros, one over the Gram
#: its rows' non-zeros, and the workers' Gram product more than both)
COLUMNS_SHARE = 0.125


#: passes of one working-set solve of the log-loss at most (no extrapolation speeds its tail: where
#: it is slow, the next steps carry on from where it stopped, the sweep checking the rest between)
LOGISTIC_PASSES = 500


def working_set_step(program, ctx, step, objective, metrics=None) -> None:
    """The working-set solver's part of a step (:func:`_solve`); the Gram table is clean
    again (cleared in the background while the solve runs) before it returns.  ``metrics``:
    the step's (the workers report the length of the columns they sent)."""
    clearing: list = []
    try:
        _solve(program, ctx, step, objective, clearing, metrics)
    finally:  # the Gram table is clean before any next step
        errors = [e for thread, errs in clearing if thread.join() is None for e in errs]
    if errors:
        raise errors[0]


def _kind(program, size: int):
    """How the driver receives a working set of ``size`` coefficients: ``"columns"`` while their
    expected non-zeros (the data's mean per column) are a small share of the Gram's entries and
    fit the workers' shares of the ``working_set`` table, else ``"gram"`` (squared loss; the
    log-loss has no Gram form: None, parallel rounds)."""
    d = program._d
    nnz = size * d["nnz"] / max(program.num_features, 1)
    workers = max(d.get("workers", 1), 1)
    share = program.gram_limit ** 2 // workers
    c = program.ws_row_width
    rows, _ = program._ws_rows_expected(d["n"], nnz)
    fits = 2 * (c * rows + 2 * nnz) / workers + size + 2 <= share  # (twice a worker's even part)
    if program.loss_name != "squared":
        return "columns" if fits else None
    if nnz <= COLUMNS_SHARE * size * size and fits:
        return "columns"
    return "gram"


def _read_columns(ctx, program, m: int, metrics, clearing: list):
    """The working set's columns as the workers sent them (:meth:`LassoProgram._send_columns`):
    ``(col_ptr, rows, vals)`` over the rows they carry, then each of the program's values per
    row (weight and residual; weight, margin and label), or None when a worker's share of the
    table was too small."""
    workers = ctx.num_workers
    share = program.gram_limit ** 2 // workers
    c = program.ws_row_width
    lengths = [int(metrics.total(f"ws_floats_{k}", -1.0)) if metrics is not None else -1 for k in range(workers)]
    table = ctx.table("working_set")

    def clear():  # zeros again behind the read (in the background, while the solve runs): a Gram summed
        for k, used in enumerate(lengths):  # into the table later must find it clean
            if used > 0:
                table.write(range(k * share, k * share + used), np.zeros((used, 1)))

    if min(lengths) < 0:
        clearing.append(_in_background(clear))
        return None
    counts = np.zeros(m, dtype=np.int64)
    parts, row_parts, offset = [], [], 0
    for k, used in enumerate(lengths):
        packed = table.read(range(k * share, k * share + used))[:, 0]
        R, nnz = int(packed[0]), int(packed[1])
        row_parts.append(packed[2:2 + c * R].reshape(R, c))
        lens = packed[2 + c * R:2 + c * R + m].astype(np.int64)
        entries = packed[2 + c * R + m:2 + c * R + m + 2 * nnz].reshape(nnz, 2)
        cols = np.repeat(np.arange(m, dtype=np.int64), lens)
        parts.append((cols, entries[:, 0].astype(np.int64) + offset, entries[:, 1]))
        counts += lens
        offset += R
    cols = np.concatenate([p[0] for p in parts])
    order = np.argsort(cols, kind="stable")  # column by column, the workers' rows in turn
    col_ptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(counts, out=col_ptr[1:])
    rows = np.concatenate([p[1] for p in parts])[order]
    vals = np.concatenate([p[2] for p in parts])[order]
    per_row = np.concatenate(row_parts)
    clearing.append(_in_background(clear))
    return (col_ptr, rows, vals) + tuple(np.ascontiguousarray(per_row[:, q]) for q in range(c))


def _solve(program, ctx, step, objective, clearing: list, metrics) -> None:
    """Working-set solver on the driver (celer / skglm style): while the non-zeros
    number at most ``3/4 gram_limit``, solve the Lasso restricted to a working
    set exactly on the driver, from its columns (the workers send them once per
    working set with their rows' residuals; the solve keeps that residual) or
    its Gram matrix ``X_A' W X_A`` (summed over the workers, once per working
    set); the next sweep's gradient checks the rest and grows the set.  The set
    is the non-zeros plus the coefficients that violate the optimality
    conditions most (``|grad| / pen``), at least ``gram_limit / 2`` and twice
    the non-zeros, at most ``gram_limit``; it is taken right after the first
    sweep, and the inner solve stops well inside the whole problem's duality
    gap.  The parallel rounds run when the non-zeros exceed ``3/4 gram_limit``
    (``workingSetLimit``)."""
    d = program._d
    coef = d["coef"]
    J = program.num_features
    live = coef[:J, PEN] >= 0
    nonzero = live & (coef[:J, BETA] != 0)
    active = np.flatnonzero(nonzero | (live & (step[:J] != 0)))
    fresh = "ws_asked" in d
    if fresh:  # a step just sent the working set d["gram_set"] into the table: solve on it
        m = len(d["gram_set"])
        del d["ws_asked"]
        if d["ws_kind"] == "columns":
            columns = _read_columns(ctx, program, m, metrics, clearing)
            if columns is None and program.loss_name == "squared":  # too many for a worker's share: the Gram
                d["ws_kind"] = "gram"
                d["need_gram"] = d["gram_set"]
                return
            if columns is None:  # (the log-loss has no Gram form: parallel rounds from here on)
                d["ws_off"] = True
                _forget(d)
                return
            d["ws_columns"] = tuple(a if q == 4 else _read_only(a) for q, a in enumerate(columns))  # (4: the
            # residual / the margins, which the solve moves on a copy of its own)
        else:  # the shards send the non-zero entries only: O(nnz), never m^2, here
            gram = ctx.table("working_set").read_entries(range(0, m * m))  # (width 1: an entry per key)
            keys, vals = gram.keys, gram.vals
            clearing.append(_in_background(ctx.table("working_set").write, keys, np.zeros(len(keys))))  # clean
            # for the next working set, while the solve below runs (the kernel releases the GIL)
            rows, cols = np.divmod(keys, m)
            indptr = np.zeros(m + 1, dtype=np.int64)
            np.cumsum(np.bincount(rows, minlength=m), out=indptr[1:])
            d["gram"] = (indptr, cols, np.asarray(vals, dtype=np.float64))
    if np.count_nonzero(nonzero) > (3 * program.gram_limit) // 4 or len(active) == 0 or d.get("ws_off"):
        _forget(d)
        return
    solvable = "gram" in d or "ws_columns" in d
    stale = d.get("gram_set") is None or not solvable or not np.all(np.isin(active, d["gram_set"]))
    if stale and not fresh:  # (a fresh set is solved on first: it was chosen from this gradient)
        nz = np.flatnonzero(nonzero)
        size = min(program.gram_limit, max(program.gram_limit // 2, 2 * len(nz), len(active) + len(active) // 4 + 64))
        rest = np.flatnonzero(live & ~nonzero)
        _forget(d)
        d["gram_set"] = union(nz, _worst(rest, np.abs(d["grad"][rest]) / np.maximum(coef[rest, PEN], 1e-300),
                                         size - len(nz))).astype(np.int64)
        kind = _kind(program, len(d["gram_set"]))
        if kind is None:  # (log-loss, its rows do not fit the table: parallel rounds)
            d["ws_off"] = True
            _forget(d)
            return
        d["need_gram"] = d["gram_set"]
        d["ws_kind"] = kind
        return
    gs = d["gram_set"]
    beta = coef[gs, BETA].copy()
    # stop the inner solve well inside the outer test; while the whole problem's duality
    # gap is still large (the set will change), well inside that gap (celer's rule)
    if program.loss_name == "squared":
        gap = program.duality_gap(coef, d["grad"], d["sums"])
    else:  # no duality gap for the log-loss: ten times a pass's predicted decrease stands in for it
        gap = 5.0 * float(d["curv"] @ (step * step))
    tol = 1e-6 * np.sqrt(program.tol * max(abs(objective), 1e-300))
    if np.isfinite(gap) and gap > 1e3 * program.tol * max(abs(objective), 1e-300):
        tol = max(tol, 1e-3 * np.sqrt(gap / len(gs)))
    l2 = coef[gs, L2].copy()
    curv = np.where(coef[gs, CURV] > 0, coef[gs, CURV] + l2, 0.0)
    offset = None
    if "ws_columns" in d and program.loss_name != "squared":  # the log-loss, its margins moving
        col_ptr, rows, vals, w, margin, y = d["ws_columns"]
        margin = margin.copy()  # (the journal's entries may hold the one before)
        J = program.num_features
        mean = coef[:J, MEAN]
        b = float(coef[J, BETA] - mean @ coef[:J, BETA]) if program.fit_intercept else 0.0  # uncentred offset
        updates, b = K.data_logistic(col_ptr, rows, vals, w, margin, y, coef[gs, PEN].copy(), l2, beta,
                                     program.fit_intercept, b, float(d["W"]), LOGISTIC_PASSES, tol)
        d["ws_columns"] = (col_ptr, rows, vals, w, margin, y)  # the workers' margins once they apply the change
        if program.fit_intercept:  # back to the centred intercept of the new coefficients
            full = coef[:J, BETA].copy()
            full[gs] = beta
            offset = b + float(mean @ full)
    elif "ws_columns" in d:
        col_ptr, rows, vals, w, r = d["ws_columns"]
        r = r.copy()  # (the journal's entries may hold the one before)
        updates, _ = K.data_lasso(col_ptr, rows, vals, w, r, curv, coef[gs, MEAN].copy(), coef[gs, PEN].copy(), l2,
                                  beta, float(d["sums"]["wr"]), float(d["W"]), 100000, tol)
        d["ws_columns"] = (col_ptr, rows, vals, w, r)  # the workers' residual once they apply the change
    else:
        indptr, cols, vals = d["gram"]
        updates = K.gram_lasso(indptr, cols, vals, curv, coef[gs, MEAN].copy(), d["grad"][gs].copy(), beta,
                               coef[gs, PEN].copy(), l2, 100000, tol)
    d["updates"] += int(updates)
    if offset is not None:  # the intercept (coefficient J) moved with them
        gs, beta = np.append(gs, program.num_features), np.append(beta, offset)
    rows = coef[gs].copy()
    rows[:, DELTA] = beta - rows[:, BETA]
    rows[:, BETA] = beta
    ctx.table("coef").write(gs, rows)
    d["pending"] = gs


def _forget(d) -> None:
    """Drop the working set's data (its Gram matrix or columns)."""
    for key in ("gram_set", "gram", "ws_columns"):
        d.pop(key, None)


def _read_only(a: np.ndarray) -> np.ndarray:
    """``a`` marked read-only: fixed while its working set lasts (the journal then refers to it)."""
    a.flags.writeable = False
    return a
