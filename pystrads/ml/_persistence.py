"""Shared persistence plumbing for pystrads models: pyspark metadata plus data written by Spark."""

from __future__ import annotations

from pyspark.ml.util import MLReadable, MLReader, MLWritable, MLWriter


class ModelWriter(MLWriter):
    """Writes ``instance`` through its ``_save_data(path, spark)`` (after the caller's metadata)."""

    def __init__(self, instance):
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        self.instance._save(path, self.sparkSession)


class ModelReader(MLReader):
    """Reads a model through ``cls._load(path, spark)``."""

    def __init__(self, cls):
        super().__init__()
        self.cls = cls

    def load(self, path: str):
        return self.cls._load(path, self.sparkSession)


class PersistentModel(MLReadable, MLWritable):
    """Mixin: a model implementing ``_save(path, spark)`` and classmethod ``_load(path, spark)``."""

    def write(self) -> MLWriter:
        return ModelWriter(self)

    @classmethod
    def read(cls) -> MLReader:
        return ModelReader(cls)
