"""The Lasso / L1-logistic kernels and programs: planning, Gram tail, schedules, dependency check."""

import sys

import numpy as np
import pytest
from pyspark import cloudpickle

from pystrads.datasets.synthetic import lambda_max, strads_lasso_problem, uniform_sparse_problem
from pystrads.engine import Engine
from pystrads.kernels import cd as K
from pystrads.programs._coef import relaxed, soft_step
from pystrads.programs._rows import ColumnSample
from pystrads.programs._working_set import _worst
from pystrads.programs.lasso import AUTO_MAX_WIDTH, LassoProgram, auto_width
from pystrads.programs.logistic import L1LogisticProgram

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # GramSpy travels by value


def lasso_objective(x, y, beta, lam):
    r = y - x @ beta
    return 0.5 * r @ r / len(y) + lam * np.abs(beta).sum()


def reference_lasso(x, y, lam, sweeps=200000, tol=1e-14, l2=0.0):
    """Plain serial cyclic CD on the dense problem (independent of the kernels):
    ``1/(2n) |y - x beta|^2 + lam |beta|_1 + l2/2 |beta|^2``."""
    n, J = x.shape
    beta, r = np.zeros(J), y.copy()
    norms = (x * x).sum(axis=0) / n
    for _ in range(sweeps):
        biggest = 0.0
        for j in range(J):
            if norms[j] == 0:
                continue
            z = x[:, j] @ r / n + norms[j] * beta[j]
            new = np.sign(z) * max(abs(z) - lam, 0.0) / (norms[j] + l2)
            if new != beta[j]:
                r -= x[:, j] * (new - beta[j])
                biggest = max(biggest, abs(new - beta[j]))
                beta[j] = new
        if biggest < tol:
            break
    return beta


def test_rows_to_csc_round_trip():
    p = uniform_sparse_problem(50, 30, 400, seed=1)
    dense = p.dense()
    ptr, rows, vals = K.rows_to_csc(p.row_ptr, p.col_idx, p.vals, 30)
    back = np.zeros_like(dense)
    for j in range(30):
        np.add.at(back[:, j], rows[ptr[j]:ptr[j + 1]], vals[ptr[j]:ptr[j + 1]])
    np.testing.assert_allclose(back, dense)


def test_column_sample_normalises_each_column_and_keeps_empty_ones():
    """Unit-norm sample columns; columns the sample never touches -- in the middle and at the
    end (a last feature that is zero in every sampled row) -- stay empty with norm 1."""
    rows = [(np.array([0, 2]), np.array([3.0, 1.0])), (np.array([0]), np.array([4.0])),
            (np.array([2]), np.array([-2.0]))]
    sample = ColumnSample(rows, 5)
    assert sample.num_rows == 3
    np.testing.assert_array_equal(np.diff(sample.ptr), [2, 0, 2, 0, 0])
    np.testing.assert_allclose(sample.vals, [3 / 5, 4 / 5, 1 / np.sqrt(5), -2 / np.sqrt(5)])
    np.testing.assert_array_equal(sample.rows, [0, 1, 0, 2])


def test_workers_samples_merge_into_the_sample_of_their_stacked_rows():
    """Each worker sends the columns (CSC) of the rows it sampled; the driver's merge is the
    sample built from those rows stacked in worker order -- and a worker whose sample is every
    row sends exactly its data."""
    rng = np.random.default_rng(3)
    J = 7
    rows = [(np.sort(rng.choice(J, size=int(rng.integers(0, 4)), replace=False)), None) for _ in range(30)]
    rows = [(i, rng.normal(size=len(i))) for i, _ in rows]
    prog = LassoProgram(J, 0.1, sample_rows=1000)

    class Ctx:
        num_workers, worker = 2, 0

        @staticmethod
        def rng(salt=0):
            return np.random.default_rng(salt)

    parts = []
    for lo, hi in ((0, 12), (12, 30)):
        data = prog.load(None, [(0.0, 1.0, i, v) for i, v in rows[lo:hi]])
        parts.append(prog.data_summary(Ctx, data))
        assert parts[-1][0] == hi - lo
    merged = ColumnSample.from_columns(parts)
    direct = ColumnSample(rows, J)
    assert merged.num_rows == direct.num_rows == 30

    def dense(sample):
        out = np.zeros((sample.num_rows, J))
        out[sample.rows, np.repeat(np.arange(J), np.diff(sample.ptr))] = sample.vals
        return out[np.lexsort(out.T[::-1])]  # rows in a fixed order (load sorts each worker's rows)

    np.testing.assert_array_equal(merged.ptr, direct.ptr)
    np.testing.assert_allclose(dense(merged), dense(direct), rtol=0, atol=1e-15)
    few = LassoProgram(J, 0.1, sample_rows=10).data_summary(Ctx, prog.load(None, [(0.0, 1.0, i, v) for i, v in rows]))
    assert few[0] == 5 and few[2].max() < 5 and len(few[1]) == J + 1  # 10 rows over 2 workers


def test_plan_rounds_keeps_correlated_columns_apart_and_loses_nothing():
    p = strads_lasso_problem(300, 400, nnz_per_col=10, corr_prob=0.5, seed=2)
    x = p.dense()
    sample = ColumnSample([(i, v) for _, i, v in p.rows()], 400)
    unit = x / np.maximum(np.linalg.norm(x, axis=0), 1e-300)
    corr = np.abs(unit.T @ unit)
    stream = np.random.default_rng(0).permutation(400).astype(np.int64)
    ptr, coords, used = K.plan_rounds(stream, 16, 32, 1000, 400, sample.ptr, sample.rows, sample.vals, 0.3, 300)
    assert used == 400
    assert sorted(coords.tolist()) == list(range(400))  # every candidate lands in some round exactly once
    pairs = 0
    for r in range(len(ptr) - 1):
        c = coords[ptr[r]:ptr[r + 1]]
        assert 1 <= len(c) <= 16
        sub = corr[np.ix_(c, c)] - np.eye(len(c))
        assert sub.max() < 0.3 + 1e-12
        pairs += len(c) * (len(c) - 1) // 2
    assert pairs > 0
    # without the check the same stream puts correlated pairs together
    ptr2, coords2, _ = K.plan_rounds(stream, 16, 16, 1000, 400, sample.ptr, sample.rows, sample.vals, 0.0, 300)
    worst = max((corr[np.ix_(c, c)] - np.eye(len(c))).max()
                for c in (coords2[ptr2[r]:ptr2[r + 1]] for r in range(len(ptr2) - 1)))
    assert worst > 0.9


def test_the_conflict_graph_holds_exactly_the_correlated_pairs_and_plans_the_same_rounds_as_the_lists():
    p = strads_lasso_problem(300, 400, nnz_per_col=10, corr_prob=0.5, seed=2)
    sample = ColumnSample([(i, v) for _, i, v in p.rows()], 400)
    dense = np.zeros((sample.num_rows, 400))
    for j in range(400):
        dense[sample.rows[sample.ptr[j]:sample.ptr[j + 1]], j] = sample.vals[sample.ptr[j]:sample.ptr[j + 1]]
    corr = np.abs(dense.T @ dense)
    cols = np.sort(np.random.default_rng(1).choice(400, 150, replace=False)).astype(np.int64)
    conf_ptr, conf_idx = K.conflict_graph(cols, sample.ptr, sample.rows, sample.vals, 0.3, sample.num_rows)
    for a, j in enumerate(cols):
        expected = {int(k) for k in cols if k != j and corr[j, k] >= 0.3}
        assert set(conf_idx[conf_ptr[a]:conf_ptr[a + 1]].tolist()) == expected
    assert conf_ptr[-1] > 0  # the generator's correlated neighbours are among them
    # a working set in many passes (with the intercept, never checked): both checks, the same rounds
    stream = np.concatenate([np.random.default_rng(k).permutation(np.append(cols, 400)) for k in range(20)])
    args = (stream, 16, 32, 10_000, 400, sample.ptr, sample.rows, sample.vals, 0.3, sample.num_rows)
    lists, graph = K.plan_rounds(*args, method="lists"), K.plan_rounds(*args, method="graph")
    for a, b in zip(lists, graph):
        np.testing.assert_array_equal(a, b)
    assert lists[2] == len(stream)
    for r in range(len(graph[0]) - 1):
        c = graph[1][graph[0][r]:graph[0][r + 1]]
        c = c[c < 400]
        assert (corr[np.ix_(c, c)] - np.diag(np.diag(corr[np.ix_(c, c)]))).max(initial=0.0) < 0.3


def test_gram_entries_and_working_set_solver_match_dense_algebra():
    p = uniform_sparse_problem(80, 40, 600, seed=3)
    x = p.dense()
    w = np.random.default_rng(1).uniform(0.5, 2, 80)
    ptr, rows, vals = K.rows_to_csc(p.row_ptr, p.col_idx, p.vals, 40)
    coords = np.array([1, 5, 7, 20, 33], dtype=np.int64)
    keys, parts = K.gram_entries(ptr, rows, vals, coords, w, 80)
    assert np.all(np.diff(keys) > 0)  # merged on the worker: one entry per pair, sorted
    g = np.bincount(keys, weights=parts, minlength=25).reshape(5, 5)
    np.testing.assert_allclose(g, (x[:, coords] * w[:, None]).T @ x[:, coords], atol=1e-12)
    # a sparser set: only the structurally non-zero pairs travel; a dense design gives m^2 entries, not
    # the unmerged sum over rows of (non-zeros in the row)^2
    big = np.arange(40, dtype=np.int64)
    keys, parts = K.gram_entries(ptr, rows, vals, big, w, 80)
    dense = (x * w[:, None]).T @ x
    assert len(keys) == np.count_nonzero((x != 0).astype(int).T @ (x != 0).astype(int))
    np.testing.assert_allclose(np.bincount(keys, weights=parts, minlength=1600).reshape(40, 40), dense, atol=1e-12)
    rng = np.random.default_rng(5)
    xd = rng.normal(size=(300, 30))
    dptr, drows, dvals = K.rows_to_csc(np.arange(0, 301 * 30, 30, dtype=np.int64)[:301],
                                       np.tile(np.arange(30), 300).astype(np.int32), xd.ravel(), 30)
    keys, parts = K.gram_entries(dptr, drows, dvals, np.arange(30, dtype=np.int64), np.ones(300), 300)
    assert len(keys) == 900  # not 300 * 900
    np.testing.assert_allclose(parts.reshape(30, 30), xd.T @ xd, atol=1e-9)
    # the Gram solver reaches the reference Lasso on the columns it sees
    sub, y = x[:, coords], p.y
    n = len(y)
    lam = 0.01
    G = sub.T @ sub / n
    indptr = np.arange(6, dtype=np.int64) * 5
    beta = np.zeros(5)
    grad = -sub.T @ y / n
    K.gram_lasso(indptr, np.tile(np.arange(5), 5).astype(np.int64), G.ravel(), np.diag(G).copy(), np.zeros(5),
                 grad, beta, np.full(5, lam), np.zeros(5), 100000, 1e-14)
    np.testing.assert_allclose(beta, reference_lasso(sub, y, lam), atol=1e-9)
    # elastic net: the ridge part on the diagonal, curvature and gradient
    lam, l2 = 0.001, 0.05
    beta = np.zeros(5)
    K.gram_lasso(indptr, np.tile(np.arange(5), 5).astype(np.int64), G.ravel(), np.diag(G) + l2, np.zeros(5),
                 grad.copy(), beta, np.full(5, lam), np.full(5, l2), 100000, 1e-14)
    ref = reference_lasso(sub, y, lam, l2=l2)
    assert np.count_nonzero(ref) >= 2 and not np.allclose(ref, reference_lasso(sub, y, lam), atol=1e-3)
    np.testing.assert_allclose(beta, ref, atol=1e-9)


def test_the_working_sets_columns_travel_packed_and_solve_like_the_gram():
    """A worker packs a working set's columns with its touched rows' weights and residuals
    (``working_set_columns``: nothing else, rows renumbered in order); ``data_lasso`` on them
    reaches the reference weighted elastic net with an implicit intercept -- the centred
    columns -- as ``gram_lasso`` does on the centred Gram, and keeps the residual it leaves."""
    rng = np.random.default_rng(2)
    p = strads_lasso_problem(150, 60, nnz_per_col=6, seed=8)
    x, y = p.dense(), p.y
    n = len(y)
    w = rng.uniform(0.5, 2.0, n)
    ptr, rows, vals = K.rows_to_csc(p.row_ptr, p.col_idx, p.vals, 60)
    coords = np.array([3, 4, 10, 11, 12, 30, 31, 47], dtype=np.int64)
    beta0 = np.zeros(len(coords))
    r = y - x @ np.zeros(60)
    out = np.full(K.working_set_floats(ptr, coords, n, 2, False), np.nan)
    used = K.working_set_columns(ptr, rows, vals, coords, out, np.column_stack([w, r]), False)
    touched = np.flatnonzero((x[:, coords] != 0).any(axis=1))
    R, nnz = int(out[0]), int(out[1])
    assert (R, nnz) == (len(touched), np.count_nonzero(x[:, coords])) and used == 2 + 2 * R + len(coords) + 2 * nnz
    np.testing.assert_array_equal(out[2:2 + 2 * R].reshape(R, 2), np.column_stack([w[touched], r[touched]]))
    lens = out[2 + 2 * R:2 + 2 * R + len(coords)].astype(np.int64)
    np.testing.assert_array_equal(lens, np.count_nonzero(x[:, coords], axis=0))
    ent = out[2 + 2 * R + len(coords):used].reshape(nnz, 2)
    got = np.zeros((R, len(coords)))
    got[ent[:, 0].astype(np.int64), np.repeat(np.arange(len(coords)), lens)] = ent[:, 1]
    np.testing.assert_array_equal(got, x[touched][:, coords])
    # the solve: weighted, centred (an intercept), elastic net; against plain CD on the centred problem
    W = w.sum()
    mean = (w @ x[:, coords]) / W
    xc = (x[:, coords] - mean) * np.sqrt(w / W * n)[:, None]
    yc = (y - w @ y / W) * np.sqrt(w / W * n)
    lam, l2 = 0.1 * np.abs(xc.T @ yc).max() / n, 0.01
    ref = reference_lasso(xc, yc, lam, l2=l2)
    assert np.count_nonzero(ref) >= 4
    col_ptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    curv = (w @ (x[:, coords] - mean) ** 2) / W + l2
    beta, res = beta0.copy(), r[touched].copy()
    updates, sum_wr = K.data_lasso(col_ptr, ent[:, 0].astype(np.int64), ent[:, 1].copy(), w[touched].copy(), res, curv,
                                   mean, np.full(len(coords), lam), np.full(len(coords), l2), beta, float(w @ r), W,
                                   100000, 1e-14)
    np.testing.assert_allclose(beta, ref, atol=1e-9)
    full = y - x[:, coords] @ beta
    np.testing.assert_allclose(res, full[touched], atol=1e-12)  # the residual it leaves is the workers' to be
    assert abs(sum_wr - w @ full) <= 1e-9 and updates > 0
    G = (x[:, coords] * w[:, None]).T @ x[:, coords] / W
    gbeta = beta0.copy()
    K.gram_lasso(np.arange(len(coords) + 1, dtype=np.int64) * len(coords), np.tile(np.arange(len(coords)),
                 len(coords)).astype(np.int64), G.ravel(), curv.copy(), mean, -(x[:, coords].T @ (w * y) - mean * (w @ y)) / W, gbeta, np.full(len(coords), lam),
                 np.full(len(coords), l2), 100000, 1e-14)
    np.testing.assert_allclose(gbeta, beta, atol=1e-9)


def test_working_set_solver_extrapolates_through_correlated_columns():
    """Anderson acceleration in ``gram_lasso``: on 60 columns drawn from 6 shared factors (plain
    cyclic CD needs 385 passes to a 1e-12 step here) it stops within 200 passes at the exact
    Lasso solution; and it keeps an extrapolation only where the objective goes down (kept
    blindly, they raise it by 4e-3 on the second problem)."""
    def problem(seed, lam):
        rng = np.random.default_rng(seed)
        n, m = 400, 60
        x = rng.standard_normal((n, 6))[:, rng.integers(0, 6, m)] + 0.3 * rng.standard_normal((n, m))
        y = x[:, :10] @ rng.standard_normal(10) + 0.1 * rng.standard_normal(n)
        G = x.T @ x / n
        indptr, cols = np.arange(m + 1, dtype=np.int64) * m, np.tile(np.arange(m), m).astype(np.int64)

        def solve(passes):
            beta = np.zeros(m)
            updates = K.gram_lasso(indptr, cols, G.ravel(), np.diag(G).copy(), np.zeros(m), -x.T @ y / n, beta,
                                   np.full(m, lam), np.zeros(m), passes, 1e-12)
            return beta, updates // m, 0.5 * np.mean((y - x @ beta) ** 2) + lam * np.abs(beta).sum()
        return x, y, solve

    x, y, solve = problem(3, 0.01)
    beta, passes, _ = solve(100000)
    assert passes <= 200, passes
    np.testing.assert_allclose(beta, reference_lasso(x, y, 0.01), atol=1e-8)
    _, _, solve = problem(1, 0.05)
    trace = [solve(passes)[2] for passes in range(1, 40)]  # the objective after every pass: never up
    assert np.all(np.diff(trace) <= 1e-15), np.diff(trace).max()


def test_the_columns_solver_searches_along_the_extrapolation():
    """``data_lasso`` steps along Anderson's extrapolation as far as the objective falls (an
    exact line search) where ``gram_lasso`` keeps it or not: on the STRADS generator's columns,
    ill-conditioned, it reaches the same tight solution in
    about half the passes (351 against 656 here), and its objective never goes up from one pass to the next."""
    p = strads_lasso_problem(400, 600, nnz_per_col=10, seed=11)
    x, y = p.dense(), p.y
    n, m = x.shape
    lam = 0.02 * lambda_max(p)
    col_ptr, rows, vals = K.rows_to_csc(p.row_ptr, p.col_idx, p.vals, m)
    curv = (x * x).sum(axis=0) / n

    def columns(passes, tol=1e-12):
        beta, r = np.zeros(m), y.copy()
        updates, _ = K.data_lasso(col_ptr, rows.astype(np.int64), vals, np.ones(n), r, curv.copy(), np.zeros(m),
                                  np.full(m, lam), np.zeros(m), beta, float(y.sum()), float(n), passes, tol)
        return beta, updates // m, lasso_objective(x, y, beta, lam)

    G = x.T @ x / n
    gram_beta = np.zeros(m)
    gram_passes = K.gram_lasso(np.arange(m + 1, dtype=np.int64) * m, np.tile(np.arange(m), m).astype(np.int64),
                               G.ravel(), curv.copy(), np.zeros(m), -x.T @ y / n, gram_beta, np.full(m, lam),
                               np.zeros(m), 100000, 1e-12) // m
    beta, passes, best = columns(100000)
    np.testing.assert_allclose(beta, gram_beta, atol=1e-7)  # (a correlated pair: within the step tolerance)
    assert abs(best - lasso_objective(x, y, gram_beta, lam)) <= 1e-13 * best
    assert np.count_nonzero(beta) >= 50 and passes <= 0.6 * gram_passes, (passes, gram_passes)
    trace = [columns(k, 0.0)[2] for k in range(1, 60)]
    assert np.all(np.diff(trace) <= 1e-15 * best), np.diff(trace).max()


@pytest.mark.parametrize("intercept", [False, True])
def test_the_columns_solver_of_the_log_loss_meets_its_optimality_conditions(intercept):
    """``data_logistic`` (coordinate Newton steps halved until the objective falls, an active set
    between full passes) on weighted rows: at its answer the gradient is ``-lambda sign(beta)`` on
    the non-zeros, at most lambda in size on the zeros, 0 along the unpenalised offset; the
    margins it leaves are the rows' ``x beta + b``."""
    p = strads_lasso_problem(300, 80, nnz_per_col=12, seed=3)
    x = p.dense()
    n, m = x.shape
    y = (p.y > np.median(p.y)).astype(float)
    w = np.random.default_rng(0).uniform(0.5, 2, n)
    W = w.sum()
    col_ptr, rows, vals = K.rows_to_csc(p.row_ptr, p.col_idx, p.vals, m)
    lam = 0.1 * np.abs(x.T @ (w * (0.5 - y))).max() / W
    beta, margin = np.zeros(m), np.zeros(n)
    updates, b = K.data_logistic(col_ptr, rows.astype(np.int64), vals, w, margin, y, np.full(m, lam), np.zeros(m),
                                 beta, intercept, 0.0, W, 100000, 1e-12)
    prob = 1 / (1 + np.exp(-(x @ beta + b)))
    grad = x.T @ (w * (prob - y)) / W
    nz = beta != 0
    assert 20 <= nz.sum() < m and updates > 0
    np.testing.assert_allclose(margin, x @ beta + b, atol=1e-12)
    np.testing.assert_allclose(grad[nz], -lam * np.sign(beta[nz]), atol=1e-9)
    assert np.all(np.abs(grad[~nz]) <= lam * (1 + 1e-9))
    if intercept:
        assert b != 0.0 and abs(w @ (prob - y)) / W <= 1e-8
    else:
        assert b == 0.0


def test_soft_step_freezes_and_thresholds():
    step = soft_step(np.array([0.0, 1.0, 0.0, 2.0]), np.array([-3.0, 0.0, 0.5, 1.0]),
                     np.array([1.0, 2.0, 1.0, 0.0]), np.array([1.0, 0.5, 1.0, 1.0]))
    np.testing.assert_allclose(step, [2.0, -0.25, 0.0, 0.0])


def test_relaxed_steps_stay_on_the_linear_piece_and_lower_each_coordinates_objective():
    """``relaxed`` moves omega times the step only where |beta| stays linear on the way (no
    sign change, not ending at 0); there each coordinate's objective (the quadratic bound
    plus the L1 term) falls by omega (2 - omega) times the plain step's decrease."""
    rng = np.random.default_rng(3)
    n = 20000
    beta = np.where(rng.random(n) < 0.3, 0.0, rng.standard_normal(n))
    grad, curv, pen = rng.standard_normal(n), rng.random(n) + 0.1, rng.random(n)
    plain = soft_step(beta, grad, curv, pen)

    def q(d):  # the coordinate's objective change for a move d
        return grad * d + 0.5 * curv * d * d + pen * (np.abs(beta + d) - np.abs(beta))

    for omega in (1.5, 1.8, 1.95):
        step = relaxed(beta, plain, omega)
        wide = step != plain
        assert 0.2 * n < wide.sum() < 0.9 * n  # both kinds occur
        np.testing.assert_allclose(step[wide], omega * plain[wide])
        new = beta + plain
        assert np.all(np.sign(beta + step)[wide] == np.sign(new)[wide]) and np.all(new[wide] != 0)
        assert np.all((beta[wide] == 0) | (np.sign(beta[wide]) == np.sign(new[wide])))
        bound = omega * (2 - omega) * q(plain)  # (<= 0)
        assert np.all(q(step)[wide] <= bound[wide] + 1e-12)
        assert np.all(q(step) <= 1e-15)
    np.testing.assert_array_equal(relaxed(beta, plain, 1.0), plain)


@pytest.fixture(scope="module")
def small(sc):
    p = strads_lasso_problem(600, 900, nnz_per_col=20, seed=4)
    rdd = sc.parallelize([(y, 1.0, i, v) for y, i, v in p.rows()], 2)
    sample = ColumnSample([(i, v) for _, i, v in p.rows()], 900)
    lam = 0.05 * lambda_max(p)
    x = p.dense()
    ref = reference_lasso(x, p.y, lam)
    return p, rdd, sample, lam, x, lasso_objective(x, p.y, ref, lam)


@pytest.mark.parametrize("schedule,gram,tol", [("dynamic", 4096, 1e-9), ("dynamic", 0, 1e-8), ("shotgun", 0, 1e-8),
                                               ("roundrobin", 0, 1e-8)])
def test_every_schedule_reaches_the_reference_optimum(small, schedule, gram, tol):
    p, rdd, sample, lam, x, best = small
    prog = LassoProgram(900, lam, fit_intercept=False, standardization=False, schedule=schedule,
                        coords_per_round=32, candidates_per_round=64, tol=tol, max_iter=300, gram_limit=gram,
                        sample=sample)
    with Engine(prog, rdd, num_workers=2, seed=1).fit() as res:
        beta, b0 = prog.result(res.read_table("coef"))
    assert b0 == 0.0
    got = lasso_objective(x, p.y, beta, lam)
    assert abs(got - best) <= 1e-6 * best, (schedule, got, best)
    assert abs(prog.driver_state["objective"] - got) <= 1e-9 * best  # the reported objective is the real one
    hist = [o for o, _ in prog.driver_state["history"]]
    assert hist[-1] <= hist[0]


@pytest.mark.parametrize("cls", [LassoProgram, L1LogisticProgram])
def test_a_workers_threads_give_the_very_same_coefficients(small, cls):
    """The column dots of a round (and of the closing sweeps) are split over the worker's
    threads by coordinate: the same sums per coordinate, so the very same path."""
    p, rdd, sample, lam, x, best = small
    cut = float(np.median(p.y))
    data = rdd if cls is LassoProgram else rdd.map(lambda r: (float(r[0] > cut),) + tuple(r[1:]))
    betas = []
    for threads in (1, 2):
        prog = cls(900, lam, fit_intercept=False, standardization=False, coords_per_round=96,
                   candidates_per_round=192, tol=1e-12, max_iter=6, gram_limit=0, sample=sample)
        prog.threaded_min_coords = 16  # split even this small problem's rounds
        with Engine(prog, data, num_workers=2, seed=1, config={"worker.threads": threads}).fit() as res:
            betas.append(prog.result(res.read_table("coef"))[0])
            assert res.summary.fixed["threads"] == threads
    assert np.count_nonzero(betas[0]) > 0 and np.array_equal(betas[0], betas[1])


def test_working_set_solver_from_the_first_sweep_and_rounds_beyond_its_limit(small):
    """The driver's working-set solver takes over right after the first sweep (no
    parallel round at all when the support fits), and a support larger than 3/4 of
    workingSetLimit falls back to the parallel rounds; both reach the optimum."""
    p, rdd, sample, lam, x, best = small
    support = int(np.count_nonzero(reference_lasso(x, p.y, lam)))
    assert support >= 8
    used = {}
    for limit in (4096, support // 2):
        prog = LassoProgram(900, lam, fit_intercept=False, standardization=False, coords_per_round=32,
                            candidates_per_round=64, tol=1e-9, max_iter=300, gram_limit=limit, sample=sample)
        with Engine(prog, rdd, num_workers=2, seed=1).fit() as res:
            beta, _ = prog.result(res.read_table("coef"))
        got = lasso_objective(x, p.y, beta, lam)
        assert abs(got - best) <= 1e-6 * best, (limit, got, best)
        used[limit] = (prog.driver_state["round_updates"], prog.driver_state["updates"], len(prog.driver_state["history"]))
    rounds, updates, steps = used[4096]
    assert rounds == 0 and updates > 0, used  # every update by the driver's solver
    assert steps <= 12, used  # a handful of (Gram, delta) steps
    assert used[support // 2][0] > 0, used  # beyond the limit: parallel rounds


def test_relaxed_rounds_reach_the_optimum_in_fewer_rounds_along_correlated_columns(small):
    """Rounds only on the STRADS generator's chains of correlated columns: with the default
    relaxation (1.8) the objective falls monotonically and reaches the reference optimum;
    when it is within 1e-6 of it, plain coordinate descent (relaxation 1) after as many
    coordinate updates is still more than 10x farther."""
    p, rdd, sample, lam, x, best = small
    runs = {}
    for omega in (1.0, 1.8):
        prog = LassoProgram(900, lam, fit_intercept=False, standardization=False, coords_per_round=32,
                            candidates_per_round=64, tol=1e-12, max_iter=12, gram_limit=0, sample=sample,
                            relaxation=omega)
        with Engine(prog, rdd, num_workers=2, seed=1, config={"step.maxRounds": 40}).fit() as res:
            beta, _ = prog.result(res.read_table("coef"))
        hist = prog.driver_state["history"]
        objective = np.array([o for o, _ in hist])
        assert np.all(np.diff(objective) <= 1e-15 * best), (omega, np.diff(objective).max())
        runs[omega] = ((objective - best) / best, np.array([u for _, u in hist]))
    gaps, updates = runs[1.8]
    assert gaps[-1] <= 1e-9, gaps
    first = int(np.argmax(gaps <= 1e-6))
    plain_gaps, plain_updates = runs[1.0]
    behind = plain_gaps[plain_updates <= updates[first]][-1]
    assert behind > 1e-5, runs
    with pytest.raises(ValueError, match="relaxation=2.0 is not in"):
        LassoProgram(900, lam, relaxation=2.0)


def test_the_logistic_program_takes_no_relaxation():
    """Over-relaxation is the squared loss's: the logistic program refuses the parameter
    instead of accepting a value it would never use, and keeps every other one."""
    with pytest.raises(TypeError, match="relaxation"):
        L1LogisticProgram(10, 0.1, relaxation=1.5)
    prog = L1LogisticProgram(10, 0.1, tol=1e-9, coords_per_round=8)
    assert not hasattr(prog, "relaxation")
    assert (prog.tol, prog.coords_per_round, prog.num_coords) == (1e-9, 8, 11)
    assert LassoProgram(10, 0.1, relaxation=1.0).relaxation == 1.0


class GramSpy(LassoProgram):
    """Keeps every Gram matrix (or set of columns) the driver read off the shards, with its working
    set; with the columns, the coefficients their residual stands at once the driver solved."""

    def _working_set(self, ctx, step, objective, metrics=None):
        d = self._d
        fresh, gram_set, kind = "ws_asked" in d, d.get("gram_set"), d.get("ws_kind")
        beta = d["coef"][:, 0].copy()
        super()._working_set(ctx, step, objective, metrics)
        if fresh and kind == "gram" and "gram" in d:
            self.grams.append((gram_set.copy(), d["gram"]))
        if fresh and kind == "columns":
            if "ws_columns" in d:
                beta[gram_set] = ctx.table("coef").read(gram_set)[:, 0]  # (the solve's, which it wrote)
            self.columns.append((gram_set.copy(), beta, d.get("ws_columns")))


def test_each_working_set_gets_its_own_gram_matrix(small):
    """With a small workingSetLimit the working set changes from step to step; each Gram the
    driver solves on is X_A' X_A / n of that very set -- nothing left over from the previous
    set's entries (the table is cleared, in the background, between two sets)."""
    p, rdd, sample, lam, x, best = small
    prog = GramSpy(900, lam, fit_intercept=False, standardization=False, tol=1e-9, max_iter=300, gram_limit=64,
                   sample=sample)
    prog.grams, prog.columns = [], []
    with Engine(prog, rdd, num_workers=2, seed=1).fit() as res:
        beta, _ = prog.result(res.read_table("coef"))
    assert abs(lasso_objective(x, p.y, beta, lam) - best) <= 1e-6 * best
    sets = [tuple(gs) for gs, _ in prog.grams]
    assert len(set(sets)) >= 2, sets  # several working sets
    for gs, (indptr, cols, vals) in prog.grams:
        m = len(gs)
        got = np.zeros((m, m))
        got[np.repeat(np.arange(m), np.diff(indptr)), cols] = vals
        np.testing.assert_allclose(got, x[:, gs].T @ x[:, gs] / len(p.y), atol=1e-12)


@pytest.mark.parametrize("intercept", [False, True])
def test_the_log_loss_solves_its_working_sets_on_the_driver(small, intercept):
    """L1-logistic regression with the working-set solver (the set's columns, with every row's
    margin and label where there is an intercept): every update is the driver's, a few steps,
    and the answer meets the optimality conditions computed here from the dense data (the
    gradient ``-lambda sign(beta)`` on the non-zeros, at most lambda on the zeros, 0 along the
    intercept)."""
    p, rdd, sample, lam, x, best = small
    cut = float(np.median(p.y))
    data = rdd.map(lambda r: (float(r[0] > cut),) + tuple(r[1:]))
    y = (p.y > cut).astype(float)
    reg = 0.5 * np.abs(x.T @ (y - (y.mean() if intercept else 0.5))).max() / len(y)
    prog = L1LogisticProgram(900, reg, fit_intercept=intercept, standardization=False, tol=1e-10, max_iter=100,
                             gram_limit=4096, sample=sample)
    with Engine(prog, data, num_workers=2, seed=1).fit() as res:
        beta, b0 = prog.result(res.read_table("coef"))
    d = prog.driver_state
    assert d["round_updates"] == 0 and d["updates"] > 0 and len(d["history"]) <= 20, d["history"]
    grad = x.T @ (1 / (1 + np.exp(-(x @ beta + b0))) - y) / len(y)
    nz = beta != 0
    assert nz.sum() >= 10 and (b0 != 0.0) == intercept
    np.testing.assert_allclose(grad[nz], -reg * np.sign(beta[nz]), atol=1e-4 * reg)  # (tol is on the objective)
    assert np.all(np.abs(grad[~nz]) <= reg * (1 + 1e-4))
    if intercept:
        assert abs(np.mean(1 / (1 + np.exp(-(x @ beta + b0))) - y)) <= 1e-6


def test_the_log_loss_leaves_working_sets_whose_rows_outgrow_the_table_to_its_rounds(small):
    """With an intercept every row's margin travels with a working set: where they outgrow the
    workers' shares of the table (``workingSetLimit`` 16: 128 floats a worker for 300 rows),
    the log-loss has no Gram to fall back on, so its parallel rounds carry the fit -- to the
    optimum the working sets reach with room enough."""
    p, rdd, sample, lam, x, best = small
    cut = float(np.median(p.y))
    data = rdd.map(lambda r: (float(r[0] > cut),) + tuple(r[1:]))
    y = (p.y > cut).astype(float)
    reg = 0.5 * np.abs(x.T @ (y - y.mean())).max() / len(y)
    got = {}
    for limit in (16, 4096):
        prog = L1LogisticProgram(900, reg, fit_intercept=True, standardization=False, tol=1e-10, max_iter=300,
                                 gram_limit=limit, sample=sample)
        with Engine(prog, data, num_workers=2, seed=1).fit() as res:
            res.read_table("coef")
        got[limit] = (prog.driver_state["objective"], prog.driver_state["round_updates"],
                      bool(prog.driver_state.get("ws_off")))
    assert got[16][1] > 0 and got[16][2] and got[4096][1] == 0 and not got[4096][2], got
    assert abs(got[16][0] - got[4096][0]) <= 1e-6 * got[4096][0], got


@pytest.mark.parametrize("share", [0.0, 1.0])
def test_the_working_sets_columns_or_gram_give_the_same_optimum(small, monkeypatch, share):
    """Sparse data sends the working set's columns (the driver's solve moves its own copy of
    their residual), dense data the Gram matrix: forced either way, the fit reaches the same
    optimum with the same support; the columns the driver received are those of the set over
    every row the workers hold (Gram and x'Wr as the dense algebra has them), and a set too
    big for the workers' shares of the table falls back to the Gram matrix."""
    from pystrads.programs import _working_set

    monkeypatch.setattr(_working_set, "COLUMNS_SHARE", share)
    p, rdd, sample, lam, x, best = small
    n = len(p.y)
    for limit in (4096, 48):
        if limit == 48 and share == 1.0:  # asked for even where the driver expects them not to fit
            monkeypatch.setattr(_working_set, "_kind", lambda program, size: "columns")
        prog = GramSpy(900, lam, fit_intercept=False, standardization=False, tol=1e-9, max_iter=300,
                       gram_limit=limit, sample=sample)
        prog.grams, prog.columns = [], []
        with Engine(prog, rdd, num_workers=2, seed=1).fit() as res:
            beta, _ = prog.result(res.read_table("coef"))
        assert abs(lasso_objective(x, p.y, beta, lam) - best) <= 1e-6 * best, (share, limit)
        if share == 0.0:  # every set as a Gram matrix
            assert prog.grams and not prog.columns
            continue
        if limit == 48:  # 48 columns of 20 non-zeros outgrow a worker's 1 152 floats: the Gram after all
            assert prog.grams and prog.columns and all(c is None for _, _, c in prog.columns), limit
            continue
        assert prog.columns and not prog.grams
        for gs, at, (col_ptr, rows, vals, w, r) in prog.columns:
            m = len(gs)
            sub = np.zeros((len(w), m))
            sub[rows, np.repeat(np.arange(m), np.diff(col_ptr))] = vals
            np.testing.assert_allclose(sub.T @ sub, x[:, gs].T @ x[:, gs], atol=1e-12)
            np.testing.assert_allclose(sub.T @ (w * r), x[:, gs].T @ (p.y - x @ at), atol=1e-9)
            assert len(w) == np.count_nonzero((x[:, gs] != 0).any(axis=1)) and np.all(w == 1.0)
        assert len(prog.columns) <= 4, len(prog.columns)  # a few sets, each sent once


@pytest.mark.slow
def test_dependency_check_matters_on_correlated_columns(sc):
    """Groups of 4 near-identical columns: updated together they overshoot (priority
    only, no check), while the dynamic schedule with the check converges."""
    rng = np.random.default_rng(7)
    n, groups = 400, 20
    base = np.zeros((n, groups))  # orthogonal groups: disjoint rows
    for g in range(groups):
        base[g * 20:(g + 1) * 20, g] = rng.random(20) + 0.5
    x = np.repeat(base, 4, axis=1) * (1 + 0.1 * rng.standard_normal((n, 4 * groups)))  # corr ~ 0.99
    y = base @ rng.standard_normal(groups) + 0.01 * rng.standard_normal(n)
    J = x.shape[1]
    recs = [(float(y[i]), 1.0, np.flatnonzero(x[i]), x[i][x[i] != 0]) for i in range(n)]
    rdd = sc.parallelize(recs, 2)
    sample = ColumnSample([(r[2], r[3]) for r in recs], J)
    lam = 0.01 * float(np.abs(x.T @ y).max() / n)
    best = lasso_objective(x, y, reference_lasso(x, y, lam), lam)
    results = {}
    # "workers' sample": the sample drawn by the workers as they load (every row), not given
    for name, rho, gram in (("check", 0.5, 0), ("no check", 0.0, 0), ("shipped", 0.3, 4096),
                            ("workers' sample", 0.5, 0)):
        given = name != "workers' sample"
        prog = LassoProgram(J, lam, fit_intercept=False, standardization=False, schedule="dynamic",
                            coords_per_round=J, candidates_per_round=J, rho=rho, tol=1e-9, max_iter=40,
                            gram_limit=gram, min_rounds_per_step=8, sample=sample if given else None,
                            sample_rows=0 if given else n,
                            damping="eso" if name == "shipped" else "none")  # STRADS's plain update
        with Engine(prog, rdd, num_workers=2, seed=1, config={"step.targetSeconds": 1.0}).fit() as res:
            beta, _ = prog.result(res.read_table("coef"))
        results[name] = lasso_objective(x, y, beta, lam)
        if not given:  # (built at the first round's planning)
            assert prog.driver_state["sample"].num_rows == n
    assert results["shipped"] <= best * (1 + 1e-7), results
    assert results["check"] <= best * 1.01, results  # the plain rounds with the check: slow but steady
    assert results["workers' sample"] == pytest.approx(results["check"], rel=1e-9), results
    assert not results["no check"] <= best * 2, results  # without it: diverged (inf / nan) or far off


def test_logistic_program_reaches_the_reference_optimum(sc):
    p = strads_lasso_problem(500, 300, nnz_per_col=30, seed=8)
    x = p.dense()
    m = x @ p.beta_true
    y = (m + 0.2 * np.random.default_rng(0).standard_normal(len(m)) > np.median(m)).astype(float)
    rdd = sc.parallelize([(float(y[k]), 1.0, i, v) for k, (_, i, v) in enumerate(p.rows())], 2)
    lam = 0.005

    def objective(beta, b):
        mm = x @ beta + b
        return np.mean(np.logaddexp(0, mm) - y * mm) + lam * np.abs(beta).sum()

    prog = L1LogisticProgram(300, lam, fit_intercept=True, standardization=False, tol=1e-10, max_iter=200,
                             sample=ColumnSample([(i, v) for _, i, v in p.rows()], 300))
    with Engine(prog, rdd, num_workers=2, seed=1).fit() as res:
        beta, b0 = prog.result(res.read_table("coef"))
    got = objective(beta, b0)
    # reference: proximal gradient (ISTA) with a safe step, many iterations, on the dense problem
    L = 0.25 * np.linalg.norm(np.column_stack([x, np.ones(len(y))]), 2) ** 2 / len(y)
    bb, b = np.zeros(300), 0.0
    for _ in range(30000):
        mm = x @ bb + b
        s = 1 / (1 + np.exp(-mm))
        gb, g0 = x.T @ (s - y) / len(y), np.mean(s - y)
        z = bb - gb / L
        bb = np.sign(z) * np.maximum(np.abs(z) - lam / L, 0)
        b -= g0 / L
    assert got <= objective(bb, b) + 1e-9
    assert abs(got - objective(bb, b)) <= 1e-6 * objective(bb, b)
    assert b0 != 0.0 and np.count_nonzero(beta) > 0


@pytest.mark.parametrize("seed", [0, 21, 30])  # 21 and 30: the priorities' order puts the intercept first
def test_a_step_of_three_rounds_moves_a_feature_as_well_as_the_intercept(sc, seed):
    """With ``step.maxRounds=3`` (a first step sized after a slow start runs as few rounds) the
    logistic step is the intercept's round, one feature round and the sweep: the feature round
    (one coordinate wide here, as the automatic width makes it for one feature) is never spent
    on the intercept, so one iteration moves the one feature (as MLlib's first
    L-BFGS iteration does), whatever the priorities' random order."""
    rows = [(float(i % 7 > 3), 1.0, np.array([0]), np.array([float(i % 7) - 3.0])) for i in range(28)]
    rdd = sc.parallelize(rows, 2)
    prog = L1LogisticProgram(1, 0.0, fit_intercept=True, max_iter=1, coords_per_round=1, gram_limit=0,
                             sample=ColumnSample([r[2:] for r in rows], 1))
    with Engine(prog, rdd, num_workers=2, seed=seed, config={"step.maxRounds": 3}).fit() as res:
        beta, b0 = prog.result(res.read_table("coef"))
    assert beta[0] > 0.5 and b0 != 0.0


def test_the_working_set_takes_the_worst_violators():
    """The working set's padding is the ``count`` candidates with the largest violation: the same
    set a full sort gives (ties aside), all of them when fewer, none for a count of 0."""
    rng = np.random.default_rng(5)
    ids = np.sort(rng.choice(1_000_000, 50_000, replace=False))
    violation = rng.exponential(size=len(ids))
    for count in (1, 7, 4096, len(ids) - 1):
        expected = ids[np.argsort(-violation, kind="stable")[:count]]
        assert np.array_equal(np.sort(_worst(ids, violation, count)), np.sort(expected)), count
    assert np.array_equal(np.sort(_worst(ids, violation, len(ids) + 3)), ids)
    assert len(_worst(ids, violation, 0)) == 0 and len(_worst(ids, violation, -2)) == 0


def test_the_auto_round_width_is_wide_for_sparse_wide_data_and_narrow_for_dense_or_shared_rows():
    # the STRADS generator: 20 000 x 200 000, 25 non-zeros a column (~250 a row)
    strads = auto_width(200_000, 5e6, 5e6 * 250.6, 2)
    assert 3500 < strads < 5000
    assert auto_width(1000, 1e7, 1e7 * 1000, 2) < 16  # 10 000 x 1 000 dense: every round shares every row
    assert auto_width(20_000, 4e6, 4e6 * 200.5, 2) < strads / 4  # denser columns, fewer of them
    assert auto_width(200_000, 5e6, 5e6 * 250.6, 8) > strads  # less column work a worker: wider rounds
    assert auto_width(10 ** 7, 5e7, 5e7 * 6, 2) == AUTO_MAX_WIDTH
    assert auto_width(300, 300, 300, 2) == 300  # rows that share nothing: one round takes every column
    assert auto_width(1, 10, 10, 2) == auto_width(50, 0, 0, 2) == 1
