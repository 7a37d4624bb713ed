"""MLlib-style estimators and models (pyspark.ml Params, Pipelines, persistence)."""

from .lda import StradsLDA, StradsLDAModel, StradsLDASummary
from .recommendation import StradsMF, StradsMFModel, StradsMFSummary

__all__ = ["StradsLDA", "StradsLDAModel", "StradsLDASummary", "StradsMF", "StradsMFModel", "StradsMFSummary"]
