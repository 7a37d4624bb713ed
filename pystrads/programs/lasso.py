"""Sparse L1 / elastic-net linear models by scheduled parallel coordinate descent (STRADS Lasso).

This module holds :class:`LassoProgram` (squared loss).  Around it:
:mod:`pystrads.programs.logistic` (:class:`L1LogisticProgram`, the log-loss on
the same schedule), :mod:`pystrads.programs._rows` (the row structures:
:class:`RowBlock`, :func:`rows_to_arrays`, :func:`canonical_permutation`,
:class:`ColumnSample`), :mod:`pystrads.programs._coef` (the ``coef`` table's
columns and :func:`soft_step`) and :mod:`pystrads.programs._working_set` (the
driver's Gram solver); import each name from the module that defines it.

Objective (MLlib's ``LinearRegression`` / ``LogisticRegression``, in the
original units of the features)::

    F(b, beta) = 1/W sum_i w_i loss(y_i, b + x_i . beta)
                 + sum_j pen_j |beta_j| + 1/2 sum_j l2_j beta_j^2

with ``W = sum_i w_i``, ``loss = (y - m)^2 / 2`` (:class:`LassoProgram`) or the
log-loss (:class:`L1LogisticProgram`), ``pen_j = regParam * alpha * s_j`` and
``l2_j = regParam * (1 - alpha) * s_j^2 / sigma_y`` (``alpha`` MLlib's
``elasticNetParam``), where ``s_j`` is the feature's standard deviation with
``standardization`` (MLlib penalises the standardised coefficients) and 1
without, and ``sigma_y`` is the label's standard deviation for squared loss
(MLlib fits a standardised label and scales ``regParam`` by ``1 / sigma_y``,
which cancels in the L1 part only) and 1 for the log-loss.  The L2 part is
smooth: it joins the loss in every coordinate step (gradient ``+ l2_j
beta_j``, curvature ``+ l2_j``), so coordinate descent stays exact.
Features of zero variance keep ``beta_j = 0``, as in MLlib.

Layout on the runtime:

* workers hold their rows of X column-wise (CSC), labels, weights and their
  slice of the residual (Lasso) or margins (logistic) as state;
* table ``coef`` (on the shards) holds per coefficient: value, last change,
  curvature, penalty, mean; ``pull`` sums the workers' partial sums and
  applies the soft-thresholded coordinate step next to the rows;
* table ``grad`` receives every step's closing *sweep*: each worker's partial
  gradient over all coefficients.  From it the driver computes the step each
  coefficient would take now, the objective and the stopping test, and the
  next step's priorities -- "priority refreshed once per pass of work with
  the KKT violations of the zero coefficients", which avoids the starvation
  of the plain ``(delta beta)^2 + eta`` rule;
* the driver's ``schedule`` orders candidates by priority, runs the STRADS
  correlation check on a row sample (no two coefficients whose columns
  correlate by ``>= rho`` in one round) and ships the step's rounds at once:
  a pipeline of rounds planned from values up to one step stale.

``schedule`` chooses the candidate stream: ``"dynamic"`` (priorities from
the refreshed gradient; ``priority="delta"`` selects the plain STRADS rule
``(delta beta)^2 + eta``), ``"shotgun"`` (uniform random, no check) or
``"roundrobin"`` (cyclic, no check).  All three run through the same push,
pull and apply.

With an intercept, Lasso keeps X sparse and centres it implicitly: workers
keep ``r = y - X beta`` and send ``sum_i w_i r_i`` with every partial sum;
the shard subtracts ``mean_j * sum w r``.  Logistic regression updates the
intercept as coefficient ``J`` (an implicit column of ones) in rounds of
its own.
"""

from __future__ import annotations

import time
from typing import Any, Dict, Optional, Tuple

import numpy as np

from ..engine.program import Program, Schedule, Table
from ..engine.program.stopping import EarlyStopping
from ..kernels import cd as K
from ._coef import BETA, COEF_WIDTH, CURV, DELTA, L2, MEAN, PEN, eso_factor, soft_step, stepped
from ._rows import ColumnSample, canonical_permutation, rows_to_arrays
from ._working_set import working_set_step

SCHEDULES = ("dynamic", "shotgun", "roundrobin")
#: a round's column dots are split over the worker's threads from this many coordinates on (a
#: thread hand-off costs tens of microseconds, a column of the STRADS problem ~0.1 us a non-zero);
#: the residual update (``add_columns``) and the ESO overlap scatter into shared rows and stay on one
#: thread: per-thread copies of the residual would cost more than the scatter itself
THREADED_MIN_COORDS = 1024
PRIORITIES = ("gradient", "delta")
#: ``coords_per_round="auto"``: a round's fixed cost (its requests and round clock), in the
#: non-zeros of column work a worker does in the same time (measured: ~7 ms a round against
#: ~25 ns a non-zero), and the widest round the rule picks (the dependency check's cost
#: grows with the square of the width: 16 384 made the schedule the slowest part of a step)
ROUND_COST_NONZEROS = 1 << 18
AUTO_MAX_WIDTH = 8192


def _read_only(value):
    """``value`` with a numpy array marked read-only (it never changes again)."""
    if isinstance(value, np.ndarray):
        value.flags.writeable = False
    return value


class LassoProgram(Program):
    """Lasso (squared loss) by STRADS's dynamic, prioritised, dependency-checked parallel CD.

    Parameters
    ----------
    num_features : int
    reg_param : float
        ``lambda`` (MLlib's ``regParam``).
    elastic_net : float
        ``alpha`` in [0, 1] (MLlib's ``elasticNetParam``): 1 is the Lasso, 0 ridge.
    fit_intercept, standardization : bool
        As MLlib (see the module docstring for the objective).
    schedule : {"dynamic", "shotgun", "roundrobin"}
    priority : {"gradient", "delta"}
        Dynamic priorities: the step each coefficient would take on the
        refreshed gradient (default), or STRADS's ``(delta beta)^2 + eta``.
    coords_per_round, candidates_per_round : int or "auto"
        L and L' (coefficients updated per round; candidates examined).  ``"auto"`` picks L
        from the data when the fit starts (:func:`auto_width`) and L' = 2 L.
    rho : float
        Correlation threshold of the dependency check (``<= 0``: off).
    eta : float
        Priority floor, relative to the largest priority.
    passes : float
        Passes over the working set per step (dynamic).
    max_iter : int
        Steps (each a batch of rounds ending with a gradient sweep).
    tol : float
        Stop when the relative duality gap (Lasso, ``reg_param > 0``) and the
        predicted decrease of one more pass are below ``tol`` relative to the
        objective.
    sample : ColumnSample, optional
        Row sample for the dependency check (driver only).
    sample_rows : int
        Without ``sample``: rows the workers sample from their data for the dependency check
        (split evenly; sent to the driver once, before the init step; 0 = no sample).
    relaxation : float
        Over-relaxation of the rounds' coordinate steps, in (0, 2) (squared loss only:
        :class:`~pystrads.programs.logistic.L1LogisticProgram` has no ``relaxation``): a
        coefficient moves ``relaxation`` times its soft-thresholded step where the L1
        term stays linear on the way (no sign change, not ending at 0), else the plain
        step; 1 is plain coordinate descent.  Under the ESO bound each such step still
        decreases the objective (by ``relaxation * (2 - relaxation)`` times the plain
        step's bound), and along correlated columns -- which the dependency check puts
        in successive rounds, Gauss-Seidel style -- it converges like SOR: on the STRADS
        problem 1.8 reaches a 1e-6 gap in about half the rounds of 1.
    """

    loss_name = "squared"
    #: how a parallel round's steps are kept from overshooting (``damping``)
    dampings = ("eso", "none")
    staleness = 0
    checkpoint_ignore = ("t_origin",)  # a perf_counter origin of this process

    def __init__(self, num_features: int, reg_param: float, *, relaxation: float = 1.8, **options: Any):
        self._init_shared(num_features, reg_param, **options)
        if not 0.0 < float(relaxation) < 2.0:
            raise ValueError(f"relaxation={relaxation!r} is not in (0, 2)")
        self.relaxation = float(relaxation)

    def _init_shared(self, num_features: int, reg_param: float, fit_intercept: bool = True,
                     elastic_net: float = 1.0, standardization: bool = True, schedule: str = "dynamic",
                     priority: str = "gradient", coords_per_round: int = 256, candidates_per_round: int = 512,
                     rho: float = 0.3, eta: float = 1e-6, passes: float = 3.0, max_iter: int = 100,
                     tol: float = 1e-6, min_rounds_per_step: int = 32, gram_limit: int = 4096,
                     damping: str = "eso", sample: Optional[ColumnSample] = None, sample_rows: int = 0,
                     early_stopping: Optional[EarlyStopping] = None) -> None:
        """The parameters of both losses (all but ``relaxation``, which the squared loss alone takes)."""
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule={schedule!r} is not one of {SCHEDULES}")
        if priority not in PRIORITIES:
            raise ValueError(f"priority={priority!r} is not one of {PRIORITIES}")
        self.num_features = int(num_features)
        self.reg_param = float(reg_param)
        if not 0.0 <= float(elastic_net) <= 1.0:
            raise ValueError(f"elastic_net={elastic_net!r} is not in [0, 1]")
        self.elastic_net = float(elastic_net)
        self.fit_intercept = bool(fit_intercept)
        self.standardization = bool(standardization)
        self.schedule_name = schedule
        self.priority = priority
        self.coords_per_round = "auto" if coords_per_round == "auto" else int(coords_per_round)
        self.candidates_per_round = ("auto" if candidates_per_round == "auto" or self.coords_per_round == "auto"
                                     else max(int(candidates_per_round), self.coords_per_round))
        self.rho = float(rho)
        self.eta = float(eta)
        self.passes = float(passes)
        self.max_iter = int(max_iter)
        self.tol = float(tol)
        self.min_rounds_per_step = int(min_rounds_per_step)
        self.gram_limit = int(gram_limit) if self.loss_name in ("squared", "logistic") else 0
        if damping not in self.dampings:
            raise ValueError(f"damping={damping!r} is not one of {self.dampings}")
        self.damping = damping
        self.t_origin = time.perf_counter()  # history times count from here (the estimator sets its start)
        self.sample_rows = 0 if sample is not None else max(0, int(sample_rows))
        self.early_stopping = early_stopping
        self._d = {"sample": sample or ColumnSample.empty(self.num_features)}  # driver-only state

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_d"] = {}  # driver-only arrays never travel into closures
        return state

    # ------------------------------------------------------------------ layout
    @property
    def num_coords(self) -> int:
        """Coefficients on the shards (logistic regression adds the intercept)."""
        return self.num_features

    #: coefficients per feature (a *unit*: what the schedule picks and the dependency check
    #: compares; the multinomial program has one per class, updated in the same round)
    unit_width = 1

    @property
    def num_units(self) -> int:
        """Units the schedule picks from: the features (and the intercept where it is a coefficient)."""
        return self.num_coords // self.unit_width

    @property
    def num_penalised(self) -> int:
        """The penalised coefficients: the first rows of ``coef`` (the intercepts follow them)."""
        return self.num_features * self.unit_width

    def _feature_rows(self, coef: np.ndarray) -> np.ndarray:
        """``coef``'s penalised rows as (feature, coefficient of the unit, column): a view."""
        return coef[:self.num_penalised].reshape(self.num_features, self.unit_width, coef.shape[1])

    def _unit_coords(self, units: np.ndarray) -> np.ndarray:
        """The coefficients of ``units``, unit by unit."""
        if self.unit_width == 1:
            return units
        return (units[:, None] * self.unit_width + np.arange(self.unit_width)).ravel()

    def _per_unit(self, values: np.ndarray) -> np.ndarray:
        """A per-coefficient array summed over each unit's coefficients."""
        return values if self.unit_width == 1 else values.reshape(-1, self.unit_width).sum(axis=1)

    def tables(self):
        tables = [Table("coef", self.num_coords, self.coef_width, "float64", contrib_width=self.contrib_width),
                  Table("grad", self.num_coords, self.grad_width, "float64", contrib_width=self.grad_width),
                  Table("totals", 1, 7, "float64", single_shard=True)]
        if self.gram_limit:  # the driver's working-set solver's input (sparse use: zero pages)
            tables.append(Table("working_set", self.gram_limit ** 2, 1, "float64"))
        return tables

    grad_width = 1
    coef_width = COEF_WIDTH
    contrib_width = 4  # x'Wr, sum w r, and the two curvature sums of the ESO damping

    def load(self, ctx, records):
        if getattr(self, "early_stopping", None) is None:
            return self._columns(records, False)
        records = list(records)  # read twice: the training rows, then the validation rows
        data = self._columns(records, False)
        data["validation"] = self._columns(records, True)
        return data

    def _columns(self, records, held_out: bool) -> Dict[str, np.ndarray]:
        """The training (or validation) rows of ``records``, column-wise (CSC), with labels and weights."""
        row_ptr, col_idx, vals, y, w = rows_to_arrays(records, self.num_features, held_out)
        order = canonical_permutation(row_ptr, col_idx, vals, y, w)  # straight to CSC in that order
        col_ptr, row_idx, cvals = K.ordered_rows_to_csc(row_ptr, col_idx, vals, order, self.num_features)
        return {"col_ptr": col_ptr, "row_idx": row_idx, "vals": cvals, "y": y[order], "w": w[order]}

    def data_summary(self, ctx, data):
        """This worker's share of the dependency check's row sample: its rows' columns (CSC)."""
        n = len(data["y"])
        k = min(n, -(-self.sample_rows // ctx.num_workers))
        if k <= 0:
            return None
        chosen = np.sort(ctx.rng(0x5A4D).choice(n, size=k, replace=False))
        new_row = np.full(n, -1, dtype=np.int64)
        new_row[chosen] = np.arange(k)
        return (k, *K.csc_row_subset(data["col_ptr"], data["row_idx"], data["vals"], new_row))

    def check_data(self, summaries):
        # read-only: the loop's journal then refers to them instead of copying them every step
        parts = tuple(tuple(_read_only(x) for x in s) for s in summaries if s is not None)
        if self.sample_rows and parts:  # built when a round is first planned (the working set may do without)
            self._d["sample_parts"] = parts

    # ------------------------------------------------------------------ worker side
    def init_state(self, ctx, data):
        w, y = data["w"], data["y"]
        sum_x, sum_xx = np.zeros(self.num_features), np.zeros(self.num_features)
        K.column_sums(data["col_ptr"], data["row_idx"], data["vals"], w, sum_x, sum_xx)
        coef = np.zeros((self.num_coords, self.coef_width))
        rows = self._feature_rows(coef)  # the sums go on each feature's first coefficient
        rows[:, 0, CURV] = sum_xx
        rows[:, 0, MEAN] = sum_x
        ctx.table("coef").add(range(0, len(coef)), coef)
        row_counts = np.bincount(data["row_idx"], minlength=len(y)).astype(np.float64)
        ctx.table("totals").add([0], [[w.sum(), (w * w).sum(), (w * y).sum(), (w * y * y).sum(), len(y),
                                       len(data["vals"]), float(row_counts @ row_counts)]])
        state = self._initial_state(data)
        if "validation" in data:  # the validation rows' residual (margins) follows the same steps
            state["validation"] = self._initial_state(data["validation"])
        partials = self._sweep_partials(ctx, data, state)
        ctx.table("grad").add(range(0, len(partials)), partials)
        return state

    def _initial_state(self, data) -> Dict[str, np.ndarray]:
        return {"r": data["y"].copy()}

    def _sweep_partials(self, ctx, data, state) -> np.ndarray:
        out = np.zeros(self.num_features)
        col_ptr, v = data["col_ptr"], data["w"] * state["r"]
        ctx.parallel(lambda cols: K.all_column_dots(col_ptr[cols.start:cols.stop + 1], data["row_idx"], data["vals"],
                                                    v, out[cols.start:cols.stop]), ctx.split(col_ptr))
        return out

    #: coordinates from which a round's column dots are split over the worker's threads
    threaded_min_coords = THREADED_MIN_COORDS

    def _coordinate_parts(self, ctx, work) -> list:
        """The round's coordinates as ranges for the worker's threads (one range when few)."""
        return ctx.split(len(work)) if len(work) >= self.threaded_min_coords else [range(0, len(work))]

    @staticmethod
    def _inv_weight(ctx, state) -> float:
        """``1 / W`` (the total weight, summed by the init step): partial sums travel
        pre-divided so ``pull`` needs no global figure."""
        if "inv_w" not in state:
            total = float(ctx.table("totals").read([0])[0, 0])
            state["inv_w"] = 1.0 / total if total > 0 else 0.0
        return state["inv_w"]

    def push(self, ctx, data, state, work):
        w, r = data["w"], state["r"]
        wr = w * r
        inv_w = self._inv_weight(ctx, state)
        if isinstance(work, str):  # the closing sweep: full partial gradient and the loss parts
            ctx.report(wr=wr.sum(), wrr=float(wr @ r))
            if "validation" in data:  # and the validation rows' (intercept-free) residual sums
                held, r_held = data["validation"], state["validation"]["r"]
                ctx.report(val_w=float(held["w"].sum()), val_wr=float(held["w"] @ r_held),
                           val_wrr=float(held["w"] @ (r_held * r_held)))
            partials = self._sweep_partials(ctx, data, state) * inv_w
            ctx.contribute("grad", range(0, len(partials)), partials)
            return state
        if isinstance(work, tuple):  # the working set's Gram matrix or columns, for the driver's solver
            kind, coords = work
            if kind == "gram":  # ("gram", coords): its weighted Gram matrix, summed over the workers
                keys, vals = K.gram_entries(data["col_ptr"], data["row_idx"], data["vals"], coords, w, len(w))
                ctx.table("working_set").add(keys, vals * inv_w)  # duplicate keys add up
            elif kind == "columns":  # ("columns", coords): its columns over this worker's rows
                self._send_columns(ctx, data, state, coords)
            return state
        z, c_omega = np.empty(len(work)), np.empty(len(work))  # a round
        c_plain = np.zeros(len(work))
        col_ptr, row_idx, vals = data["col_ptr"], data["row_idx"], data["vals"]
        parts = self._coordinate_parts(ctx, work)
        if self.damping == "eso":
            omega = K.row_overlap(col_ptr, row_idx, work, len(w))
            w_omega = w * omega

            def dots(k):
                K.column_dots2(col_ptr, row_idx, vals, work[k.start:k.stop], wr, w_omega, z[k.start:k.stop],
                               c_omega[k.start:k.stop])
                K.column_dots2(col_ptr, row_idx, vals, work[k.start:k.stop], wr, w, z[k.start:k.stop],
                               c_plain[k.start:k.stop])
        else:
            c_omega[:] = 0.0

            def dots(k):
                K.column_dots(col_ptr, row_idx, vals, work[k.start:k.stop], wr, z[k.start:k.stop])
        ctx.parallel(dots, parts)
        ctx.contribute("coef", work, np.column_stack([z, np.full(len(work), wr.sum()), c_omega, c_plain]) * inv_w,
                       read_back=[DELTA])  # apply reads the steps taken: they come back with the tick
        return state

    #: values per row that travel with the working set's columns (:meth:`_ws_rows`)
    ws_row_width = 2

    def _ws_rows_expected(self, n: int, nnz: float):
        """The rows expected to travel with a working set of ``nnz`` non-zeros (of ``n`` rows),
        and whether they are every row."""
        return min(n, nnz), False

    def _ws_rows(self, data, state):
        """The values per row that travel with the working set's columns (weight, residual) and
        whether every row goes (not only those the columns touch)."""
        return np.column_stack([data["w"], state["r"]]), False

    def _send_columns(self, ctx, data, state, coords) -> None:
        """Columns ``coords`` of this worker's rows, with their rows' :meth:`_ws_rows`, packed
        (:func:`~pystrads.kernels.cd.working_set_columns`) into this worker's share of the
        ``working_set`` table; their length goes to the driver as metric ``ws_floats_<worker>``
        (-1: too many for the share; the driver then asks for the Gram matrix instead, or runs
        parallel rounds)."""
        share = (self.gram_limit ** 2) // ctx.num_workers
        values, every = self._ws_rows(data, state)
        bound = K.working_set_floats(data["col_ptr"], coords, len(data["w"]), values.shape[1], every)
        used = -1
        if bound <= share:
            packed = np.empty(bound)
            used = int(K.working_set_columns(data["col_ptr"], data["row_idx"], data["vals"], coords, packed, values,
                                             every))
            base = ctx.worker * share
            ctx.table("working_set").write(range(base, base + used), packed[:used, None])
        ctx.report(**{f"ws_floats_{ctx.worker}": float(used)})

    def apply(self, ctx, data, state, work):
        if isinstance(work, str):
            return state
        if isinstance(work, tuple):  # ("delta", coords): changes the driver made between steps
            kind, work = work
            if kind != "delta":
                return state
            delta = ctx.table("coef").read(work)[:, DELTA]
        else:
            delta = ctx.pulled("coef")[:, 0]  # (the DELTA column read back)
        K.add_columns(data["col_ptr"], data["row_idx"], data["vals"], work, delta, state["r"], -1.0)
        if "validation" in data:
            held = data["validation"]
            K.add_columns(held["col_ptr"], held["row_idx"], held["vals"], work, delta, state["validation"]["r"], -1.0)
        return state

    # ------------------------------------------------------------------ shard side
    def pull(self, table, keys, partials, current):
        if table == "grad":
            return partials
        l2 = current[:, L2]
        grad = self._coord_gradient(partials, current) + l2 * current[:, BETA]
        # ESO damping: a coefficient whose rows other coefficients of the round also touch
        # takes a proportionally shorter step, so the parallel round cannot overshoot
        # (sum_j x_ij d_j)^2 <= omega_i sum_j x_ij^2 d_j^2 (the separable L2 part needs none)
        factor = eso_factor(partials[:, 2], partials[:, 3])
        curv = np.where(current[:, CURV] > 0, current[:, CURV] * factor + l2, 0.0)
        return stepped(current, grad, curv, self.relaxation)

    def _coord_gradient(self, partials, current):
        """Derivative of the smooth part along each coefficient, from the summed partials
        (``x_j' W r / W`` and ``sum w r / W``; centred by the column mean)."""
        return -(partials[:, 0] - current[:, MEAN] * partials[:, 1])

    # ------------------------------------------------------------------ driver side
    def _prepare(self, ctx) -> None:
        """First schedule: column statistics -> curvature, penalty, mean on the shards."""
        d = self._d
        tot = ctx.table("totals").read()[0]
        W, W2, Sy, Syy, n, nnz, row_sq = (float(v) for v in tot)
        d.update(W=W, W2=W2, Sy=Sy, Syy=Syy, n=int(n), nnz=int(nnz), workers=ctx.num_workers)
        if W <= 0:
            return
        L = self.coords_per_round
        if L == "auto":
            L = auto_width(self.num_features, nnz, row_sq, ctx.num_workers)
            ctx.record(coordinates_per_round=L)
        Lp = 2 * L if self.candidates_per_round == "auto" else self.candidates_per_round
        d["width"] = (int(L), int(Lp))
        coef = ctx.table("coef").read()
        J = self.num_features
        rows = self._feature_rows(coef)
        sum_x, sum_xx = rows[:, 0, MEAN].copy(), rows[:, 0, CURV].copy()
        mean = sum_x / W if W > 0 else np.zeros(J)
        denom = W - W2 / W if W > 0 else 0.0
        centred = sum_xx - W * mean * mean
        # a constant column leaves only the rounding of sum_xx - W mean^2: that is no variance
        centred = np.where(centred > 1e-11 * sum_xx, centred, 0.0)
        var = centred / denom if denom > 0 else np.zeros(J)
        std = np.sqrt(var)
        frozen = ~(std > 0)  # zero variance: MLlib keeps these coefficients at 0
        scale = std if self.standardization else np.ones(J)
        pen = self.reg_param * self.elastic_net * scale
        l2 = self.reg_param * (1.0 - self.elastic_net) * scale * scale / self._l2_label_scale()
        curv = self._curvature(sum_xx, mean, W)
        rows[:, :, PEN] = np.where(frozen, -1.0, pen)[:, None]
        rows[:, :, L2] = np.where(frozen, 0.0, l2)[:, None]
        rows[:, :, CURV] = np.where(frozen, 0.0, curv)[:, None]
        rows[:, :, MEAN] = (mean if self.fit_intercept else 0.0 * mean)[:, None]
        coef[:, BETA] = 0.0
        coef[:, DELTA] = 0.0
        self._extra_prepare(coef)
        ctx.table("coef").write(range(0, len(coef)), coef)
        d.update(mean=_read_only(mean), std=_read_only(std), frozen=_read_only(frozen), coef=coef, cursor=0,
                 updates=0, round_updates=0, history=[], gap=np.inf)  # (read-only: fixed for the fit)
        d["grad_rows"] = ctx.table("grad").read() / W  # the init step sent raw sums
        d["sums"] = self._init_sums()
        d["grad"] = self._driver_gradient(d["grad_rows"], coef, d["sums"])
        d["objective"] = self._objective0()
        d["history"].append((d["objective"], 0))
        ctx.record_row(iteration=0, objective=d["objective"], updates=0, round_updates=0, gap=np.inf,
                       elapsed_s=time.perf_counter() - self.t_origin)

    def _extra_prepare(self, coef) -> None:
        pass

    def _starting_intercepts(self, ctx) -> None:
        """Write MLlib's starting intercepts into ``coef`` (the model of a fit with ``maxIter=0``);
        the squared loss's intercept follows from the means in :meth:`result`."""

    def _l2_label_scale(self) -> float:
        """MLlib's ``sigma_y`` (weighted, unbiased; ``|mean y|`` for a constant label, 1 if
        that is 0 too): it fits the standardised label with ``regParam / sigma_y``."""
        d = self._d
        W, W2, Sy, Syy = d["W"], d["W2"], d["Sy"], d["Syy"]
        denom = W - W2 / W
        var = max(Syy - Sy * Sy / W, 0.0) / denom if denom > 0 else 0.0
        sd = float(np.sqrt(var)) if var > 0 else abs(Sy / W)
        return sd if sd > 0 else 1.0

    def _curvature(self, sum_xx, mean, W):
        centred = sum_xx - (W * mean * mean if self.fit_intercept else 0.0)
        return np.maximum(centred, 0.0) / W

    def _init_sums(self) -> Dict[str, float]:
        """The sweep's reported sums at beta = 0 (before any sweep ran)."""
        return {"wr": self._d["Sy"]}

    def _objective0(self) -> float:
        d = self._d
        sq = d["Syy"] - (d["Sy"] ** 2 / d["W"] if self.fit_intercept else 0.0)
        return 0.5 * sq / d["W"]

    def _driver_gradient(self, grad_rows, coef, sums) -> np.ndarray:
        """Full gradient of the smooth part (loss and L2) from the sweep's summed partials
        (divided by W)."""
        return -(grad_rows[:, 0] - coef[:, MEAN] * sums["wr"] / self._d["W"]) + coef[:, L2] * coef[:, BETA]

    def _driver_curvature(self, grad_rows, coef, sums) -> np.ndarray:
        return np.where(coef[:, CURV] > 0, coef[:, CURV] + coef[:, L2], 0.0)

    def _coefficient_stats(self, ctx, metrics) -> float:
        """After a step's sweep: objective, proposed steps, stopping figures."""
        d = self._d
        coef = self._read_coef(ctx)
        sums = {key: metrics.last(key, 0.0) for key in ("wr", "wrr", "loss", "su", "sh")}
        rows = ctx.table("grad").read()
        grad = self._driver_gradient(rows, coef, sums)
        d["coef"], d["grad"], d["sums"], d["grad_rows"] = coef, grad, sums, rows
        return self._objective(coef, sums)

    def _read_coef(self, ctx) -> np.ndarray:
        """The ``coef`` table as the step left it (read after every step)."""
        return ctx.table("coef").read()

    def _objective(self, coef, sums) -> float:
        W = self._d["W"]
        sq = sums["wrr"] - (sums["wr"] ** 2 / W if self.fit_intercept else 0.0)
        return 0.5 * sq / W + self._penalty(coef)

    def _penalty(self, coef) -> float:
        J = self.num_penalised
        beta = coef[:J, BETA]
        return float(np.maximum(coef[:J, PEN], 0.0) @ np.abs(beta) + 0.5 * (coef[:J, L2] @ (beta * beta)))

    def duality_gap(self, coef, grad, sums) -> float:
        """Lasso (elastic-net) duality gap at the current coefficients (``inf`` when
        undefined).  ``grad``: gradient of the smooth part, L2 included.  The elastic
        net is the Lasso on the data augmented by the rows ``sqrt(W l2_j) e_j`` with
        label 0 (their residuals ``-sqrt(W l2_j) beta_j``), so the Lasso's gap applies."""
        J = self.num_features
        pen = coef[:J, PEN]
        live = pen > 0
        if not np.any(live) or np.any((pen == 0)):
            return np.inf
        W = self._d["W"]
        beta = coef[:J, BETA]
        ridge = W * float(coef[:J, L2] @ (beta * beta))
        # in the "times W" scale: P = 1/2 r'Wr + sum W pen |beta|; |x~_j' W r| = W |grad_j|
        rr = sums["wrr"] - (sums["wr"] ** 2 / W if self.fit_intercept else 0.0)
        dual_norm = float(np.max(np.abs(grad[:J][live]) / pen[live]))
        scale = min(1.0, 1.0 / dual_norm) if dual_norm > 0 else 1.0
        ry = rr - W * float(beta @ grad[:J]) + ridge  # r'W y~ = r'W r + beta' X~'W r (loss part of grad)
        rr += ridge
        gap = 0.5 * rr * (1 + scale * scale) + W * float(np.maximum(pen, 0) @ np.abs(beta)) - scale * ry
        return max(gap, 0.0) / W

    def _validation_loss(self, coef, metrics) -> float:
        """The mean loss of the validation rows (1/2 the weighted mean squared error) at ``coef``,
        from the workers' residual sums and the driver's intercept; NaN without validation rows."""
        s0, s1, s2 = (metrics.last(key, 0.0) for key in ("val_w", "val_wr", "val_wrr"))
        if not s0 > 0:
            return float("nan")
        b = self.result(coef)[1]  # residuals y - x beta: the intercept comes off them
        return 0.5 * (s2 - 2.0 * b * s1 + b * b * s0) / s0

    def after_step(self, ctx, metrics):
        d = self._d
        objective = self._coefficient_stats(ctx, metrics)
        coef, grad = d["coef"], d["grad"]
        stopping = getattr(self, "early_stopping", None)
        validation = {} if stopping is None else {"validation_loss": self._validation_loss(coef, metrics)}
        curv = self._driver_curvature(d["grad_rows"], coef, d["sums"])
        step = soft_step(coef[:, BETA], grad, curv, coef[:, PEN])
        d["step"], d["curv"] = step, curv
        moving = self._per_unit(((step != 0) | (coef[:, BETA] != 0)).astype(np.float64)) > 0
        working = int(np.count_nonzero(moving[:self.num_features] & ~d["frozen"]))  # the dynamic schedule's
        d["working_sizes"] = d.get("working_sizes", [])[-1:] + [working]
        planned = d.setdefault("planned", {}).pop(ctx.step, 0)
        d["updates"] += planned
        d["round_updates"] += planned
        gap = self.duality_gap(coef, grad, d["sums"]) if self.loss_name == "squared" else np.inf
        decrease = 0.5 * float(curv @ (step * step))
        d["gap"] = gap
        d["objective"] = objective
        if "ws_asked" in d:  # the step brought the working set's columns (or Gram) and moved no coefficient:
            self._working_set(ctx, step, objective, metrics)  # not an iteration (MLlib's maxIter counts
            return  # those that move them); the driver solves, the next step applies it
        d["history"].append((objective, d["updates"]))
        it = len(d["history"]) - 1
        ctx.record(iteration=it, objective=objective, updates=d["updates"], round_updates=d["round_updates"],
                   gap=gap, decrease=decrease, nonzeros=int(np.count_nonzero(coef[:self.num_penalised, BETA])))
        ctx.record_row(iteration=it, objective=objective, updates=d["updates"], round_updates=d["round_updates"],
                       gap=gap, elapsed_s=time.perf_counter() - self.t_origin, **validation)
        shown = {"objective": objective, "nonzeros": int(np.count_nonzero(coef[:self.num_penalised, BETA])),
                 **validation}
        if np.isfinite(gap):
            shown["gap"] = gap
        ctx.progress(it, self.max_iter, "iteration", **shown)
        scale = max(abs(objective), 1e-12 * abs(d["history"][0][0]), 1e-300)  # an exact fit has F -> 0
        gap_ok = gap <= self.tol * scale if np.isfinite(gap) else True
        # while the working set is too large for the driver's solver, the duality gap lags far
        # behind the objective (one barely violating zero among a million moves it linearly):
        # then an objective change below tol / 10 over a whole step also counts as converged
        prev = d["history"][-2][0] if len(d["history"]) > 1 else np.inf
        settled = planned > 0 and abs(prev - objective) <= 0.1 * self.tol * scale  # a step of rounds
        if validation and stopping.observe(ctx, it, validation["validation_loss"]):
            pass  # the validation metric ended the fit
        elif (gap_ok or settled) and decrease <= self.tol * scale:
            ctx.stop("converged")
        elif it >= self.max_iter:
            ctx.stop("maxIter")
        elif self._uses_working_set():
            self._working_set(ctx, step, objective, metrics)

    # ------------------------------------------------------------------ the schedule
    def schedule(self, ctx):
        d = self._d
        if "W" not in d:
            self._prepare(ctx)
            if d["W"] <= 0:
                return None
            if self.max_iter == 0:  # MLlib's maxIter=0: the model at the starting point
                self._starting_intercepts(ctx)
                return None
            if self._uses_working_set():  # straight to the driver's solver when the support may fit
                live = np.ones(self.num_coords, dtype=bool)
                live[:self.num_features] = ~d["frozen"]
                d["curv"] = np.where(live, self._driver_curvature(d["grad_rows"], d["coef"], d["sums"]), 0.0)
                d["step"] = soft_step(d["coef"][:, BETA], d["grad"], d["curv"], d["coef"][:, PEN])
                self._working_set(ctx, d["step"], d["objective"])
        tail = []
        if "pending" in d:  # the driver's working-set solution: workers update residuals
            tail.append(("delta", d.pop("pending")))
        if "need_gram" in d:  # the working set's columns or Gram matrix for the driver's solver
            tail.append((d.get("ws_kind", "gram"), d.pop("need_gram")))
            d["ws_asked"] = True
        if tail:
            self._planned(ctx, 0)
            return Schedule.shared(tail + ["sweep"])
        J = self.num_units
        rng = np.random.default_rng([ctx.seed, ctx.step])
        L, Lp = d["width"]
        live = np.ones(J, dtype=bool)
        live[:self.num_features] = ~d["frozen"]
        max_rounds = self._round_budget(min(ctx.rounds_hint, 1 << 16))
        rho = self.rho
        if self.schedule_name == "dynamic":
            stream = self._dynamic_stream(rng, live, L)
        else:
            rho = 0.0
            ids = np.flatnonzero(live)
            budget = max(len(ids), self.min_rounds_per_step * L)
            if self.schedule_name == "shotgun":
                stream = rng.choice(ids, size=budget, replace=True) if len(ids) else ids
            else:
                pos = (d["cursor"] + np.arange(budget)) % max(len(ids), 1)
                stream = ids[pos] if len(ids) else ids
                d["cursor"] = int((d["cursor"] + budget) % max(len(ids), 1))
        if J > self.num_features:  # the intercepts have rounds of their own (_with_intercept_rounds): a
            stream = stream[stream < self.num_features]  # feature round they took would be lost
        if "sample_parts" in d:
            d["sample"] = ColumnSample.from_columns(d.pop("sample_parts"))
        sample = d["sample"]
        round_ptr, coords, _ = K.plan_rounds(stream.astype(np.int64), L, Lp if rho > 0 else L, max_rounds,
                                             self.num_features, sample.ptr, sample.rows, sample.vals, rho,
                                             max(sample.num_rows, 1))
        rounds = [coords[round_ptr[r]:round_ptr[r + 1]] for r in range(len(round_ptr) - 1)]
        rounds = [self._unit_coords(r) for r in self._with_intercept_rounds(rounds)]
        self._planned(ctx, int(sum(len(r) for r in rounds)))
        return Schedule.shared(self._engine_rounds(rounds) + ["sweep"])

    def _planned(self, ctx, updates: int) -> None:
        """The coordinate updates step ``ctx.step`` runs, for its ``after_step`` (kept per step:
        with pipelined schedules the next step is planned before this one's ``after_step``)."""
        planned = self._d.setdefault("planned", {})
        for step in [s for s in planned if s < ctx.step - 1]:  # planned for steps that never ran
            del planned[step]
        planned[ctx.step] = updates

    def plans_ahead(self, ctx) -> bool:
        """Rounds only (no driver working-set solver, whose solution the next step's schedule
        applies), once the working set has settled: the next step's rounds then come from
        priorities one step older at little cost.  While it still grows (the first steps) each
        step's rounds depend on the one before, and a schedule a step stale would cost a step."""
        sizes = self._d.get("working_sizes", ())
        if len(sizes) < 2 or self._uses_working_set():
            return False
        return abs(sizes[-1] - sizes[-2]) <= 0.1 * max(sizes[-2], 1)

    def serial_rounds(self, work):
        """Serial mode: a coordinate round one unit (a coefficient; a feature's coefficients) at a
        time, in the round's order -- cyclic coordinate descent in the schedule's order."""
        if isinstance(work, np.ndarray) and len(work) > self.unit_width:
            return np.split(work, len(work) // self.unit_width)
        return [work]

    def _engine_rounds(self, rounds: list) -> list:
        """The engine's rounds for the planned coefficient rounds (one each here)."""
        return rounds

    def _with_intercept_rounds(self, rounds):
        return rounds

    def _round_budget(self, hint: int) -> int:
        """Coefficient rounds that fit in a step of ``hint`` rounds with the closing sweep
        (the step must stay within ``step.maxRounds``, which caps the hint)."""
        return max(1, hint - 1)

    def _uses_working_set(self) -> bool:
        """The driver's working-set solver is on (not for the log-loss once its rows outgrew the table)."""
        return (bool(self.gram_limit) and self.schedule_name == "dynamic" and self.priority == "gradient"
                and not self._d.get("ws_off"))

    def _working_set(self, ctx, step, objective, metrics=None) -> None:
        """The driver's working-set solver's part of the step (:func:`._working_set.working_set_step`)."""
        working_set_step(self, ctx, step, objective, metrics)

    def _dynamic_stream(self, rng, live, L) -> np.ndarray:
        d = self._d
        J = self.num_units
        live_coef = np.repeat(live, self.unit_width)  # per coefficient
        if self.priority == "delta":  # plain STRADS: (delta beta)^2 + eta, sampled with replacement
            coef = d["coef"]
            prio = np.where(live, self._per_unit(coef[:, DELTA] ** 2), 0.0)
            top = prio.max() if prio.size else 0.0
            prio = np.where(live, prio + self.eta * (top if top > 0 else 1.0), 0.0)
            budget = max(int(np.count_nonzero(live)), self.min_rounds_per_step * L)
            return rng.choice(J, size=budget, replace=True, p=prio / prio.sum())
        step = d.get("step")
        if step is None:  # first step: proposals from the initial gradient
            curv = np.where(live_coef, self._driver_curvature(d["grad_rows"], d["coef"], d["sums"]), 0.0)
            step = soft_step(d["coef"][:, BETA], d["grad"], curv, d["coef"][:, PEN])
            d["curv"] = curv
        curv = d["curv"]
        prio = self._per_unit(curv * step * step)
        active = live & ((prio > 0) | (self._per_unit(np.abs(d["coef"][:, BETA])) != 0))
        ids = np.flatnonzero(active)
        if len(ids) == 0:
            ids = np.flatnonzero(live)
        p = prio[ids]
        top = p.max() if len(p) else 0.0
        p = p + self.eta * (top if top > 0 else 1.0)
        # `passes` passes of the working set per step (and min_rounds_per_step rounds' worth at
        # least): a worker's step costs milliseconds, so priorities refreshed from the
        # sweep's gradient every few passes beat filling the step's time budget with stale ones.
        # But the step's closing sweep reads every column once: at least as many updates as
        # live columns keep it at most about half of a step's work on wide problems
        want = max(self.passes * len(ids), self.min_rounds_per_step * min(L, len(ids)), int(live.sum()))
        passes = int(np.ceil(want / max(len(ids), 1)))
        parts = []
        for _ in range(passes):  # a priority-weighted random order of the working set per pass
            keys = rng.exponential(size=len(ids)) / p
            parts.append(ids[np.argsort(keys, kind="stable")])
        return np.concatenate(parts) if parts else ids

    # ------------------------------------------------------------------ results
    def result(self, coef: np.ndarray) -> Tuple[np.ndarray, float]:
        """``(coefficients, intercept)`` in the original units from the final ``coef`` table."""
        d = self._d
        beta = coef[:self.num_features, BETA].copy()
        intercept = 0.0
        if self.fit_intercept and d.get("W", 0) > 0:
            intercept = d["Sy"] / d["W"] - float(d["mean"] @ beta)
        return beta, intercept

    @property
    def driver_state(self) -> Dict[str, Any]:
        return self._d


def auto_width(num_features: int, nnz: float, row_sq: float, num_workers: int) -> int:
    """``coords_per_round="auto"``: the round width L that makes the most progress per second.

    A round of L coordinates costs a fixed ``t0`` (requests and the round clock) plus L times a
    coordinate's column work; its steps are damped by the rows they share (ESO): a coordinate's
    row holds on average ``w = sum_i n_i^2 / sum_i n_i`` non-zeros (``n_i``: row i's), of which
    ``1 + (w - 1) (L - 1) / (J - 1)`` are in the round.  Progress per second,
    ``L / ((1 + a L) (t0 + c L))`` with ``a = (w - 1) / (J - 1)``, peaks at
    ``L = sqrt(t0 / (a c))``; with ``t0 / c`` = :data:`ROUND_COST_NONZEROS` over a coordinate's
    non-zeros per worker.  Sparse, wide data gets wide rounds (the STRADS generator, 200 000
    columns of 25 non-zeros: ~4 500); dense or narrow data narrow ones.  At most
    :data:`AUTO_MAX_WIDTH` and the number of features."""
    J = max(int(num_features), 1)
    if nnz <= 0 or J == 1:
        return 1
    overlap = max(row_sq / nnz - 1.0, 0.0)  # other non-zeros in a coordinate's row, on average
    per_worker = max(nnz / J / max(num_workers, 1), 1.0)
    a = max(overlap / max(J - 1, 1), 1e-12)
    width = np.sqrt(ROUND_COST_NONZEROS / per_worker / a)
    return int(max(1, min(width, AUTO_MAX_WIDTH, J)))
