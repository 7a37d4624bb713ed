"""Serial mode (``spark.pystrads.debug.serial``): one worker runs every round's work in schedule
order, each part of a round (``Program.serial_rounds``) committed before the next, so a program
author can compare a parallel program with its serial execution.  Each shipped program's parallel
run agrees with its serial run to the program's tolerance; a parallel program that is wrong (it
updates correlated coordinates together with no damping) disagrees with its serial run."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from pyspark import cloudpickle

from pystrads.datasets.synthetic import strads_lasso_problem
from pystrads.engine import Engine, Program, Schedule, Table
from pystrads.programs._rows import ColumnSample
from pystrads.programs.lasso import LassoProgram
from pystrads.programs.logistic import L1LogisticProgram
from pystrads.programs.multinomial import MultinomialProgram

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the test's program travels by value

SERIAL = {"debug.serial": True}


def rounds_run(result) -> int:
    return int(sum(row["rounds"] for row in result.summary.rows))


class JacobiLeastSquares(Program):
    """``min ||A x - b||^2`` with every coordinate's exact step taken at once from the same
    residual (Jacobi): a parallel program that diverges where the columns correlate, because
    the steps ignore each other.  Serial mode runs it one coordinate a round (Gauss-Seidel)."""

    def __init__(self, num_features: int, sweeps: int):
        self.num_features, self.sweeps = int(num_features), int(sweeps)

    def tables(self):
        return [Table("x", self.num_features, 1, "float64", contrib_width=2)]

    def load(self, ctx, records):
        rows = sorted(records, key=lambda r: r[0])
        a = np.array([r[1] for r in rows]).reshape(-1, self.num_features)
        return {"a": a, "b": np.array([r[2] for r in rows], dtype=np.float64)}

    def init_state(self, ctx, data):
        return {"residual": data["b"].copy(), "x": np.zeros(self.num_features)}

    def schedule(self, ctx):
        n = ctx.rounds_this_step(self.sweeps, 1)
        return Schedule.shared([np.arange(self.num_features)] * n) if n else None

    def serial_rounds(self, cols):
        return [cols[i:i + 1] for i in range(len(cols))]

    def push(self, ctx, data, state, cols):
        a, r = data["a"][:, cols], state["residual"]
        ctx.report(loss=float(r @ r))
        ctx.contribute("x", cols, np.column_stack([a.T @ r, (a * a).sum(axis=0)]))
        return state

    def pull(self, table, keys, partials, current):
        return current + (partials[:, 0] / partials[:, 1])[:, None]

    def apply(self, ctx, data, state, cols):
        new = ctx.table("x").read(cols)[:, 0]
        state["residual"] -= data["a"][:, cols] @ (new - state["x"][cols])
        state["x"][cols] = new
        return state


def test_a_wrong_parallel_program_disagrees_with_its_serial_run(sc):
    rng = np.random.default_rng(0)
    n, d = 200, 6
    base = rng.standard_normal((n, 1))
    a = 0.7 * base + 0.5 * rng.standard_normal((n, d))  # correlated columns (about 0.66)
    b = a @ rng.standard_normal(d) + 0.01 * rng.standard_normal(n)
    rdd = sc.parallelize([(i, a[i].tolist(), float(b[i])) for i in range(n)], 2)
    best = np.linalg.lstsq(a, b, rcond=None)[0]
    got = {}
    for name, config in (("parallel", None), ("serial", SERIAL)):
        program = JacobiLeastSquares(d, sweeps=60)
        with Engine(program, rdd, num_workers=2, seed=1, config=config).fit() as res:
            got[name] = res.read_table("x")[:, 0]
            assert res.engine.num_workers == (1 if config else 2)
            assert rounds_run(res) == 60 * (d if config else 1)  # serial: one coordinate a round
    np.testing.assert_allclose(got["serial"], best, rtol=1e-6, atol=1e-6)  # Gauss-Seidel converges
    assert not np.allclose(got["parallel"], best, rtol=1e-2, atol=1e-2)  # Jacobi does not


@pytest.fixture(scope="module")
def small(sc):
    p = strads_lasso_problem(300, 120, nnz_per_col=20, seed=4)
    rows = list(p.rows())
    return p, rows, ColumnSample([(i, v) for _, i, v in rows], 120)


@pytest.mark.parametrize("cls", [LassoProgram, pytest.param(L1LogisticProgram, marks=pytest.mark.slow), MultinomialProgram])
def test_the_linear_programs_agree_with_their_serial_runs(sc, small, cls):
    """Parallel rounds (L = 32, dependency check off) and one coefficient (a feature's K
    coefficients) a round reach the same optimum: the programs' tolerance."""
    p, rows, sample = small
    cut = np.quantile(p.y, [1 / 3, 2 / 3])
    label = {LassoProgram: lambda y: y, L1LogisticProgram: lambda y: float(y > cut[0]),
             MultinomialProgram: lambda y: float(np.searchsorted(cut, y))}[cls]
    rdd = sc.parallelize([(label(y), 1.0, i, v) for y, i, v in rows], 2)
    extra = {"num_classes": 3} if cls is MultinomialProgram else {}
    reg = 0.05 if cls is MultinomialProgram else 0.02  # (a serial unit of the multinomial: two ticks)
    results = {}
    for name, config in (("parallel", None), ("serial", SERIAL)):
        program = cls(120, reg, coords_per_round=32, candidates_per_round=64, rho=1.0, tol=1e-10, max_iter=200,
                      gram_limit=0, sample=sample, **extra)
        with Engine(program, rdd, num_workers=2, seed=1, config=config).fit() as res:
            results[name] = (program.driver_state["objective"], rounds_run(res), program.driver_state["updates"])
    (f_par, r_par, u_par), (f_ser, r_ser, u_ser) = results["parallel"], results["serial"]
    unit = 3 if cls is MultinomialProgram else 1
    assert r_ser >= u_ser // unit  # serial: a round per coefficient (per feature's K coefficients)
    assert u_par // unit > 1.5 * r_par / (2 if cls is MultinomialProgram else 1)  # parallel: several a round
    assert abs(f_par - f_ser) <= 1e-7 * abs(f_ser), (f_par, f_ser)


def test_mf_and_lda_agree_with_their_serial_runs(sc):
    """StradsMF's coordinate descent (a round updates independent rows) gives the same factors on
    one worker; StradsLDA's rotation on one worker is serial collapsed Gibbs, and its chain
    reaches the parallel chains' likelihood (the program's tolerance: a sampler's, 1 %)."""
    from pystrads.programs.lda import LDAProgram
    from pystrads.programs.mf import MFProgram
    from pystrads.ps.partition import range_bounds

    rng = np.random.default_rng(2)
    n_users, n_items, rank = 60, 40, 3
    users, items = rng.integers(0, n_users, 900), rng.integers(0, n_items, 900)
    ratings = (rng.standard_normal((n_users, rank)) @ rng.standard_normal((rank, n_items)))[users, items]
    rdd = sc.parallelize(list(zip(users.tolist(), items.tolist(), ratings.tolist())), 2) \
        .keyBy(lambda t: t[0]).partitionBy(2).values()
    factors = []
    for config in (None, SERIAL):
        program = MFProgram(n_users, n_items, rank, 0.05, np.bincount(items, minlength=n_items), 6, 2, seed=5)
        with Engine(program, rdd, seed=5, config=config).fit() as res:
            factors.append(program.item_matrix(res.read_table("item_factors")))
            assert res.engine.num_workers == (1 if config else 2)
    assert np.abs(factors[0]).max() > 0.1
    np.testing.assert_allclose(factors[1], factors[0], rtol=1e-9, atol=1e-9)

    vocab, k = 300, 5
    phi = rng.dirichlet(np.full(vocab, 0.05), size=k)
    docs = []
    for d in range(240):
        z = rng.choice(k, size=50, p=rng.dirichlet(np.full(k, 0.2)))
        words, counts = np.unique([rng.choice(vocab, p=phi[t]) for t in z], return_counts=True)
        docs.append((d, words, counts))
    weights = np.zeros(vocab)
    for _, w, c in docs:
        np.add.at(weights, w, c)
    likelihood = []
    for workers, config in ((2, None), (1, SERIAL)):
        program = LDAProgram(num_topics=k, vocab_size=vocab, num_workers=workers,
                             block_bounds=range_bounds(vocab, workers, weights), alpha=0.5, beta=0.1, max_iter=40,
                             sampler="fplus", seed=3, word_weights=weights)
        with Engine(program, sc.parallelize(docs, 2), seed=1, config=config).fit() as res:
            assert res.read_table("word_topic").sum() == weights.sum()  # the counts stay exact
            its = res.summary.iterations
            assert its[-1]["log_likelihood"] > its[0]["log_likelihood"] + 0.05 * abs(its[0]["log_likelihood"])
            likelihood.append(its[-1]["log_likelihood"])
    assert abs(likelihood[1] - likelihood[0]) <= 0.01 * abs(likelihood[0]), likelihood
