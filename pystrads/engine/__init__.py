"""The step engine and the public Program API.

The names below load on first use: a Spark worker that unpickles the worker side
(:mod:`.worker`, :mod:`.program`) imports those modules only, not the driver's (the launcher,
the coordinator, the job), which it never runs.
"""

from typing import TYPE_CHECKING

from .. import lazy_exports

_EXPORTS = {
    "Engine": ".driver", "FitResult": ".driver", "TrainingSummary": ".driver",
    "FitSetup": ".preflight", "check_java": ".preflight", "preflight": ".preflight",
    **{name: ".program" for name in ("Contribution", "Program", "RowEntries", "Schedule", "ScheduleContext",
                                     "StepMetrics", "Table", "WorkerContext")},
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # for type checkers and IDEs: the names as if imported eagerly
    from .driver import Engine, FitResult, TrainingSummary
    from .preflight import FitSetup, check_java, preflight
    from .program import (Contribution, Program, RowEntries, Schedule, ScheduleContext, StepMetrics, Table,
                          WorkerContext)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
