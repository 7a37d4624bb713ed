"""StradsMF's data through Spark: the ratings in, the factors out.

- Reading the ratings: :func:`read_ratings` (checked, with the sorted distinct ids and each item's
  number of ratings from :func:`ids_and_item_counts`), :func:`dense_ids` (a rating's ids as
  positions, on the workers) and :func:`user_factors` (what each worker hands over when the fit
  ends, gathered by :func:`gather_user_factors`).
- The factors out, as ALS gives them: :func:`factors_frame` (``userFactors`` / ``itemFactors``),
  :func:`predictions` (``transform``'s column) and :func:`recommendations` (``recommendFor*``);
  a saved model's factor tables: :func:`save_factors` / :func:`load_factors`.
"""

from __future__ import annotations

import numpy as np
import pyspark
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..errors import ConfigurationError, InputError
from ._arrow import collect_per_partition
from ._validation import check_ratings

#: ALSModel.transform casts the ids to int from Spark 4 on (3.5 keeps their input type)
_ALS_CASTS_IDS = int(pyspark.__version__.split(".")[0]) >= 4


def read_ratings(dataset, ucol: str, icol: str, rcol: str, workers: int):
    """``(records, stats)``: the ratings as (u, i, r) doubles, each worker's partition holding whole
    users (hashed by user), and ``users``, ``items``, ``item_counts``, ``item_positives`` (see
    :func:`ids_and_item_counts`).
    Refuses empty input, bad ids and bad ratings first (one job, naming the column, the value and the fix)."""
    triples = dataset.select(F.col(ucol).cast("double").alias("u"), F.col(icol).cast("double").alias("i"),
                             F.col(rcol).cast("double").alias("r"))
    check_ratings(triples, ucol, icol, rcol)
    users, items, item_counts, item_positives = ids_and_item_counts(triples)
    if not len(users) or not len(items):
        raise InputError("the input has no ratings; StradsMF needs at least one (user, item, rating) row")
    return triples.repartition(workers, "u"), {"users": users, "items": items, "item_counts": item_counts,
                                               "item_positives": item_positives}


def ids_and_item_counts(triples):
    """``(users, items, item_counts, item_positives)`` of checked ``triples`` (columns u, i, r as
    double): sorted distinct ids as int64, each item's number of ratings and of ratings > 0.  One Spark job and no shuffle: each
    partition reduces its rows to its distinct users and item counts with numpy (Arrow batches),
    the driver merges them -- the ids end up on the driver anyway."""
    def reduce(batches):
        us, its, cs, ps = ([np.zeros(0, np.int64)] for _ in range(4))
        for batch in batches:
            us.append(np.unique(batch.column(0).to_numpy(zero_copy_only=False).astype(np.int64)))
            ids, where, counts = np.unique(batch.column(1).to_numpy(zero_copy_only=False).astype(np.int64),
                                           return_inverse=True, return_counts=True)
            its.append(ids)
            cs.append(counts)
            positive = batch.column(2).to_numpy(zero_copy_only=False) > 0
            ps.append(np.bincount(where, weights=positive, minlength=len(ids)).astype(np.int64))
        return np.unique(np.concatenate(us)), np.concatenate(its), np.concatenate(cs), np.concatenate(ps)

    parts = collect_per_partition(triples.select("u", "i", "r"), reduce) or [(np.zeros(0, np.int64),) * 4]
    users = np.unique(np.concatenate([p[0] for p in parts]))
    items, where = np.unique(np.concatenate([p[1] for p in parts]), return_inverse=True)
    item_counts = np.bincount(where, weights=np.concatenate([p[2] for p in parts]), minlength=len(items))
    item_positives = np.bincount(where, weights=np.concatenate([p[3] for p in parts]), minlength=len(items))
    return users, items, item_counts.astype(np.float64), item_positives.astype(np.float64)


def dense_ids(users: np.ndarray, items: np.ndarray, row):
    """A rating ``(u, i, r)`` with its ids as positions in the sorted ``users`` / ``items``."""
    u, i, r = row
    return int(np.searchsorted(users, int(u))), int(np.searchsorted(items, int(i))), float(r)


def user_factors(worker: int, data, state):
    """What a worker hands over when the fit ends: its users' positions and factor rows."""
    return data.users, state.w


def gather_user_factors(exports, num_users: int, rank: int) -> np.ndarray:
    """The user factor matrix from the workers' :func:`user_factors`."""
    w = np.zeros((num_users, rank))
    for local, rows in exports:
        w[local] = rows
    return w


def factors_frame(spark, ids: np.ndarray, factors: np.ndarray):
    """DataFrame (id int, features array<float>), as ALSModel.userFactors / itemFactors."""
    schema = T.StructType([T.StructField("id", T.IntegerType(), False),
                           T.StructField("features", T.ArrayType(T.FloatType(), False), True)])
    rows = [(int(i), [float(x) for x in f]) for i, f in zip(ids, factors.astype(np.float32))]
    return spark.createDataFrame(rows, schema)


def predictions(dataset, ucol: str, icol: str, out_col: str, user_ids, w, item_ids, h, drop: bool):
    """``dataset`` with column ``out_col``, as ALSModel.transform: the predicted rating as a
    non-null float, NaN for an unknown user or item (those rows dropped with ``drop``)."""
    from pyspark.sql.functions import pandas_udf

    factors = (user_ids, w.astype(np.float32), item_ids, h.astype(np.float32))

    @pandas_udf("float")  # the factors travel with the function (Spark broadcasts large ones)
    def predict(users, items):
        import pandas as pd

        uid, w, iid, h = factors
        u = users.to_numpy(dtype=np.float64, na_value=np.nan)
        i = items.to_numpy(dtype=np.float64, na_value=np.nan)
        ui = np.searchsorted(uid, np.nan_to_num(u, nan=-1).astype(np.int64))
        ii = np.searchsorted(iid, np.nan_to_num(i, nan=-1).astype(np.int64))
        ui_c, ii_c = np.minimum(ui, len(uid) - 1), np.minimum(ii, len(iid) - 1)
        known = (uid[ui_c] == u) & (iid[ii_c] == i)
        out = np.full(len(u), np.nan, dtype=np.float32)
        out[known] = np.einsum("ij,ij->i", w[ui_c[known]], h[ii_c[known]])
        return pd.Series(out)

    out = dataset
    if _ALS_CASTS_IDS:
        out = out.withColumn(ucol, F.col(ucol).cast("int")).withColumn(icol, F.col(icol).cast("int"))
    out = out.withColumn(out_col, F.coalesce(predict(F.col(ucol), F.col(icol)), F.lit(float("nan")).cast("float")))
    return out.where(~F.isnan(F.col(out_col))) if drop else out


def recommendations(spark, src_ids, src, dst_ids, dst, num: int, src_col: str, dst_col: str, block_size: int,
                    subset=None):
    """DataFrame(src_col, recommendations: array<struct<dst_col, rating>>), ALS's schema: the
    ``num`` best destinations of each source (of those in ``subset``, when given) by the dot
    product of their factors; ``block_size`` sources are scored at once."""
    if num < 1:
        raise ConfigurationError(f"numItems/numUsers={num} must be >= 1")
    if subset is not None:
        pos = np.minimum(np.searchsorted(src_ids, subset), len(src_ids) - 1)
        rows_idx = np.unique(pos[src_ids[pos] == subset])
    else:
        rows_idx = np.arange(len(src_ids))
    factors = (src_ids, src.astype(np.float32), dst_ids, dst.astype(np.float32))
    n = min(num, len(dst_ids))
    blocks = [rows_idx[i:i + block_size] for i in range(0, len(rows_idx), block_size)]

    def top(block):
        s_ids, s, d_ids, d = factors
        scores = s[block] @ d.T
        part = np.argpartition(-scores, n - 1, axis=1)[:, :n] if n < scores.shape[1] else \
            np.tile(np.arange(scores.shape[1]), (len(block), 1))
        for r, row in enumerate(block):
            cand = part[r]
            order = cand[np.argsort(-scores[r, cand], kind="stable")]
            yield (int(s_ids[row]), [(int(d_ids[j]), float(scores[r, j])) for j in order])

    schema = T.StructType([
        T.StructField(src_col, T.IntegerType(), False),
        T.StructField("recommendations", T.ArrayType(T.StructType([
            T.StructField(dst_col, T.IntegerType(), True), T.StructField("rating", T.FloatType(), True)]),
            True), True)])
    # one row per block of block_size source rows, spread over partitions; each partition scores
    # its blocks against all destinations (the factors travel with the function)
    parts = max(1, min(len(blocks), int(spark.conf.get("spark.sql.shuffle.partitions", "4") or 4)))
    starts = spark.range(0, len(blocks), 1, parts)

    def score(batches):
        import pyarrow as pa

        rec_type = pa.list_(pa.struct([(dst_col, pa.int32()), ("rating", pa.float32())]))
        for batch in batches:
            out = [rec for b in batch.column(0).to_pylist() for rec in top(blocks[int(b)])]
            yield pa.RecordBatch.from_arrays(
                [pa.array([r[0] for r in out], pa.int32()),
                 pa.array([[{dst_col: d, "rating": v} for d, v in r[1]] for r in out], rec_type)],
                [src_col, "recommendations"])

    return starts.mapInArrow(score, schema)


def save_factors(write, user_ids, w, item_ids, h) -> None:
    """A saved model's ``userFactors/`` and ``itemFactors/``: (id long, features array<double>) rows."""
    schema = T.StructType([T.StructField("id", T.LongType(), False),
                           T.StructField("features", T.ArrayType(T.DoubleType(), False), False)])
    for name, ids, factors in (("userFactors", user_ids, w), ("itemFactors", item_ids, h)):
        write(name, schema, [(int(i), row.tolist()) for i, row in zip(ids, factors)])


def load_factors(read):
    """``(user_ids, w, item_ids, h)`` of a model written by :func:`save_factors`."""
    parts = []
    for name in ("userFactors", "itemFactors"):
        rows = sorted((r["id"], r["features"]) for r in read(name).collect())
        parts += [np.array([r[0] for r in rows], dtype=np.int64),
                  np.array([r[1] for r in rows], dtype=np.float64).reshape(len(rows), -1)]
    return parts
