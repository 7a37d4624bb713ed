"""The bases every pystrads estimator and model fill in.

:class:`_StradsEstimator` holds the one ``_fit``: check the params and the input columns (no
Spark job), choose and check the workers, scan the input, build the program, run it on the
:class:`~pystrads.engine.Engine`, read the model back and attach its training summary.  An
estimator fills in the hooks (the only place it differs from the others):

================  ============================================================================
``_fit_columns``  the params naming the columns ``fit`` reads (class attribute)
``_scan``         ``fit -> (records, stats)``: one pass over the input that refuses bad values
``_program``      ``fit -> Program``
``_engine_args``  ``fit -> dict`` of extra :class:`~pystrads.engine.Engine` arguments (optional)
``_read_model``   ``(result, fit) -> model``, without params or summary
``_summary_class``  ``cls(engine_result, fit)``: the training summary
================  ============================================================================

Every estimator gets ``set<Name>`` for each of its params and a ``setParams`` with its
``__init__``'s signature; a model (:class:`_StradsModel`) gets ``set<Name>`` for the params it
lists in ``_setters`` -- MLlib's model setters -- and the persistence of
:class:`~pystrads.ml._persistence.PersistentModel`.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import time
from typing import Any, ClassVar, Dict, Optional, Tuple

from pyspark import keyword_only
from pyspark.ml import Estimator, Model
from pyspark.ml.param import Param
from pyspark.ml.util import DefaultParamsReadable, DefaultParamsWritable

from ..engine import Engine
from ..errors import PystradsError
from ..engine.driver.preflight import FitSetup, preflight
from ._params import _StradsParams, add_accessor
from ._persistence import ParamsWriter, PersistentModel
from ._summary import HasTrainingSummary

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Fit:
    """One fit in progress, as the hooks see it: the input, the workers and the seed, what the
    scan found (``records`` for the engine, ``stats`` for the program, the model and the
    summary; hooks may add to ``stats``), the program and the one-off costs (``timings``, s)."""

    dataset: Any
    t_start: float
    setup: Optional[FitSetup] = None
    workers: int = 0
    seed: int = 0
    records: Any = None
    stats: Dict[str, Any] = dataclasses.field(default_factory=dict)
    program: Any = None
    timings: Dict[str, float] = dataclasses.field(default_factory=dict)


def _set_params_like(init):
    """A ``setParams`` that takes exactly the keyword arguments of ``init`` (pyspark's pair of
    ``@keyword_only`` methods with one signature, written once)."""
    signature = inspect.signature(init)

    @keyword_only
    def setParams(self, **kwargs):
        signature.bind(self, **kwargs)  # an unknown name is a TypeError, as with a written-out signature
        self._set(**kwargs)
        self._check_set_params()
        return self

    setParams.__signature__ = signature
    setParams.__doc__ = "Sets params for this estimator (the keyword arguments of its constructor)."
    return setParams


class _StradsEstimator(Estimator, _StradsParams, DefaultParamsReadable, DefaultParamsWritable):
    """Base of the pystrads estimators (see the module docstring)."""

    _fit_columns: ClassVar[Tuple[str, ...]] = ()
    _summary_class: ClassVar[type]

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        for name in dir(cls):
            if isinstance(getattr(cls, name, None), Param):
                add_accessor(cls, "set", name)
        if "__init__" in vars(cls) and "setParams" not in vars(cls):
            cls.setParams = _set_params_like(cls.__init__)

    def write(self):
        """pyspark's params writer, with vector and matrix params (MLlib's bounds) in MLlib's JSON form."""
        return ParamsWriter(self)

    def _fit(self, dataset):
        fit = Fit(dataset, time.perf_counter())
        self._check_params()
        self._check_columns(dataset, *self._fit_columns)
        self._warn_mllib_only()
        requested = self.getOrDefault("numWorkers")
        config = {"checkpoint.interval": max(0, self.getOrDefault("checkpointInterval"))} \
            if self.hasParam("checkpointInterval") else None  # MLlib's rule, when a checkpoint directory is set
        fit.setup = preflight(dataset, requested or None, config, workers_param="numWorkers",  # before any job
                              per_executor=self._multithreaded())
        fit.workers = fit.setup.num_workers
        fit.seed = int(self.getOrDefault("seed"))  # HasSeed always has a default
        fit.records, fit.stats = self._scan(fit)
        fit.program = self._program(fit)
        fit.timings["scan_s"] = time.perf_counter() - fit.t_start
        engine = Engine(fit.program, fit.records, seed=fit.seed, keep_states=False, setup=fit.setup,
                        **self._engine_args(fit))
        with engine.fit() as result:
            t0 = time.perf_counter()
            model = self._read_model(result, fit)
            fit.timings["read_model_s"] = time.perf_counter() - t0
            model._summary = self._summary_class(result, fit)
        model._resetUid(self.uid)  # as MLlib's: a model carries its estimator's uid (tools key on it)
        return self._copyValues(model)

    # -- the hooks
    def _multithreaded(self) -> bool:
        """Whether this fit's program computes with its workers' threads (``ctx.parallel``):
        then, without settings, one worker per executor with all of its cores."""
        return True

    def _scan(self, fit: Fit) -> Tuple[Any, Dict[str, Any]]:
        raise NotImplementedError

    def _program(self, fit: Fit):
        raise NotImplementedError

    def _engine_args(self, fit: Fit) -> Dict[str, Any]:
        return {}

    def _read_model(self, result, fit: Fit) -> "_StradsModel":
        raise NotImplementedError


class _StradsModel(HasTrainingSummary, Model, _StradsParams, PersistentModel):
    """Base of the pystrads models: the training summary, persistence and the setters of the
    params named in ``_setters`` (MLlib's model setters: point a fitted or loaded model at
    other columns)."""

    _setters: ClassVar[Tuple[str, ...]] = ()
    _summary: Optional[Any] = None
    _closed: bool = False

    def _repr_fields(self) -> Dict[str, Any]:
        """What ``repr`` shows after the uid, as MLlib's models' ``toString`` (``numFeatures``, ...)."""
        return {}

    def __repr__(self) -> str:
        try:
            fields = "".join(f", {name}={value}" for name, value in self._repr_fields().items())
        except Exception:  # noqa: BLE001 -- a repr never raises (a closed model, say)
            fields = ""
        return f"{type(self).__name__}: uid={self.uid}{fields}"

    # -- the DataFrames a model keeps on the executors, and freeing them
    def _kept_frames(self) -> list:
        """The DataFrames this model keeps on the executors (what :meth:`close` frees)."""
        return []

    def _forget_frames(self) -> None:
        """Drop this model's references to its kept frames (after :meth:`close`)."""

    def close(self) -> None:
        """Free what the model keeps on the executors: its tables' local-checkpoint blocks (or its
        Parquet files under ``spark.pystrads.model.dir``).  The model and its copies cannot
        score, recommend or save afterwards (a saved model loads again); models whose
        parameters live on the driver (the linear models) keep working.  Also a context manager:
        ``with est.fit(df) as model: ...`` closes it at the end of the block."""
        from ..engine.driver.frames import release_frame

        for frame in self._kept_frames():
            if frame is not None:
                release_frame(frame)
        self._closed = True
        self._forget_frames()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> bool:
        self.close()
        return False

    def _check_open(self) -> None:
        if self._closed or any(vars(f).get("_pystrads_released", False) for f in self._kept_frames() if f is not None):
            raise PystradsError(f"this {type(self).__name__} was closed (close()): the tables it kept on the executors "
                                "are freed; load a saved copy or fit again")

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        for name in cls._setters:
            add_accessor(cls, "set", name)
