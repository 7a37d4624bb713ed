"""Early stopping on a validation metric: the stop rule a program's ``after_step`` applies.

A program that holds validation data (rows its workers keep apart and never train on) reports a
validation metric per iteration; :class:`EarlyStopping` decides, on the driver, when that metric
has stopped improving.  The metric is one where smaller is better (an RMSE, a log-perplexity, a
mean loss).  The rule is xgboost's ``early_stopping_rounds`` with MLlib's ``validationTol``
(GBTs): an evaluation *improves* on the best so far when::

    value < best - tol * max(|value|, 0.01)

and the fit stops once ``rounds`` evaluations in a row have not improved (``rounds = 0``: never;
the rule only tracks the best).  ``tol = 0`` counts any decrease.  The instance is plain data (it lives on the program, so it is pickled with it and
saved in checkpoints).
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional


class EarlyStopping:
    """The stop rule (see the module docstring).

    Parameters
    ----------
    metric : str
        Name of the validation metric (for messages and the summary), e.g. ``"validation_rmse"``.
    rounds : int
        Evaluations without improvement after which the fit stops (>= 1; 0: never stop, only
        track the best).
    tol : float
        Relative improvement an evaluation needs to count (>= 0).
    source : str
        Where the validation rows come from, for messages (e.g. ``"validationIndicatorCol 'v'"``).
    """

    def __init__(self, metric: str, rounds: int, tol: float = 0.0, source: str = ""):
        if int(rounds) < 0:
            raise ValueError(f"rounds={rounds} must be >= 0")
        if not (tol >= 0 and math.isfinite(tol)):
            raise ValueError(f"tol={tol} must be a finite number >= 0")
        self.metric = str(metric)
        self.rounds = int(rounds)
        self.tol = float(tol)
        self.source = str(source)
        self.best_iteration: Optional[int] = None
        self.best_value = math.inf
        self.since_best = 0
        self.stopped_at: Optional[int] = None

    @property
    def stops(self) -> bool:
        """Whether the rule can end a fit (``rounds >= 1``): a program then ends its steps at
        every evaluation, so that the fit stops right after the evaluation that decides."""
        return self.rounds >= 1

    def update(self, iteration: int, value: float) -> Optional[str]:
        """Take the metric of ``iteration``; the stop reason once the fit should stop, else None.
        A non-finite value never improves."""
        value = float(value)
        if math.isfinite(value) and (self.best_iteration is None
                                     or value < self.best_value - self.tol * max(abs(value), 0.01)):
            self.best_iteration, self.best_value, self.since_best = int(iteration), value, 0
            return None
        self.since_best += 1
        if not self.stops or self.since_best < self.rounds:
            return None
        self.stopped_at = int(iteration)
        return (f"early stopping: {self.metric} did not improve for {self.since_best} evaluation(s) after its best, "
                f"{self.best_value:.6g} at iteration {self.best_iteration}")

    def observe(self, ctx, iteration: int, value: float) -> Optional[str]:
        """:meth:`update`, and end the fit after this step (``ctx.stop``, a
        :class:`~pystrads.engine.program.ScheduleContext`) when the rule says so; returns the reason."""
        reason = self.update(iteration, value)
        if reason:
            ctx.stop(reason)
        return reason

    def summary(self) -> Dict[str, Any]:
        """What a training summary shows: the best iteration and value, and where the fit stopped."""
        return {"metric": self.metric, "best_iteration": self.best_iteration,
                "best_value": None if self.best_iteration is None else self.best_value,
                "stopped_at": self.stopped_at}
