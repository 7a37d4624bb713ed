"""Readers for the common input formats of topic models, recommenders and sparse regression.

Each returns a Spark DataFrame shaped for the matching estimator and refuses
malformed input with a message naming the file, the line or column and the
fix -- before any training starts:

* :func:`read_uci_bow` -- UCI bag-of-words (``docword.*.txt[.gz]`` and
  ``vocab.*.txt``) -> ``(docId int, features vector)`` + vocabulary, for StradsLDA;
* :func:`read_count_vectors` -- saved ``CountVectorizer`` output (Parquet with a
  vector column) and, optionally, its fitted ``CountVectorizerModel`` for the
  vocabulary, for StradsLDA;
* :func:`read_movielens` -- MovieLens ``ratings.csv`` (latest, 20M, 25M),
  ``ratings.dat`` (1M, 10M) or ``u.data`` (100K) -> ``(userId int, movieId int,
  rating float, timestamp long)``, for StradsMF;
* :func:`read_libsvm` -- LIBSVM / SVMlight text -> ``(label double, features
  vector)``, for StradsLasso / StradsLogisticRegression.

Text corpora (one document per line, JSON lines, CSV, Parquet) are read by
:func:`pystrads.datasets.read_text_corpus`.
"""

from __future__ import annotations

import gzip
import os
from typing import List, Optional, Tuple

from ..errors import InputError

INT32_MAX = 2 ** 31 - 1


def _local_head(path: str, n: int) -> List[str]:
    """The first ``n`` lines of a local (optionally gzipped) file."""
    opener = gzip.open if path.endswith(".gz") else open
    out = []
    with opener(path, "rt", encoding="utf-8", errors="replace") as fh:
        for line in fh:
            out.append(line.rstrip("\n"))
            if len(out) == n:
                break
    return out


def _is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def _strip_file(path: str) -> str:
    return path[len("file://"):] if path.startswith("file://") else path


def _require(path: str, what: str) -> None:
    if _is_local(path) and not os.path.exists(_strip_file(path)):
        raise InputError(f"{what} {path!r} does not exist; check the path (local paths are read on the "
                         "driver and the executors alike, so on a cluster use a shared filesystem)")


def read_uci_bow(spark, docword_path: str, vocab_path: Optional[str] = None):
    """UCI bag-of-words: ``(df, vocabulary)``.

    ``docword``: three header lines (D documents, W words, NNZ entries), then
    ``docID wordID count`` per line, 1-based ids.  The DataFrame has one row per
    document with at least one word: ``docId`` (the file's id) and
    ``features``, a SparseVector of size W with the counts at ``wordID - 1`` --
    exactly what ``CountVectorizer`` would give StradsLDA.  ``vocabulary`` is the
    list of W words from ``vocab_path`` (line i = word i), or None.
    """
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import functions as F

    _require(docword_path, "docword file")
    if _is_local(docword_path):
        head = _local_head(_strip_file(docword_path), 3)
    else:
        head = [r[0] for r in spark.read.text(docword_path).limit(3).collect()]
    try:
        num_docs, num_words, nnz = (int(x.strip()) for x in head)
    except ValueError:
        raise InputError(f"{docword_path}: the first three lines must be D, W and NNZ (integers), got {head!r}; "
                         "is this a UCI docword file?") from None
    vocabulary = None
    if vocab_path is not None:
        _require(vocab_path, "vocab file")
        vocabulary = [r[0] for r in spark.read.text(vocab_path).collect()] if not _is_local(vocab_path) else \
            _local_head(_strip_file(vocab_path), num_words + 1)
        vocabulary = [w.strip() for w in vocabulary if w.strip()]
        if len(vocabulary) != num_words:
            raise InputError(f"{vocab_path} has {len(vocabulary)} words but {docword_path} says W={num_words}; "
                             "pass the vocab file of the same collection")
    lines = spark.read.text(docword_path)
    parts = F.split(F.trim(F.col("value")), r"\s+")
    triples = (lines.where(F.size(parts) == 3)
               .select(parts.getItem(0).cast("long").alias("doc"), parts.getItem(1).cast("long").alias("word"),
                       parts.getItem(2).cast("double").alias("count")))
    bad = triples.where(F.col("doc").isNull() | F.col("word").isNull() | F.col("count").isNull()
                        | (F.col("doc") < 1) | (F.col("doc") > num_docs) | (F.col("word") < 1)
                        | (F.col("word") > num_words) | (F.col("count") <= 0)
                        | (F.col("count") != F.floor(F.col("count")))).limit(1).collect()
    if bad:
        r = bad[0]
        raise InputError(f"{docword_path}: bad entry doc={r['doc']} word={r['word']} count={r['count']} "
                         f"(ids must be in 1..D={num_docs} / 1..W={num_words}, counts positive integers)")
    size = num_words

    @F.udf(returnType=VectorUDT())
    def to_vector(words, counts):
        import numpy as np
        from pyspark.ml.linalg import SparseVector

        idx = np.asarray(words, dtype=np.int64) - 1
        cnt = np.asarray(counts, dtype=np.float64)
        order = np.argsort(idx, kind="stable")
        idx, cnt = idx[order], cnt[order]
        starts = np.flatnonzero(np.r_[True, idx[1:] != idx[:-1]])  # repeated (doc, word) lines add up
        return SparseVector(size, idx[starts].tolist(), np.add.reduceat(cnt, starts).tolist())

    df = (triples.groupBy("doc").agg(F.collect_list("word").alias("w"), F.collect_list("count").alias("c"))
          .select(F.col("doc").cast("int").alias("docId"), to_vector("w", "c").alias("features")))
    return df, vocabulary


def read_count_vectors(spark, path: str, features_col: str = "features", model_path: Optional[str] = None):
    """Saved ``CountVectorizer`` output: ``(df, vocabulary)``.

    ``path``: Parquet with a term-count vector column ``features_col``;
    ``model_path``: the saved ``CountVectorizerModel`` (or a ``PipelineModel``
    whose last CountVectorizerModel is used) for the vocabulary, else None.
    The vectors are checked to have the vocabulary's size.
    """
    from pyspark.ml.linalg import VectorUDT

    _require(path, "count-vector Parquet")
    df = spark.read.parquet(path)
    if features_col not in df.columns:
        raise InputError(f"{path}: no column {features_col!r} (columns: {df.columns}); pass features_col=")
    if not isinstance(df.schema[features_col].dataType, VectorUDT):
        raise InputError(f"{path}: column {features_col!r} is {df.schema[features_col].dataType.simpleString()}, "
                         "not a vector; it must hold CountVectorizer's term counts")
    vocabulary = None
    if model_path is not None:
        from pyspark.ml import PipelineModel
        from pyspark.ml.feature import CountVectorizerModel

        _require(model_path, "CountVectorizerModel")
        try:
            vocabulary = list(CountVectorizerModel.load(model_path).vocabulary)
        except Exception:  # noqa: BLE001 -- maybe a pipeline holding one
            try:
                stages = PipelineModel.load(model_path).stages
            except Exception as exc:  # noqa: BLE001
                raise InputError(f"{model_path} is neither a CountVectorizerModel nor a PipelineModel: "
                                 f"{str(exc)[:200]}") from None
            cvs = [s for s in stages if isinstance(s, CountVectorizerModel)]
            if not cvs:
                raise InputError(f"{model_path}: the pipeline has no CountVectorizerModel stage")
            vocabulary = list(cvs[-1].vocabulary)
        first = df.select(features_col).first()
        if first is not None and first[0].size != len(vocabulary):
            raise InputError(f"{path}: vectors have size {first[0].size} but the vocabulary of {model_path} has "
                             f"{len(vocabulary)} words; pass the model that made these vectors")
    return df, vocabulary


def read_movielens(spark, path: str):
    """MovieLens ratings as ``(userId int, movieId int, rating float, timestamp long)``.

    ``path``: a ``ratings.csv[.gz]`` (header ``userId,movieId,rating,timestamp``),
    a ``ratings.dat`` (``user::movie::rating::timestamp``), a ``u.data`` (tab
    separated), or a directory holding one of them.
    """
    from pyspark.sql import functions as F

    _require(path, "MovieLens path")
    local = _strip_file(path)
    if _is_local(path) and os.path.isdir(local):
        for name in ("ratings.csv", "ratings.csv.gz", "ratings.dat", "u.data"):
            if os.path.exists(os.path.join(local, name)):
                path = os.path.join(local, name)
                break
        else:
            raise InputError(f"{local} holds no ratings.csv, ratings.csv.gz, ratings.dat or u.data")
    name = os.path.basename(path.rstrip("/"))
    if name.startswith("ratings.csv"):
        raw = spark.read.option("header", True).csv(path)
        need = ["userId", "movieId", "rating"]
        missing = [c for c in need if c not in raw.columns]
        if missing:
            raise InputError(f"{path}: missing column(s) {missing} (columns: {raw.columns}); a MovieLens "
                             "ratings.csv has userId,movieId,rating,timestamp")
        cols = [F.col(c) for c in need] + [F.col("timestamp") if "timestamp" in raw.columns else F.lit(None)]
    else:
        sep = "::" if name.endswith(".dat") else "\t"
        raw = spark.read.text(path)
        parts = F.split(F.col("value"), sep if sep == "\t" else "::")
        cols = [parts.getItem(i) for i in range(4)]
    df = raw.select(cols[0].cast("long").alias("userId"), cols[1].cast("long").alias("movieId"),
                    cols[2].cast("float").alias("rating"), cols[3].cast("long").alias("timestamp"))
    bad = df.where(F.col("userId").isNull() | F.col("movieId").isNull() | F.col("rating").isNull()
                   | F.isnan("rating") | (F.col("userId") < 0) | (F.col("movieId") < 0)
                   | (F.col("userId") > INT32_MAX) | (F.col("movieId") > INT32_MAX)).limit(1).collect()
    if bad:
        raise InputError(f"{path}: unparsable or out-of-range rating row {bad[0].asDict()} (ids must be "
                         f"integers in [0, {INT32_MAX}], ratings numbers)")
    return df.select(F.col("userId").cast("int"), F.col("movieId").cast("int"), "rating", "timestamp")


def read_libsvm(spark, path: str, num_features: Optional[int] = None):
    """LIBSVM / SVMlight text (``label index:value ...``, 1-based indices) as
    ``(label double, features vector)`` with Spark's own reader.  Pass
    ``num_features`` when known (saves a pass over the data and keeps train and
    test vectors the same size)."""
    _require(path, "libsvm file")
    reader = spark.read.format("libsvm")
    if num_features is not None:
        if num_features < 1:
            raise InputError(f"num_features={num_features} must be >= 1")
        reader = reader.option("numFeatures", int(num_features))
    try:
        return reader.load(path)
    except Exception as exc:  # noqa: BLE001 -- Spark's message is long; keep its first line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"{path}: not readable as libsvm ({first[:300]}); lines must be "
                         "'label index:value ...' with 1-based increasing indices") from None


__all__: Tuple[str, ...] = ("read_uci_bow", "read_count_vectors", "read_movielens", "read_libsvm")
