"""StradsMF's data through Spark: the ratings in, the factors out -- the factors never on the driver.

- Reading the ratings: :func:`read_ratings` (checked, with the sorted distinct ids and each item's
  number of ratings from :func:`ids_and_item_counts`), :func:`dense_ids` (a batch of ratings' ids as
  positions, on the workers) and :func:`user_factors` (what each worker leaves on the shards
  when the fit ends).
- The factors out, as ALS holds them: :func:`fitted_factors` makes ``userFactors`` /
  ``itemFactors`` (DataFrames of id int, features array<float>) on the executors, from the
  workers' exports and the ``item_factors`` table (:mod:`pystrads.engine.driver.frames`), and
  materialises them before the shards drop the fit; :func:`predictions` (``transform``: two
  left joins) and :func:`recommendations` (``recommendFor*``: ALS's blocked top-k -- blocks of
  ``blockSize`` rows cross-joined, each pair scored by one matmul, the pairs' candidates merged
  per block); a saved model's factor tables: :func:`save_factors` / :func:`load_factors`.
"""

from __future__ import annotations

from typing import List, Optional

import numpy as np
import pyspark
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..errors import ConfigurationError, InputError
from ..kernels.sets import unique
from ..programs.mf import RatingBlock
from ..ps.protocol import numbers, numpy_filled, numpy_of
from ._arrow import collect_per_partition, partition_id
from ._validation import bad_rating_rows, refuse_ratings

#: ALSModel.transform casts the ids to int from Spark 4 on (3.5 keeps their input type)
_ALS_CASTS_IDS = int(pyspark.__version__.split(".")[0]) >= 4


def read_ratings(dataset, ucol: str, icol: str, rcol: str, workers: int, vcol: Optional[str] = None):
    """``(records, stats)``: the ratings as (u, i, r) doubles (and v, the validation flag as a
    boolean, null counting as training, when ``vcol`` names the validation indicator), each
    worker's partition holding whole users (hashed by user), and ``users``, ``items``,
    ``item_counts``, ``item_positives`` of the training ratings (see :func:`ids_and_item_counts`).
    Refuses empty input, bad ids and bad ratings (in the same job, naming the column, the value and the fix)."""
    columns = [F.col(ucol).cast("double").alias("u"), F.col(icol).cast("double").alias("i"),
               F.col(rcol).cast("double").alias("r")]
    if vcol:
        columns.append(F.coalesce(F.col(vcol), F.lit(False)).alias("v"))
    triples = dataset.select(*columns)
    users, items, item_counts, item_positives = ids_and_item_counts(triples, (ucol, icol, rcol))
    if not len(users) or not len(items):
        raise InputError("the input has no training ratings; StradsMF needs at least one (user, item, rating) row"
                         + (f" whose {vcol!r} is false" if vcol else ""))
    return triples.repartition(workers, "u"), {"users": users, "items": items, "item_counts": item_counts,
                                               "item_positives": item_positives}


#: a partition that holds more distinct users (items) than this sends none; the driver then asks
#: Spark for the distinct ids (a shuffle) instead of merging every partition's (bounded memory)
IDS_PER_PARTITION = 1 << 18


def ids_and_item_counts(triples, names=("u", "i", "r")):
    """``(users, items, item_counts, item_positives)`` of ``triples`` (columns u, i, r as double,
    and v, true for a validation rating, when there is one) checked in the same pass
    (:func:`~._validation.bad_rating_rows`, whose first refused row :func:`~._validation.refuse_ratings`
    names with the user, item and rating columns ``names``): sorted distinct ids as int32 (ALS's ids), each item's number of
    training ratings and of those > 0.  One Spark job and no shuffle while each partition has at
    most :data:`IDS_PER_PARTITION` distinct users and items: it reduces its rows to them and the
    item counts with numpy (Arrow batches) and the driver merges them.  Past that (millions of
    users, spread over every partition) Spark's distinct / group-by make the ids, so the driver
    holds each id once."""
    limit = IDS_PER_PARTITION  # read here: the tasks see the driver's value
    validation = "v" in triples.columns
    frame = triples.select("u", "i", "r", *(["v"] if validation else []))

    def reduce(batches):
        us, its, cs, ps = ([np.zeros(0, np.int32)] for _ in range(4))
        rows = 0
        for batch in batches:
            rows += batch.num_rows
            u, i, r = (numpy_filled(batch.column(k), np.nan) for k in range(3))
            bad = bad_rating_rows(u, i, r)
            if len(bad):  # the driver refuses the input: its first bad row is all it needs
                return rows, tuple(batch.column(k)[int(bad[0])].as_py() for k in range(3)), None, None, None, None
            if validation:
                keep = ~numpy_filled(batch.column(3), False).astype(bool)
                u, i, r = u[keep], i[keep], r[keep]
            us.append(unique(u.astype(np.int32)))
            ids, where, counts = np.unique(i.astype(np.int32), return_inverse=True, return_counts=True)
            its.append(ids)
            cs.append(counts)
            ps.append(np.bincount(where, weights=r > 0, minlength=len(ids)).astype(np.int64))
            if len(us) > 64:  # keep a partition's memory bounded by its distinct ids
                us = [unique(np.concatenate(us))]
        users = unique(np.concatenate(us))
        items, where = np.unique(np.concatenate(its), return_inverse=True)
        if len(users) > limit:
            users = None
        if len(items) > limit:
            return rows, None, users, None, None, None
        return (rows, None, users, items,
                np.bincount(where, weights=np.concatenate(cs), minlength=len(items)).astype(np.int64),
                np.bincount(where, weights=np.concatenate(ps), minlength=len(items)).astype(np.int64))

    checked = collect_per_partition(frame, reduce)
    refuse_ratings(sum(p[0] for p in checked), next((p[1] for p in checked if p[1] is not None), None), *names)
    parts = [p[2:] for p in checked]
    if validation:
        triples = triples.filter(~F.col("v"))
    if any(p[0] is None for p in parts):
        users = _distinct_ids(triples.select(F.col("u").cast("int").alias("id")).distinct(), "id")[0]
    else:
        users = unique(np.concatenate([np.zeros(0, np.int32)] + [p[0] for p in parts]))
    if any(p[1] is None for p in parts):
        items, item_counts, item_positives = _distinct_ids(
            triples.groupBy(F.col("i").cast("int").alias("id"))
            .agg(F.count(F.lit(1)).alias("n"), F.sum((F.col("r") > 0).cast("long")).alias("p")), "id", "n", "p")
        return users, items, item_counts.astype(np.float64), item_positives.astype(np.float64)
    parts = parts or [(None,) + (np.zeros(0, np.int32),) * 3]  # no partitions at all
    items, where = np.unique(np.concatenate([p[1] for p in parts]), return_inverse=True)
    item_counts = np.bincount(where, weights=np.concatenate([p[2] for p in parts]), minlength=len(items))
    item_positives = np.bincount(where, weights=np.concatenate([p[3] for p in parts]), minlength=len(items))
    return users, items, item_counts.astype(np.float64), item_positives.astype(np.float64)


def _distinct_ids(frame, id_col: str, *value_cols: str):
    """A frame of distinct ids (and values per id) as numpy arrays sorted by id (ids int32)."""
    def columns(batches):
        got = [[] for _ in range(1 + len(value_cols))]
        for batch in batches:
            for out, name in zip(got, (id_col,) + value_cols):
                out.append(numpy_of(batch.column(name)))
        return [np.concatenate(c) if c else np.zeros(0) for c in got]

    parts = collect_per_partition(frame.select(id_col, *value_cols), columns)
    cols = [np.concatenate([p[j] for p in parts]) if parts else np.zeros(0) for j in range(1 + len(value_cols))]
    del parts
    if not value_cols:  # in place: the driver's peak stays ~2x the ids
        cols[0] = cols[0].astype(np.int32, copy=False)
        cols[0].sort()
        return cols
    order = np.argsort(cols[0], kind="stable")
    return [cols[0][order].astype(np.int32)] + [c[order] for c in cols[1:]]


def dense_ids(users: np.ndarray, items: np.ndarray, batch) -> List[RatingBlock]:
    """An Arrow batch of ratings (columns u, i, r, and v: the validation flag, with a validation
    set) as one :class:`RatingBlock` with its ids as positions in the sorted ``users`` / ``items``
    (``Engine(decode_batch=...)``: one vectorised search per batch instead of a Python tuple and
    two searches per rating).  ``users`` and ``items`` are the training ratings' ids: a validation
    rating of another user or item cannot be predicted (ALS's cold start); it stays, with position
    -1, so that the program counts it (and refuses a validation set of nothing but those)."""
    u, i, r = (numpy_of(batch.column(j)) for j in range(3))
    u, i = u.astype(np.int32), i.astype(np.int32)
    pu, pi = np.searchsorted(users, u), np.searchsorted(items, i)
    if batch.num_columns < 4:
        return [RatingBlock(pu, pi, r.astype(np.float64, copy=False))]
    held = numpy_of(batch.column(3)).astype(bool)
    known = (pu < len(users)) & (pi < len(items))
    known[known] &= (users[pu[known]] == u[known]) & (items[pi[known]] == i[known])
    cold = held & ~known
    pu[cold], pi[cold] = -1, -1
    return [RatingBlock(pu, pi, r.astype(np.float64, copy=False), held)]


def user_factors(worker: int, data, state):
    """What a worker leaves on the shards when the fit ends: its users' positions and factor rows."""
    return data.users, state.w


#: ALSModel.userFactors / itemFactors
FACTORS_SCHEMA = T.StructType([T.StructField("id", T.IntegerType(), False),
                               T.StructField("features", T.ArrayType(T.FloatType(), False), True)])
#: a saved model's userFactors/ and itemFactors/ (the layout of every earlier version)
SAVED_SCHEMA = T.StructType([T.StructField("id", T.LongType(), False),
                             T.StructField("features", T.ArrayType(T.DoubleType(), False), False)])


def _factors_batch(ids: np.ndarray, rows: np.ndarray):
    """An Arrow batch of :data:`FACTORS_SCHEMA` from ids and a (len(ids), rank) matrix."""
    import pyarrow as pa

    rows = np.ascontiguousarray(rows, dtype=np.float32)
    rank = rows.shape[1] if rows.ndim == 2 else 0
    offsets = numbers(np.arange(len(ids) + 1, dtype=np.int32) * rank)
    features = pa.ListArray.from_arrays(offsets, numbers(rows.ravel(), pa.float32()))
    return pa.RecordBatch.from_arrays([numbers(np.asarray(ids, dtype=np.int32)), features], ["id", "features"])


def _factors_batches(ids: np.ndarray, rows: np.ndarray, size: int = 1 << 16):
    """:func:`_factors_batch` of at most ``size`` rows at a time (bounded Arrow batches)."""
    for a in range(0, len(ids), size):
        yield _factors_batch(ids[a:a + size], rows[a:a + size])


def _features(column, rows: int) -> np.ndarray:
    """An Arrow list<float> column of equal-length rows as a (rows, rank) float32 matrix."""
    values = numpy_of(column.flatten()).astype(np.float32, copy=False)
    return values.reshape(rows, -1) if rows else np.zeros((0, 0), np.float32)


def fitted_factors(spark, result, program, users: np.ndarray, items: np.ndarray, rank: int, config):
    """``(userFactors, itemFactors)`` of a finished fit.  A model of at most
    ``spark.pystrads.mf.localModelBytes`` is read onto the driver (the workers' exports and the
    ``item_factors`` table: one read, no Spark job, which a small fit would otherwise pay as two
    jobs) and becomes two local DataFrames.  A larger one is made by executor tasks: each
    worker's users from its export, the items in ranges of the ``item_factors`` table
    (``program.item_rows``), both materialised before the fit is released
    (:func:`~pystrads.engine.driver.frames.keep_frames`); only the ids (already on the driver) travel
    in the tasks' closures.  ``config``: the fit's settings."""
    from ..engine.driver.frames import keep_frames, row_ranges, shard_frame  # the driver's side (this module is the workers' too)

    if (len(users) + len(items)) * rank * 8 <= config["mf.localModelBytes"]:
        w = np.zeros((len(users), rank))
        for positions, rows in result.exports:
            w[positions] = rows
        h = program.item_matrix(result.read_table("item_factors"))
        return _local_frame(spark, users, w), _local_frame(spark, items, h)
    workers = result.engine.num_workers

    def read_users(reader, worker):
        positions, w = reader.export(worker)
        yield from _factors_batches(users[positions], w)

    tasks = [(lo, hi, items[lo:hi]) for lo, hi in row_ranges(len(items), workers)]

    def read_items(reader, task):
        lo, hi, ids = task
        yield from _factors_batches(ids, program.item_rows(reader.table("item_factors"), lo, hi))

    user_frame = shard_frame(spark, result, range(workers), read_users, FACTORS_SCHEMA)
    item_frame = shard_frame(spark, result, tasks, read_items, FACTORS_SCHEMA)
    kept = keep_frames(result, {"userFactors": user_frame, "itemFactors": item_frame})
    return kept["userFactors"], kept["itemFactors"]


def _local_frame(spark, ids: np.ndarray, factors: np.ndarray):
    """A factor DataFrame (:data:`FACTORS_SCHEMA`) from driver arrays: a local relation, no job."""
    import pyarrow as pa

    if _ALS_CASTS_IDS:  # pyspark >= 4 takes an Arrow table as it is
        batches = list(_factors_batches(ids, factors)) or [_factors_batch(ids[:0], factors[:0])]
        return spark.createDataFrame(pa.Table.from_batches(batches), FACTORS_SCHEMA)
    # 3.5: rows of Python numbers (its pandas conversion without Arrow refuses numpy scalars)
    return spark.createDataFrame([(int(i), row.tolist()) for i, row in zip(ids, factors.astype(np.float32))],
                                 FACTORS_SCHEMA)


def predictions(dataset, ucol: str, icol: str, out_col: str, users, items, drop: bool):
    """``dataset`` with column ``out_col``, as ALSModel.transform: left joins with the factor
    frames ``users`` and ``items``; the predicted rating as a non-null float, NaN for an unknown
    user or item (those rows dropped with ``drop``)."""
    out = dataset
    if _ALS_CASTS_IDS:
        out = out.withColumn(ucol, F.col(ucol).cast("int")).withColumn(icol, F.col(icol).cast("int"))
    u_id, u_f, i_id, i_f = (f"__pystrads_{n}" for n in ("uid", "ufeatures", "iid", "ifeatures"))
    def key(col):  # ints from 4 on (ALS's join); 3.5 keeps the input's type: compared as doubles, as ALS does
        return F.col(col) if _ALS_CASTS_IDS else F.col(col).cast("double")

    out = out.join(users.select(F.col("id").alias(u_id), F.col("features").alias(u_f)),
                   key(ucol) == key(u_id), "left") \
        .join(items.select(F.col("id").alias(i_id), F.col("features").alias(i_f)), key(icol) == key(i_id), "left")
    dot = F.aggregate(F.zip_with(u_f, i_f, lambda a, b: a.cast("double") * b), F.lit(0.0), lambda acc, x: acc + x)
    prediction = F.coalesce(dot.cast("float"), F.lit(float("nan")).cast("float"))  # an unknown id: null -> NaN
    out = out.withColumn(out_col, prediction).drop(u_id, u_f, i_id, i_f)
    return out.where(~F.isnan(F.col(out_col))) if drop else out


def _blocks(factors, block_size: int):
    """``factors`` (id, features) as blocks of at most ``block_size`` rows of one partition:
    (block long, ids binary int32, features binary float32 row-major, rank int)."""
    import pyarrow as pa

    def run(batches):
        part, count = partition_id(), 0
        ids, feats, held = [], [], 0  # rows read but not yet in a block

        def blocks(final):
            nonlocal ids, feats, held, count
            i, f = np.concatenate(ids), np.concatenate(feats)
            full = held if final else held - held % block_size
            for a in range(0, full, block_size):
                count += 1
                b = min(full, a + block_size)
                yield pa.RecordBatch.from_arrays(
                    [pa.array([(part << 32) | count], pa.int64()), pa.array([i[a:b].tobytes()], pa.binary()),
                     pa.array([f[a:b].tobytes()], pa.binary()), pa.array([f.shape[1]], pa.int32())],
                    ["block", "ids", "features", "rank"])
            ids, feats, held = [i[full:]], [f[full:]], held - full

        for batch in batches:  # streamed: at most one block and one batch held at a time
            if batch.num_rows:
                ids.append(batch.column(0).to_numpy(zero_copy_only=False).astype(np.int32))
                feats.append(_features(batch.column(1), batch.num_rows))
                held += batch.num_rows
                if held >= block_size:
                    yield from blocks(False)
        if held:
            yield from blocks(True)

    return factors.mapInArrow(run, "block long, ids binary, features binary, rank int")


def _recommend_schema(src_col: str, dst_col: str):
    return T.StructType([
        T.StructField(src_col, T.IntegerType(), False),
        T.StructField("recommendations", T.ArrayType(T.StructType([
            T.StructField(dst_col, T.IntegerType(), True), T.StructField("rating", T.FloatType(), True)]),
            True), True)])


def recommendations(src, dst, num: int, src_col: str, dst_col: str, block_size: int, subset=None):
    """DataFrame(src_col, recommendations: array<struct<dst_col, rating>>), ALS's schema: the
    ``num`` best rows of the factor frame ``dst`` for each row of ``src`` (of those whose id is
    in ``subset``'s ``src_col``, when given) by the dot product of their features, best first
    (ties: the smaller id).  ALS's blocked top-k: blocks of ``block_size`` rows of each side are
    cross-joined, each block pair is scored by one matmul and keeps each source's best ``num``
    (argpartition), and each source id's candidates from every destination block are merged."""
    import pyarrow as pa

    if num < 1:
        raise ConfigurationError(f"numItems/numUsers={num} must be >= 1")
    if subset is not None:
        src = src.join(subset.select(F.col(src_col).cast("int").alias("id")), "id", "left_semi")
    d = _blocks(dst, block_size).select(*(F.col(c).alias("d_" + c) for c in ("ids", "features")))
    pairs = _blocks(src, block_size).crossJoin(d)

    def score(batches):  # one output row per source row and destination block: its best num candidates
        for batch in batches:
            cols = {name: batch.column(name).to_pylist() for name in ("ids", "features", "rank", "d_ids",
                                                                      "d_features")}
            for ids, f, rank, d_ids, d_f in zip(*cols.values()):
                s = np.frombuffer(f, np.float32).reshape(-1, rank)
                d_id = np.frombuffer(d_ids, np.int32)
                scores = s @ np.frombuffer(d_f, np.float32).reshape(-1, rank).T
                k = min(num, len(d_id))
                top = np.argpartition(-scores, k - 1, axis=1)[:, :k] if k < len(d_id) else \
                    np.broadcast_to(np.arange(k), scores.shape)
                offsets = pa.array(np.arange(len(s) + 1, dtype=np.int32) * k)
                yield pa.RecordBatch.from_arrays(
                    [pa.array(np.frombuffer(ids, np.int32)),
                     pa.ListArray.from_arrays(offsets, pa.array(d_id[top].ravel())),
                     pa.ListArray.from_arrays(offsets, pa.array(np.take_along_axis(scores, top, axis=1).ravel()))],
                    ["id", "top_ids", "top_scores"])

    def merge(batches):  # one row per source id: the candidates of every destination block, contiguous
        for batch in batches:
            if not batch.num_rows:
                continue
            pairs = batch.column("pairs")  # a list of structs (top_ids, top_scores), both lists
            pair_offsets = pairs.offsets.to_numpy()
            flat = pairs.flatten()
            ids_list, vals_list = flat.field("top_ids"), flat.field("top_scores")
            cand_offsets = ids_list.offsets.to_numpy()[pair_offsets]  # each source row's candidate range
            cand = ids_list.flatten().to_numpy()
            vals = vals_list.flatten().to_numpy()
            best_ids, best_vals, out_offsets = [], [], [0]
            for r in range(batch.num_rows):
                c, v = cand[cand_offsets[r]:cand_offsets[r + 1]], vals[cand_offsets[r]:cand_offsets[r + 1]]
                order = np.lexsort((c, -v))[:num]  # best first, ties: the smaller id
                best_ids.append(c[order])
                best_vals.append(v[order])
                out_offsets.append(out_offsets[-1] + len(order))
            recs = pa.ListArray.from_arrays(
                pa.array(np.array(out_offsets, dtype=np.int32)),
                pa.StructArray.from_arrays([pa.array(np.concatenate(best_ids)), pa.array(np.concatenate(best_vals))],
                                           [dst_col, "rating"]))
            yield pa.RecordBatch.from_arrays([batch.column("id"), recs], [src_col, "recommendations"])

    scored = pairs.mapInArrow(score, "id int, top_ids array<int>, top_scores array<float>")
    # grouped by the source id, as ALS's top-k aggregation: never by a block, whose rows a cross join may
    # compute once per partition of the other side (a cartesian product re-reads its left input)
    grouped = scored.groupBy("id").agg(F.collect_list(F.struct("top_ids", "top_scores")).alias("pairs"))
    return grouped.mapInArrow(merge, _recommend_schema(src_col, dst_col))


def save_factors(write, users, items) -> None:
    """A saved model's ``userFactors/`` and ``itemFactors/``: (id long, features array<double>)
    rows, written by the executors from the factor frames."""
    for name, frame in (("userFactors", users), ("itemFactors", items)):
        write(name, SAVED_SCHEMA, frame.select(F.col("id").cast("long").alias("id"),
                                               F.col("features").cast("array<double>").alias("features")))


def load_factors(read):
    """``(userFactors, itemFactors)`` frames (ALS's column types) of a model written by
    :func:`save_factors` (by this version or an earlier one)."""
    return tuple(read(name).select(F.col("id").cast("int").alias("id"),
                                   F.col("features").cast("array<float>").alias("features"))
                 for name in ("userFactors", "itemFactors"))
