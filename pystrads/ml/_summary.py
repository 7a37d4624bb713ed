"""What every estimator's training summary and fitted model share.

:class:`FitSummary` holds a fit's history as MLlib-style summaries do:
``iterations`` (pandas, one row per iteration), ``steps`` (pandas, one row per
step: rounds, seconds and the time split) and ``timings`` (one-off costs in
seconds: input scan, shard start, data load, init, reading the model back),
with ``to_pandas``, ``totalIterations`` and the history columns as lists.
:class:`HasTrainingSummary` gives a model ``hasSummary`` / ``summary``.
"""

from __future__ import annotations

from typing import Any, Dict, List


class FitSummary:
    """Base of the estimators' training summaries (see the module docstring)."""

    def __init__(self, engine_summary, **timings: float):
        import pandas as pd

        self.iterations = pd.DataFrame(engine_summary.iterations)
        self.steps = pd.DataFrame(engine_summary.rows)
        self.timings: Dict[str, Any] = dict(engine_summary.fixed, **timings)

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

    @staticmethod
    def _axes(ax):
        """``ax``, or new axes (needs matplotlib: ``pip install 'pystrads[plot]'``)."""
        if ax is None:
            import matplotlib.pyplot as plt

            _, ax = plt.subplots(figsize=(6, 4))
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
