"""A fitted StradsLDA model's topics kept off the driver, and the model operations over them.

:class:`WordTopics` is what a :class:`~pystrads.ml.lda.StradsLDAModel` holds:

- ``frame``: DataFrame(term int, topics array<int>, counts array<int>) (:data:`ENTRIES_SCHEMA`),
  one row per term that has tokens (term in [0, V)): its topics with a non-zero count, ascending,
  and those counts n_wt -- the model's non-zeros, not V x K -- made by executor tasks reading the
  fit's ``word_topic`` entries from the shards (:func:`fitted_topics`), or read from a saved
  model's Parquet (models saved by earlier versions hold each term's K counts,
  :data:`COUNTS_SCHEMA`; every operation reads both);
- ``topic_totals``: n_t, K int64, and ``vocab_size`` V, on the driver;
- ``dense``: V x K int32 on the driver for a model built from an array or a fitted model of at
  most ``spark.pystrads.lda.localModelBytes`` as int32 (read from the shards when the fit ends,
  with no ``frame`` until one is asked for), or cached once a small model was collected.

p(term | topic) = φ[w, t] = (n_wt + β) / (n_t + Vβ) (:meth:`WordTopics.phi`, the one formula
every path uses, so they agree bit for bit).  The operations: :func:`describe` (each partition
keeps its per-topic top n, the driver merges K x n candidates per partition),
:func:`dense_counts` (``topicsMatrix``: collects), and :class:`FoldIn` (``transform``,
``logLikelihood``): a small model ships φ in the task closure; a large one joins the documents'
(bucket, term) pairs with the model rows and folds in per bucket of documents (a bucket is a
hash of a document's content), so a task gets only the rows its documents use.
"""

from __future__ import annotations

import dataclasses
import math
import pickle
import warnings
from typing import List, Optional

import numpy as np
import pyspark
from pyspark.sql import types as T

from ..config import Config
from ..errors import ConfigurationError, InputError
from ..kernels.rows import csr_gather_into
from ..kernels.sets import unique
from ..ps.protocol import concat_entries
from ._arrow import collect_binary, collect_per_partition, vectors
from ._lda_data import _doc_terms, fold_in, log_likelihood, with_topic_mixtures

#: the model's rows, each term's non-zero counts; a saved model's data/ folder
ENTRIES_SCHEMA = T.StructType([T.StructField("term", T.IntegerType(), False),
                               T.StructField("topics", T.ArrayType(T.IntegerType(), False), False),
                               T.StructField("counts", T.ArrayType(T.IntegerType(), False), False)])
#: the rows as models saved by earlier versions hold them: each term's K counts
COUNTS_SCHEMA = T.StructType([T.StructField("term", T.IntegerType(), False),
                              T.StructField("counts", T.ArrayType(T.IntegerType(), False), False)])

#: topicsMatrix() warns above this many cells (it collects the matrix onto the driver)
LARGE_MODEL_CELLS = 50_000_000

#: bytes of word-topic rows one executor task reads from the shards per request / per task
READ_BYTES, TASK_BYTES = 8 << 20, 64 << 20

#: the bucket column the documents carry through the joined fold-in
BUCKET = "__pystrads_bucket"

#: cogroup(...).applyInArrow, which the joined fold-in needs, came with Spark 4.0
_HAS_COGROUP_ARROW = int(pyspark.__version__.split(".")[0]) >= 4


def _entries_batch(terms: np.ndarray, offsets: np.ndarray, topics: np.ndarray, counts: np.ndarray):
    """An Arrow batch of :data:`ENTRIES_SCHEMA` from term ids and their rows' entries (CSR)."""
    import pyarrow as pa

    offsets = pa.array(np.asarray(offsets, dtype=np.int64) - int(offsets[0]), pa.int32())
    return pa.RecordBatch.from_arrays([pa.array(np.asarray(terms, dtype=np.int32)),
                                       pa.ListArray.from_arrays(offsets, pa.array(topics, pa.int32())),
                                       pa.ListArray.from_arrays(offsets, pa.array(counts, pa.int32()))],
                                      ["term", "topics", "counts"])


def _counts_batch(terms: np.ndarray, rows: np.ndarray):
    """An Arrow batch of :data:`ENTRIES_SCHEMA` from term ids and their (n, K) count rows."""
    from ..kernels.rows import to_csr

    return _entries_batch(terms, *to_csr(np.ascontiguousarray(rows, dtype=np.int32)))


def _row_columns(frame) -> list:
    """The model frame's columns :func:`_batch_counts` reads (either layout)."""
    return ["term", "topics", "counts"] if "topics" in frame.columns else ["term", "counts"]


def _batch_counts(batch, k: int):
    """(terms int64, counts (n, k) int32) of an Arrow batch of the model's rows, in either layout
    (:data:`ENTRIES_SCHEMA`, or :data:`COUNTS_SCHEMA` of models saved by earlier versions)."""
    from ..kernels.rows import csr_into

    terms = batch.column(0).to_numpy(zero_copy_only=False).astype(np.int64)
    if batch.num_columns == 3:
        topics, counts = batch.column(1), batch.column(2)
        offsets = np.asarray(topics.offsets, dtype=np.int64)
        block = np.empty((len(terms), k), np.int32)
        csr_into(offsets - offsets[0], topics.flatten().to_numpy(zero_copy_only=False).astype(np.int32, copy=False),
                 counts.flatten().to_numpy(zero_copy_only=False).astype(np.int32, copy=False), block, 0)
        return terms, block
    values = batch.column(1).flatten().to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
    return terms, values.reshape(len(terms), k)


def _batch_entries(batch, k: int):
    """(terms int64, offsets int64, topics int32, counts int32) of an Arrow batch of the model's
    rows, in either layout (entries as they are; the earlier versions' K counts per term as their
    non-zeros)."""
    from ..kernels.rows import to_csr

    terms = batch.column(0).to_numpy(zero_copy_only=False).astype(np.int64)
    if batch.num_columns == 3:
        topics, counts = batch.column(1), batch.column(2)
        offsets = np.asarray(topics.offsets, dtype=np.int64)
        return (terms, offsets - offsets[0],
                topics.flatten().to_numpy(zero_copy_only=False).astype(np.int32, copy=False),
                counts.flatten().to_numpy(zero_copy_only=False).astype(np.int32, copy=False))
    offsets, topics, counts = to_csr(_batch_counts(batch, k)[1])
    return terms, offsets.astype(np.int64), topics, counts


def _rows_entries(parts):
    """Model rows' entries from several batches (:func:`_batch_entries`), one CSR sorted by term."""
    if not parts:
        return np.zeros(0, np.int64), np.zeros(1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int32)
    terms = np.concatenate([p[0] for p in parts])
    offsets, topics, counts = concat_entries([p[1:] for p in parts], np.int32)
    if len(terms) > 1 and not bool(np.all(terms[1:] > terms[:-1])):  # rows in term order
        order = np.argsort(terms, kind="stable")
        lengths = np.diff(offsets)[order]
        take = np.repeat(offsets[:-1][order], lengths) + (np.arange(lengths.sum()) -
                                                          np.repeat(np.cumsum(lengths) - lengths, lengths))
        terms, topics, counts = terms[order], topics[take], counts[take]
        offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    return terms, offsets, topics, counts


@dataclasses.dataclass(eq=False)
class WordTopics:
    """The word-topic counts of a model (see the module docstring)."""

    frame: object
    topic_totals: np.ndarray
    vocab_size: int
    dense: Optional[np.ndarray] = None

    @classmethod
    def of(cls, word_topic) -> Optional["WordTopics"]:
        """``word_topic`` itself (None or a WordTopics) or, for V x K counts, the model held on the driver."""
        return word_topic if word_topic is None or isinstance(word_topic, WordTopics) else cls.from_array(word_topic)

    @classmethod
    def from_array(cls, word_topic) -> "WordTopics":
        dense = np.ascontiguousarray(word_topic, dtype=np.int32)
        return cls(None, dense.sum(axis=0, dtype=np.int64), int(dense.shape[0]), dense)

    @classmethod
    def from_frame(cls, frame, vocab_size: int, k: int) -> "WordTopics":
        """Rows of a saved model: the topic totals summed on the executors (one job)."""
        def totals(batches):
            out = np.zeros(k, np.int64)
            for batch in batches:
                out += _batch_counts(batch, k)[1].sum(axis=0, dtype=np.int64)
            return out

        parts = collect_per_partition(frame.select(*_row_columns(frame)), totals)
        return cls(frame, np.sum(parts, axis=0, dtype=np.int64) if parts else np.zeros(k, np.int64), int(vocab_size))

    @property
    def k(self) -> int:
        return int(len(self.topic_totals))

    @property
    def int32_bytes(self) -> int:
        return self.vocab_size * self.k * 4

    def rows_frame(self, spark):
        """The rows as a DataFrame (made from ``dense`` the first time, for a model built from an array)."""
        if self.frame is None:
            keep = np.flatnonzero(self.dense.any(axis=1))
            rows = []
            for i in keep:
                topics = np.flatnonzero(self.dense[i])
                rows.append((int(i), topics.tolist(), self.dense[i, topics].tolist()))
            self.frame = spark.createDataFrame(rows, ENTRIES_SCHEMA)
        return self.frame

    def phi(self, counts: np.ndarray, beta: float) -> np.ndarray:
        return topic_word_prob(counts, self.topic_totals, self.vocab_size, beta)


def topic_word_prob(counts: np.ndarray, topic_totals: np.ndarray, vocab_size: int, beta: float) -> np.ndarray:
    """p(term | topic) of count rows (n, K): (n_wt + β) / (n_t + Vβ)."""
    return (counts.astype(np.float64) + beta) / (topic_totals.astype(np.float64) + vocab_size * beta)


def fitted_topics(spark, result, vocab_size: int, k: int, config: Config,
                  word_tokens: Optional[np.ndarray] = None) -> WordTopics:
    """The :class:`WordTopics` of a finished fit.  A model of at most
    ``spark.pystrads.lda.localModelBytes`` as int32 is read onto the driver (one read of the
    shards, no Spark job: what transform would collect anyway).  A larger one is made by executor
    tasks that read the non-zero ``word_topic`` rows in ranges (each shard filters its part),
    materialised before the fit is released (:func:`~pystrads.engine.driver.frames.keep_frame`); the
    topic totals (K numbers) come to the driver.  ``config``: the fit's settings; ``word_tokens``:
    each word's tokens in the corpus, which bound its row's non-zeros (``min(K, tokens)``), so
    the reads are cut by entries (without them: by rows, assuming rows 1/8 full)."""
    from ..engine.driver.frames import keep_frame, shard_frame  # the driver's side (this module is the workers' too)

    totals = np.asarray(result.read_table("topic_totals")[0], dtype=np.int64)
    if vocab_size * k * 4 <= config["lda.localModelBytes"]:
        dense = np.ascontiguousarray(result.read_table("word_topic"), dtype=np.int32)
        return WordTopics(None, totals, int(vocab_size), dense)
    stored = [t for s in result.summary.shards for name, t in (s.get("tables") or {}).items()
              if name.endswith("/word_topic") and "nonzeros" in t]
    entry_bytes = 8 * sum(t["nonzeros"] for t in stored) + 8 * vocab_size if stored else vocab_size * k * 4
    num_tasks = max(result.engine.num_workers, -(-entry_bytes // TASK_BYTES))
    tasks = read_plan(vocab_size, k, num_tasks, word_tokens)

    def read(reader, task):
        table = reader.table("word_topic")
        for lo, hi in zip(task[:-1], task[1:]):
            got = table.read_entries(range(lo, hi))
            if len(got.keys):
                yield _entries_batch(got.keys, *got.csr)

    frame = keep_frame(shard_frame(spark, result, tasks, read, ENTRIES_SCHEMA), result, "word_topic")
    return WordTopics(frame, totals, int(vocab_size))


def read_plan(vocab_size: int, k: int, num_tasks: int, word_tokens: Optional[np.ndarray] = None) -> List[np.ndarray]:
    """The reads of a V x K word-topic table in ``num_tasks`` tasks: per task the row bounds of
    its requests, each request at most about :data:`READ_BYTES` of entries.  With ``word_tokens``
    a row's entries are bounded by ``min(K, tokens)`` (8 bytes each, and 8 for its key): the
    requests and the tasks are cut by that mass, so a table of rare words at large K is read in a
    few requests; without, a request is ``8 READ_BYTES / 4K`` rows (rows 1/8 full, at most 8x
    READ_BYTES) and the tasks are equal row ranges."""
    from ..engine.driver.frames import row_ranges

    if word_tokens is None:
        step = max(1, 8 * READ_BYTES // (4 * k))
        return [np.unique(np.r_[np.arange(lo, hi, step), hi]).astype(np.int64) for lo, hi in row_ranges(vocab_size, num_tasks)]
    bound = 8 * np.minimum(k, np.ceil(np.asarray(word_tokens, dtype=np.float64))) + 8
    mass = np.concatenate(([0.0], np.cumsum(bound)))
    total = mass[-1]
    cuts = np.unique(np.r_[0, np.searchsorted(mass, np.arange(1, total // READ_BYTES + 1) * READ_BYTES, side="right") - 1,
                           vocab_size]).astype(np.int64)  # request bounds: each request's rows <= READ_BYTES (or one row)
    num_tasks = max(1, min(num_tasks, len(cuts) - 1))
    at = np.unique(np.r_[0, np.searchsorted(mass[cuts], np.linspace(0, total, num_tasks + 1)[1:-1]), len(cuts) - 1])
    return [cuts[a:b + 1] for a, b in zip(at[:-1], at[1:]) if b > a]


def dense_counts(topics: WordTopics, spark, cache: bool = False) -> np.ndarray:
    """V x K int32 on the driver (collects the rows; kept on ``topics`` when ``cache``)."""
    if topics.dense is not None:
        return topics.dense
    out = np.zeros((topics.vocab_size, topics.k), np.int32)
    frame = topics.rows_frame(spark)
    frame = frame.select(*_row_columns(frame))
    table = frame.toArrow() if hasattr(frame, "toArrow") else frame._collect_as_arrow()  # pyspark 3.5: private
    for batch in (table.to_batches() if hasattr(table, "to_batches") else table):
        terms, counts = _batch_counts(batch, topics.k)
        out[terms] = counts
    del table
    if cache:
        topics.dense = out
    return out


def topics_matrix(topics: WordTopics, spark):
    """MLlib's topicsMatrix(): V x K counts as a local DenseMatrix (warns for large models)."""
    from pyspark.ml.linalg import DenseMatrix

    v, k = topics.vocab_size, topics.k
    if v * k > LARGE_MODEL_CELLS:
        warnings.warn(f"topicsMatrix() collects a {v} x {k} dense matrix ({v * k * 8 / 1e9:.1f} GB as doubles) on the "
                      "driver; use describeTopics() for the top terms", stacklevel=3)
    # isTransposed as MLlib's matrices arrive from the JVM: 0, by columns
    return DenseMatrix(v, k, dense_counts(topics, spark).astype(np.float64).ravel(order="F"), 0)


def save_topics(write, topics: WordTopics, alpha: np.ndarray, beta: float, spark) -> dict:
    """A model's ``_save_data``: the rows (written by the executors) and the metadata."""
    frame = topics.rows_frame(spark)
    write("data", ENTRIES_SCHEMA if "topics" in frame.columns else COUNTS_SCHEMA, frame)
    return {"alpha": alpha.tolist(), "beta": beta, "vocabSize": topics.vocab_size, "k": topics.k}


def load_topics(read, metadata):
    """``(WordTopics, alpha, beta)`` of a saved model (alpha: k values, or one value for a symmetric prior)."""
    return (WordTopics.from_frame(read("data"), int(metadata["vocabSize"]), int(metadata["k"])), metadata["alpha"],
            metadata["beta"])


# -- describeTopics: per-partition top n per topic, merged on the driver


def _merge_top(terms: np.ndarray, counts: np.ndarray, n: int):
    """The first ``n`` of (terms, counts) by decreasing count, ties by increasing term."""
    order = np.lexsort((terms, -counts))[:n]
    return terms[order], counts[order]


def describe(topics: WordTopics, beta: float, max_terms: int, spark):
    """DataFrame(topic, termIndices, termWeights), as LDAModel.describeTopics: each topic's
    ``max_terms`` most likely terms by φ, in decreasing order, ties by term index (φ increases
    with n_wt, so the top terms are the top counts).  A topic with fewer terms of non-zero
    count than asked gets the smallest zero-count term ids after them, as a sort of the whole
    column of φ gives."""
    if max_terms < 1:
        raise ConfigurationError(f"maxTermsPerTopic={max_terms} must be >= 1")
    k, n = topics.k, min(max_terms, topics.vocab_size)

    def candidates(batches):
        best = [(np.zeros(0, np.int64), np.zeros(0, np.int64))] * k
        for batch in batches:
            terms, counts = _batch_counts(batch, k)
            for t in range(k):
                col = counts[:, t]
                rows = np.flatnonzero(col > 0)
                if len(rows) > n:  # all the rows tied with the n-th largest, then the exact order
                    rows = rows[col[rows] >= np.partition(col[rows], len(rows) - n)[len(rows) - n]]
                best[t] = _merge_top(np.concatenate([best[t][0], terms[rows]]),
                                     np.concatenate([best[t][1], col[rows].astype(np.int64)]), n)
        # three flat arrays, not 2 k small ones: pickled per partition, those weighed ~200 bytes each
        sizes = [len(b[0]) for b in best]
        return (np.repeat(np.arange(k, dtype=np.int32), sizes), np.concatenate([b[0] for b in best]),
                np.concatenate([b[1] for b in best]))

    frame = topics.rows_frame(spark)
    parts = collect_per_partition(frame.select(*_row_columns(frame)), candidates)
    flat = [np.concatenate([p[j] for p in parts] or [np.zeros(0, np.int64)]) for j in range(3)]
    del parts
    order = np.lexsort((flat[1], -flat[2], flat[0]))  # by topic, then decreasing count, then term
    cand_topic, cand_term, cand_count = (a[order] for a in flat)
    bounds = np.searchsorted(cand_topic, np.arange(k + 1))
    rows = []
    for t in range(k):
        lo = bounds[t]
        hi = min(bounds[t + 1], lo + n)
        terms, counts = cand_term[lo:hi], cand_count[lo:hi]
        if len(terms) < n:  # every term of non-zero count is here: fill with the smallest other ids
            taken = set(terms.tolist())
            fill = [w for w in range(n + len(taken)) if w not in taken][:n - len(terms)]
            terms = np.concatenate([terms, np.asarray(fill, np.int64)])
            counts = np.concatenate([counts, np.zeros(len(fill), np.int64)])
        totals = topics.topic_totals[t:t + 1].astype(np.float64) + topics.vocab_size * beta
        weights = (counts.astype(np.float64) + beta) / totals[0]
        rows.append((t, [int(i) for i in terms], [float(w) for w in weights]))
    schema = T.StructType([T.StructField("topic", T.IntegerType(), False),
                           T.StructField("termIndices", T.ArrayType(T.IntegerType(), False), False),
                           T.StructField("termWeights", T.ArrayType(T.DoubleType(), False), False)])
    return spark.createDataFrame(rows, schema)


# -- transform / logLikelihood


def _add_exact(partials: List[float], x: float) -> None:
    """Adds ``x`` to the exact sum held as non-overlapping ``partials`` (Shewchuk, as math.fsum)."""
    i = 0
    for y in partials:
        if abs(x) < abs(y):
            x, y = y, x
        hi = x + y
        lo = y - (hi - x)
        if lo:
            partials[i] = lo
            i += 1
        x = hi
    partials[i:] = [x]


def _bucket_count(dataset) -> int:
    """Buckets of documents for the joined fold-in: the input's partitions (task slots under
    Spark Connect, which knows partitions only by running a job)."""
    from ..engine.driver.preflight import default_num_workers
    from ..spark import handle_of

    return max(1, dataset.rdd.getNumPartitions() if not handle_of(dataset).connect else default_num_workers(dataset))


@dataclasses.dataclass
class FoldIn:
    """Gibbs fold-in of documents with the topics fixed: each document's stream is seeded by
    ``seed`` and its content, so its result depends on it alone, on either path (module
    docstring): φ shipped with the function when the model's int32 size is at most
    ``spark.pystrads.lda.localModelBytes``, else the joined fold-in."""

    topics: WordTopics
    beta: float
    alpha: np.ndarray
    n_iter: int
    seed: int

    def _local(self, dataset) -> bool:
        if self.topics.dense is not None:
            return True
        limit = Config.from_spark(dataset.sparkSession)["lda.localModelBytes"]
        if self.topics.int32_bytes <= limit:
            return True
        if not _HAS_COGROUP_ARROW:
            warnings.warn(f"pyspark {pyspark.__version__} has no cogroup applyInArrow: the fold-in collects the "
                          f"{self.topics.int32_bytes / 2**20:.0f} MiB model on the driver (pyspark >= 4 does not)")
            return True
        return False

    def _fold(self, features_index: int, phi=None):
        return fold_in(features_index, self.alpha, self.n_iter, int(self.seed), phi)

    def mixtures(self, dataset, features_col: str, out_col: str):
        """``dataset`` with each document's topic mixture in the vector column ``out_col`` (refused
        when it exists)."""
        if out_col in dataset.columns:
            raise InputError(f"topicDistributionCol {out_col!r} already exists in the input; choose another name")
        from pyspark.ml.linalg import VectorUDT  # here: workers import this module, not pyspark.ml

        index = dataset.columns.index(features_col)
        schema = T.StructType(dataset.schema.fields + [T.StructField(out_col, VectorUDT(), True)])
        if self._local(dataset):
            attach = with_topic_mixtures(self._fold(index, self._phi(dataset)), self.alpha, index, out_col)
            return dataset.mapInArrow(attach, schema)
        attach = with_topic_mixtures(self._fold(index), self.alpha, index, out_col)
        return self._joined(dataset, index, lambda batches, lookup: list(attach(batches, lookup)), schema)

    def score(self, dataset, features_col: str):
        """(Σ over documents of log p(tokens | θ_d, φ), tokens), the sum exact (fsum: the same
        for any partitioning and either path)."""
        index = dataset.columns.index(features_col)

        def exact(fn):
            def run(batches, lookup=None):
                partials, tokens = [], 0
                for ll, n in fn(batches, lookup):
                    _add_exact(partials, ll)
                    tokens += n
                return partials, tokens
            return run

        if self._local(dataset):
            fn = exact(log_likelihood(self._fold(index, self._phi(dataset)), self.alpha))
            parts = collect_per_partition(dataset, fn)
        else:
            import pyarrow as pa

            fn = exact(log_likelihood(self._fold(index), self.alpha))

            def run(batches, lookup):
                out = pickle.dumps(fn(batches, lookup), protocol=pickle.HIGHEST_PROTOCOL)
                return [pa.RecordBatch.from_arrays([pa.array([out], pa.binary())], ["result"])]

            joined = self._joined(dataset, index, run, T.StructType([T.StructField("result", T.BinaryType())]))
            parts = [pickle.loads(b) for b in collect_binary(joined, "result")]
        return math.fsum(x for p in parts for x in p[0]), sum(p[1] for p in parts)

    def _phi(self, dataset) -> np.ndarray:
        return self.topics.phi(dense_counts(self.topics, dataset.sparkSession, cache=True), self.beta)

    def _joined(self, dataset, index: int, fn, schema):
        """``fn(batches, lookup)`` once per bucket of documents, on the executors: the
        documents' distinct (bucket, term) pairs joined with the model's rows, cogrouped with
        the documents by bucket; ``lookup(words) -> (φ rows, row of each word)`` builds φ for
        the bucket's terms only (a term without tokens gets β / (n_t + Vβ))."""
        import pyarrow as pa

        buckets, k, beta = _bucket_count(dataset), self.topics.k, self.beta
        columns = _row_columns(self.topics.rows_frame(dataset.sparkSession))
        totals, vocab = self.topics.topic_totals, self.topics.vocab_size  # not the frame: tasks cannot hold it

        def doc_buckets(column):
            for vec in vectors(column):
                terms, _, digest = _doc_terms(*(vec[1:] if vec is not None else (np.zeros(0, np.int64), np.zeros(0))))
                yield int.from_bytes(digest, "little") % buckets, terms

        def pairs(batches):
            seen = set()
            for batch in batches:
                for bucket, terms in doc_buckets(batch.column(0)):
                    seen.update((bucket, int(t)) for t in terms)
            if seen:
                arr = np.array(sorted(seen), dtype=np.int32).reshape(-1, 2)
                yield pa.RecordBatch.from_arrays([pa.array(arr[:, 0]), pa.array(arr[:, 1])], ["bucket", "term"])

        def tag(batches):
            for batch in batches:
                ids = np.array([b for b, _ in doc_buckets(batch.column(index))], dtype=np.int32)
                yield pa.RecordBatch.from_arrays(list(batch.columns) + [pa.array(ids)], batch.schema.names + [BUCKET])

        def run(docs, rows):
            # the bucket's model rows as their entries (memory per non-zero); φ is made per run of
            # documents, for the run's words only (fold_in's FOLD_PHI_BYTES)
            model_terms, offsets, topics, counts = _rows_entries([_batch_entries(b, k) for b in
                                                                 rows.select(columns).to_batches()])

            def lookup(words):
                needed = unique(words)
                at = np.minimum(np.searchsorted(model_terms, needed), max(len(model_terms) - 1, 0))
                found = np.flatnonzero(model_terms[at] == needed) if len(model_terms) else np.zeros(0, np.int64)
                block = np.zeros((len(needed), k), np.int32)
                if len(found):
                    csr_gather_into(offsets, topics, counts, at[found], block, found)
                return topic_word_prob(block, totals, vocab, beta), np.searchsorted(needed, words)

            docs = docs.drop_columns([BUCKET])
            out = fn(docs.to_batches(), lookup)
            return pa.Table.from_batches(out) if out else pa.Table.from_batches([], schema=_arrow_schema(schema))

        pair_schema = T.StructType([T.StructField("bucket", T.IntegerType()), T.StructField("term", T.IntegerType())])
        needed = dataset.select(dataset.columns[index]).mapInArrow(
            pairs, pair_schema).distinct() \
            .join(self.topics.rows_frame(dataset.sparkSession).hint("merge"), "term")  # never broadcast the model
        tagged = dataset.mapInArrow(tag, T.StructType(dataset.schema.fields + [T.StructField(BUCKET, T.IntegerType())]))
        return tagged.groupBy(BUCKET).cogroup(needed.groupBy("bucket")).applyInArrow(run, schema)


def _arrow_schema(schema):
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema)
