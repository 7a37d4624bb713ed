"""MLlib-style estimators and models (pyspark.ml Params, Pipelines, persistence)."""

from .lda import StradsLDA, StradsLDAModel, StradsLDASummary
from .classification import StradsLogisticRegression, StradsLogisticRegressionModel
from .recommendation import StradsMF, StradsMFModel, StradsMFSummary
from .regression import StradsLasso, StradsLassoModel

__all__ = ["StradsLDA", "StradsLDAModel", "StradsLDASummary", "StradsMF", "StradsMFModel", "StradsMFSummary",
           "StradsLasso", "StradsLassoModel", "StradsLogisticRegression", "StradsLogisticRegressionModel"]
