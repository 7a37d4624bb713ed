"""Matrix factorisation for implicit feedback: the objective of Spark's ALS with
``implicitPrefs=True`` (Hu, Koren & Volinsky 2008), solved by scheduled feature-block coordinate
descent (iALS++, Rendle et al. 2021) -- :class:`ImplicitMFProgram`.

Objective, over **every** (user, item) pair, with confidence ``c = 1 + alpha |r|`` on the observed
pairs (1 elsewhere) and preference ``p = 1`` where ``r > 0`` (0 elsewhere)::

    sum_(u,i) c_ui (p_ui - x_u . y_i)^2 + lambda (sum_u n_u |x_u|^2 + sum_i n_i |y_i|^2)

(``n_u``, ``n_i``: positive observations of user u, item i -- ALS's scaling).  The unobserved
pairs enter through the Gramians ``G_W = W'W`` and ``G_Y = Y'Y`` (kernels/mf.py), so a sweep costs
O(observations * rank * b + (users + items) * rank * b) for blocks of b features.

Data and tables as :class:`~pystrads.programs.mf.MFProgram`: ratings partitioned by user, W local
to its worker, H on the shards block-major (``item_factors``); a small single-shard ``gram``
table holds G_W (rows ``0..rank-1``) and G_Y (rows ``rank..2 rank-1``).  Each item has an
*owner* worker (item ``j`` belongs to worker ``j mod U``) that adds the item's Gramian terms, so
the shards' ``pull`` stays MFProgram's ridge solve.

An iteration is ``num_blocks + 2`` shared rounds:

1. ``(W_GRAM, 0)``: every worker contributes its W'W; the shard sums them into G_W;
2. ``(ITEMS, c)`` for each feature block c: every worker contributes, per local item, the
   observed sums over its users; each owner adds ``G_W[B,B]`` and ``-G_W[B,-B] y_j,-B``; the
   shards solve each item's block (exact: items are independent given W); ``apply`` folds the
   new block into the local predictions;
3. ``(Y_GRAM, 0)``: the owners contribute Y'Y over their items; ``apply`` then updates every
   feature block of the local users with G_Y (exact: users are independent given Y, all local)
   and reports the objective.

Every update is an exact block minimiser, so the objective never increases.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..engine.program import Schedule, Table
from ..engine.program.stopping import EarlyStopping
from .mf import MFProgram, _MFData, _triples, _Validation, hash_uniform, over_ranges, rounds_next_step

#: Kinds of round (the first element of a round's work item).
W_GRAM, ITEMS, Y_GRAM = 0, 1, 2


def initial_factors(ids: np.ndarray, rank: int, seed: int) -> np.ndarray:
    """The start of W: each row a random unit vector of the first quadrant (absolute Gaussian
    entries, normalised -- the start Spark's ALS describes), hashed from (seed, id) so it does not
    depend on the partitioning.  Measured on MovieLens (rank 10, alpha 40): the first iteration
    ends at 0.57x the objective of a start from the whole sphere, and the rankings after 15
    iterations match ALS's."""
    u1 = np.stack([hash_uniform(ids, 2 * k, seed) for k in range(rank)], axis=1)
    u2 = np.stack([hash_uniform(ids, 2 * k + 1, seed) for k in range(rank)], axis=1)
    w = np.abs(np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2))  # Box-Muller
    norms = np.linalg.norm(w, axis=1, keepdims=True)
    return np.divide(w, norms, out=np.full_like(w, 1.0 / np.sqrt(max(rank, 1))), where=norms > 0)


#: bound on the score comparisons :func:`percentile_ranks` holds at once (held-out pairs x items)
RANK_CELLS = 1 << 22


def percentile_ranks(program: "ImplicitMFProgram", table, data: _MFData, w: np.ndarray):
    """``(ranks, weights)`` of a worker's held-out positives (validation ratings ``r > 0``): each
    pair's percentile rank among the items its user has no training observation of (0 = the
    top score, 1 = the bottom; ties do not count as above), and its weight ``r``.  The weighted
    mean is Hu, Koren & Volinsky's expected percentile ranking (lower is better; 0.5 for a
    random order).  Every item's factors are read from the ``item_factors`` table handle in
    ranges, each scored against the held-out users at once, at most :data:`RANK_CELLS`
    comparisons at a time."""
    held = data.validation
    positive = held.ratings > 0
    users, items, weights = held.users[positive], held.items[positive], held.ratings[positive]
    if not len(users):
        return np.zeros(0), np.zeros(0)
    rows, pair_row = np.unique(users, return_inverse=True)  # the held-out users, local positions
    wv = w[rows]
    target = np.einsum("nk,nk->n", w[users], program.item_rows_at(table, items))
    # the training items of those users (distinct per user): left out of their rankings
    rating_user, rating_item = data.rating_user, data.items[data.rating_item]
    in_rows = np.isin(rating_user, rows)
    train_row = np.searchsorted(rows, rating_user[in_rows])
    train_item = rating_item[in_rows]
    first = np.ones(len(train_row), bool)
    first[1:] = (train_row[1:] != train_row[:-1]) | (train_item[1:] != train_item[:-1])
    train_row, train_item = train_row[first], train_item[first]
    order = np.argsort(train_item, kind="stable")
    train_row, train_item = train_row[order], train_item[order]
    candidates = program.num_items - np.bincount(train_row, minlength=len(rows))
    above = np.zeros(len(users), np.int64)
    step = int(min(max(RANK_CELLS // max(len(users), 1), 256), max(program.num_items, 1)))
    for lo in range(0, program.num_items, step):
        hi = min(lo + step, program.num_items)
        scores = wv @ program.item_rows(table, lo, hi).T  # (held-out users, hi - lo)
        a, b = np.searchsorted(train_item, [lo, hi])
        scores[train_row[a:b], train_item[a:b] - lo] = -np.inf
        above += (scores[pair_row] > target[:, None]).sum(axis=1)
        # a pair's own item is no candidate above it, though its score here may round above target
        own = np.flatnonzero((items >= lo) & (items < hi))
        above[own] -= scores[pair_row[own], items[own] - lo] > target[own]
    return above / np.maximum(candidates[pair_row] - 1, 1), weights


class _ImplicitState:
    def __init__(self, w, pred, owned):
        self.w = w  # (local users, rank)
        # x_u . y_j of every local observation, item-major (data.item_ratings' order; a state whose
        # predictions were kept in rating order has no such attribute, and fails loudly on restore)
        self.pred_items = pred
        self.owned = owned  # the items this worker adds the Gramian terms of
        self.gram_w = None  # G_W of the current iteration (read in its first item round)
        self.u = None  # W of the current block (local users x b)
        self.v = None  # H of the current block at the local items, as the push read it


class ImplicitMFProgram(MFProgram):
    """Implicit-feedback matrix factorisation on the Program API (see the module docstring).

    Parameters
    ----------
    num_users, num_items : int
        Ids are ``0 .. num_users-1`` and ``0 .. num_items-1``.
    rank : int
    reg_param : float
        lambda, scaled by each user's / item's number of positive observations (as ALS) unless
        ``scale_reg`` is False (lambda alone, as the ``implicit`` library).
    item_counts : array (num_items,)
        Positive observations (``r > 0``) per item.
    alpha : float
        Confidence slope: ``c = 1 + alpha |r|``.
    num_workers : int
        U (items are owned round-robin).
    max_iter : int
    nonnegative : bool
        Project every update onto >= 0 (needs ``block_size=1``: exact coordinate updates).
    seed : int
    block_size : int
        Features per block (``rank`` = ALS's full solves; smaller = iALS++'s subspaces).
    early_stopping : EarlyStopping, optional
        The stop rule on the held-out positives' mean percentile rank (``validation_mpr``, see
        :func:`percentile_ranks`), computed after every iteration.
    scale_reg : bool
        See ``reg_param``.
    """

    def __init__(self, num_users: int, num_items: int, rank: int, reg_param: float, item_counts, alpha: float,
                 num_workers: int, max_iter: int = 10, nonnegative: bool = False, seed: int = 0,
                 block_size: int = 1, early_stopping: Optional[EarlyStopping] = None, scale_reg: bool = True):
        super().__init__(num_users, num_items, rank, reg_param, item_counts, max_iter, 1, nonnegative,
                         seed, block_size, early_stopping, scale_reg)
        self.alpha = float(alpha)
        self.num_workers = int(num_workers)
        if not (self.alpha >= 0 and np.isfinite(self.alpha)):
            raise ValueError(f"alpha={alpha} must be a finite number >= 0")

    def __repr__(self) -> str:
        return (f"ImplicitMFProgram(users={self.num_users}, items={self.num_items}, rank={self.rank}, "
                f"regParam={self.reg_param}, alpha={self.alpha}, iterations={self.max_iter}, "
                f"block={self.block_size}, nonnegative={self.nonnegative}"
                + ("" if self.scale_reg else ", regParam unscaled") + ")")

    @property
    def rounds_per_iteration(self) -> int:
        return self.num_blocks + 2

    def tables(self):
        return list(super().tables()) + [Table("gram", 2 * self.rank, self.rank, "float64", single_shard=True)]

    def work_of(self, position: int):
        """The work item of round ``position`` of an iteration."""
        if position == 0:
            return (W_GRAM, 0)
        if position <= self.num_blocks:
            return (ITEMS, position - 1)
        return (Y_GRAM, 0)

    # ------------------------------------------------------------------ worker side
    def load(self, ctx, records) -> _MFData:
        train, held = _triples(records)
        data = _MFData(train)
        if self.early_stopping is not None:  # the held-out positives (preference 1), weighted by r
            data.validation = _Validation(data.users, held, None)
        positive = data.ratings > 0
        data.c1 = self.alpha * np.abs(data.ratings)  # confidence - 1
        data.target = np.where(positive, 1.0 + data.c1, 0.0)  # confidence * preference
        data.user_reg = self.reg_weights(np.bincount(data.rating_user, weights=positive.astype(np.float64),
                                                     minlength=len(data.users)))
        # the ratings are user-major (_triples sorts them): the user pass reads them in sequence; the
        # item pass gets its own item-major copies, so it reads in sequence too (random reads of
        # per-rating arrays cost 6x the arithmetic on 2.5 M ratings a worker)
        if not np.array_equal(data.user_ratings, np.arange(len(data.ratings))):
            raise RuntimeError("ImplicitMFProgram.load: the ratings must be user-major (_triples sorts them)")
        data.item_user = data.rating_user[data.item_ratings]
        data.item_c1 = data.c1[data.item_ratings]
        data.item_target = data.target[data.item_ratings]
        return data

    def init_state(self, ctx, data: _MFData) -> _ImplicitState:
        w = initial_factors(data.users, self.rank, self.seed)
        owned = np.arange(ctx.worker, self.num_items, ctx.num_workers, dtype=np.int64)
        return _ImplicitState(w, np.zeros(len(data.c1)), owned)  # H starts at 0: every prediction is 0

    def _owned_rows(self, ctx, state: _ImplicitState) -> np.ndarray:
        """Current full rows of H at the owned items, (owned, rank)."""
        n, b = self.num_items, self.block_size
        keys = (np.arange(self.num_blocks, dtype=np.int64)[:, None] * n + state.owned[None, :]).ravel()
        rows = np.asarray(ctx.table("item_factors").read(keys)).reshape(self.num_blocks, len(state.owned), b)
        return np.ascontiguousarray(rows.transpose(1, 0, 2).reshape(len(state.owned), -1)[:, :self.rank])

    def _local_rows(self, ctx, data: _MFData) -> np.ndarray:
        """Current full rows of H at the local items, (local items, rank)."""
        return np.ascontiguousarray(np.hstack([self._block(ctx, data, c) for c in range(self.num_blocks)]))

    def push(self, ctx, data: _MFData, state: _ImplicitState, work) -> _ImplicitState:
        from ..kernels import mf as K

        kind, c = work
        if kind == W_GRAM:
            ctx.contribute("gram", range(0, self.rank), state.w.T @ state.w)
            return state
        if kind == Y_GRAM:
            if len(state.owned):
                y = self._owned_rows(ctx, state)
                ctx.contribute("gram", range(self.rank, 2 * self.rank), y.T @ y)
                ctx.report(h_reg=float((self.reg_weights(self.item_counts[state.owned])[:, None] * y ** 2).sum()))
            return state
        lo, hi = self._features(c)
        if c == 0:
            state.gram_w = np.asarray(ctx.table("gram").read(range(0, self.rank)), dtype=np.float64)
        state.v = self._block(ctx, data, c)
        state.u = np.ascontiguousarray(state.w[:, lo:hi])
        be = hi - lo
        if len(data.items):
            partials = np.empty((len(data.items), K.packed_width(be)))
            over_ranges(ctx, data.item_ptr, lambda a, b: K.implicit_item_partials(
                data.item_ptr[a:b + 1], data.item_user, data.item_c1, data.item_target, state.pred_items,
                state.u, state.v[a:b], partials[a:b]))
            ctx.contribute("item_factors", c * self.num_items + data.items, self._pad(partials, be))
        if len(state.owned):  # the unobserved pairs of the owned items: G_W's terms
            gram = state.gram_w
            tri = be * (be + 1) // 2
            owner = np.empty((len(state.owned), K.packed_width(be)))
            owner[:, :tri] = gram[lo:hi, lo:hi][np.tril_indices(be)][None, :]
            if self.num_blocks > 1:
                y = self._owned_rows(ctx, state)
                owner[:, tri:] = -(y @ gram[:, lo:hi] - y[:, lo:hi] @ gram[lo:hi, lo:hi])
            else:
                owner[:, tri:] = 0.0
            ctx.contribute("item_factors", c * self.num_items + state.owned, self._pad(owner, be))
        return state

    def apply(self, ctx, data: _MFData, state: _ImplicitState, work) -> _ImplicitState:
        from ..kernels import mf as K

        kind, c = work
        if kind == ITEMS:  # fold the block's new item values into the predictions
            new = self._block(ctx, data, c)
            change = new - state.v
            over_ranges(ctx, data.item_ptr, lambda a, b: K.implicit_add_block_items(
                data.item_ptr[a:b + 1], data.item_user, state.u, change[a:b], state.pred_items))
            state.v = state.u = None
        elif kind == Y_GRAM:  # every feature block of the local users, with G_Y
            gram = np.asarray(ctx.table("gram").read(range(self.rank, 2 * self.rank)), dtype=np.float64)
            h = self._local_rows(ctx, data)
            w = state.w
            pred = np.empty_like(state.pred_items)  # the predictions user-major, for the user pass
            pred[data.item_ratings] = state.pred_items
            for block in range(self.num_blocks):
                lo, hi = self._features(block)
                cross = w @ gram[:, lo:hi] - w[:, lo:hi] @ gram[lo:hi, lo:hi]
                u = np.ascontiguousarray(w[:, lo:hi])
                h_block, gram_block = np.ascontiguousarray(h[:, lo:hi]), np.ascontiguousarray(gram[lo:hi, lo:hi])
                over_ranges(ctx, data.user_ptr, lambda a, b: K.implicit_user_block_update(
                    data.user_ptr[a:b + 1], data.rating_item, data.c1, data.target, h_block,
                    gram_block, cross[a:b], data.user_reg[a:b], self.nonnegative, u[a:b], pred))
                w[:, lo:hi] = u
            state.pred_items = pred[data.item_ratings]
            ctx.report(observed_loss=K.implicit_observed_loss(data.c1, data.target, pred),
                       all_pairs=float(((w @ gram) * w).sum()),
                       w_reg=float((data.user_reg[:, None] * w ** 2).sum()))
            if data.validation is not None:
                ranks, weights = percentile_ranks(self, ctx.table("item_factors"), data, w)
                ctx.report(val_rank=float(ranks @ weights), val_weight=float(weights.sum()))
        return state

    def pull(self, table, keys, partials, current):
        if table == "gram":  # the summed Gramian contributions are the new rows
            return partials
        return super().pull(table, keys, partials, current)

    # ------------------------------------------------------------------ driver side
    def schedule(self, ctx) -> Optional[Schedule]:
        per = self.rounds_per_iteration
        n = rounds_next_step(ctx, self.early_stopping, per * self.max_iter, per)
        if not n:
            return None
        return Schedule.shared([self.work_of(r % per) for r in range(ctx.rounds_done, ctx.rounds_done + n)])

    def after_step(self, ctx, metrics) -> None:
        per = self.rounds_per_iteration
        objective = None
        for r, values in enumerate(metrics.rounds):
            if "observed_loss" in values and (ctx.rounds_done + r + 1) % per == 0:
                loss = values["observed_loss"] + values["all_pairs"]
                objective = loss + values.get("w_reg", 0.0) + values.get("h_reg", 0.0)
                iteration = (ctx.rounds_done + r + 1) // per
                validation = {}
                if self.early_stopping is not None and "val_weight" in values:
                    weight = values["val_weight"]
                    validation["validation_mpr"] = values["val_rank"] / weight if weight > 0 else float("nan")
                    self.early_stopping.observe(ctx, iteration, validation["validation_mpr"])
                ctx.record_row(iteration=iteration, step=ctx.step, objective=objective, loss=loss,
                               w_reg=values.get("w_reg", 0.0), h_reg=values.get("h_reg", 0.0), **validation)
        ctx.record(iteration=(ctx.rounds_done + len(metrics.rounds)) // per)
        shown = {} if objective is None else {"objective": objective}
        ctx.progress((ctx.rounds_done + len(metrics.rounds)) // per, self.max_iter, "iteration", **shown)
