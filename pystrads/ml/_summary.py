"""What every estimator's training summary and fitted model share.

:class:`FitSummary` holds a fit's history as MLlib-style summaries do:
``iterations`` (pandas, one row per iteration), ``steps`` (pandas, one row per
step: rounds, seconds and the time split) and ``timings`` (one-off costs in
seconds: input scan, shard start, data load, init, reading the model back;
``fixed`` is its earlier name), with ``to_pandas``, ``totalIterations``, the
history columns as lists (``_history``) and one plotting helper (``_plot``).
:class:`HasTrainingSummary` gives a model ``hasSummary`` / ``summary``.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional


class FitSummary:
    """Base of the estimators' training summaries (see the module docstring), made from the
    engine's result and the estimator's :class:`~pystrads.ml._base.Fit`."""

    def __init__(self, result, fit):
        import pandas as pd

        self.iterations = pd.DataFrame(result.summary.iterations)
        self.steps = pd.DataFrame(result.summary.rows)
        self.timings: Dict[str, Any] = dict(result.summary.fixed, **fit.timings)
        #: each shard's stats when the fit ended: its tables (rows, bytes, storage), the bytes of
        #: the blobs it keeps (the workers' state snapshots and results) now and at most, its
        #: resident memory now and at its peak, and its traffic
        self.shards: List[Dict[str, Any]] = list(result.summary.shards or [])
        stopping = getattr(fit.program, "early_stopping", None)
        #: the early stopping of a fit with a validation set (metric, best_iteration, best_value,
        #: stopped_at), None without one
        self.earlyStopping: Optional[Dict[str, Any]] = None if stopping is None else stopping.summary()

    @property
    def validationHistory(self) -> List[float]:
        """The validation metric per iteration (``earlyStopping["metric"]``, smaller is better);
        empty without a validation set."""
        return [] if self.earlyStopping is None else self._history(self.earlyStopping["metric"])

    @property
    def bestIteration(self) -> Optional[int]:
        """The iteration with the best validation metric (None without a validation set)."""
        return None if self.earlyStopping is None else self.earlyStopping["best_iteration"]

    @property
    def stoppedEarly(self) -> bool:
        """Whether the validation metric ended the fit before maxIter."""
        return self.earlyStopping is not None and self.earlyStopping["stopped_at"] is not None

    @property
    def fixed(self) -> Dict[str, Any]:
        """The one-off costs under their earlier name (same dict as ``timings``)."""
        return self.timings

    def _history(self, name: str) -> List[float]:
        """Column ``name`` of ``iterations`` as floats (iterations without it skipped)."""
        col = self.iterations.get(name)
        return [] if col is None else [float(v) for v in col.dropna()]

    @property
    def totalIterations(self) -> int:
        return int(self.iterations["iteration"].max()) if len(self.iterations) else 0

    def to_pandas(self):
        """The per-iteration history as a pandas DataFrame (a copy)."""
        return self.iterations.copy()

    def _plot(self, ax, y: str, ylabel: str, x: str = "iteration", marker: str = "o", log_y: bool = False,
              values: Optional[Callable[[Any], Any]] = None, title: Optional[str] = None):
        """Column ``y`` of ``iterations`` (its iterations that have it; ``values(y)`` transforms
        it) against column ``x``, on ``ax`` or new axes (needs matplotlib:
        ``pip install 'pystrads[plot]'``)."""
        if ax is None:
            import matplotlib.pyplot as plt

            _, ax = plt.subplots(figsize=(6, 4))
        rows = self.iterations.dropna(subset=[y]) if y in self.iterations else self.iterations.iloc[:0]
        ys = rows[y].to_numpy(dtype=float) if y in rows else []
        (ax.semilogy if log_y else ax.plot)(rows[x] if x in rows else [], values(ys) if values else ys,
                                            marker=marker)
        ax.set_xlabel(x)
        ax.set_ylabel(ylabel)
        if title:
            ax.set_title(title)
        return ax


class HasTrainingSummary:
    """``hasSummary`` / ``summary`` of a fitted model (``self._summary``; None once loaded)."""

    _summary = None

    @property
    def hasSummary(self) -> bool:
        return self._summary is not None

    @property
    def summary(self):
        if self._summary is None:
            raise RuntimeError(f"No training summary available for this {type(self).__name__}: the model was "
                               "loaded, not fitted in this session")
        return self._summary
