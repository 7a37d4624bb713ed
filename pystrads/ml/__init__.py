"""MLlib-style estimators and models (pyspark.ml Params, Pipelines, persistence)."""

from .lda import StradsLDA, StradsLDAModel, StradsLDASummary

__all__ = ["StradsLDA", "StradsLDAModel", "StradsLDASummary"]
