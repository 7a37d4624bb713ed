"""Matrix factorisation: coordinate descent with W/H alternation (STRADS MF, CCD++ / feature
blocks; :class:`MFProgram`) and SGD with block rotation (:class:`MFSGDProgram`).

Minimises, like ALS with explicit ratings::

    sum_(i,j) (a_ij - w_i . h_j)^2 + lambda * (sum_i n_i |w_i|^2 + sum_j m_j |h_j|^2)

(``n_i``, ``m_j``: ratings of user i, item j -- ALS's regularisation scaling).

Data: ratings partitioned by user, so each worker owns whole users and its
rows of W stay local (state); H lives on the shards as a block-major table
``item_factors`` (``num_blocks * num_items`` rows of ``block_size`` features:
row ``c * num_items + j`` holds item j's features of block c), so one block
of features of all items is a contiguous range.

Schedule (shared, ``num_blocks * inner_iterations`` rounds per iteration):
round (c, t) updates feature block c (``block_size`` 1 is CCD++'s one
feature).  ``push``: every worker sums, over its ratings of each item, the
block's normal equations (``b(b+1)/2 + b`` numbers per item: the Gram's packed lower triangle) and contributes
them; the shard's ``pull`` solves each item's block system with ALS's
regularisation next to the rows (the supplement's aggregation of partial
sums -- exact, no parallelisation error, since items are independent given
W).  ``apply``: with the committed block of H each worker solves its users'
block locally (exact for the same reason) and, after the block's last inner
iteration, its residuals.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import numpy as np

from ..engine.program import Program, Schedule, Table
from ..engine.program.stopping import EarlyStopping
from ..errors import InputError


def over_ranges(ctx, sizes, fn) -> None:
    """``fn(lo, hi)`` for the worker's groups cut by ``ctx.split(sizes)`` (a count, or a CSR
    pointer such as ratings per user), one range per thread: the kernels are ``nogil`` and each
    range writes its own rows (its users' / items' outputs, its ratings' residuals)."""
    ctx.parallel(lambda r: fn(r.start, r.stop), ctx.split(sizes))


def hash_uniform(ids: np.ndarray, column: int, seed: int) -> np.ndarray:
    """Uniform [0, 1) numbers that depend only on (seed, id, column): factor
    initialisation independent of how rows are partitioned."""
    mask = (1 << 64) - 1
    offset = np.uint64((column * 0xBF58476D1CE4E5B9 + seed * 0x94D049BB133111EB) & mask)
    with np.errstate(over="ignore"):  # splitmix64: arithmetic modulo 2^64 on purpose
        x = np.asarray(ids, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + offset
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)


class RatingBlock(NamedTuple):
    """Many ``(user, item, rating)`` records at once, as three equal-length arrays: what a
    columnar decode (``Engine(decode_batch=...)``) hands the MF programs instead of a tuple per
    rating; ``validation`` (bool, optional) marks the ratings held out for validation."""

    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray
    validation: Optional[np.ndarray] = None


class Ratings(NamedTuple):
    """A worker's ratings as arrays sorted by (user, item, rating)."""

    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray


def _triples(records):
    """(user, item, rating[, validation]) records (tuples or :class:`RatingBlock` s) as
    ``(training, validation)`` :class:`Ratings`, each sorted by (user, item, rating): a worker's
    data (and the per-rating arrays of its state) must not depend on the order a recomputed
    partition delivers its records in (a shuffle does not keep it), or a restored state would not
    match it."""
    us, its, rs, vs, rows = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0)], [np.zeros(0, bool)], []
    for rec in records:
        if isinstance(rec, RatingBlock):
            us.append(np.asarray(rec.users, dtype=np.int64))
            its.append(np.asarray(rec.items, dtype=np.int64))
            rs.append(np.asarray(rec.ratings, dtype=np.float64))
            vs.append(np.zeros(len(rs[-1]), bool) if rec.validation is None else np.asarray(rec.validation, bool))
        else:
            rows.append(rec)
    if rows:
        us.append(np.fromiter((t[0] for t in rows), dtype=np.int64, count=len(rows)))
        its.append(np.fromiter((t[1] for t in rows), dtype=np.int64, count=len(rows)))
        rs.append(np.fromiter((t[2] for t in rows), dtype=np.float64, count=len(rows)))
        vs.append(np.fromiter((len(t) > 3 and bool(t[3]) for t in rows), dtype=bool, count=len(rows)))
    del rows
    raw_u, raw_i, ratings, held = np.concatenate(us), np.concatenate(its), np.concatenate(rs), np.concatenate(vs)
    del us, its, rs, vs
    order = np.lexsort((ratings, raw_i, raw_u, held))  # training first, then validation
    split = int(len(held) - held.sum())
    train, valid = order[:split], order[split:]
    return (Ratings(raw_u[train], raw_i[train], ratings[train]),
            Ratings(raw_u[valid], raw_i[valid], ratings[valid]))


class _Validation:
    """A worker's validation ratings whose user trains on this worker and whose item has training
    ratings (the others cannot be predicted: ALS's cold start): the users as local positions, the
    items as ids."""

    def __init__(self, users: np.ndarray, held: Ratings, item_counts: Optional[np.ndarray]):
        position = np.searchsorted(users, held.users)
        known = (position < len(users)) & (users[np.minimum(position, max(len(users) - 1, 0))] == held.users) \
            if len(users) else np.zeros(len(held.users), bool)
        known &= (held.users >= 0) & (held.items >= 0)  # -1: an id without training ratings (cold start)
        if item_counts is not None:  # None: every item of the model can be predicted
            known[known] &= item_counts[held.items[known]] > 0
        self.users = position[known].astype(np.int64)
        self.items = held.items[known].astype(np.int64)
        self.ratings = held.ratings[known]
        self.unknown = int(len(known) - known.sum())

    def __len__(self) -> int:
        return len(self.ratings)

    def report(self, ctx, w: np.ndarray, h: np.ndarray) -> None:
        """Report ``val_sse`` and ``val_n`` of predictions ``w[users] . h`` (``h``: the items' rows)."""
        errors = self.ratings - np.einsum("nk,nk->n", w[self.users], h)
        ctx.report(val_sse=float(errors @ errors), val_n=float(len(errors)))


def validation_summary(data) -> Optional[dict]:
    """A worker's ``data_summary``: how many of its validation ratings can be scored, and how many
    cannot (cold start: a user or an item without training ratings)."""
    held = getattr(data, "validation", None)
    return None if held is None else {"scored": len(held), "cold_start": held.unknown}


def check_validation(early_stopping, summaries) -> None:
    """Refuse a fit with early stopping whose validation set has no rating that can be scored:
    none marked at all, or every one cold start (the validation metric would be NaN at every
    iteration, so the fit would stop early for nothing)."""
    if early_stopping is None:
        return
    scored = sum(s["scored"] for s in summaries if s)
    cold = sum(s["cold_start"] for s in summaries if s)
    source = early_stopping.source or "the validation indicator"
    if scored == 0 and cold == 0:
        raise InputError(f"{source} marks no rating for validation (every value is false or null); early "
                         "stopping needs validation ratings: mark some true, or unset it to train without one")
    if scored == 0:
        raise InputError(f"{source}: none of its {cold} validation ratings can be scored, every one is a cold "
                         "start (its user or item has no training rating); hold out ratings of users and items "
                         "that also have training ratings (e.g. split each user's ratings), or unset it")


def validation_fields(ctx, early_stopping, iteration: int, values) -> dict:
    """An iteration's ``validation_rmse`` (for its history row) from the round metrics that carry
    its ``val_sse`` / ``val_n``, after applying the stop rule to it (which may stop the fit); no
    fields without a validation set.  NaN when no validation rating could be predicted."""
    if early_stopping is None or "val_n" not in values:
        return {}
    n = values["val_n"]
    rmse = float(np.sqrt(values["val_sse"] / n)) if n else float("nan")
    early_stopping.observe(ctx, iteration, rmse)
    return {"validation_rmse": rmse}


def rounds_next_step(ctx, early_stopping, total: int, per: int) -> int:
    """Rounds of the next step of a program that runs ``total`` rounds in iterations of ``per``:
    ``ctx.rounds_this_step``, one iteration at most while a stop rule can end the fit (so that it
    ends right after the iteration that decides)."""
    n = ctx.rounds_this_step(total, per)
    return min(n, per) if early_stopping is not None and early_stopping.stops else n


class _MFData:
    """A worker's ratings with dense local ids, indexed by user (CSR) and by item (CSC); the
    programs add ``user_reg`` (and their own per-rating arrays)."""

    def __init__(self, train: Ratings):
        from ..kernels.mf import build_index

        raw_u, raw_i, self.ratings = train
        self.users, rating_user = np.unique(raw_u, return_inverse=True)
        self.items, rating_item = np.unique(raw_i, return_inverse=True)
        self.rating_user = rating_user.astype(np.int32)
        self.rating_item = rating_item.astype(np.int32)
        self.user_ptr, self.user_ratings = build_index(self.rating_user, len(self.users))
        self.item_ptr, self.item_ratings = build_index(self.rating_item, len(self.items))
        self.user_reg = None
        self.validation: Optional[_Validation] = None


class _MFState:
    def __init__(self, w, residual):
        self.w = w  # (local users, rank)
        self.residual = residual  # a - w.h for every local rating
        self.rhat = residual.copy()  # residual with the current feature added back
        self.u = np.zeros((w.shape[0], 1))  # W of the current feature block (local users x b)
        self.v = None  # H of the current feature block at the local items


class MFProgram(Program):
    """CCD++ matrix factorisation on the Program API (see the module docstring).

    Parameters
    ----------
    num_users, num_items : int
        Ids are ``0 .. num_users-1`` and ``0 .. num_items-1``.
    rank : int
    reg_param : float
        lambda, scaled by each user's / item's number of ratings (as ALS) unless ``scale_reg`` is False.
    item_counts : array (num_items,)
        Ratings per item (m_j).
    max_iter : int
        Outer iterations (each updates every feature ``inner_iterations`` times).
    inner_iterations : int
        CCD++ alternations per feature.
    nonnegative : bool
        Project every coordinate update onto >= 0.
    seed : int
    block_size : int
        Features per block (exact block solves; 1 = CCD++).
    early_stopping : EarlyStopping, optional
        The stop rule on the validation RMSE (records marked ``validation``): computed after every
        iteration, recorded as ``validation_rmse``.
    scale_reg : bool
        True: ``lambda n_u |w_u|^2 + lambda m_j |h_j|^2`` (ALS-WR, Spark's ALS); False: ``lambda``
        alone on every row (the ``implicit`` library's and Hu, Koren & Volinsky's form).
    """

    def __init__(self, num_users: int, num_items: int, rank: int, reg_param: float, item_counts,
                 max_iter: int = 10, inner_iterations: int = 3, nonnegative: bool = False, seed: int = 0,
                 block_size: int = 1, early_stopping: Optional[EarlyStopping] = None, scale_reg: bool = True):
        self.num_users = int(num_users)
        self.num_items = int(num_items)
        self.rank = int(rank)
        self.reg_param = float(reg_param)
        self.item_counts = np.asarray(item_counts, dtype=np.float64)
        self.max_iter = int(max_iter)
        self.inner_iterations = int(inner_iterations)
        self.nonnegative = bool(nonnegative)
        self.seed = int(seed)
        self.num_ratings = float(self.item_counts.sum())
        self.block_size = max(1, min(int(block_size), self.rank))
        if self.nonnegative and self.block_size > 1:
            raise ValueError("nonnegative factors need block_size=1 (exact projected coordinate updates)")
        self.num_blocks = -(-self.rank // self.block_size)
        self.early_stopping = early_stopping
        self.scale_reg = bool(scale_reg)

    def reg_weights(self, counts: np.ndarray) -> np.ndarray:
        """lambda per row with ``counts`` observations: ``lambda * counts`` (ALS's scaling) or lambda."""
        counts = np.asarray(counts, dtype=np.float64)
        return self.reg_param * (counts if self.scale_reg else np.ones_like(counts))

    def __repr__(self) -> str:
        return (f"MFProgram(users={self.num_users}, items={self.num_items}, rank={self.rank}, "
                f"regParam={self.reg_param}, iterations={self.max_iter}, inner={self.inner_iterations}, "
                f"block={self.block_size}, nonnegative={self.nonnegative}"
                + ("" if self.scale_reg else ", regParam unscaled") + ")")

    @property
    def rounds_per_iteration(self) -> int:
        return self.num_blocks * self.inner_iterations

    def tables(self):
        b = self.block_size
        packed = b * (b + 1) // 2 + b  # a block's packed Gram and right-hand side (kernels/mf.py: packed_width)
        return [Table("item_factors", self.num_blocks * self.num_items, b, "float64", contrib_width=packed)]

    def item_matrix(self, table: np.ndarray) -> np.ndarray:
        """The ``item_factors`` table (block-major rows, ``block_size`` wide) as (num_items, rank)."""
        b, n = self.block_size, self.num_items
        h = np.asarray(table).reshape(self.num_blocks, n, b).transpose(1, 0, 2).reshape(n, self.num_blocks * b)
        return np.ascontiguousarray(h[:, :self.rank])

    def item_rows(self, table, lo: int, hi: int) -> np.ndarray:
        """Items ``[lo, hi)`` as (hi - lo, rank), read from the ``item_factors`` table handle
        (one range per feature block)."""
        n = self.num_items
        return np.hstack([table.read(range(c * n + lo, c * n + hi)) for c in range(self.num_blocks)])[:, :self.rank]

    def item_rows_at(self, table, items: np.ndarray) -> np.ndarray:
        """The rows of ``items`` (ids, any order, repeats allowed) as (len(items), rank), read from
        the ``item_factors`` table handle in one request."""
        distinct, where = np.unique(items, return_inverse=True)
        keys = (np.arange(self.num_blocks, dtype=np.int64)[:, None] * self.num_items + distinct[None, :]).ravel()
        rows = np.asarray(table.read(keys)).reshape(self.num_blocks, len(distinct), self.block_size)
        return rows.transpose(1, 0, 2).reshape(len(distinct), -1)[where, :self.rank]

    def _features(self, block: int):
        lo = block * self.block_size
        return lo, min(self.rank, lo + self.block_size)

    def data_summary(self, ctx, data) -> Optional[dict]:
        return validation_summary(data)

    def check_data(self, summaries) -> None:
        check_validation(self.early_stopping, summaries)

    # ------------------------------------------------------------------ worker side
    def load(self, ctx, records) -> _MFData:
        train, held = _triples(records)
        data = _MFData(train)
        data.user_reg = self.reg_weights(np.diff(data.user_ptr))
        if self.early_stopping is not None:
            data.validation = _Validation(data.users, held, self.item_counts)
        return data

    def init_state(self, ctx, data: _MFData) -> _MFState:
        scale = 1.0 / np.sqrt(self.rank)
        w = np.empty((len(data.users), self.rank))
        for k in range(self.rank):
            w[:, k] = hash_uniform(data.users, k, self.seed) * scale
        if not self.nonnegative:
            w -= 0.5 * scale
        return _MFState(w, data.ratings.copy())  # H starts at 0, so the residual is the rating

    def _block(self, ctx, data: _MFData, block: int) -> np.ndarray:
        """H of feature block ``block`` at the local items, (local items, features in the block)."""
        start = block * self.num_items
        lo, hi = self._features(block)
        rows = ctx.table("item_factors").read(range(start, start + self.num_items), copy=False)
        return np.ascontiguousarray(rows[data.items, :hi - lo])

    def push(self, ctx, data: _MFData, state: _MFState, work) -> _MFState:
        from ..kernels import mf as K

        c, t = work
        lo, hi = self._features(c)
        if t == 0:  # add feature block c back into the residual
            state.v = self._block(ctx, data, c)
            state.u = np.ascontiguousarray(state.w[:, lo:hi])
            over_ranges(ctx, len(state.residual), lambda a, b: K.add_block(
                state.residual[a:b], data.rating_user[a:b], data.rating_item[a:b], state.u, state.v, 1.0,
                state.rhat[a:b]))
        be = hi - lo
        partials = np.empty((len(data.items), K.packed_width(be)))
        over_ranges(ctx, data.item_ptr, lambda a, b: K.item_block_partials(
            data.item_ptr[a:b + 1], data.item_ratings, data.rating_user, state.rhat, state.u, partials[a:b]))
        if len(data.items):  # apply reads the solved rows of these items: they come back with the tick
            ctx.contribute("item_factors", c * self.num_items + data.items, self._pad(partials, be), read_back=True)
        return state

    def _pad(self, partials: np.ndarray, be: int) -> np.ndarray:
        """Partial sums of a block of ``be`` features (packed: kernels/mf.py) at the table's
        contribution width: the last block of a rank that the block size does not divide is narrower
        (its packed triangle is the first part of a wider one's)."""
        from ..kernels import mf as K

        b = self.block_size
        if be == b:
            return partials
        tri, wide = be * (be + 1) // 2, b * (b + 1) // 2
        padded = np.zeros((len(partials), K.packed_width(b)))
        padded[:, :tri] = partials[:, :tri]
        padded[:, wide:wide + be] = partials[:, tri:]
        return padded

    def pull(self, table, keys, partials, current):
        from ..kernels import mf as K

        b, n = self.block_size, self.num_items
        reg = self.reg_weights(self.item_counts[keys % n])
        features = np.clip(self.rank - (keys // n) * b, 0, b).astype(np.int64)  # features past the rank stay 0
        new = np.empty((len(keys), b))
        ok = K.solve_item_blocks(np.ascontiguousarray(partials, dtype=np.float64), reg, features, new)
        if not ok.all():  # regParam 0 and a rank-deficient item: the least-norm solution
            bad = ~ok
            new[bad] = self._least_norm(partials[bad], reg[bad], features[bad])
        if self.nonnegative:
            new = np.maximum(new, 0.0)
        return new

    def _least_norm(self, partials: np.ndarray, reg: np.ndarray, features: np.ndarray) -> np.ndarray:
        """``pinv(G + reg I) rhs`` per row, over each row's first ``features`` features (0 beyond)."""
        from ..kernels import mf as K

        b = self.block_size
        gram, rhs = K.unpack(partials, b)
        diag = np.arange(b)
        padding = diag[None, :] >= features[:, None]
        gram[:, diag, diag] += reg[:, None] + padding
        rhs[padding] = 0.0
        return np.einsum("nij,nj->ni", np.linalg.pinv(gram), rhs)

    def apply(self, ctx, data: _MFData, state: _MFState, work) -> _MFState:
        from ..kernels import mf as K

        c, t = work
        lo, hi = self._features(c)
        if len(data.items):
            state.v = np.ascontiguousarray(ctx.pulled("item_factors")[:, :hi - lo])
        else:
            state.v = self._block(ctx, data, c)
        over_ranges(ctx, data.user_ptr, lambda a, b: K.user_block_update(
            data.user_ptr[a:b + 1], data.user_ratings, data.rating_item, state.rhat, state.v, data.user_reg[a:b],
            state.u[a:b]))
        if self.nonnegative:
            np.maximum(state.u, 0.0, out=state.u)
        if t == self.inner_iterations - 1:
            over_ranges(ctx, len(state.rhat), lambda a, b: K.add_block(
                state.rhat[a:b], data.rating_user[a:b], data.rating_item[a:b], state.u, state.v, -1.0,
                state.residual[a:b]))
            state.w[:, lo:hi] = state.u
            if c == self.num_blocks - 1:  # an outer iteration ends: report the training error
                ctx.report(sse=K.squared_error(state.residual),
                           w_reg=float((data.user_reg[:, None] * state.w ** 2).sum()))
                if data.validation is not None:  # and the validation error: every block is committed now
                    h = self.item_rows_at(ctx.table("item_factors"), data.validation.items) \
                        if len(data.validation) else np.zeros((0, self.rank))
                    data.validation.report(ctx, state.w, h)
        return state

    # ------------------------------------------------------------------ driver side
    def schedule(self, ctx) -> Optional[Schedule]:
        per = self.rounds_per_iteration
        n = rounds_next_step(ctx, self.early_stopping, per * self.max_iter, per)
        if not n:
            return None
        T = self.inner_iterations
        return Schedule.shared([divmod(r % per, T) for r in range(ctx.rounds_done, ctx.rounds_done + n)])

    def after_step(self, ctx, metrics) -> None:
        per = self.rounds_per_iteration
        shown = {}
        for r, values in enumerate(metrics.rounds):
            if "sse" in values and (ctx.rounds_done + r + 1) % per == 0:
                iteration = (ctx.rounds_done + r + 1) // per
                shown = dict(train_rmse=float(np.sqrt(values["sse"] / max(self.num_ratings, 1.0))),
                             **validation_fields(ctx, self.early_stopping, iteration, values))
                ctx.record_row(iteration=iteration, step=ctx.step, sse=values["sse"], w_reg=values.get("w_reg", 0.0),
                               **shown)
        ctx.record(iteration=(ctx.rounds_done + len(metrics.rounds)) // per)
        ctx.progress((ctx.rounds_done + len(metrics.rounds)) // per, self.max_iter, "iteration", **shown)


def _sgd_initial_factors(rank: int, seed: int, salt: int, ids: np.ndarray) -> np.ndarray:
    """SGD's starting factors: uniform on [0, 2/sqrt(rank)) per (id, feature), so a first
    prediction is about 1 whatever the rank; hashed, hence independent of partitioning."""
    out = np.empty((len(ids), rank))
    for k in range(rank):
        out[:, k] = hash_uniform(ids, k + salt * rank, seed)
    out *= 2.0 / np.sqrt(rank)
    return out


def _sgd_item_rows(rank: int, seed: int, row_start: int, row_stop: int) -> np.ndarray:
    """Table initializer of ``item_factors`` (runs on the shards, depends only on the rows)."""
    return _sgd_initial_factors(rank, seed, 1, np.arange(row_start, row_stop, dtype=np.int64))


def item_blocks(item_counts, num_blocks: int) -> np.ndarray:
    """Cut item ids ``0..n-1`` into ``num_blocks`` contiguous ranges of about equal rating
    mass; returns ``num_blocks + 1`` bounds."""
    counts = np.asarray(item_counts, dtype=np.float64)
    cum = np.concatenate([[0.0], np.cumsum(counts)])
    targets = cum[-1] * np.arange(1, num_blocks) / num_blocks
    inner = np.searchsorted(cum, targets, side="left")
    bounds = np.concatenate([[0], inner, [len(counts)]]).astype(np.int64)
    return np.maximum.accumulate(bounds)


class _SGDData:
    def __init__(self, users, rating_user, ratings, block_ptr, order, rating_row, block_items):
        self.users = users  # global user indices of the local users
        self.rating_user = rating_user  # local user index per rating
        self.ratings = ratings
        self.block_ptr = block_ptr  # order[block_ptr[b]:block_ptr[b+1]]: ratings of item block b
        self.order = order  # visiting order: by block, shuffled within the block (seeded hash)
        self.rating_row = rating_row  # row of the rating's item in its block's item list
        self.block_items = block_items  # list: global item indices of each block seen locally
        self.validation: Optional[_Validation] = None


class _SGDState:
    def __init__(self, w):
        self.w = w  # (local users, rank)


class MFSGDProgram(Program):
    """Matrix factorisation by SGD with block rotation (STRADS thesis, static schedule).

    Same objective as :class:`MFProgram` (ALS's, regularisation scaled by each user's and
    item's number of ratings: every rating carries ``lambda (|w_i|^2 + |h_j|^2)``).

    Ratings are partitioned by user, so each worker owns its users' rows of W (state) and
    the thesis's two-level W/H rotation (Algorithm 4, k = 2) reduces to rotating H: items
    are cut into U blocks of about equal rating mass; in round r of an iteration worker p
    runs SGD over its ratings of item block (p + r) mod U, reading those rows of H, and
    writes them back with ``put`` -- no other worker touches them in that round, so there
    is no parallelisation error and every rating is visited exactly once per iteration
    (U rounds).  Step size ``eta_t = step_size / sqrt(1 + t)`` in iteration t.

    ``train_rmse`` of an iteration is the error seen during its sweep (each rating's error
    before its update), the usual SGD training error.  With ``early_stopping`` (the stop rule on
    the validation RMSE of the records marked ``validation``) every iteration ends with one more
    round in which each worker only predicts its validation ratings (``validation_rmse``).
    """

    def __init__(self, num_users: int, num_items: int, rank: int, reg_param: float, item_counts,
                 max_iter: int = 10, num_workers: int = 1, step_size: float = 0.05,
                 nonnegative: bool = False, seed: int = 0, early_stopping: Optional[EarlyStopping] = None):
        self.num_users = int(num_users)
        self.num_items = int(num_items)
        self.rank = int(rank)
        self.reg_param = float(reg_param)
        self.item_counts = np.asarray(item_counts, dtype=np.float64)
        self.max_iter = int(max_iter)
        self.num_workers = int(num_workers)
        self.step_size = float(step_size)
        self.nonnegative = bool(nonnegative)
        self.seed = int(seed)
        self.num_ratings = float(self.item_counts.sum())
        if not self.step_size > 0:
            raise ValueError(f"step_size={step_size} must be > 0")
        self.bounds = item_blocks(self.item_counts, self.num_workers)
        self.early_stopping = early_stopping

    def __repr__(self) -> str:
        return (f"MFSGDProgram(users={self.num_users}, items={self.num_items}, rank={self.rank}, "
                f"regParam={self.reg_param}, iterations={self.max_iter}, workers={self.num_workers}, "
                f"stepSize={self.step_size}, nonnegative={self.nonnegative})")

    @property
    def rounds_per_iteration(self) -> int:
        """U rounds of block rotation, plus the validation round with a validation set."""
        return self.num_workers + (self.early_stopping is not None)

    def tables(self):
        init = functools.partial(_sgd_item_rows, self.rank, self.seed)
        return [Table("item_factors", self.num_items, self.rank, "float64", initializer=init,
                      weights=np.maximum(self.item_counts, 1.0))]

    def item_matrix(self, table: np.ndarray) -> np.ndarray:
        """The ``item_factors`` table as (num_items, rank)."""
        return np.ascontiguousarray(np.asarray(table).reshape(self.num_items, self.rank))

    def item_rows(self, table, lo: int, hi: int) -> np.ndarray:
        """Items ``[lo, hi)`` as (hi - lo, rank), read from the ``item_factors`` table handle."""
        return table.read(range(lo, hi))

    def step_size_at(self, iteration: int) -> float:
        return self.step_size / np.sqrt(1.0 + iteration)

    def data_summary(self, ctx, data) -> Optional[dict]:
        return validation_summary(data)

    def check_data(self, summaries) -> None:
        check_validation(self.early_stopping, summaries)

    # ------------------------------------------------------------------ worker side
    def load(self, ctx, records) -> _SGDData:
        (raw_u, raw_i, ratings), held = _triples(records)
        users, rating_user = np.unique(raw_u, return_inverse=True)
        rating_block = np.searchsorted(self.bounds, raw_i, side="right") - 1
        # a visiting order independent of the partitioning: by block, then a hash of (user, item)
        key = hash_uniform(raw_u * np.int64(max(self.num_items, 1)) + raw_i, 0, self.seed)
        order = np.lexsort((key, rating_block)).astype(np.int64)
        block_ptr = np.zeros(self.num_workers + 1, dtype=np.int64)
        np.cumsum(np.bincount(rating_block, minlength=self.num_workers), out=block_ptr[1:])
        rating_row = np.zeros(len(ratings), dtype=np.int64)
        block_items = []
        for b in range(self.num_workers):
            sel = order[block_ptr[b]:block_ptr[b + 1]]
            items, rows = np.unique(raw_i[sel], return_inverse=True)
            rating_row[sel] = rows
            block_items.append(items.astype(np.int64))
        data = _SGDData(users, rating_user.astype(np.int64), ratings, block_ptr, order, rating_row, block_items)
        if self.early_stopping is not None:
            data.validation = _Validation(users, held, self.item_counts)
        return data

    def init_state(self, ctx, data: _SGDData) -> _SGDState:
        return _SGDState(_sgd_initial_factors(self.rank, self.seed, 0, data.users))

    def push(self, ctx, data: _SGDData, state: _SGDState, work) -> _SGDState:
        from ..kernels import mf as K

        block, iteration = work
        if block < 0:  # the validation round: every block of this iteration is committed
            held = data.validation
            held.report(ctx, state.w, ctx.table("item_factors").read(held.items) if len(held) else
                        np.zeros((0, self.rank)))
            return state
        lo, hi = int(data.block_ptr[block]), int(data.block_ptr[block + 1])
        sse = 0.0
        if hi > lo:
            table = ctx.table("item_factors")
            keys = data.block_items[block]
            h = table.read(keys)
            sse = K.sgd_block(data.order[lo:hi], data.rating_user, data.rating_row, data.ratings, state.w, h,
                              self.step_size_at(iteration), self.reg_param, self.nonnegative)
            table.write(keys, h)
        ctx.report(sse=sse, ratings=hi - lo)
        return state

    # ------------------------------------------------------------------ driver side
    def schedule(self, ctx) -> Optional[Schedule]:
        U, per = self.num_workers, self.rounds_per_iteration
        done, n = ctx.rounds_done // per, rounds_next_step(ctx, self.early_stopping, self.max_iter * per, per)
        if not n:
            return None
        return Schedule.per_worker([[((p + r % per) % U if r % per < U else -1, done + r // per) for p in range(U)]
                                    for r in range(n)])

    def after_step(self, ctx, metrics) -> None:
        per = self.rounds_per_iteration
        shown = {}
        for r in range(per - 1, len(metrics.rounds), per):
            rounds = metrics.rounds[r - per + 1:r + 1]
            sse = float(sum(x.get("sse", 0.0) for x in rounds))
            iteration = (ctx.rounds_done + r + 1) // per
            if not np.isfinite(sse):
                raise FloatingPointError(
                    f"SGD diverged in iteration {iteration} (training error {sse}); lower the step size "
                    f"(stepSize={self.step_size}) or raise regParam")
            shown = dict(train_rmse=float(np.sqrt(sse / max(self.num_ratings, 1.0))),
                         **validation_fields(ctx, self.early_stopping, iteration, rounds[-1]))
            ctx.record_row(iteration=iteration, step=ctx.step, sse=sse, step_size=self.step_size_at(iteration - 1),
                           **shown)
        ctx.record(iteration=(ctx.rounds_done + len(metrics.rounds)) // per)
        ctx.progress((ctx.rounds_done + len(metrics.rounds)) // per, self.max_iter, "iteration", **shown)
