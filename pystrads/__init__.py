"""pystrads: STRADS-style scheduled model-parallel machine learning on Apache Spark."""

__version__ = "0.1.0"
