"""The MF programs (CCD++ / feature blocks with W/H alternation, SGD with block rotation) on local[2]
against plain numpy references."""

import numpy as np
import pytest

from pystrads.kernels import mf as K
from pystrads.engine import Engine
from pystrads.programs.mf import MFProgram, MFSGDProgram, RatingBlock, _triples, hash_uniform


def ccdpp_reference(users, items, ratings, n_users, n_items, rank, lam, iters, inner, seed):
    """Serial CCD++ in numpy with the same initialisation (W hashed, H = 0)."""
    scale = 1 / np.sqrt(rank)
    uniq = np.unique(users)
    w = np.zeros((n_users, rank))
    for k in range(rank):
        w[uniq, k] = hash_uniform(uniq, k, seed) * scale - 0.5 * scale
    h = np.zeros((n_items, rank))
    n_i = np.bincount(users, minlength=n_users).astype(float)
    m_j = np.bincount(items, minlength=n_items).astype(float)
    r = ratings - (w[users] * h[items]).sum(1)
    for _ in range(iters):
        for k in range(rank):
            rhat = r + w[users, k] * h[items, k]
            for _ in range(inner):
                num = np.bincount(items, rhat * w[users, k], n_items)
                den = lam * m_j + np.bincount(items, w[users, k] ** 2, n_items)
                h[:, k] = np.divide(num, den, out=np.zeros(n_items), where=den > 0)
                num = np.bincount(users, rhat * h[items, k], n_users)
                den = lam * n_i + np.bincount(users, h[items, k] ** 2, n_users)
                w[:, k] = np.divide(num, den, out=np.zeros(n_users), where=den > 0)
            r = rhat - w[users, k] * h[items, k]
    return w, h


def block_reference(users, items, ratings, n_users, n_items, rank, lam, iters, inner, seed, b):
    """Serial block coordinate descent: per feature block, exact ridge solves per item then user."""
    w, h = ccdpp_reference(users, items, ratings, n_users, n_items, rank, lam, 0, inner, seed)
    n_i = np.bincount(users, minlength=n_users)
    m_j = np.bincount(items, minlength=n_items)
    r = ratings - (w[users] * h[items]).sum(1)
    for _ in range(iters):
        for lo in range(0, rank, b):
            B = slice(lo, min(rank, lo + b))
            rhat = r + (w[users, B] * h[items, B]).sum(1)
            for _ in range(inner):
                for j in range(n_items):
                    sel = items == j
                    wi = w[users[sel], B]
                    h[j, B] = np.linalg.solve(wi.T @ wi + lam * m_j[j] * np.eye(wi.shape[1]), wi.T @ rhat[sel])
                for i in range(n_users):
                    sel = users == i
                    hj = h[items[sel], B]
                    w[i, B] = np.linalg.solve(hj.T @ hj + lam * n_i[i] * np.eye(hj.shape[1]), hj.T @ rhat[sel])
            r = rhat - (w[users, B] * h[items, B]).sum(1)
    return w, h


def objective(w, h, users, items, ratings, lam):
    n_i = np.bincount(users, minlength=len(w))
    m_j = np.bincount(items, minlength=len(h))
    err = ratings - (w[users] * h[items]).sum(1)
    return float(err @ err + lam * ((n_i[:, None] * w ** 2).sum() + (m_j[:, None] * h ** 2).sum()))


def fit(sc, users, items, ratings, n_users, n_items, rank, lam, iters, inner=2, workers=2, nonnegative=False,
        block=1, threads=1):
    program = MFProgram(n_users, n_items, rank, lam, np.bincount(items, minlength=n_items), iters, inner,
                        nonnegative=nonnegative, seed=5, block_size=block)
    triples = list(zip(users.tolist(), items.tolist(), ratings.tolist()))
    rdd = sc.parallelize(triples, workers).keyBy(lambda t: t[0]).partitionBy(workers).values()
    with Engine(program, rdd, seed=5, config={"step.targetSeconds": 0.2, "worker.threads": threads}).fit() as res:
        h = program.item_matrix(res.read_table("item_factors"))
        parts = res.map_states(lambda wk, data, state: (data.users, state.w))
        its = res.summary.iterations
    w = np.zeros((n_users, rank))
    for uid, rows in parts:
        w[uid] = rows
    return w, h, its


@pytest.fixture(scope="module")
def sparse_problem():
    rng = np.random.default_rng(0)
    n_users, n_items, rank = 40, 30, 3
    truth = rng.random((n_users, rank)) @ rng.random((rank, n_items))
    mask = rng.random((n_users, n_items)) < 0.5
    users, items = np.nonzero(mask)
    ratings = truth[users, items] + 0.05 * rng.standard_normal(len(users))
    return users, items, ratings, n_users, n_items


def test_distributed_updates_equal_serial_ccdpp(sc, sparse_problem):
    users, items, ratings, nu, ni = sparse_problem
    w, h, its = fit(sc, users, items, ratings, nu, ni, rank=3, lam=0.05, iters=6)
    w_ref, h_ref = ccdpp_reference(users, items, ratings, nu, ni, 3, 0.05, 6, 2, seed=5)
    assert np.allclose(w, w_ref, atol=1e-9) and np.allclose(h, h_ref, atol=1e-9)
    assert [r["iteration"] for r in its] == list(range(1, 7))
    rmse = [r["train_rmse"] for r in its]
    assert all(b <= a + 1e-12 for a, b in zip(rmse, rmse[1:])), rmse


@pytest.mark.parametrize("workers,block", [(1, 1), (2, 2)])
def test_a_workers_threads_give_the_very_same_factors(sc, sparse_problem, workers, block):
    """Threads split the users, items and ratings of a worker into disjoint ranges: every
    user's and item's sums are the same arithmetic, so the factors are bit-for-bit those of one
    thread."""
    users, items, ratings, nu, ni = sparse_problem
    one = fit(sc, users, items, ratings, nu, ni, rank=4, lam=0.05, iters=3, workers=workers, block=block)
    three = fit(sc, users, items, ratings, nu, ni, rank=4, lam=0.05, iters=3, workers=workers, block=block,
                threads=3)
    assert np.array_equal(one[0], three[0]) and np.array_equal(one[1], three[1])
    assert one[2][-1]["train_rmse"] == three[2][-1]["train_rmse"] < one[2][0]["train_rmse"]


@pytest.mark.parametrize("block", [2, 4])
def test_block_updates_equal_serial_block_coordinate_descent(sc, sparse_problem, block):
    """Blocks of 2 features (rank 5: blocks 2, 2, 1 -- a padded last block) and of 4 (4, 1)."""
    users, items, ratings, nu, ni = sparse_problem
    w, h, its = fit(sc, users, items, ratings, nu, ni, rank=5, lam=0.05, iters=4, block=block)
    w_ref, h_ref = block_reference(users, items, ratings, nu, ni, 5, 0.05, 4, 2, seed=5, b=block)
    assert np.allclose(w, w_ref, atol=1e-8) and np.allclose(h, h_ref, atol=1e-8)
    rmse = [r["train_rmse"] for r in its]
    assert len(rmse) == 4 and all(b <= a + 1e-12 for a, b in zip(rmse, rmse[1:])), rmse


def test_converges_to_the_alternating_least_squares_optimum(sc, sparse_problem):
    users, items, ratings, nu, ni = sparse_problem
    lam = 0.05
    w, h, _ = fit(sc, users, items, ratings, nu, ni, rank=3, lam=lam, iters=60, inner=3)
    # dense reference: exact alternating least squares from the CCD++ solution's neighbourhood
    n_i, m_j = np.bincount(users, minlength=nu), np.bincount(items, minlength=ni)
    wa, ha = w.copy(), h.copy()
    for _ in range(500):
        for i in range(nu):
            sel = users == i
            hj = ha[items[sel]]
            wa[i] = np.linalg.solve(hj.T @ hj + lam * n_i[i] * np.eye(3), hj.T @ ratings[sel])
        for j in range(ni):
            sel = items == j
            wi = wa[users[sel]]
            ha[j] = np.linalg.solve(wi.T @ wi + lam * m_j[j] * np.eye(3), wi.T @ ratings[sel])
    ours, optimum = objective(w, h, users, items, ratings, lam), objective(wa, ha, users, items, ratings, lam)
    assert ours <= optimum * (1 + 1e-4), (ours, optimum)
    assert np.allclose(w @ h.T, wa @ ha.T, atol=1e-2)


def test_rank_one_matrix_is_recovered(sc):
    rng = np.random.default_rng(1)
    x, y = rng.uniform(0.5, 2.0, 25), rng.uniform(0.5, 2.0, 20)
    users, items = np.meshgrid(np.arange(25), np.arange(20), indexing="ij")
    users, items = users.ravel(), items.ravel()
    ratings = x[users] * y[items]
    w, h, its = fit(sc, users, items, ratings, 25, 20, rank=1, lam=1e-9, iters=30, inner=3, nonnegative=True)
    assert np.allclose(w @ h.T, np.outer(x, y), rtol=1e-5)
    assert its[-1]["train_rmse"] < 1e-6
    assert (w >= 0).all() and (h >= 0).all()


# ---------------------------------------------------------------------------------------------- SGD


def fit_sgd(sc, users, items, ratings, n_users, n_items, rank, lam, iters, workers=2, step=0.05,
            nonnegative=False):
    program = MFSGDProgram(n_users, n_items, rank, lam, np.bincount(items, minlength=n_items), iters, workers,
                           step_size=step, nonnegative=nonnegative, seed=5)
    triples = list(zip(users.tolist(), items.tolist(), ratings.tolist()))
    rdd = sc.parallelize(triples, workers).keyBy(lambda t: t[0]).partitionBy(workers).values()
    with Engine(program, rdd, seed=5, config={"step.targetSeconds": 0.2}).fit() as res:
        h = program.item_matrix(res.read_table("item_factors"))
        parts = res.map_states(lambda wk, data, state: (data.users, state.w))
        its = res.summary.iterations
    w = np.zeros((n_users, rank))
    owner = np.full(n_users, -1)
    for p, (uid, rows) in enumerate(parts):
        w[uid] = rows
        owner[uid] = p
    return w, h, its, program, owner


_MASK = (1 << 64) - 1


def _splitmix_uniform(x: int, column: int, seed: int) -> float:
    """The documented hash, written out on Python integers (not the library's numpy code):
    splitmix64's finaliser of ``x * golden + column * c1 + seed * c2`` (mod 2^64), top 53 bits."""
    z = (x * 0x9E3779B97F4A7C15 + ((column * 0xBF58476D1CE4E5B9 + seed * 0x94D049BB133111EB) & _MASK)) & _MASK
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & _MASK
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & _MASK
    z ^= z >> 31
    return (z >> 11) / float(1 << 53)


def _equal_mass_bounds(item_counts, U):
    """Items 0..n-1 cut into U contiguous blocks: block b starts at the first item before which
    at least b/U of all ratings lie."""
    total, bounds, cum, i = sum(item_counts), [0], 0, 0
    for b in range(1, U):
        while i < len(item_counts) and cum < total * b / U:
            cum += item_counts[i]
            i += 1
        bounds.append(i)
    return bounds + [len(item_counts)]


def sgd_reference(users, items, ratings, n_users, n_items, rank, lam, step, seed, U, iters):
    """Serial SGD from the documented rule alone (none of the program's code): factors start
    uniform on [0, 2/sqrt(rank)) from the hash of (id, feature + salt * rank) (salt 0 for users,
    1 for items); users belong to worker ``user % U`` (Spark's hash partitioning of int keys);
    items are cut into U blocks of equal rating mass; in round r of iteration t worker p sweeps
    its ratings of block (p + r) mod U in the order of the hash of ``user * n_items + item``
    (column 0) with step ``step / sqrt(1 + t)``."""
    scale = 2.0 / np.sqrt(rank)
    w = np.array([[_splitmix_uniform(u, k, seed) * scale for k in range(rank)] for u in range(n_users)])
    h = np.array([[_splitmix_uniform(j, k + rank, seed) * scale for k in range(rank)] for j in range(n_items)])
    counts = [int((items == j).sum()) for j in range(n_items)]
    bounds = _equal_mass_bounds(counts, U)
    block = [next(b for b in range(U) if bounds[b] <= j < bounds[b + 1]) for j in items.tolist()]
    key = [_splitmix_uniform(int(u) * n_items + int(j), 0, seed) for u, j in zip(users.tolist(), items.tolist())]
    sse = []
    for t in range(iters):
        eta = step / np.sqrt(1 + t)
        total = 0.0
        for r in range(U):
            for p in range(U):
                sel = [n for n in range(len(ratings)) if users[n] % U == p and block[n] == (p + r) % U]
                for n in sorted(sel, key=key.__getitem__):
                    i, j = users[n], items[n]
                    e = ratings[n] - w[i] @ h[j]
                    total += e * e
                    w[i], h[j] = w[i] + eta * (e * h[j] - lam * w[i]), h[j] + eta * (e * w[i] - lam * h[j])
        sse.append(total)
    return w, h, sse, bounds


def test_sgd_rotation_equals_serial_sgd_in_the_schedules_order(sc, sparse_problem):
    """Every rating visited once per iteration, each item block by one worker at a time: the
    distributed run is the serial SGD that visits ratings in the rotation's order, to rounding."""
    users, items, ratings, nu, ni = sparse_problem
    w, h, its, program, owner = fit_sgd(sc, users, items, ratings, nu, ni, rank=3, lam=0.05, iters=5)
    assert set(owner[np.unique(users)]) == {0, 1} and len(program.bounds) == 3
    w_ref, h_ref, sse, bounds = sgd_reference(users, items, ratings, nu, ni, rank=3, lam=0.05, step=0.05, seed=5,
                                              U=2, iters=5)
    assert list(program.bounds) == bounds
    seen = np.unique(users)
    assert np.array_equal(owner[seen], seen % 2)  # the reference's partitioning is Spark's
    assert np.allclose(w[np.unique(users)], w_ref[np.unique(users)], atol=1e-10)
    assert np.allclose(h, h_ref, atol=1e-10)
    assert [r["iteration"] for r in its] == list(range(1, 6))
    assert np.allclose([r["sse"] for r in its], sse, rtol=1e-10)
    assert its[-1]["train_rmse"] < its[0]["train_rmse"]


def test_sgd_item_blocks_balance_rating_mass():
    from pystrads.programs.mf import item_blocks

    counts = np.array([50, 1, 1, 1, 1, 1, 45, 0, 0, 0])
    bounds = item_blocks(counts, 2)
    assert bounds[0] == 0 and bounds[-1] == 10 and bounds[1] == 1  # [50] | [1, 1, 1, 1, 1, 45, 0, 0, 0]
    four = item_blocks(np.ones(8), 4)
    assert list(four) == [0, 2, 4, 6, 8]
    few = item_blocks(np.ones(2), 4)  # more blocks than items: some blocks are empty
    assert len(few) == 5 and few[0] == 0 and few[-1] == 2 and np.all(np.diff(few) >= 0)
    assert sorted(np.diff(few)) == [0, 0, 1, 1]


def test_sgd_recovers_a_rank_one_matrix_with_one_and_two_workers(sc):
    rng = np.random.default_rng(1)
    x, y = rng.uniform(0.5, 2.0, 25), rng.uniform(0.5, 2.0, 20)
    users, items = np.meshgrid(np.arange(25), np.arange(20), indexing="ij")
    users, items = users.ravel(), items.ravel()
    ratings = x[users] * y[items]
    for workers in (1, 2):
        w, h, its, _, _ = fit_sgd(sc, users, items, ratings, 25, 20, rank=1, lam=0.0, iters=60, workers=workers,
                                  step=0.1, nonnegative=True)
        assert np.allclose(w @ h.T, np.outer(x, y), rtol=1e-3), workers
        assert its[-1]["train_rmse"] < 1e-3 * its[0]["train_rmse"]
        assert (w >= 0).all() and (h >= 0).all()


def test_sgd_divergence_is_reported_with_the_step_size(sc, sparse_problem):
    users, items, ratings, nu, ni = sparse_problem
    with pytest.raises(FloatingPointError, match=r"SGD diverged in iteration \d+.*stepSize=50"):
        fit_sgd(sc, users, items, ratings, nu, ni, rank=3, lam=0.05, iters=10, step=50.0)


def test_rating_blocks_and_tuples_load_as_the_same_sorted_triples():
    """A columnar decode hands ``load`` RatingBlocks; with tuples, blocks, or both mixed, in any
    order, a worker's data is the same (a restored state must match it)."""
    import pyarrow as pa

    from pystrads.ml._mf_data import dense_ids

    rng = np.random.default_rng(5)
    users, items = np.array([3, 10, 42, 77], np.int32), np.array([5, 6, 900], np.int32)
    u, i, r = users[rng.integers(0, 4, 200)], items[rng.integers(0, 3, 200)], rng.random(200)
    batch = pa.RecordBatch.from_arrays([pa.array(u.astype(float)), pa.array(i.astype(float)), pa.array(r)],
                                       ["u", "i", "r"])
    (block,) = dense_ids(users, items, batch)
    assert np.array_equal(users[block.users], u) and np.array_equal(items[block.items], i)
    assert np.array_equal(block.ratings, r)
    tuples = list(zip(block.users.tolist(), block.items.tolist(), block.ratings.tolist()))
    want, held = _triples(tuples)
    assert [len(a) for a in held] == [0, 0, 0]
    order = np.lexsort((r, block.items, block.users))
    assert all(np.array_equal(a, b[order]) for a, b in zip(want, block[:3]))
    halves = [RatingBlock(*(a[100:] for a in block[:3])), *tuples[50:100][::-1],
              RatingBlock(*(a[:50] for a in block[:3]))]
    assert all(np.array_equal(a, b) for a, b in zip(_triples(halves)[0], want))
    assert [len(a) for part in _triples([]) for a in part] == [0] * 6

    # a validation flag (4th column) splits the ratings; each part is sorted the same way
    flags = rng.random(200) < 0.3
    batch = pa.RecordBatch.from_arrays([*batch.columns, pa.array(flags)], ["u", "i", "r", "v"])
    (block,) = dense_ids(users, items, batch)
    assert np.array_equal(block.validation, flags)
    train, held = _triples([block])
    for part, keep in ((train, ~flags), (held, flags)):
        order = np.lexsort((r[keep], block.items[keep], block.users[keep]))
        assert all(np.array_equal(a, b[keep][order]) for a, b in zip(part, block[:3]))
    mixed = [(*t, f) for t, f in zip(tuples, flags)]
    assert all(np.array_equal(a, b) for x, y in zip(_triples(mixed), (train, held)) for a, b in zip(x, y))


def test_dense_ids_marks_validation_ratings_of_unknown_users_and_items():
    """Validation ratings whose user or item never trains cannot be predicted (ALS's cold start):
    the decode keeps them with positions -1 (the program counts them, and leaves them out of the
    validation metric); a training rating's ids are always known."""
    import pyarrow as pa

    from pystrads.ml._mf_data import dense_ids

    users, items = np.array([3, 10], np.int32), np.array([5, 6], np.int32)
    u, i = np.array([3, 4, 10, 10, 10]), np.array([5, 5, 7, 6, 6])
    flags = np.array([True, True, True, True, False])
    batch = pa.RecordBatch.from_arrays([pa.array(u.astype(float)), pa.array(i.astype(float)),
                                        pa.array(np.arange(5.0)), pa.array(flags)], ["u", "i", "r", "v"])
    (block,) = dense_ids(users, items, batch)
    assert block.ratings.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert block.validation.tolist() == [True, True, True, True, False]
    assert block.users.tolist() == [0, -1, -1, 1, 1] and block.items.tolist() == [0, -1, -1, 1, 1]  # user 4, item 7
    from pystrads.programs.mf import Ratings, _Validation

    held = block.validation
    scored = _Validation(np.array([0, 1]), Ratings(block.users[held], block.items[held], block.ratings[held]),
                         np.array([2.0, 2.0]))
    assert len(scored) == 2 and scored.unknown == 2 and scored.ratings.tolist() == [0.0, 3.0]



def test_the_shards_block_solve_matches_numpy_with_padding_and_rank_deficient_items():
    """``pull`` solves each item's feature block exactly (Cholesky); features past the rank stay 0,
    and an item whose matrix is singular (regParam 0, fewer ratings than features) gets the
    least-norm solution, as ``numpy.linalg.pinv`` gives it."""
    rng = np.random.default_rng(7)
    n_items, b, rank = 60, 4, 6  # blocks [0, 4) and [4, 6): the second is padded to width 4
    counts = rng.integers(1, 9, n_items).astype(float)
    counts[::3] = 0  # no regularisation for every third item ...
    program = MFProgram(50, n_items, rank, 0.1, counts, 1, 1, False, 0, block_size=b)
    keys = np.concatenate([np.arange(n_items), n_items + np.arange(0, n_items, 2)])
    partials = np.zeros((len(keys), K.packed_width(b)))
    dense = []
    for row, key in enumerate(keys):
        item, f = key % n_items, min(b, rank - (key // n_items) * b)
        x = rng.random((3 if item % 3 == 0 else 9, f))  # ... and only 3 ratings (< 4 features) for them
        gram, rhs = np.zeros((b, b)), np.zeros(b)
        gram[:f, :f], rhs[:f] = x.T @ x, x.T @ rng.random(len(x))
        partials[row] = K.pack(gram[None], rhs[None])[0]
        want = np.zeros(b)
        want[:f] = np.linalg.pinv(gram[:f, :f] + 0.1 * counts[item] * np.eye(f)) @ rhs[:f]
        dense.append(want)
    got = program.pull("item_factors", keys, partials, np.zeros((len(keys), b)))
    np.testing.assert_allclose(got, np.array(dense), rtol=1e-6, atol=1e-9)
    assert np.all(got[n_items:, 2:] == 0.0)  # features 6 and 7 do not exist
