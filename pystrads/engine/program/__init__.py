"""The public Program API: what a program implements (:class:`Program`) and what the engine
hands it (:class:`Schedule`, :class:`Table`, the contexts, :class:`StepMetrics`), in
:mod:`.api`; the early-stopping rule the shipped programs share, in :mod:`.stopping`.  This
package imports nothing else of the engine: a program needs only it (and the kernels)."""

from .api import (Contribution, Program, RowEntries, Schedule, ScheduleContext, StepMetrics, Table, WorkerContext,
                  serial_schedule, split_ranges)
from .stopping import EarlyStopping

__all__ = ["Contribution", "EarlyStopping", "Program", "RowEntries", "Schedule", "ScheduleContext", "StepMetrics",
           "Table", "WorkerContext", "serial_schedule", "split_ranges"]
