"""The step engine and the public Program API."""

from .driver import Engine, FitResult, TrainingSummary
from .preflight import FitSetup, check_java, preflight
from .program import (Contribution, Program, RowEntries, Schedule, ScheduleContext, StepMetrics, Table,
                      WorkerContext)

__all__ = ["Contribution", "Engine", "FitResult", "FitSetup", "Program", "RowEntries", "Schedule",
           "ScheduleContext", "StepMetrics", "Table", "TrainingSummary", "WorkerContext", "check_java",
           "preflight"]
