"""The implicit-feedback MF program (iALS++ feature blocks, Gramians through owner workers) on
local[2] against a dense numpy reference that never uses the Gramian trick."""

import numpy as np
import pytest

from pystrads.engine import Engine
from pystrads.programs.mf import hash_uniform
from pystrads.programs.mf_implicit import ImplicitMFProgram


def dense(users, items, ratings, nu, ni, alpha, scale_reg=True):
    """Confidences, preferences and the regularisation's weight per user and item (the positive
    counts, or 1 with ``scale_reg=False``)."""
    conf = np.ones((nu, ni))
    pref = np.zeros((nu, ni))
    conf[users, items] = 1 + alpha * np.abs(ratings)
    pref[users, items] = ratings > 0
    n_u = np.bincount(users, weights=ratings > 0, minlength=nu)
    n_i = np.bincount(items, weights=ratings > 0, minlength=ni)
    if not scale_reg:
        n_u, n_i = np.ones(nu), np.ones(ni)
    return conf, pref, n_u, n_i


def objective(w, h, users, items, ratings, lam, alpha, scale_reg=True):
    conf, pref, n_u, n_i = dense(users, items, ratings, len(w), len(h), alpha, scale_reg)
    err = pref - w @ h.T
    return float((conf * err ** 2).sum() + lam * ((n_u[:, None] * w ** 2).sum() + (n_i[:, None] * h ** 2).sum()))


def reference(users, items, ratings, nu, ni, rank, lam, alpha, iters, seed, b, nonnegative=False, scale_reg=True):
    """Serial block coordinate descent on the dense objective: per iteration, every item's blocks
    in order (exact weighted ridge solves), then every user's."""
    conf, pref, n_u, n_i = dense(users, items, ratings, nu, ni, alpha, scale_reg)
    u1 = np.stack([hash_uniform(np.arange(nu), 2 * k, seed) for k in range(rank)], axis=1)
    u2 = np.stack([hash_uniform(np.arange(nu), 2 * k + 1, seed) for k in range(rank)], axis=1)
    w = np.abs(np.sqrt(-2 * np.log(1 - u1)) * np.cos(2 * np.pi * u2))  # unit vectors, first quadrant
    w /= np.linalg.norm(w, axis=1, keepdims=True)
    h = np.zeros((ni, rank))

    def solve(x, y, c, p, reg, B):  # rows of x (fixed side) weighted by c, targets p, block B of y
        rest = np.ones(rank, bool)
        rest[B] = False
        s = x[:, rest] @ y[rest]
        xb = x[:, B]
        new = np.linalg.solve(xb.T @ (c[:, None] * xb) + reg * np.eye(xb.shape[1]), xb.T @ (c * (p - s)))
        return np.maximum(new, 0) if nonnegative else new

    blocks = [slice(lo, min(rank, lo + b)) for lo in range(0, rank, b)]
    for _ in range(iters):
        for B in blocks:
            for j in range(ni):
                h[j, B] = solve(w, h[j], conf[:, j], pref[:, j], lam * n_i[j], B)
        for B in blocks:
            for u in range(nu):
                w[u, B] = solve(h, w[u], conf[u], pref[u], lam * n_u[u], B)
    return w, h


def fit(sc, users, items, ratings, nu, ni, rank, lam, alpha, iters, block, workers=2, nonnegative=False, threads=1,
        scale_reg=True):
    positives = np.bincount(items, weights=ratings > 0, minlength=ni)
    program = ImplicitMFProgram(nu, ni, rank, lam, positives, alpha, workers, iters, nonnegative=nonnegative,
                                seed=5, block_size=block, scale_reg=scale_reg)
    triples = list(zip(users.tolist(), items.tolist(), ratings.tolist()))
    rdd = sc.parallelize(triples, workers).keyBy(lambda t: t[0]).partitionBy(workers).values()
    with Engine(program, rdd, seed=5, config={"step.targetSeconds": 0.2, "worker.threads": threads}).fit() as res:
        h = program.item_matrix(res.read_table("item_factors"))
        parts = res.map_states(lambda wk, data, state: (data.users, state.w))
        its = res.summary.iterations
    w = np.zeros((nu, rank))
    for uid, rows in parts:
        w[uid] = rows
    return w, h, its


@pytest.fixture(scope="module")
def interactions():
    """Counts (r > 0) plus a few negative ratings (confidence alpha |r|, preference 0)."""
    rng = np.random.default_rng(3)
    nu, ni = 30, 25
    mask = rng.random((nu, ni)) < 0.3
    mask[np.arange(nu), rng.integers(0, ni, nu)] = True  # every user and item observed
    mask[rng.integers(0, nu, ni), np.arange(ni)] = True
    users, items = np.nonzero(mask)
    ratings = rng.integers(1, 6, len(users)).astype(float)
    ratings[rng.random(len(users)) < 0.1] *= -1
    return users, items, ratings, nu, ni


@pytest.mark.parametrize("rank,block,scale_reg", [(4, 4, True), (5, 2, True), (5, 2, False)])
def test_distributed_blocks_equal_the_dense_serial_reference(sc, interactions, rank, block, scale_reg):
    """Full solves (b = rank, ALS's updates) and blocks 2, 2, 1 of rank 5 (a padded last block and
    the cross-block Gramian terms of the owners); regParam scaled by the counts (ALS) or not (the
    ``implicit`` library), the reported objective the one minimised."""
    users, items, ratings, nu, ni = interactions
    lam = 0.1 if scale_reg else 1.5  # unscaled: a lambda of the size of the scaled ones
    w, h, its = fit(sc, users, items, ratings, nu, ni, rank, lam, 2.0, 4, block, scale_reg=scale_reg)
    w_ref, h_ref = reference(users, items, ratings, nu, ni, rank, lam, 2.0, 4, 5, block, scale_reg=scale_reg)
    assert np.allclose(h, h_ref, atol=1e-8) and np.allclose(w, w_ref, atol=1e-8), np.abs(w - w_ref).max()
    objectives = [r["objective"] for r in its]
    assert [r["iteration"] for r in its] == [1, 2, 3, 4]
    assert np.isclose(objectives[-1], objective(w, h, users, items, ratings, lam, 2.0, scale_reg), rtol=1e-9)
    other = objective(w, h, users, items, ratings, lam, 2.0, not scale_reg)
    assert not np.isclose(objectives[-1], other, rtol=1e-3), (objectives[-1], other)
    assert all(b <= a * (1 + 1e-12) for a, b in zip(objectives, objectives[1:])), objectives


def test_nonnegative_coordinate_updates_stay_nonnegative_and_exact(sc, interactions):
    users, items, ratings, nu, ni = interactions
    w, h, _ = fit(sc, users, items, ratings, nu, ni, 3, 0.1, 1.0, 3, 1, nonnegative=True)
    w_ref, h_ref = reference(users, items, ratings, nu, ni, 3, 0.1, 1.0, 3, 5, 1, nonnegative=True)
    assert (w >= 0).all() and (h >= 0).all() and (h == 0).any()
    assert np.allclose(h, h_ref, atol=1e-8) and np.allclose(w, w_ref, atol=1e-8)


def test_a_lone_worker_with_three_threads_gives_the_very_same_factors(sc, interactions):
    """Threads split the worker's users, items and observations into disjoint ranges (same
    arithmetic per user and item): bit for bit the factors of one thread."""
    users, items, ratings, nu, ni = interactions
    w1, h1, _ = fit(sc, users, items, ratings, nu, ni, 5, 0.1, 2.0, 2, 2, workers=1)
    w3, h3, _ = fit(sc, users, items, ratings, nu, ni, 5, 0.1, 2.0, 2, 2, workers=1, threads=3)
    assert np.array_equal(w1, w3) and np.array_equal(h1, h3)
    w_ref, h_ref = reference(users, items, ratings, nu, ni, 5, 0.1, 2.0, 2, 5, 2)
    assert np.allclose(w3, w_ref, atol=1e-9) and np.allclose(h3, h_ref, atol=1e-9)


def test_one_worker_owning_every_item_gives_the_same_factors(sc, interactions):
    """Item ownership is round-robin over the workers (the other tests run 2): the result must not
    depend on U."""
    users, items, ratings, nu, ni = interactions
    w, h, _ = fit(sc, users, items, ratings, nu, ni, 5, 0.1, 2.0, 2, 2, workers=1)
    w_ref, h_ref = reference(users, items, ratings, nu, ni, 5, 0.1, 2.0, 2, 5, 2)
    assert np.allclose(w, w_ref, atol=1e-9) and np.allclose(h, h_ref, atol=1e-9)


def test_more_user_partitions_than_task_slots_are_merged_whole(sc, interactions):
    """Three partitions by user on local[2]: the engine merges partitions (no shuffle), so each
    user's observations stay in one worker and the result is still exact."""
    users, items, ratings, nu, ni = interactions
    w, h, _ = fit(sc, users, items, ratings, nu, ni, 5, 0.1, 2.0, 2, 2, workers=3)
    w_ref, h_ref = reference(users, items, ratings, nu, ni, 5, 0.1, 2.0, 2, 5, 2)
    assert np.allclose(w, w_ref, atol=1e-9) and np.allclose(h, h_ref, atol=1e-9)


def test_negative_alpha_is_refused():
    with pytest.raises(ValueError, match="alpha=-1"):
        ImplicitMFProgram(3, 3, 2, 0.1, np.ones(3), -1.0, 2)
