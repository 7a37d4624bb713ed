"""The step engine and the public Program API.

Four parts, each a package: the public Program API (:mod:`.program`), the step loop whoever
runs it (:mod:`.scheduler`), what runs in the executors' tasks (:mod:`.executor`) and the
driver's side (:mod:`.driver`); each imports only the ones before it.  The names below load on
first use: a Spark worker that unpickles the worker side imports the executor's modules and
what they need, never the driver's, which it never runs.
"""

from typing import TYPE_CHECKING

from .. import lazy_exports

_EXPORTS = {
    "Engine": ".driver.engine", "FitResult": ".driver.engine", "TrainingSummary": ".driver.engine",
    "FitSetup": ".driver.preflight", "check_java": ".driver.preflight", "preflight": ".driver.preflight",
    **{name: ".program" for name in ("Contribution", "Program", "RowEntries", "Schedule", "ScheduleContext",
                                     "StepMetrics", "Table", "WorkerContext")},
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # for type checkers and IDEs: the names as if imported eagerly
    from .driver.engine import Engine, FitResult, TrainingSummary
    from .driver.preflight import FitSetup, check_java, preflight
    from .program import (Contribution, Program, RowEntries, Schedule, ScheduleContext, StepMetrics, Table,
                          WorkerContext)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
