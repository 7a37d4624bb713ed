"""Binary logistic regression with an L1 / elastic-net penalty: :class:`L1LogisticProgram`.

The Lasso's program (:mod:`pystrads.programs.lasso`, whose docstring gives the
objective and the layout) with the log-loss: workers keep margins instead of
residuals, push the partial gradient and curvature of the log-loss, and the
intercept is coefficient ``J``, updated in rounds of its own.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..kernels import cd as K
from ._coef import BETA, CURV, DELTA, L2, MEAN, PEN, eso_factor, stepped
from .lasso import LassoProgram


class L1LogisticProgram(LassoProgram):
    """Binary logistic regression with an L1 penalty (the thesis's SchMP-SLR) on the same schedule.

    Labels in {0, 1}. Workers keep margins; push sends the partial gradient
    ``sum w (p - y) x`` and curvature ``sum w p (1-p) x^2`` (and the sums that
    centre them); ``pull`` takes the soft-thresholded Newton step.  With an
    intercept, features are centred implicitly as MLlib does (the intercept
    coefficient ``J`` is then nearly decoupled from the others and is updated
    in rounds of its own); the reported intercept is converted back.

    Parameters are :class:`LassoProgram`'s but ``relaxation``, which the log-loss's Newton
    steps do not use (it is a TypeError here, not a setting that does nothing).
    """

    loss_name = "logistic"
    grad_width = 3  # sum x u, sum h x^2, sum h x
    contrib_width = 6  # sum x u, sum u, sum h x^2, sum h x, sum h, sum h omega x^2

    def __init__(self, num_features: int, reg_param: float, **options: Any):
        self._init_shared(num_features, reg_param, **options)

    @property
    def num_coords(self) -> int:
        return self.num_features + (1 if self.fit_intercept else 0)

    def _initial_state(self, data):
        return {"m": np.zeros(len(data["y"]))}

    def _terms(self, data, state):
        u, h = np.empty_like(state["m"]), np.empty_like(state["m"])
        loss = K.logistic_terms(state["m"], data["y"], data["w"], u, h)
        return u, h, loss

    def _sweep_partials(self, ctx, data, state):
        u, h, _ = self._terms(data, state)
        coords = np.arange(self.num_coords, dtype=np.int64)
        gu, ghx2, ghx = (np.empty(self.num_coords) for _ in range(3))
        self._column_dots(ctx, data, coords, u, h, gu, ghx2, ghx)
        return np.column_stack([gu, ghx2, ghx])

    def _column_dots(self, ctx, data, coords, u, h, gu, ghx2, ghx) -> None:
        """``gu = X' u``, ``ghx2 = (X^2)' h``, ``ghx = X' h`` at ``coords``, over the worker's threads."""
        cols = data["col_ptr"], data["row_idx"], data["vals"]

        def dots(k):
            K.column_dots2(*cols, coords[k.start:k.stop], u, h, gu[k.start:k.stop], ghx2[k.start:k.stop])
            K.column_dots(*cols, coords[k.start:k.stop], h, ghx[k.start:k.stop])
        ctx.parallel(dots, self._coordinate_parts(ctx, coords))

    def push(self, ctx, data, state, work):
        if isinstance(work, tuple):  # the working set's columns for the driver's solver, or its solution
            if work[0] == "columns":
                self._send_columns(ctx, data, state, work[1])
            return state
        inv_w = self._inv_weight(ctx, state)
        u, h, loss = self._terms(data, state)
        if isinstance(work, str):
            ctx.report(loss=loss, su=u.sum(), sh=h.sum())
            if "validation" in data:  # the validation rows' log-loss at their margins
                held = data["validation"]
                ctx.report(val_w=float(held["w"].sum()), val_loss=self._terms(held, state["validation"])[2])
            partials = self._sweep_partials(ctx, data, state) * inv_w
            ctx.contribute("grad", range(0, len(partials)), partials)
            return state
        gu, ghx2, ghx, gho = (np.empty(len(work)) for _ in range(4))
        cols = data["col_ptr"], data["row_idx"], data["vals"]
        self._column_dots(ctx, data, work, u, h, gu, ghx2, ghx)
        if self.damping == "eso":  # curvature sum x^2 h omega: the parallel round's separable bound
            K.column_dots2(*cols, work, u, h * K.row_overlap(data["col_ptr"], data["row_idx"], work, len(h)), gu,
                           gho)
        else:
            gho[:] = ghx2
        n = len(work)
        ctx.contribute("coef", work, np.column_stack([gu, np.full(n, u.sum()), ghx2, ghx, np.full(n, h.sum()),
                                                      gho]) * inv_w, read_back=[DELTA, MEAN])
        return state

    #: weight, margin and label travel with the working set's columns
    ws_row_width = 3

    def _ws_rows_expected(self, n: int, nnz: float):
        return (n, True) if self.fit_intercept else (min(n, nnz), False)

    def _ws_rows(self, data, state):
        """Weight, margin and label per row; every row with an intercept (the driver moves it)."""
        return np.column_stack([data["w"], state["m"], data["y"]]), self.fit_intercept

    def apply(self, ctx, data, state, work):
        if isinstance(work, str):
            return state
        if isinstance(work, tuple):  # ("delta", coords): the driver's working-set solution
            kind, work = work
            if kind != "delta":
                return state
            rows = ctx.table("coef").read(work)[:, [DELTA, MEAN]]
        else:
            rows = ctx.pulled("coef")  # the steps taken and the column means, back with the round's tick
        delta = rows[:, 0]
        shift = float(rows[:, 1] @ delta)  # implicit centring: (x - mean) delta
        for part, margins in ((data, state), (data.get("validation"), state.get("validation"))):
            if part is not None:
                K.add_columns(part["col_ptr"], part["row_idx"], part["vals"], work, delta, margins["m"], 1.0)
                margins["m"] -= shift
        return state

    def _validation_loss(self, coef, metrics) -> float:
        """The validation rows' weighted mean log-loss (NaN without validation rows)."""
        weight = metrics.last("val_w", 0.0)
        return metrics.last("val_loss", 0.0) / weight if weight > 0 else float("nan")

    def pull(self, table, keys, partials, current):
        if table == "grad":
            return partials
        mu = current[:, MEAN]
        l2 = current[:, L2]
        grad = partials[:, 0] - mu * partials[:, 1] + l2 * current[:, BETA]
        curv = partials[:, 2] - 2 * mu * partials[:, 3] + mu * mu * partials[:, 4]
        factor = eso_factor(partials[:, 5], partials[:, 2])
        curv = np.where(current[:, PEN] >= 0, np.maximum(curv, 1e-12) * factor + l2, 0.0)
        return stepped(current, grad, curv)

    def _extra_prepare(self, coef):
        if self.fit_intercept:
            coef[self.num_features, PEN] = 0.0  # the intercept: unpenalised
            coef[self.num_features, CURV] = 0.25
            coef[self.num_features, MEAN] = 0.0

    def _starting_intercepts(self, ctx) -> None:
        """MLlib's: the log-odds of the (weighted) classes, where both occur."""
        d = self._d
        p = d["Sy"] / d["W"]
        if self.fit_intercept and 0 < p < 1:
            coef = ctx.table("coef").read()
            coef[self.num_features, BETA] = np.log(p / (1 - p))
            ctx.table("coef").write(range(self.num_features, self.num_features + 1), coef[self.num_features:])

    def _curvature(self, sum_xx, mean, W):
        return 0.25 * super()._curvature(sum_xx, mean, W)  # a bound; partial sums bring the real one

    def _l2_label_scale(self) -> float:
        return 1.0  # MLlib's LogisticRegression scales nothing by the label

    def _objective0(self) -> float:
        return float(np.log(2.0))

    def _init_sums(self):
        d = self._d
        return {"su": 0.5 * d["W"] - d["Sy"], "sh": 0.25 * d["W"]}

    def _driver_gradient(self, grad_rows, coef, sums):
        return grad_rows[:, 0] - coef[:, MEAN] * sums["su"] / self._d["W"] + coef[:, L2] * coef[:, BETA]

    def _driver_curvature(self, grad_rows, coef, sums):
        live = (coef[:, PEN] >= 0) & (coef[:, CURV] > 0)
        mu = coef[:, MEAN]
        curv = grad_rows[:, 1] - 2 * mu * grad_rows[:, 2] + mu * mu * sums["sh"] / self._d["W"]
        return np.where(live, np.maximum(curv, 1e-12) + coef[:, L2], 0.0)

    def _objective(self, coef, sums):
        return sums["loss"] / self._d["W"] + self._penalty(coef)

    def _with_intercept_rounds(self, rounds):
        if not self.fit_intercept:
            return rounds
        J = self.num_features
        out = [np.array([J], dtype=np.int64)]
        for i, r in enumerate(rounds):
            r = r[r != J]
            if len(r):
                out.append(r)
            if i % 8 == 7:
                out.append(np.array([J], dtype=np.int64))
        return out

    def _round_budget(self, hint: int) -> int:
        if not self.fit_intercept:
            return super()._round_budget(hint)
        return max(1, ((hint - 2) * 8) // 9)  # one intercept round first and one per 8 more, then the sweep

    def result(self, coef):
        beta = coef[:self.num_features, BETA].copy()
        if not self.fit_intercept:
            return beta, 0.0
        return beta, float(coef[self.num_features, BETA] - coef[:self.num_features, MEAN] @ beta)
