"""Shared persistence for pystrads models: pyspark's params metadata plus data written by Spark
(:class:`PersistentModel`), with an overwrite that also works under Spark Connect."""

from __future__ import annotations

from pyspark.ml.util import MLReadable, MLReader, MLWritable, MLWriter


def metadata_context(spark):
    """What ``DefaultParamsWriter.saveMetadata`` / ``DefaultParamsReader.loadMetadata`` take:
    the session on pyspark 4 (so Spark Connect sessions work), the SparkContext on 3.5."""
    import pyspark

    return spark if int(pyspark.__version__.split(".")[0]) >= 4 else spark.sparkContext


class ModelWriter(MLWriter):
    """Writes ``instance`` through its ``_save_data(path, spark)`` (after the caller's metadata)."""

    def __init__(self, instance):
        super().__init__()
        self.instance = instance

    def _handleOverwrite(self, path: str) -> None:
        from ..engine.spark import is_connect_session

        if not is_connect_session(self.sparkSession):
            return super()._handleOverwrite(path)
        # pyspark's overwrite goes through the JVM, which a Spark Connect client does not have:
        # delete the directory through pyarrow's filesystems (local paths, hdfs://, s3://, ...)
        # as seen from this process
        from ..ps import storage

        if storage.exists(path):
            storage.delete_dir(path)

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
    """Mixin: MLlib's layout -- pyspark's params metadata (uid, params, ``_extra_metadata()``) in
    ``path/metadata`` plus the model's data, written and read by Spark so that any Hadoop / DBFS
    path works. A model implements ``_extra_metadata()``, ``_save_data(path, spark)`` and the
    classmethod ``_from_data(path, spark, metadata)``, which returns a model without its params."""

    def write(self) -> MLWriter:
        return ModelWriter(self)

    @classmethod
    def read(cls) -> MLReader:
        return ModelReader(cls)

    def _extra_metadata(self) -> dict:
        return {}

    def _save(self, path: str, spark) -> None:
        from pyspark.ml.util import DefaultParamsWriter

        DefaultParamsWriter.saveMetadata(self, path, metadata_context(spark), extraMetadata=self._extra_metadata())
        self._save_data(path, spark)

    @classmethod
    def _load(cls, path: str, spark):
        from pyspark.ml.util import DefaultParamsReader

        metadata = DefaultParamsReader.loadMetadata(path, metadata_context(spark))
        model = cls._from_data(path, spark, metadata)
        model._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(model, metadata)
        return model
