"""Worked examples of the Program API, one per program shape, each with a known answer.

=====================  =================================  ==========================================
shape                  program                            known answer
=====================  =================================  ==========================================
static rotation        :class:`RotationSum`               exact per-key sums of the input
alternating, k-part.   :class:`BlockLeastSquares`         ``numpy.linalg.lstsq``
dynamic, pipelined     :class:`PriorityLasso`             the Lasso optimum (serial CD reference)
data-parallel (SSP)    :class:`DataParallelSGD`           the noise-free least-squares weights
=====================  =================================  ==========================================

plus :class:`CounterProgram` (an additive counter table for atomicity tests)
and :class:`EmptyProgram` (rounds that do nothing: the runtime's own cost).

They are small on purpose; read them as templates.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

import numpy as np

from ..engine.program import Program, Schedule, Table


def _rows_to_arrays(records: Iterable[Any]):
    """(row id, features, target) records -> (ids, matrix, vector)."""
    rows = list(records)
    if not rows:
        return np.zeros(0, np.int64), np.zeros((0, 0)), np.zeros(0)
    ids = np.array([r[0] for r in rows], dtype=np.int64)
    mat = np.array([r[1] for r in rows], dtype=np.float64)
    vec = np.array([r[2] for r in rows], dtype=np.float64)
    return ids, mat, vec


class RotationSum(Program):
    """Static rotation (STRADS LDA's word rotation, k = 1).

    Input records are ``(key, value)`` pairs.  Keys are cut into U blocks; in
    round r worker p owns block (p + r) mod U and does a read-modify-write
    (``get`` then ``put``) of the block's rows, adding its local values.  A
    ``put`` is only correct because no two workers own a block in the same
    round, so after ``iterations`` rotations the table holds exactly
    ``iterations`` times the per-key sums.
    """

    def __init__(self, num_keys: int, iterations: int = 1):
        self.num_keys = int(num_keys)
        self.iterations = int(iterations)

    def tables(self):
        return [Table("sums", self.num_keys, 1, "float64")]

    def _blocks(self, num_workers: int) -> np.ndarray:
        return np.linspace(0, self.num_keys, num_workers + 1).round().astype(np.int64)

    def load(self, ctx, records):
        pairs = list(records)
        keys = np.array([k for k, _ in pairs], dtype=np.int64)
        vals = np.array([v for _, v in pairs], dtype=np.float64)
        local = np.bincount(keys, weights=vals, minlength=self.num_keys)
        return {"local": local, "bounds": self._blocks(ctx.num_workers)}

    def schedule(self, ctx):
        U = ctx.num_workers
        n = ctx.rounds_this_step(self.iterations * U, U)
        return Schedule.per_worker([[(p + r) % U for p in range(U)] for r in range(n)]) if n else None

    def push(self, ctx, data, state, block):
        lo, hi = int(data["bounds"][block]), int(data["bounds"][block + 1])
        table = ctx.table("sums")
        rows = table.read(range(lo, hi))
        rows[:, 0] += data["local"][lo:hi]
        table.write(np.arange(lo, hi), rows)
        ctx.report(updated=hi - lo)
        return state

    def after_step(self, ctx, metrics):
        ctx.record(iteration=(ctx.rounds_done + len(metrics.rounds)) // ctx.num_workers)


class BlockLeastSquares(Program):
    """Alternating / k-partite blocks (STRADS MF's W-then-H; thesis Algorithm 2).

    Minimises ``0.5 ||A x - b||^2`` by block coordinate descent.  Columns are
    given as ``groups`` (k disjoint index arrays); rounds cycle through the
    groups and in each round *every* worker computes, over its own rows, the
    partial sums ``[a_j . r, a_j . a_j]`` of every column j of the group and
    ``contribute``-s them; the shard's ``pull`` sums them and sets
    ``x_j += g_j / G_jj`` next to the rows; ``apply`` then updates each
    worker's residual.  The in-group update is exact when a group's columns
    are orthogonal (as W's or H's rows are independent in MF), so the fit is
    block Gauss-Seidel and converges to ``lstsq``.

    Input records are ``(row id, a_row, b_value)``.
    """

    def __init__(self, num_features: int, groups: Sequence[Sequence[int]], max_sweeps: int = 200,
                 tol: float = 1e-12):
        self.num_features = int(num_features)
        self.groups = [np.asarray(g, dtype=np.int64) for g in groups]
        self.max_sweeps = int(max_sweeps)
        self.tol = float(tol)
        self._last = None

    def tables(self):
        return [Table("x", self.num_features, 1, "float64", contrib_width=2)]

    def load(self, ctx, records):
        _, a, b = _rows_to_arrays(records)
        if a.size == 0:
            a = np.zeros((0, self.num_features))
        return {"a": a, "b": b}

    def init_state(self, ctx, data):
        return {"residual": data["b"].copy(), "x": np.zeros(self.num_features)}

    def schedule(self, ctx):
        k = len(self.groups)
        n = ctx.rounds_this_step(self.max_sweeps * k, k)
        if not n:
            return None
        return Schedule.shared([(ctx.rounds_done + r) % k for r in range(n)])

    def push(self, ctx, data, state, group):
        cols = self.groups[group]
        a = data["a"][:, cols]
        r = state["residual"]
        ctx.report(loss=0.5 * float(r @ r))
        ctx.contribute("x", cols, np.column_stack([a.T @ r, np.einsum("ij,ij->j", a, a)]))
        return state

    def pull(self, table, keys, partials, current):
        g, diag = partials[:, 0], partials[:, 1]
        step = np.divide(g, diag, out=np.zeros_like(g), where=diag > 0)
        return current + step[:, None]

    def apply(self, ctx, data, state, group):
        cols = self.groups[group]
        new = ctx.table("x").read(cols)[:, 0]
        delta = new - state["x"][cols]
        state["x"][cols] = new
        state["residual"] -= data["a"][:, cols] @ delta
        return state

    def after_step(self, ctx, metrics):
        loss = metrics.last("loss")
        ctx.record(objective=loss, sweep=(ctx.rounds_done + len(metrics.rounds)) // len(self.groups))
        if self._last is not None and abs(self._last - loss) <= self.tol * max(1.0, abs(loss)):
            ctx.stop("converged")
        self._last = loss


class PriorityLasso(Program):
    """Dynamic, prioritised, dependency-checked schedule with pipelining (STRADS Lasso).

    Minimises ``0.5 ||A x - b||^2 + lam ||x||_1``.  The driver reads the
    coefficients' priorities ``(delta x_j)^2 + eta`` from the shards, samples
    ``candidates`` coordinates by priority, keeps up to ``coords_per_round``
    whose columns are nearly uncorrelated (``|corr| < rho``), and ships
    ``pipeline_depth`` such rounds per step -- chosen from values up to that
    many rounds stale.  Workers send partial sums, the shard's ``pull``
    soft-thresholds next to the rows, workers update residuals in ``apply``.

    ``correlation`` is the (num_features x num_features) matrix of column
    correlations used by the dependency check (a real program estimates it
    on a row sample).  Table ``x`` has two columns: value and priority.
    """

    def __init__(self, num_features: int, lam: float, correlation: np.ndarray, coords_per_round: int = 2,
                 candidates: int = 8, rho: float = 0.2, pipeline_depth: int = 4, eta: float = 1e-6,
                 max_rounds: int = 5000, tol: float = 1e-14):
        self.num_features = int(num_features)
        self.lam = float(lam)
        self.correlation = np.asarray(correlation, dtype=np.float64)
        self.coords_per_round = int(coords_per_round)
        self.candidates = int(candidates)
        self.rho = float(rho)
        self.pipeline_depth = int(pipeline_depth)
        self.eta = float(eta)
        self.max_rounds = int(max_rounds)
        self.tol = float(tol)
        self._last = None

    def tables(self):
        return [Table("x", self.num_features, 2, "float64", contrib_width=2, fill=1.0)]

    def load(self, ctx, records):
        _, a, b = _rows_to_arrays(records)
        if a.size == 0:
            a = np.zeros((0, self.num_features))
        return {"a": a, "b": b}

    def init_state(self, ctx, data):
        return {"residual": data["b"].copy(), "x": np.zeros(self.num_features)}

    def _pick(self, priority: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        p = priority / priority.sum()
        n = min(self.candidates, int(np.count_nonzero(p)))
        cand = rng.choice(self.num_features, size=n, replace=False, p=p)
        chosen = []
        for j in cand:  # dependency check: skip j if correlated with one already chosen
            if all(abs(self.correlation[j, k]) < self.rho for k in chosen):
                chosen.append(int(j))
            if len(chosen) == self.coords_per_round:
                break
        return np.array(sorted(chosen), dtype=np.int64)

    def schedule(self, ctx):
        if ctx.rounds_done >= self.max_rounds:
            return None
        x = ctx.table("x").read()
        priority = np.maximum(x[:, 1], self.eta)
        rng = np.random.default_rng([ctx.seed, ctx.step])
        n = min(self.pipeline_depth, self.max_rounds - ctx.rounds_done)
        return Schedule.shared([self._pick(priority, rng) for _ in range(n)])

    def push(self, ctx, data, state, coords):
        a = data["a"][:, coords]
        r = state["residual"]
        ctx.report(loss=0.5 * float(r @ r))
        ctx.contribute("x", coords, np.column_stack([a.T @ r, np.einsum("ij,ij->j", a, a)]))
        return state

    def pull(self, table, keys, partials, current):
        g, diag = partials[:, 0], partials[:, 1]
        old = current[:, 0]
        z = g + diag * old
        new = np.where(diag > 0, np.sign(z) * np.maximum(np.abs(z) - self.lam, 0.0) / np.where(diag > 0, diag, 1), 0.0)
        return np.column_stack([new, (new - old) ** 2 + self.eta])

    def apply(self, ctx, data, state, coords):
        new = ctx.table("x").read(coords)[:, 0]
        delta = new - state["x"][coords]
        state["x"][coords] = new
        state["residual"] -= data["a"][:, coords] @ delta
        return state

    def after_step(self, ctx, metrics):
        x = ctx.table("x").read()[:, 0]
        objective = metrics.last("loss") + self.lam * float(np.abs(x).sum())
        ctx.record(objective=objective, updates=(ctx.rounds_done + len(metrics.rounds)))
        if self._last is not None and abs(self._last - objective) <= self.tol * max(1.0, abs(objective)) \
                and float(ctx.table("x").read()[:, 1].max()) <= 2 * self.eta + self.tol:
            ctx.stop("converged")
        self._last = objective


class DataParallelSGD(Program):
    """Data-parallel ("push only", Petuum) with bounded staleness (SSP).

    Least squares by full-batch gradient steps: every round each worker reads
    the whole weight vector (possibly ``staleness`` rounds stale), computes
    its rows' gradient and ``add``-s ``-lr * gradient``.  The schedule is
    empty (``Schedule.data_parallel``).  Input records: ``(row id, a_row, b)``.
    """

    def __init__(self, num_features: int, num_rows: int, lr: float, rounds: int = 300, staleness: int = 2):
        self.num_features = int(num_features)
        self.num_rows = int(num_rows)
        self.lr = float(lr)
        self.rounds = int(rounds)
        self.staleness = int(staleness)

    def tables(self):
        return [Table("w", self.num_features, 1, "float64")]

    def load(self, ctx, records):
        _, a, b = _rows_to_arrays(records)
        if a.size == 0:
            a = np.zeros((0, self.num_features))
        return {"a": a, "b": b}

    def schedule(self, ctx):
        left = self.rounds - ctx.rounds_done
        return Schedule.data_parallel(min(left, max(1, ctx.rounds_hint))) if left > 0 else None

    def push(self, ctx, data, state, work):
        table = ctx.table("w")
        keys = np.arange(self.num_features)
        w = table.read(keys)[:, 0]
        err = data["a"] @ w - data["b"]
        ctx.report(loss=0.5 * float(err @ err))
        table.add(keys, (-self.lr / self.num_rows) * (data["a"].T @ err))
        return state

    def after_step(self, ctx, metrics):
        ctx.record(objective=metrics.last("loss"))


class CounterProgram(Program):
    """An additive counter table: in round r worker p adds ``(p + 1) * (r + 1)``
    to counter ``(p + r) mod num_keys`` and 1 to counter ``num_keys`` (a round
    count).  The final table is a closed form of the rounds run, so any lost
    or doubled update shows."""

    def __init__(self, num_keys: int = 16, rounds_per_step: int = 10, steps: int = 3):
        self.num_keys = int(num_keys)
        self.rounds_per_step = int(rounds_per_step)
        self.steps = int(steps)

    def tables(self):
        return [Table("counter", self.num_keys + 1, 1, "int64")]

    def load(self, ctx, records):
        return sum(1 for _ in records)

    def init_state(self, ctx, data):
        ctx.table("counter").add([self.num_keys], [[1]])
        return 0

    def schedule(self, ctx):
        if ctx.step > self.steps:
            return None
        return Schedule.data_parallel(self.rounds_per_step)

    def push(self, ctx, data, state, work):
        key = (ctx.worker + ctx.round) % self.num_keys
        ctx.table("counter").add([key, self.num_keys], [[(ctx.worker + 1) * (ctx.round + 1)], [1]])
        return state + 1

    def expected(self, num_workers: int) -> np.ndarray:
        out = np.zeros(self.num_keys + 1, dtype=np.int64)
        out[self.num_keys] = num_workers
        for r in range(self.rounds_per_step * self.steps):
            for p in range(num_workers):
                out[(p + r) % self.num_keys] += (p + 1) * (r + 1)
                out[self.num_keys] += 1
        return out


class EmptyProgram(Program):
    """Rounds that do nothing: measures the runtime's per-round cost."""

    def __init__(self, rounds: int = 1000, rounds_per_step: Optional[int] = None):
        self.rounds = int(rounds)
        self.rounds_per_step = rounds_per_step

    def load(self, ctx, records):
        return sum(1 for _ in records)

    def schedule(self, ctx):
        left = self.rounds - ctx.rounds_done
        if left <= 0:
            return None
        n = self.rounds_per_step or ctx.rounds_hint
        return Schedule.data_parallel(min(left, n))

    def push(self, ctx, data, state, work):
        return state


class EveryRoundProgram(Program):
    """A scheduler that decides every round from fresh values: each step is one round whose
    work item (a row of table ``score``) the driver picks after reading the whole table --
    the shape of STRADS's dynamic schedules with the scheduler kept in the loop.  Each
    worker holds ``block_bytes`` of immutable data (to show the per-round cost does not
    depend on it) and adds 1 to the picked row.  Measures the runtime's per-step cost."""

    def __init__(self, rounds: int = 200, num_rows: int = 64, block_bytes: int = 1 << 20):
        self.rounds = int(rounds)
        self.num_rows = int(num_rows)
        self.block_bytes = int(block_bytes)

    def tables(self):
        return [Table("score", self.num_rows, 1)]

    def load(self, ctx, records):
        list(records)
        return np.full(max(1, self.block_bytes // 8), float(ctx.worker))

    def init_state(self, ctx, data):
        return 0

    def schedule(self, ctx):
        if ctx.rounds_done >= self.rounds:
            return None
        score = ctx.table("score").read()[:, 0]
        return Schedule.shared([int(np.argmin(score))])  # the least-visited row next

    def push(self, ctx, data, state, work):
        ctx.table("score").add([work], [[1.0]])
        return state + 1


# ---------------------------------------------------------------------------- problem generators
def orthogonal_groups_problem(num_rows: int = 400, num_groups: int = 3, group_size: int = 4, seed: int = 0):
    """A least-squares problem whose columns come in groups that are orthogonal
    within a group (the structure that makes a group's update exact).

    Returns ``(a, b, groups)``.
    """
    rng = np.random.default_rng(seed)
    blocks = []
    for _ in range(num_groups):
        q, _ = np.linalg.qr(rng.standard_normal((num_rows, group_size)))
        blocks.append(q * rng.uniform(0.5, 2.0, group_size))
    a = np.hstack(blocks)
    b = a @ rng.standard_normal(a.shape[1]) + 0.1 * rng.standard_normal(num_rows)
    groups = [list(range(g * group_size, (g + 1) * group_size)) for g in range(num_groups)]
    return a, b, groups


def lasso_reference(a: np.ndarray, b: np.ndarray, lam: float, sweeps: int = 20000, tol: float = 1e-15) -> np.ndarray:
    """Serial cyclic coordinate descent for ``0.5||Ax-b||^2 + lam||x||_1`` (a plain reference)."""
    x = np.zeros(a.shape[1])
    r = b.copy()
    norms = (a * a).sum(axis=0)
    for _ in range(sweeps):
        biggest = 0.0
        for j in range(a.shape[1]):
            if norms[j] == 0:
                continue
            z = a[:, j] @ r + norms[j] * x[j]
            new = np.sign(z) * max(abs(z) - lam, 0.0) / norms[j]
            if new != x[j]:
                r -= a[:, j] * (new - x[j])
                biggest = max(biggest, abs(new - x[j]))
                x[j] = new
        if biggest < tol:
            break
    return x


def as_records(a: np.ndarray, b: np.ndarray):
    """``(row id, row, target)`` records as the example programs read them."""
    return [(i, a[i].tolist(), float(b[i])) for i in range(len(b))]
