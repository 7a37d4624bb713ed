"""MLlib-style estimators and models (pyspark.ml Params, Pipelines, persistence).

The names below load on first use: a Spark worker that unpickles one of this package's data
functions (:mod:`._arrow`, :mod:`._lda_data`, ...) imports that module only, not the estimators
and with them all of ``pyspark.ml`` (whose package imports every MLlib algorithm, pandas and
scipy: seconds per Python worker).
"""

from typing import TYPE_CHECKING

from .. import lazy_exports

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


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
