"""Multinomial (softmax) logistic regression with an elastic-net penalty: :class:`MultinomialProgram`.

The binary program (:mod:`pystrads.programs.logistic`) with K classes.  Objective (MLlib's
``LogisticRegression(family="multinomial")``)::

    F(b, B) = 1/W sum_i w_i (logsumexp(m_i) - m_{i, y_i})
              + sum_jk pen_j |B_jk| + 1/2 sum_jk l2_j B_jk^2,      m_ik = b_k + x_i . B_k

Layout: coefficient ``(j, k)`` is row ``j K + k`` of ``coef`` and the intercepts ``b_k`` follow
the ``J K`` penalised rows.  A feature's K coefficients are one *unit* of the schedule: the
dependency check compares features, and a round updates every class of its features at once.
That is safe because each row's curvature is a diagonal bound of the softmax Hessian
(:func:`~pystrads.kernels.cd.softmax_terms`), and rows that several features of the round share
are damped by the same ESO weights as the binary program's.  Workers keep the ``(n, K)`` margins.

Softmax is unchanged when one feature's K coefficients all move by the same amount, so after
every step the driver moves each feature's coefficients to the shift that minimises their
penalty (glmnet's ``elc``; the workers' margins need no change) -- the optimum lies there, and
coordinate steps alone approach it slowly.  With an intercept the features are centred
implicitly as in the binary program.  The result follows MLlib's conventions: intercepts
centred to sum 0, and without a penalty each feature's coefficients centred too.
"""

from __future__ import annotations

from typing import Any, Tuple

import numpy as np

from ..kernels import cd as K
from ..engine.program import Table
from ._coef import BETA, COEF_WIDTH, CURV, DELTA, L2, MEAN, PEN
from .logistic import L1LogisticProgram

#: the ``coef`` column of the line-search rounds: a proposed change, waiting for its step size
PROP = COEF_WIDTH
#: columns of a line-search contribution: ``COMMIT_ONLY`` is 1 when it only commits proposals;
#: ``COMMIT`` is the step size to commit the key's waiting proposal with (0: none waits)
COMMIT_ONLY, COMMIT = 5, 6


def _step_size(decrease: float, curvature: float) -> float:
    """The step along a round's direction minimising ``t decrease + t^2 curvature / 2`` in [0, 1]."""
    if not decrease < 0:
        return 0.0
    return 1.0 if curvature <= 0 else min(1.0, -decrease / curvature)


class MultinomialProgram(L1LogisticProgram):
    """Multinomial logistic regression with MLlib's elastic net on the STRADS schedule.

    Labels are class indices ``0 .. num_classes - 1``.  Parameters are
    :class:`~pystrads.programs.logistic.L1LogisticProgram`'s and ``num_classes`` (>= 2);
    ``coords_per_round`` counts features (each with its ``num_classes`` coefficients).

    ``damping`` (how a round's parallel steps are kept from overshooting): ``"line"`` (default)
    runs each round in two ticks -- the shards propose every coefficient's own step, the workers
    measure the loss's exact curvature along the round's whole direction (summed in table
    ``line``), and every step is scaled by the one step size that minimises the local model of
    the objective along it (Tseng and Yun's coordinate gradient descent; at most 1) -- so rows
    shared by many features cost only what their steps really interact.  The shards commit a
    proposal with its step size when the coefficient is next proposed, or in the step's last
    round; ``"eso"`` damps each step by its rows' overlap in one
    tick, as the binary program (cheaper where columns rarely share rows); ``"none"``.
    """

    loss_name = "multinomial"
    dampings = ("line", "eso", "none")
    coef_width = COEF_WIDTH + 1
    contrib_width = 7

    def __init__(self, num_features: int, reg_param: float, *, num_classes: int, **options: Any):
        if int(num_classes) < 2:
            raise ValueError(f"num_classes={num_classes!r}: the multinomial loss needs at least 2 classes")
        self.num_classes = int(num_classes)
        options.setdefault("damping", "line")
        # a round costs a pass over the (n, K) margins whatever its width: fewer, wider rounds, and
        # steps of a few passes over the working set only (the sweep that ends them is cheap)
        options.setdefault("min_rounds_per_step", 4)
        super().__init__(num_features, reg_param, **options)

    @property
    def unit_width(self) -> int:  # type: ignore[override]
        return self.num_classes

    @property
    def num_coords(self) -> int:
        return (self.num_features + (1 if self.fit_intercept else 0)) * self.num_classes

    def tables(self):
        extra = [Table("line", 1, 2, "float64", single_shard=True)] if self.damping == "line" else []
        return super().tables() + extra

    # ------------------------------------------------------------------ worker side
    def _initial_state(self, data):
        return {"m": np.zeros((len(data["y"]), self.num_classes))}

    def _terms(self, data, state):
        u, h = np.empty_like(state["m"]), np.empty_like(state["m"])
        loss = K.softmax_terms(state["m"], data["y"], data["w"], u, h)
        return u, h, loss

    def _by_row(self, ctx, part, features):
        """``part``'s columns ``features`` (ascending) by row, cut into the worker's threads' parts:
        ``(ptr, pos, val, cuts, intercept)`` (:func:`~pystrads.kernels.cd.columns_by_row`).  Kept in
        ``part`` while the same features come back: every sweep, and rounds over one working set."""
        key = "sweep" if len(features) == self.num_units else "round" if features[0] < self.num_features else "ones"
        cache = part.setdefault("by_row", {})
        hit = cache.get(key)
        if hit is not None and np.array_equal(hit[0], features):
            return hit[1]
        cache.pop(key, None)  # free the old arrays first
        parts = self._coordinate_parts(ctx, features)
        cuts = np.array([r.start for r in parts] + [len(features)], dtype=np.int64)
        ptr, pos, val = K.columns_by_row(part["col_ptr"], part["row_idx"], part["vals"], features, cuts,
                                         len(part["y"]))
        intercept = len(features) - 1 if len(features) and features[-1] == self.num_features else -1
        entry = (ptr, pos, val, cuts, intercept)
        cache[key] = (features.copy(), entry)
        return entry

    def _class_dots(self, ctx, data, features, u, h, with_h1=True):
        """``(X' u, (X^2)' h, X' h)`` at ``features``, each ``(len(features), K)``, over the worker's
        threads (a part of the features each), passing over the rows in order."""
        order = np.argsort(features, kind="stable")
        ptr, pos, val, cuts, intercept = self._by_row(ctx, data, features[order])
        shape = (len(features), self.num_classes)
        gu, gh2 = np.empty(shape), np.empty(shape)
        gh1 = np.empty(shape if with_h1 else (0, self.num_classes))

        def dots(p):
            K.class_row_dots(ptr, pos, val, p, cuts[p], cuts[p + 1], intercept, u, h, gu, gh2, gh1)
        ctx.parallel(dots, range(len(cuts) - 1))
        if np.all(order[1:] > order[:-1]):
            return gu, gh2, gh1
        out = []
        for a in (gu, gh2, gh1):
            b = np.empty_like(a)
            if len(a):
                b[order] = a
            out.append(b)
        return tuple(out)

    def _direction(self, ctx, part, features, delta, shift, out):
        """``out = X[:, features] @ delta - shift`` over ``part``'s rows (the worker's threads a
        range of rows each)."""
        order = np.argsort(features, kind="stable")
        ptr, pos, val, _, intercept = self._by_row(ctx, part, features[order])
        delta = np.ascontiguousarray(delta[order])
        ctx.parallel(lambda r: K.class_row_direction(ptr, pos, val, intercept, delta, shift, out, r.start, r.stop),
                     ctx.split(len(out)))

    def _sweep_partials(self, ctx, data, state):
        u, h, _ = self._terms(data, state)
        units = np.arange(self.num_units, dtype=np.int64)
        gu, gh2, gh1 = self._class_dots(ctx, data, units, u, h)
        return np.column_stack([gu.ravel(), gh2.ravel(), gh1.ravel()])

    def push(self, ctx, data, state, work):
        if isinstance(work, str):  # the closing sweep: the binary program's, on the class arrays
            for key in ("terms", "buffers", "waiting"):
                state.pop(key, None)  # a step ends holding no round's arrays
            return super().push(ctx, data, state, work)
        inv_w = self._inv_weight(ctx, state)
        if isinstance(work, tuple) and work[0] == "line":  # the round's line search
            return self._push_line(ctx, data, state, inv_w)
        if isinstance(work, tuple):  # ("commit", None): the proposals still waiting, by worker 0
            waiting = state.get("waiting")
            keys = np.flatnonzero(waiting) if waiting is not None else np.zeros(0, dtype=np.int64)
            if ctx.worker == 0 and len(keys):
                rows = np.zeros((len(keys), self.contrib_width))
                rows[:, COMMIT_ONLY] = 1.0
                rows[:, COMMIT] = waiting[keys]
                ctx.contribute("coef", keys, rows)
            state.pop("waiting", None)
            return state
        u, h, _ = self._terms(data, state)
        features = work[::self.num_classes] // self.num_classes  # whole units, in order
        gu, gh2, gh1 = self._class_dots(ctx, data, features, u, h)
        commit = np.zeros(len(work))
        if self.damping == "eso":  # curvature sum x^2 h omega: the parallel round's separable bound
            omega = K.row_overlap(data["col_ptr"], data["row_idx"], features, len(data["y"]))
            gho = self._class_dots(ctx, data, features, u, h * omega[:, None], with_h1=False)[1]
        elif self.damping == "line":
            state["terms"] = u  # the line search's slope and curvature come from them
            gho = np.zeros_like(gh2)  # (COMMIT_ONLY: 0)
            waiting = state.setdefault("waiting", np.zeros(self.num_coords))
            if ctx.worker == 0:  # the step sizes of these coefficients' waiting proposals
                commit = waiting[work]
            waiting[work] = 0.0
        else:
            gho = gh2
        su, sh = u.sum(axis=0), h.sum(axis=0)
        n = len(features)
        rows = np.column_stack([gu.ravel(), np.tile(su, n), gh2.ravel(), gh1.ravel(), np.tile(sh, n), gho.ravel(),
                                np.zeros(len(work))]) * inv_w
        rows[:, COMMIT] = commit
        ctx.contribute("coef", work, rows, read_back=True)
        return state

    def _push_line(self, ctx, data, state, inv_w):
        """The line search's sums along the proposed direction ``dm`` (the margins' change):
        ``sum u . dm`` (the loss's slope) and ``sum w (p . dm^2 - (p . dm)^2)`` (its curvature,
        exact for the softmax), with the penalty's change along it added once (by worker 0)."""
        u = state.pop("terms")
        dm, penalty_change = state["direction"][0], state["direction"][1]
        slope, curvature = K.softmax_line_sums(u, data["y"], data["w"], dm)
        row = [[slope * inv_w + (penalty_change if ctx.worker == 0 else 0.0), curvature * inv_w]]
        ctx.contribute("line", [0], np.array(row), read_back=True)
        return state

    def apply(self, ctx, data, state, work):
        if isinstance(work, str):
            return state
        if isinstance(work, tuple) and work[0] == "commit":
            return state
        k_all = self.num_classes
        if isinstance(work, tuple):  # the line search's step: the margins move by its share
            decrease, curvature = ctx.pulled("line")[0]
            step = _step_size(float(decrease), float(curvature))
            dm, _, held_dm, coords = state.pop("direction")
            state["waiting"][coords] = step  # the shards commit the proposals with it later
            if step > 0:
                for margins, change in ((state["m"], dm), (state.get("validation", {}).get("m"), held_dm)):
                    if change is not None:
                        change *= step
                        margins += change
            state["buffers"] = (dm, held_dm)  # the next round's direction is written over them
            return state
        rows = ctx.pulled("coef")  # the stepped rows, back with the round's tick
        features = work[::k_all] // k_all
        column = PROP if self.damping == "line" else DELTA
        delta = rows[:, column].reshape(-1, k_all)
        shift = (rows[:, MEAN].reshape(-1, k_all) * delta).sum(axis=0)  # implicit centring, per class
        moved = []
        buffers = state.pop("buffers", (None, None))
        for part, margins, buffer in ((data, state, buffers[0]),
                                      (data.get("validation"), state.get("validation"), buffers[1])):
            if part is None:
                continue
            cols = part["col_ptr"], part["row_idx"], part["vals"]
            if self.damping == "line":  # the direction, into the last round's buffer
                target = buffer if buffer is not None else np.empty_like(margins["m"])
                self._direction(ctx, part, features, delta, shift, target)
                moved.append(target)
            else:
                K.add_class_columns(*cols, features, delta, margins["m"])
                margins["m"] -= shift
        if self.damping == "line":
            beta, prop, pen, l2 = rows[:, BETA], rows[:, PROP], np.maximum(rows[:, PEN], 0.0), rows[:, L2]
            new = beta + prop
            change = float(pen @ (np.abs(new) - np.abs(beta)) + 0.5 * (l2 @ (new * new - beta * beta)))
            state["direction"] = (moved[0], change, moved[1] if len(moved) > 1 else None, work)
        return state

    def pull(self, table, keys, partials, current):
        if table == "line":
            return partials  # the round's summed slope and curvature
        if table != "coef" or self.damping != "line":
            return super().pull(table, keys, partials, current)
        new = current.copy()
        commit = partials[:, COMMIT] * current[:, PROP]  # a waiting proposal, with its step size
        new[:, BETA] += commit
        new[:, DELTA] = commit
        new[:, PROP] = 0.0
        if partials[0, COMMIT_ONLY] > 0:
            return new
        stepped = super().pull(table, keys, partials, new)  # each coefficient's own step, proposed
        new[:, PROP] = stepped[:, DELTA]
        return new

    def _with_intercept_rounds(self, rounds):
        """With the line search: a round costs a pass over the ``(n, K)`` margins whatever its
        width, so the narrow rounds at a step's end that only repeat features its earlier rounds
        updated (candidates the dependency check kept deferring) are dropped, and the intercepts
        join every round (the line search prices their interaction with the features)."""
        if self.damping != "line" or not rounds:
            return super()._with_intercept_rounds(rounds)
        J = self.num_features
        widest = max(len(r) for r in rounds)
        seen = np.zeros(J + 1, dtype=bool)
        out = []
        for r in rounds:
            r = r[r != J]
            if 8 * len(r) < widest:
                r = r[~seen[r]]
            if len(r):
                seen[r] = True
                out.append(np.append(r, J) if self.fit_intercept else r)
        if not out and self.fit_intercept:
            out.append(np.array([J], dtype=np.int64))
        return out

    def serial_rounds(self, work):
        """Serial mode: one feature's coefficients a round, each with its own line search (the
        schedule's line round closes the last)."""
        parts = super().serial_rounds(work)
        if self.damping != "line" or len(parts) < 2:
            return parts
        return [r for part in parts[:-1] for r in (part, ("line", None))] + [parts[-1]]

    def _engine_rounds(self, rounds):
        if self.damping != "line":
            return rounds
        return [r for coords in rounds for r in (coords, ("line", None))] + [("commit", None)]

    def _round_budget(self, hint: int) -> int:
        if self.damping != "line":
            return super()._round_budget(hint)
        return super()._round_budget(max(2, hint // 2))  # two ticks a round, the commit, the sweep

    # ------------------------------------------------------------------ driver side
    def _extra_prepare(self, coef):
        if self.fit_intercept:
            tail = coef[self.num_penalised:]
            tail[:, PEN] = 0.0  # the intercepts: unpenalised
            tail[:, CURV] = 0.25
            tail[:, MEAN] = 0.0

    def _starting_intercepts(self, ctx) -> None:
        """MLlib's: ``log(W_k + 1)`` of each class's weight ``W_k``, centred."""
        if not self.fit_intercept:
            return
        coef = ctx.table("coef").read()
        # the intercepts' gradient rows at the zero start are 1 / K - W_k / W
        weights = np.maximum(1.0 / self.num_classes - self._d["grad_rows"][self.num_penalised:, 0], 0.0) * self._d["W"]
        logs = np.log1p(weights)
        tail = coef[self.num_penalised:]
        tail[:, BETA] = logs - logs.mean()
        ctx.table("coef").write(range(self.num_penalised, len(coef)), tail)

    def _objective0(self) -> float:
        return float(np.log(self.num_classes))

    def _init_sums(self):
        return {}

    def _class_sums(self, grad_rows) -> Tuple[np.ndarray, np.ndarray]:
        """Per coefficient, its class's ``sum w (p - y) / W`` and ``sum h / W``: the intercepts' partials
        (zero without an intercept, where no feature is centred and they are not needed)."""
        if not self.fit_intercept:
            return np.zeros(self.num_coords), np.zeros(self.num_coords)
        tail = grad_rows[self.num_penalised:]
        reps = self.num_units
        return np.tile(tail[:, 0], reps), np.tile(tail[:, 1], reps)

    def _driver_gradient(self, grad_rows, coef, sums):
        su = self._class_sums(grad_rows)[0]
        return grad_rows[:, 0] - coef[:, MEAN] * su + coef[:, L2] * coef[:, BETA]

    def _driver_curvature(self, grad_rows, coef, sums):
        live = (coef[:, PEN] >= 0) & (coef[:, CURV] > 0)
        mu = coef[:, MEAN]
        sh = self._class_sums(grad_rows)[1]
        curv = grad_rows[:, 1] - 2 * mu * grad_rows[:, 2] + mu * mu * sh
        return np.where(live, np.maximum(curv, 1e-12) + coef[:, L2], 0.0)

    def _read_coef(self, ctx) -> np.ndarray:
        """The ``coef`` table, each feature's coefficients moved to their penalty's best shift (written back)."""
        coef = super()._read_coef(ctx)
        rows = self._feature_rows(coef)
        shift = np.zeros(self.num_features)
        K.class_shift(np.ascontiguousarray(rows[:, :, BETA]), rows[:, 0, PEN].copy(), rows[:, 0, L2].copy(), shift)
        moved = np.flatnonzero(shift)
        if len(moved):
            rows[moved, :, BETA] += shift[moved, None]
            keys = self._unit_coords(moved.astype(np.int64))
            ctx.table("coef").write(keys, coef[keys])
        return coef

    # ------------------------------------------------------------------ results
    def result(self, coef):
        """``(coefficient matrix (K, J), intercepts (K,))`` in the original units, as MLlib reports
        them: intercepts centred to sum 0 with an intercept; without a penalty each feature's
        coefficients centred too (the objective does not change)."""
        k_all, J = self.num_classes, self.num_features
        matrix = coef[:J * k_all, BETA].reshape(J, k_all).T.copy()
        intercepts = np.zeros(k_all)
        if self.fit_intercept:
            mean = coef[:J * k_all, MEAN].reshape(J, k_all)[:, 0]
            intercepts = coef[J * k_all:, BETA] - matrix @ mean
            intercepts -= intercepts.mean()
        if self.reg_param == 0.0:
            matrix -= matrix.mean(axis=0)
        return matrix, intercepts
