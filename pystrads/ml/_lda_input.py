"""Reading StradsLDA's input: the documents' term-count vectors as the LDA program's records
(one row per non-empty document, keyed by a hash of its content), and the corpus scan that checks
every vector before any training and counts documents, tokens and tokens per term.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError


#: the documents as the LDA program's workers read them (one row per non-empty document)
DOC_RECORD_SCHEMA = "doc long, terms array<long>, counts array<long>"


def _doc_records(dataset, features_col: str):
    """(doc key, term indices, term counts) per non-empty document as a DataFrame, and a corpus scan.

    The scan (one Spark job) checks every vector (same size, finite,
    non-negative integral counts) and counts tokens per term, documents,
    empty documents and the longest document's tokens (``max_length``).  Both go through ``mapInArrow`` (classic sessions and
    Spark Connect alike).  A document's key is a hash of its terms and counts: a
    worker orders its documents by key, so the Gibbs chain depends on which documents
    a worker holds, never on the order Spark delivers them in (a shuffle's reducer reads
    local blocks first, so that order differs between local mode and a cluster, and
    between a partition and its recomputation after a lost executor).  Equal documents
    get equal keys and are interchangeable.
    """
    import hashlib

    from ._arrow import collect_per_partition, partition_id, vectors

    frame = dataset.select(features_col)

    def rows(batches):
        part, i = partition_id(), 0
        for batch in batches:
            for vec in vectors(batch.column(0)):
                yield (part, i) + ((None, None, None) if vec is None else vec)
                i += 1

    def scan(batches):
        size = None
        out = {"docs": 0, "empty": 0, "null": 0, "tokens": 0, "max_length": 0, "bad": None, "sizes": set(),
               "freq": None}
        for part, i, vsize, idx, val in rows(batches):
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
            out["docs"] += 1
            out["tokens"] += int(counts.sum())
            out["max_length"] = max(out["max_length"], int(counts.sum()))
            np.add.at(out["freq"], idx, counts)
        return out

    def merge(a, b):
        if a["freq"] is None:
            a["freq"] = b["freq"]
        elif b["freq"] is not None and len(a["freq"]) == len(b["freq"]):
            a["freq"] = a["freq"] + b["freq"]
        for key in ("docs", "empty", "null", "tokens"):
            a[key] += b[key]
        a["max_length"] = max(a["max_length"], b["max_length"])
        a["sizes"] |= b["sizes"]
        a["bad"] = a["bad"] or b["bad"]
        return a

    parts = collect_per_partition(frame, scan)
    if not parts:  # e.g. df.limit(0): no partitions at all
        raise InputError(f"featuresCol {features_col!r}: the input has no rows; LDA needs at least one "
                         "non-empty document")
    stats = parts[0]
    for other in parts[1:]:
        stats = merge(stats, other)

    def keep(batches):
        import pyarrow as pa

        docs, terms, counts = [], [], []
        for part, i, vsize, idx, val in rows(batches):
            if vsize is None:
                continue
            c = np.round(val).astype(np.int64)
            nz = c > 0
            if nz.any():
                t, n = np.ascontiguousarray(idx[nz], dtype=np.int64), np.ascontiguousarray(c[nz], dtype=np.int64)
                digest = hashlib.blake2b(t.tobytes() + b"|" + n.tobytes(), digest_size=8).digest()
                docs.append(int.from_bytes(digest, "little", signed=True))
                terms.append(t)
                counts.append(n)
        if docs:
            yield pa.RecordBatch.from_arrays(
                [pa.array(docs, pa.int64()), pa.array(terms, pa.list_(pa.int64())),
                 pa.array(counts, pa.list_(pa.int64()))], ["doc", "terms", "counts"])

    return frame.mapInArrow(keep, DOC_RECORD_SCHEMA), stats
