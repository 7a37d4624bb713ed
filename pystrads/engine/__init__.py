"""The step engine and the public Program API."""

from .driver import Engine, FitResult, TrainingSummary
from .preflight import check_java
from .program import Program, Schedule, ScheduleContext, StepMetrics, Table, WorkerContext

__all__ = ["Engine", "FitResult", "Program", "Schedule", "ScheduleContext", "StepMetrics", "Table",
           "TrainingSummary", "WorkerContext", "check_java"]
