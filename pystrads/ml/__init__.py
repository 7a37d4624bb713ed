"""MLlib-style estimators and models (pyspark.ml Params, Pipelines, persistence).

The names below load on first use: a Spark worker that unpickles one of this package's data
functions (:mod:`._arrow`, :mod:`._lda_data`, ...) imports that module only, not the estimators
and with them all of ``pyspark.ml`` (whose package imports every MLlib algorithm, pandas and
scipy: seconds per Python worker).
"""

from importlib import import_module
from typing import TYPE_CHECKING

_EXPORTS = {
    "StradsLDA": ".lda", "StradsLDAModel": ".lda", "StradsLDASummary": ".lda",
    "StradsLogisticRegression": ".classification", "StradsLogisticRegressionModel": ".classification",
    "StradsMF": ".recommendation", "StradsMFModel": ".recommendation", "StradsMFSummary": ".recommendation",
    "StradsLasso": ".regression", "StradsLassoModel": ".regression",
}

__all__ = list(_EXPORTS)

if TYPE_CHECKING:  # for type checkers and IDEs: the names as if imported eagerly
    from .classification import StradsLogisticRegression, StradsLogisticRegressionModel
    from .lda import StradsLDA, StradsLDAModel, StradsLDASummary
    from .recommendation import StradsMF, StradsMFModel, StradsMFSummary
    from .regression import StradsLasso, StradsLassoModel


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
