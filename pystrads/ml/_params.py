"""Params every pystrads estimator has beyond MLlib's, and the checks of the params they share.

:class:`HasNumWorkers` is ``numWorkers`` (a shared param in the style of
``pyspark.ml.param.shared``); :func:`check_common_params` refuses, before any
Spark job, the values of ``maxIter``, ``numWorkers`` and ``checkpointInterval``
that no estimator accepts, with the same message everywhere.
"""

from __future__ import annotations

from typing import Any

from pyspark.ml.param import Param, Params, TypeConverters

from ..errors import ConfigurationError


class HasNumWorkers(Params):
    """Mixin for param numWorkers: the data partitions (workers) of a fit."""

    numWorkers: "Param[int]" = Param(
        Params._dummy(), "numWorkers",
        "data partitions (workers) updating the model in parallel; they must all run at once (barrier "
        "mode). 0 = one per Spark task slot.", typeConverter=TypeConverters.toInt)

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(numWorkers=0)

    def getNumWorkers(self) -> int:
        return self.getOrDefault(self.numWorkers)


def check_common_params(est: Params, rule: str = "MLlib's") -> None:
    """``maxIter >= 1``, ``numWorkers >= 0`` and, where the estimator has it,
    ``checkpointInterval >= 1`` or ``-1`` (``rule``: whose rule that is, for the message)."""
    if est.getOrDefault("maxIter") < 1:
        raise ConfigurationError(f"maxIter={est.getOrDefault('maxIter')!r} must be >= 1")
    if est.getOrDefault("numWorkers") < 0:
        raise ConfigurationError(f"numWorkers={est.getOrDefault('numWorkers')!r} must be >= 0 (0 = one per task slot)")
    if est.hasParam("checkpointInterval"):
        interval = est.getOrDefault("checkpointInterval")
        if interval != -1 and interval < 1:
            raise ConfigurationError(f"checkpointInterval={interval!r} must be >= 1, or -1 to disable checkpoints "
                                     f"({rule} rule)")
