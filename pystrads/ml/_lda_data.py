"""StradsLDA's documents through Arrow: for training, the term-count vectors as the LDA
program's records (one row per non-empty document, keyed by a hash of its content) and the corpus
scan that checks every vector before any training and counts documents, tokens and tokens per
term (:func:`_doc_records`); for inference, the Gibbs fold-in of new documents with the topics
fixed (:func:`fold_in`) and what a model makes of it: topic mixtures (:func:`with_topic_mixtures`)
and the log-likelihood (:func:`log_likelihood`).  Where the topics come from: :mod:`._lda_model`.
"""

from __future__ import annotations

import hashlib
import logging
import pickle
from typing import Optional

import numpy as np

from ..errors import ConfigurationError, InputError
from ..ps.protocol import numbers, numpy_filled, numpy_of

log = logging.getLogger("pystrads.ml.lda")


#: the documents as the LDA program's workers read them (one row per non-empty document); with a
#: validation set, a fourth column ``validation boolean`` marks the held-out documents
DOC_RECORD_SCHEMA = "doc long, terms array<long>, counts array<long>"

#: the corpus scan's rows: a partition's stats (term < 0) or a term's token count
SCAN_COLUMNS = ["term", "count", "stats"]

#: non-zero term counts the driver receives from the corpus scan at most, over every partition
#: (~16 bytes each): past its share a partition's counts are summed on the executors instead (a
#: second job, with a shuffle), so the driver's memory is bounded by the vocabulary, never by
#: partitions x vocabulary
TERMS_BUDGET = 1 << 23


def _partitions(frame) -> int:
    """The partitions of ``frame`` (classic sessions; 256 where Spark Connect cannot say)."""
    try:
        return max(1, frame.rdd.getNumPartitions())
    except Exception:  # noqa: BLE001 -- Spark Connect has no RDDs
        return 256


def _doc_terms(idx: np.ndarray, val: np.ndarray):
    """A document's terms with a positive count, those counts (both int64) and the 8-byte digest of
    both that identifies the document (equal documents, equal digests)."""
    counts = np.round(val).astype(np.int64)
    keep = counts > 0
    terms, counts = np.ascontiguousarray(idx[keep], dtype=np.int64), np.ascontiguousarray(counts[keep])
    return terms, counts, hashlib.blake2b(terms.tobytes() + b"|" + counts.tobytes(), digest_size=8).digest()


def _check_corpus(stats, col: str, validation_col: Optional[str] = None) -> None:
    """Refuses a corpus whose scan found a bad count or vectors of several sizes, no document with
    a term, or (``validation_col`` given) no non-empty document held out, naming the column, the
    row and the value; logs the documents skipped."""
    bad = stats["bad"]  # (partition, row, term, value, size); term None: a vector of another size
    if bad is not None and bad[2] is not None:
        raise InputError(f"featuresCol {col!r}: row {bad[1]} of partition {bad[0]} has count {bad[3]} for term "
                         f"{bad[2]}; term counts must be finite non-negative integers (CountVectorizer output)")
    if bad is not None or len(stats["sizes"]) > 1:
        raise InputError(f"featuresCol {col!r}: vectors have different sizes {sorted(stats['sizes'])}; "
                         "every document needs the same vocabulary (one CountVectorizer model)")
    if stats["docs"] + stats["empty"] + stats["null"] + stats.get("validation_docs", 0) == 0:
        raise InputError(f"featuresCol {col!r}: the input has no rows; LDA needs at least one non-empty document")
    if stats["docs"] == 0 and stats.get("validation_docs"):
        raise InputError(f"featuresCol {col!r}: every non-empty document ({stats['validation_docs']}) is marked for "
                         "validation (validationIndicatorCol); LDA needs training documents: mark some false")
    if stats["docs"] == 0:
        raise InputError(f"featuresCol {col!r}: no document has any term ({stats['empty']} empty, "
                         f"{stats['null']} null rows); LDA needs at least one non-empty document")
    if validation_col and not stats.get("validation_docs"):
        raise InputError(f"validationIndicatorCol {validation_col!r} marks no non-empty document for validation "
                         "(every value is false or null, or the marked documents have no term); early stopping "
                         "needs validation documents: mark some true, or unset it to train without one")
    if stats["empty"] or stats["null"]:
        log.info("StradsLDA: skipped %d empty and %d null documents", stats["empty"], stats["null"])


def _doc_records(dataset, features_col: str, validation_col: Optional[str] = None):
    """The corpus as a DataFrame of its term-count vectors (and validation flags), which
    :func:`corpus_blocks` turns into documents -- (doc key, term indices, term counts[,
    validation]) per non-empty one -- inside the fit's workers, and a corpus scan.

    The scan (one Spark job) checks every vector (same size, finite,
    non-negative integral counts; :func:`_check_corpus` refuses the corpus
    otherwise) and counts tokens per term, documents and empty documents -- of the training
    documents only when ``validation_col`` marks held-out ones (true; null counts as training),
    which are checked alike and counted apart (``validation_docs``, ``validation_tokens``).  It goes
    through ``mapInArrow`` (classic sessions and Spark Connect alike); each partition's token counts
    per term come back as its non-zero terms while they fit its share of :data:`TERMS_BUDGET`, and
    otherwise a second job sums them by term on the executors (a ``groupBy``), so the driver's
    memory is bounded by the vocabulary, never by partitions x vocabulary.  A document's key is a hash
    of its terms and counts: a worker orders its documents by key, so the Gibbs chain depends on
    which documents a worker holds, never on the order Spark delivers them in (a shuffle's reducer reads
    local blocks first, so that order differs between local mode and a cluster, and
    between a partition and its recomputation after a lost executor).  Equal documents
    get equal keys and are interchangeable.
    """
    from pyspark.sql import functions as F

    from ._arrow import collect_arrow, collect_per_partition, partition_id, vectors

    frame = dataset.select(features_col, *([F.coalesce(F.col(validation_col), F.lit(False))] if validation_col else []))
    held_out = bool(validation_col)

    def rows(batches):
        part, i = partition_id(), 0
        for batch in batches:
            flags = numpy_of(batch.column(1)) if held_out else None
            for j, vec in enumerate(vectors(batch.column(0))):
                held = bool(flags[j]) if held_out else False
                yield (part, i, held) + ((None, None, None) if vec is None else vec)
                i += 1

    def empty():
        return {"docs": 0, "empty": 0, "null": 0, "tokens": 0, "max_length": 0, "bad": None, "sizes": set(),
                "freq": None, "validation_docs": 0, "validation_tokens": 0}

    def scan(batches):
        size = None
        out = empty()
        for part, i, held, vsize, idx, val in rows(batches):
            if vsize is None:
                out["null"] += 1
                continue
            out["sizes"].add(int(vsize))
            if size is None:
                size = int(vsize)
                out["freq"] = np.zeros(size, dtype=np.int64)
            if out["bad"] is None:
                bad = ~np.isfinite(val) | (val < 0) | (val != np.round(val))
                if bad.any() or vsize != size:
                    j = int(np.flatnonzero(bad)[0]) if bad.any() else 0
                    out["bad"] = (part, i, int(idx[j]) if bad.any() else None, float(val[j]) if bad.any() else None,
                                  int(vsize))
                    continue
            counts = np.round(val).astype(np.int64)
            if counts.sum() == 0:
                out["empty"] += 1
                continue
            if held:
                out["validation_docs"] += 1
                out["validation_tokens"] += int(counts.sum())
                continue
            out["docs"] += 1
            out["tokens"] += int(counts.sum())
            out["max_length"] = max(out["max_length"], int(counts.sum()))
            np.add.at(out["freq"], idx, counts)
        return out

    limit = TERMS_BUDGET // _partitions(frame)  # read here: the tasks see the driver's value

    def sparse_scan(batches):
        """A partition's scan with its token counts as (terms, counts) of its non-zero terms, or
        None past ``limit`` of them (the counts are then summed on the executors)."""
        out = scan(batches)
        freq = out.pop("freq")
        if freq is None:  # no document with a term here
            out["terms"] = (np.zeros(0, np.int64), np.zeros(0, np.int64))
            return out
        nz = np.flatnonzero(freq)
        out["terms"] = (nz, freq[nz]) if len(nz) <= limit else None
        return out

    def scan_rows(batches):
        """A partition's scan as rows: its stats (pickled, under term -1 - partition) and its
        token count per non-zero term."""
        import pyarrow as pa

        part = partition_id()
        out = scan(batches)
        freq = out.pop("freq")
        yield pa.RecordBatch.from_arrays(
            [pa.array([-1 - part], pa.int64()), pa.array([0], pa.int64()),
             pa.array([pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)], pa.binary())], SCAN_COLUMNS)
        if freq is None:
            return
        terms = np.flatnonzero(freq)
        for a in range(0, len(terms), 1 << 20):
            chunk = terms[a:a + (1 << 20)]
            yield pa.RecordBatch.from_arrays([numbers(chunk.astype(np.int64)), numbers(freq[chunk]),
                                              pa.nulls(len(chunk), pa.binary())], SCAN_COLUMNS)

    def merge(a, b):
        for key in ("docs", "empty", "null", "tokens", "validation_docs", "validation_tokens"):
            a[key] += b[key]
        a["max_length"] = max(a["max_length"], b["max_length"])
        a["sizes"] |= b["sizes"]
        a["bad"] = a["bad"] or b["bad"]
        return a

    parts = collect_per_partition(frame, sparse_scan)  # one job, no shuffle, while the counts are few
    if any(p["terms"] is None for p in parts):  # many terms a partition: summed on the executors
        summed = collect_arrow(frame.mapInArrow(scan_rows, "term long, count long, stats binary")
                               .groupBy("term").agg(F.sum("count").alias("count"),
                                                    F.first("stats", ignorenulls=True).alias("stats")))
        terms = numpy_of(summed.column("term")).astype(np.int64) if summed.num_rows else np.zeros(0, np.int64)
        counts = numpy_of(summed.column("count")).astype(np.int64) if summed.num_rows else np.zeros(0, np.int64)
        blobs = summed.column("stats").to_pylist() if summed.num_rows else []
        parts = [pickle.loads(blobs[j]) for j in sorted(np.flatnonzero(terms < 0), key=lambda j: -terms[j])]
        pieces = [(terms[terms >= 0], counts[terms >= 0])]
    else:
        pieces = [p.pop("terms") for p in parts]
    stats = parts[0] if parts else empty()  # no partitions at all: e.g. df.limit(0)
    for other in parts[1:]:
        stats = merge(stats, other)
    stats.pop("terms", None)
    if len(stats["sizes"]) == 1:
        stats["freq"] = np.zeros(next(iter(stats["sizes"])), dtype=np.int64)
        for terms, counts in pieces:
            known = (terms >= 0) & (terms < len(stats["freq"]))
            np.add.at(stats["freq"], terms[known], counts[known])
    _check_corpus(stats, features_col, validation_col)

    return frame, stats


def _kept_batch(batch, held_out: bool):
    """The documents of a raw batch (its term-count vectors, and the validation flags when
    ``held_out``) as a :data:`DOC_RECORD_SCHEMA` batch: each non-empty document's key (the
    digest of its terms and counts), terms and counts; None when the batch has none."""
    import pyarrow as pa

    from ._arrow import vectors

    docs, terms, counts, flags = [], [], [], []
    held = numpy_of(batch.column(1)) if held_out else None
    for j, vec in enumerate(vectors(batch.column(0))):
        if vec is None:
            continue
        t, n, digest = _doc_terms(vec[1], vec[2])
        if len(t):
            docs.append(int.from_bytes(digest, "little", signed=True))
            terms.append(t)
            counts.append(n)
            flags.append(bool(held[j]) if held_out else False)
    if not docs:
        return None
    offsets = numbers(np.concatenate([[0], np.cumsum([len(t) for t in terms])]), pa.int32())
    columns = [numbers(np.array(docs, dtype=np.int64)),
               pa.ListArray.from_arrays(offsets, numbers(np.concatenate(terms), pa.int64())),
               pa.ListArray.from_arrays(offsets, numbers(np.concatenate(counts), pa.int64()))] \
        + ([numbers(np.array(flags, dtype=bool))] if held_out else [])
    return pa.RecordBatch.from_arrays(columns, ["doc", "terms", "counts"] + ["validation"] * held_out)


def corpus_blocks(batch):
    """A raw batch of :func:`_doc_records`' frame (term-count vectors[, validation flags]) as
    :class:`~pystrads.programs.lda.DocBlock` s (``Engine(decode_batch=...)``): the documents are
    made inside the fit's own Python worker, so its barrier stage runs one Python operator and
    its tasks need one Python worker each."""
    kept = _kept_batch(batch, batch.num_columns > 1)
    return [] if kept is None else doc_blocks(kept)


def doc_blocks(batch):
    """A batch of :data:`DOC_RECORD_SCHEMA` rows as one :class:`~pystrads.programs.lda.DocBlock`
    (``Engine(decode_batch=...)``: the lists' buffers as numpy arrays, no Python list per document)."""
    from ..programs.lda import DocBlock

    if batch.num_rows == 0:
        return []
    terms, counts = batch.column(1), batch.column(2)
    held = numpy_of(batch.column(3)).astype(bool) if batch.num_columns > 3 else None
    return [DocBlock(numpy_of(batch.column(0)), numpy_filled(terms.value_lengths(), 0).astype(np.int64),
                     numpy_of(terms.flatten()), numpy_of(counts.flatten()), held)]


#: the joined fold-in's φ block per call of the kernel (rows of the distinct words of a run of
#: documents x K float64): the documents are folded in runs of at most this much φ, so a task's
#: memory follows its model rows' non-zeros and this block, never its bucket's terms x K
FOLD_PHI_BYTES = 32 << 20


def fold_in(features_index: int, alpha: np.ndarray, n_iter: int, seed: int, phi: Optional[np.ndarray] = None):
    """``fn(batches, lookup=None, each=None)``: a partition's batches (column ``features_index``
    holding term counts) and, per document, its Gibbs fold-in topic counts with the topics fixed
    -- ``(batches, counts, lengths)``, one fold-in per call.  φ is ``phi`` (V x K, travelling in
    the function: Spark broadcasts large ones; one run of all the documents) or, with
    ``lookup(words) -> (phi, rows)``, built per run of documents for the words the run uses
    (runs of at most :data:`FOLD_PHI_BYTES` of φ, dropped once the run is done);
    ``each(d0, counts, rows, ptr, phi)`` sees every run when it is folded: its first document,
    its documents' counts, their tokens' rows of ``phi`` and their offsets.  Each document draws
    from its own random stream, seeded by ``seed`` and its digest: its topic distribution
    depends on it alone, never on how the input is partitioned, ordered or cut into runs."""
    if phi is not None and phi.shape[0] == 0:
        raise ConfigurationError("the model has an empty vocabulary")
    k, phi_bytes = len(alpha), FOLD_PHI_BYTES  # read here, on the driver: the closure carries it

    def run(batches, lookup=None, each=None):
        from ..kernels import lda as K
        from ._arrow import vectors

        batches = list(batches)
        words, ptr, streams, distinct = [], [0], [], []
        for batch in batches:
            for vec in vectors(batch.column(features_index)):
                idx, val = (np.zeros(0, np.int64), np.zeros(0)) if vec is None else vec[1:]
                t, n, digest = _doc_terms(idx, val)
                words.append(np.repeat(t, n))
                ptr.append(ptr[-1] + int(n.sum()))
                streams.append(int.from_bytes(digest, "little"))
                distinct.append(len(t))
        doc_words = np.concatenate(words) if words else np.zeros(0, np.int64)
        doc_ptr = np.asarray(ptr, dtype=np.int64)
        n_docs = len(streams)
        # runs of documents: all of them with a shipped φ, else at most FOLD_PHI_BYTES of φ rows
        # (counting each document's distinct words: an upper bound on the run's)
        cuts = [0, n_docs]
        if lookup is not None and n_docs:
            budget = max(1, phi_bytes // (8 * k))
            cuts, used = [0], 0
            for d, m in enumerate(distinct):
                if used and used + m > budget:
                    cuts.append(d)
                    used = 0
                used += m
            cuts.append(n_docs)
        counts = []
        for d0, d1 in zip(cuts[:-1], cuts[1:]):
            if d1 == d0:
                continue
            lo, hi = int(doc_ptr[d0]), int(doc_ptr[d1])
            run_ptr = doc_ptr[d0:d1 + 1] - lo
            phi_rows, rows = (phi, doc_words) if lookup is None else lookup(doc_words[lo:hi])
            counts.append(K.fold_in(rows, run_ptr, phi_rows, alpha, n_iter, K.doc_states(seed, streams[d0:d1])))
            if each is not None:
                each(d0, counts[-1], rows, run_ptr, phi_rows)
            del phi_rows, rows
        counts = np.concatenate(counts) if counts else np.zeros((0, k))
        return batches, counts, np.diff(doc_ptr)

    return run


def _theta(counts: np.ndarray, length: int, alpha: np.ndarray) -> np.ndarray:
    """A document's topic mixture from its fold-in counts and the prior (one value per topic;
    zeros for a document without terms)."""
    return np.zeros(len(counts)) if length == 0 else (counts + alpha) / (length + alpha.sum())


def with_topic_mixtures(fold: callable, alpha: np.ndarray, features_index: int, out_col: str):
    """``fn(batches, lookup=None)`` for ``mapInArrow``: the batches with a dense vector column
    ``out_col`` of each document's topic mixture (``fold``: from :func:`fold_in`)."""
    def attach(batches, lookup=None):
        import pyarrow as pa

        from ._arrow import dense_vectors

        batches, counts, lengths = fold(batches, lookup)
        start = 0
        for batch in batches:
            theta = [_theta(counts[i], lengths[i], alpha) for i in range(start, start + batch.num_rows)]
            start += batch.num_rows
            column = dense_vectors(theta, batch.schema.field(features_index).type)
            yield pa.RecordBatch.from_arrays(list(batch.columns) + [column], batch.schema.names + [out_col])

    return attach


def log_likelihood(fold: callable, alpha: np.ndarray):
    """``fn(batches, lookup=None)``: per document with tokens, ``(log p(its tokens | theta_d, phi),
    its tokens)``."""
    def score(batches, lookup=None):
        out = []

        def each(d0, counts, rows, ptr, phi):  # while the run's φ is at hand
            for j in np.flatnonzero(np.diff(ptr)):
                n = int(ptr[j + 1] - ptr[j])
                out.append((float(np.log(phi[rows[ptr[j]:ptr[j + 1]]] @ _theta(counts[j], n, alpha)).sum()), n))

        fold(batches, lookup, each)
        yield from out

    return score
