"""Saving and loading pystrads models in MLlib's layout (:class:`PersistentModel`), with an
overwrite that also works under Spark Connect.

The base writes what every model has -- pyspark's params metadata (class, uid, params, plus the
model's extra metadata) in ``path/metadata`` -- and a model adds its arrays through two hooks:
``_save_data(write)`` calls ``write(name, schema, rows)`` for each parquet folder
``path/<name>`` (``rows`` a list made on the driver, or a DataFrame the executors write) and
returns the extra metadata; the classmethod ``_load_data(read, metadata)``
reads them back with ``read(name)`` (a DataFrame) and returns the model, without its params.
Spark writes and reads the data, so any Hadoop / DBFS path works.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict

from pyspark.ml.util import DefaultParamsWriter, GeneralMLWriter, MLReadable, MLReader, MLWritable, MLWriter


def metadata_context(spark):
    """What ``DefaultParamsWriter.saveMetadata`` / ``DefaultParamsReader.loadMetadata`` take:
    the session on pyspark 4 (so Spark Connect sessions work), the SparkContext on 3.5."""
    import pyspark

    return spark if int(pyspark.__version__.split(".")[0]) >= 4 else spark.sparkContext


def json_param_map(instance) -> Dict[str, Any]:
    """The params set on ``instance``, as the metadata's JSON holds them: vectors and matrices
    (MLlib's bound params) in MLlib's JSON form, which the params' type converters read back."""
    return {param.name: _json_value(value) for param, value in instance._paramMap.items()}


def _json_value(value):
    from pyspark.ml.linalg import DenseMatrix, DenseVector, SparseMatrix, SparseVector

    if isinstance(value, SparseVector):
        return {"type": 0, "size": int(value.size), "indices": value.indices.tolist(),
                "values": value.values.tolist()}
    if isinstance(value, DenseVector):
        return {"type": 1, "values": value.toArray().tolist()}
    if isinstance(value, SparseMatrix):
        return {"class": "matrix", "type": 0, "numRows": value.numRows, "numCols": value.numCols,
                "colPtrs": value.colPtrs.tolist(), "rowIndices": value.rowIndices.tolist(),
                "values": value.values.tolist(), "isTransposed": bool(value.isTransposed)}
    if isinstance(value, DenseMatrix):
        return {"class": "matrix", "type": 1, "numRows": value.numRows, "numCols": value.numCols,
                "values": value.values.tolist(), "isTransposed": bool(value.isTransposed)}
    return value


class ParamsWriter(DefaultParamsWriter):
    """pyspark's writer of an estimator's params (``DefaultParamsWriter``), with vector and matrix
    params saved in MLlib's JSON form (pyspark's would fail on them)."""

    def saveImpl(self, path: str) -> None:
        DefaultParamsWriter.saveMetadata(self.instance, path, metadata_context(self.sparkSession),
                                         paramMap=json_param_map(self.instance))


class ModelWriter(GeneralMLWriter):
    """Writes ``instance`` through its ``_save(path, spark)``, or -- ``format(name)``, one of the
    model's ``_export_formats`` besides ``"internal"`` -- its ``_export(name, path, spark)``."""

    def __init__(self, instance):
        super().__init__()
        self.instance = instance
        self.source = "internal"

    def format(self, source: str) -> "ModelWriter":
        """The format to save in: ``"internal"`` (MLlib's layout, what ``load`` reads) or an export
        format the model has (``"pmml"`` for the linear regression model, as MLlib's)."""
        formats = self.instance._export_formats
        if not isinstance(source, str) or source.lower() not in formats:
            from ..errors import ConfigurationError

            raise ConfigurationError(f"format {source!r}: a {type(self.instance).__name__} saves as "
                                     + " or ".join(map(repr, formats)))
        self.source = source.lower()
        return self

    def _handleOverwrite(self, path: str) -> None:
        from ..spark import is_connect_session

        if not is_connect_session(self.sparkSession):
            return super()._handleOverwrite(path)
        # pyspark's overwrite goes through the JVM, which a Spark Connect client does not have:
        # a Spark task deletes the directory through pyarrow's filesystems (local paths, hdfs://,
        # s3://, ...) as the executors, which write the model, see them (the client may see none)
        from ..spark import handle_of

        handle_of(self.sparkSession).run_tasks(lambda _index: [_delete_dir(path)], 1)

    def saveImpl(self, path: str) -> None:
        if self.source == "internal":
            self.instance._save(path, self.sparkSession)
        else:
            self.instance._export(self.source, path, self.sparkSession)


def _delete_dir(path: str) -> bool:
    """Delete ``path`` (a model directory) if it exists; whether it did."""
    from ..ps import storage

    if not storage.exists(path):
        return False
    storage.delete_dir(path)
    return True


class ModelReader(MLReader):
    """Reads a model through ``cls._load(path, spark)``."""

    def __init__(self, cls):
        super().__init__()
        self.cls = cls

    def load(self, path: str):
        return self.cls._load(path, self.sparkSession)


class PersistentModel(MLReadable, MLWritable):
    """Mixin: MLlib's layout, metadata and uid and params written here, the data by the hooks
    ``_save_data`` / ``_load_data`` (see the module docstring)."""

    #: what ``write().format(...)`` takes: ``"internal"`` and the model's export formats
    _export_formats = ("internal",)

    def write(self) -> MLWriter:
        return ModelWriter(self)

    def _export(self, source: str, path: str, spark) -> None:
        """Write the model to ``path`` in export format ``source`` (one of ``_export_formats``)."""
        raise NotImplementedError

    @classmethod
    def read(cls) -> MLReader:
        return ModelReader(cls)

    def _save_data(self, write: Callable[[str, Any, list], None]) -> Dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def _load_data(cls, read: Callable[[str], Any], metadata: Dict[str, Any]):
        raise NotImplementedError

    def _save(self, path: str, spark) -> None:
        from ..spark import is_dataframe

        def write(name: str, schema, rows) -> None:
            frame = rows if is_dataframe(rows) else spark.createDataFrame(rows, schema)
            frame.write.parquet(os.path.join(path, name))

        extra = self._save_data(write)
        DefaultParamsWriter.saveMetadata(self, path, metadata_context(spark), extraMetadata=extra,
                                         paramMap=json_param_map(self))

    @classmethod
    def _load(cls, path: str, spark):
        from pyspark.ml.util import DefaultParamsReader

        metadata = DefaultParamsReader.loadMetadata(path, metadata_context(spark))
        model = cls._load_data(lambda name: spark.read.parquet(os.path.join(path, name)), metadata)
        model._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(model, metadata)
        return model
