"""Wire format shared by the shard server and its client.

Row blocks travel as Arrow record batches.  A write stream (``do_put``) has
two columns, ``key`` (int64, sorted) and ``value`` (a FixedSizeList of the
table's dtype, one list per row).  A read stream (``do_get``) has only the
``value`` column, in the order of the keys asked for.  Small control calls
are Flight actions with a JSON body and a JSON answer.  Tickets and put
descriptors start with a JSON header; a key-list ticket appends the keys as
raw little-endian int64 after a NUL byte.

A worker's round (``do_exchange``) sends its contribution as a write stream
does, its header in the call's descriptor; the read-back rows come back as a
read stream.  On a rounds stream (``op: "rounds"``, one per step's rounds) each
round is its batches and then a metadata-only message holding the round's
header; the answer is metadata-only messages, each a flag byte (1 on the
round's last) followed by the next bytes of the read-back rows (C order, the
table's dtype).

A *sparse* read or write (header ``"sparse": true``) carries each row as its
non-zero entries instead: two list columns, ``cols`` (int32 column indices)
and ``vals`` (the table's dtype), one list per row (Arrow list arrays are
CSR: offsets and values), after the ``key`` column of a write.  Mostly-zero
rows (LDA's word-topic counts: 8 % non-zero on Reuters at K = 50) then
cost their non-zeros, not their width; the encoding is numba
(:mod:`pystrads.kernels.rows`, imported on the first sparse request).
"""

from __future__ import annotations

import enum
import json
from typing import Any, Dict, Iterator, List, Tuple

import numpy as np
import pyarrow as pa


class Action(str, enum.Enum):
    """Every action a shard serves, declared here once: the server serves each by one of its
    parts' ``action_<name>`` methods (and no other), the client sends no other (an unknown name
    is a ``ValueError`` before any call).  A member is its name as a string."""

    # the shard: liveness, lease, tables, programs, stats
    PING = "ping"
    HEARTBEAT = "heartbeat"
    CREATE_TABLE = "create_table"
    DROP_TABLES = "drop_tables"
    REGISTER_PROGRAM = "register_program"
    STATS = "stats"
    SHUTDOWN = "shutdown"
    # a fit's steps (ps.steps): loop epochs, fences, round clocks, commit and abort
    CLAIM = "claim"
    BEGIN_STEP = "begin_step"
    ENTER = "enter"
    TICK = "tick"
    STEP_DONE = "step_done"
    WAIT_STEP = "wait_step"
    COMMIT_STEP = "commit_step"
    ABORT_STEP = "abort_step"
    METRICS = "metrics"
    WORKER_ERROR = "worker_error"
    FIT_ERROR = "fit_error"
    # the workers' mailbox (ps.mailbox)
    POST = "post"
    HELLO = "hello"
    WAIT_HELLOS = "wait_hellos"
    WAIT_BLOBS = "wait_blobs"
    NEXT = "next"
    # checkpoints (ps.snapshots)
    SNAPSHOT = "snapshot"
    RESTORE = "restore"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def of(cls, name: Any) -> "Action":
        """The action ``name`` (a member or its string), or a ``ValueError`` naming the known ones."""
        try:
            return cls(name)
        except ValueError:
            raise ValueError(f"unknown shard action {name!r}; known: {', '.join(a.value for a in cls)}") from None


DTYPES = {
    "float64": (np.float64, pa.float64()),
    "float32": (np.float32, pa.float32()),
    "int64": (np.int64, pa.int64()),
    "int32": (np.int32, pa.int32()),
}


#: A stored byte string (a worker's pickled state) travels as binary chunks of this size.
BLOB_CHUNK = 2 << 20
#: default bytes per Arrow record batch in a get / put stream: under gRPC's 4 MiB message
#: limit with room for the batch's metadata (``spark.pystrads.rpc.chunkBytes``)
CHUNK_BYTES = (4 << 20) - (64 << 10)
BLOB_SCHEMA = pa.schema([pa.field("chunk", pa.binary())])


# -- arrays to and from numpy through their buffers: pyarrow's pa.array and Array.to_numpy (and
#    np.asarray of an Array) import pandas for their type checks, ~0.4 s of CPU in every new
#    Python worker and shard process, which need neither pandas nor those checks

def numbers(values, type: "pa.DataType | None" = None) -> pa.Array:
    """A 1-D numpy array (or sequence) of numbers or booleans as an Arrow array without nulls;
    ``type`` converts first (a primitive Arrow type).  No copy when ``values`` is contiguous and
    already of that type (booleans are packed into bits)."""
    a = np.ascontiguousarray(values)
    if type is not None:
        a = a.astype(type.to_pandas_dtype(), copy=False)
    if a.ndim != 1:
        raise ValueError(f"numbers() takes a 1-D array, got shape {a.shape}")
    if a.dtype == np.bool_:
        return pa.Array.from_buffers(pa.bool_(), len(a), [None, pa.py_buffer(np.packbits(a, bitorder="little"))])
    return pa.Array.from_buffers(pa.from_numpy_dtype(a.dtype), len(a), [None, pa.py_buffer(a)])


def binary_array(items) -> pa.BinaryArray:
    """Byte strings (bytes, memoryviews, buffers) as one Arrow binary array (one copy, the join)."""
    items = list(items)
    offsets = np.zeros(len(items) + 1, dtype=np.int64)
    np.cumsum([memoryview(x).nbytes for x in items], out=offsets[1:])
    if offsets[-1] >= 1 << 31:
        raise ValueError(f"{int(offsets[-1])} bytes do not fit one binary array (2 GiB at most); send fewer at once")
    data = b"".join(items)
    return pa.Array.from_buffers(pa.binary(), len(items), [None, pa.py_buffer(offsets.astype(np.int32)),
                                                           pa.py_buffer(data)])


def numpy_of(array) -> np.ndarray:
    """An Arrow array or chunked array as numpy, as ``to_numpy(zero_copy_only=False)`` gives it: a
    read-only view of the buffer for numbers without nulls, booleans unpacked; anything else
    (nulls, other types) through ``to_numpy``."""
    if isinstance(array, pa.ChunkedArray):
        return _joined([numpy_of(c) for c in array.chunks], array.type)
    if array.null_count or not _primitive(array.type):
        return array.to_numpy(zero_copy_only=False)
    return _values(array)


def numpy_filled(array, fill) -> np.ndarray:
    """A primitive Arrow array as numpy with its nulls replaced by ``fill`` (``fill_null``, whose
    scalar conversion imports pandas, then :func:`numpy_of`)."""
    if isinstance(array, pa.ChunkedArray):
        return _joined([numpy_filled(c, fill) for c in array.chunks], array.type)
    if not _primitive(array.type):
        raise TypeError(f"numpy_filled takes numbers or booleans, got {array.type}")
    values = _values(array)
    if not array.null_count:
        return values
    return np.where(numpy_of(array.is_valid()), values, np.asarray(fill).astype(values.dtype))


def _joined(parts: list, type) -> np.ndarray:
    """A chunked array's chunks as one numpy array (one chunk: as it is; none: empty of ``type``)."""
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else numpy_of(pa.nulls(0, type))


def _primitive(t) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def _values(array) -> np.ndarray:
    """A primitive array's values buffer as numpy (null slots hold whatever the buffer has)."""
    n, t = len(array), array.type
    buffer = array.buffers()[1]
    if pa.types.is_boolean(t):
        if n == 0:
            return np.zeros(0, dtype=np.bool_)
        bits = np.unpackbits(np.frombuffer(buffer, dtype=np.uint8), count=array.offset + n, bitorder="little")
        return bits[array.offset:].astype(np.bool_)
    dtype = np.dtype(t.to_pandas_dtype())
    if n == 0:
        return np.zeros(0, dtype=dtype)
    return np.frombuffer(buffer, dtype=dtype, count=n, offset=array.offset * dtype.itemsize)


def offsets_of(array) -> np.ndarray:
    """A list array's offsets (int32 or int64, as the type has them) as numpy, without pandas."""
    return numpy_of(array.offsets)


def binary_parts(batch: pa.RecordBatch) -> pa.Buffer:
    """The bytes a blob stream's batch carries (its chunks' values, which are contiguous in the
    array's data buffer), as one zero-copy slice of that buffer."""
    column = batch.column(0)
    if len(column) == 0:
        return pa.py_buffer(b"")
    offsets = np.frombuffer(column.buffers()[1], dtype=np.int32)[column.offset:column.offset + len(column) + 1]
    return column.buffers()[2].slice(int(offsets[0]), int(offsets[-1] - offsets[0]))


def blob_batches(parts) -> list:
    """Record batches of :data:`BLOB_SCHEMA` that carry ``parts`` (buffers) without copying them."""
    batches = []
    for part in parts:
        offsets = pa.py_buffer(np.array([0, part.size], dtype=np.int32))
        batches.append(pa.record_batch([pa.Array.from_buffers(pa.binary(), 1, [None, offsets, part])],
                                       schema=BLOB_SCHEMA))
    return batches


class Blob:
    """A stored byte string, kept as the Arrow buffers it arrived in (no copy on receipt):
    ``parts`` are :class:`pyarrow.Buffer` (or any buffer-protocol objects)."""

    __slots__ = ("parts", "nbytes")

    def __init__(self, parts):
        self.parts = [p if isinstance(p, pa.Buffer) else pa.py_buffer(p) for p in parts]
        self.nbytes = int(sum(p.size for p in self.parts))

    def __len__(self) -> int:
        return self.nbytes


def check_dtype(name: str) -> str:
    if name not in DTYPES:
        raise ValueError(f"dtype {name!r} is not supported; use one of {sorted(DTYPES)}")
    return name


def value_schema(dtype: str, width: int, with_keys: bool) -> pa.Schema:
    value = pa.field("value", pa.list_(DTYPES[dtype][1], width))
    if with_keys:
        return pa.schema([pa.field("key", pa.int64()), value])
    return pa.schema([value])


def rows_to_array(values: np.ndarray) -> pa.FixedSizeListArray:
    """A (n, width) C-contiguous numpy block as a FixedSizeList array (zero copy)."""
    n, width = values.shape
    flat = numbers(np.ascontiguousarray(values).reshape(-1))
    return pa.FixedSizeListArray.from_arrays(flat, width)


def array_to_rows(column, width: int, dtype: str) -> np.ndarray:
    """A FixedSizeList column back as a read-only (n, width) numpy view."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if isinstance(column, pa.FixedSizeListArray) and not column.null_count:  # (flatten() is a compute call)
        flat = numpy_of(column.values.slice(column.offset * width, len(column) * width))
    else:
        flat = numpy_of(column.flatten())
    if flat.dtype != DTYPES[dtype][0]:
        flat = flat.astype(DTYPES[dtype][0])
    return flat.reshape(-1, width)


def sparse_schema(dtype: str, with_keys: bool) -> pa.Schema:
    fields = [pa.field("cols", pa.list_(pa.int32())), pa.field("vals", pa.list_(DTYPES[dtype][1]))]
    return pa.schema(([pa.field("key", pa.int64())] if with_keys else []) + fields)


def rows_to_sparse(values: np.ndarray) -> Tuple[pa.ListArray, pa.ListArray]:
    """A (n, width) block as its non-zero entries: ``(cols, vals)`` list arrays, one list per row."""
    from ..kernels.rows import to_csr

    offsets, cols, vals = to_csr(np.ascontiguousarray(values))
    offsets = numbers(offsets)
    return pa.ListArray.from_arrays(offsets, numbers(cols)), pa.ListArray.from_arrays(offsets, numbers(vals))


def entry_batches(offsets: np.ndarray, cols: np.ndarray, vals: np.ndarray, schema: pa.Schema,
                  chunk_bytes: int, keys: "np.ndarray | None" = None) -> list:
    """Rows given as their entries (CSR) as sparse record batches (``cols``, ``vals``, after
    ``key`` when ``keys`` are given) of about ``chunk_bytes`` each, cut by the entries they
    hold (whole rows; at least one batch, possibly empty)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    n = len(offsets) - 1
    per_entry = 4 + vals.dtype.itemsize
    if keys is not None:  # a key per row: count it as an entry's worth
        chunk_bytes = max(1, chunk_bytes // 2)
    cuts = [0]
    if n:
        # row cuts where the entries reach another chunk's worth (row ends, so rows stay whole)
        budget = max(1, chunk_bytes // per_entry)
        marks = np.searchsorted(offsets[1:], np.arange(budget, int(offsets[-1]) + 1, budget), side="left") + 1
        cuts = unique_cuts(np.r_[0, marks, n], n)
    batches = []
    for a, b in zip(cuts[:-1], cuts[1:]):
        lo, hi = int(offsets[a]), int(offsets[b])
        off = numbers(offsets[a:b + 1] - lo, pa.int32())
        columns = [pa.ListArray.from_arrays(off, numbers(cols[lo:hi], pa.int32())),
                   pa.ListArray.from_arrays(off, numbers(vals[lo:hi]))]
        if keys is not None:
            columns.insert(0, numbers(keys[a:b], pa.int64()))
        batches.append(pa.record_batch(columns, schema=schema))
    if not batches:
        batches.append(pa.record_batch([pa.nulls(0, f.type) for f in schema], schema=schema))
    return batches


def unique_cuts(marks: np.ndarray, n: int) -> list:
    """Strictly increasing cut points from 0 to ``n`` out of ``marks`` (sorted, possibly repeated)."""
    marks = np.clip(np.asarray(marks, dtype=np.int64), 0, n)
    keep = np.r_[True, marks[1:] != marks[:-1]]
    out = marks[keep].tolist()
    if out[0] != 0:
        out.insert(0, 0)
    if out[-1] != n:
        out.append(n)
    return out


def sparse_entries(cols, vals, dtype: str, width: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(offsets, cols, vals)`` (CSR, offsets from 0) of two received list columns; raises
    ValueError if they disagree or a column index is outside ``[0, width)``."""
    offsets = offsets_of(cols).astype(np.int64)
    offsets = offsets - offsets[0]
    c = numpy_of(cols.flatten())
    v = numpy_of(vals.flatten())
    other = offsets_of(vals).astype(np.int64)
    if len(c) != len(v) or not np.array_equal(other - other[0], offsets):
        raise ValueError("a sparse batch's cols and vals lists differ in length")
    if len(c) and (int(c.min()) < 0 or int(c.max()) >= width):
        raise ValueError(f"a sparse column index is outside [0, {width})")
    if v.dtype != DTYPES[dtype][0]:
        v = v.astype(DTYPES[dtype][0])
    return offsets, c.astype(np.int32, copy=False), v


def concat_entries(parts, vals_dtype: Any = np.float64) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One CSR ``(offsets int64[n + 1], cols int32, vals)`` of the rows of ``parts``, in order:
    each part an ``(offsets, cols, vals)`` of its rows, its offsets from 0 into its own ``cols``.
    No parts: no rows, with values of ``vals_dtype``.  Every place that joins row entries (a
    shard's chunks, the shards' parts of a read, a model's batches) joins them here."""
    if not parts:
        return np.zeros(1, np.int64), np.zeros(0, np.int32), np.zeros(0, vals_dtype)
    offsets, base = [np.zeros(1, np.int64)], 0
    for o, c, _ in parts:
        offsets.append(np.asarray(o[1:], dtype=np.int64) + base)
        base += len(c)
    return (np.concatenate(offsets), np.concatenate([np.asarray(c, dtype=np.int32) for _, c, _ in parts]),
            np.concatenate([v for _, _, v in parts]))


def sparse_rows_per_chunk(width: int, dtype: str, chunk_bytes: int) -> int:
    """Rows per batch of a sparse stream: every entry non-zero at worst (int32 index + value)."""
    itemsize = np.dtype(DTYPES[dtype][0]).itemsize
    return max(1, chunk_bytes // max(1, width * (itemsize + 4) + 16))


def rows_per_chunk(width: int, dtype: str, chunk_bytes: int) -> int:
    itemsize = np.dtype(DTYPES[dtype][0]).itemsize
    return max(1, chunk_bytes // max(1, width * itemsize + 8))


def iter_chunks(keys: np.ndarray, values: np.ndarray, chunk_rows: int) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    for start in range(0, len(keys), chunk_rows):
        yield keys[start:start + chunk_rows], values[start:start + chunk_rows]


#: Actions a shard also serves on a worker's rounds stream (``op: "action"``), so that the
#: worker's poll for its next command costs no call set-up
STREAM_ACTIONS = ("next",)

#: Bytes of small writes a worker's round may hold back to send with its clock tick (per round,
#: all shards together); a write that would pass it goes at once, by a call of its own.
RIDING_BYTES = 256 << 10


def riding_payload(writes: List[Tuple[str, str, Any, np.ndarray]]) -> Tuple[List[list], bytes]:
    """Writes ``(table, op, keys or range, rows)`` as a header field (one ``[table, op, rows,
    width, dtype, start or None]`` each) and the payload after the header: each write's int64
    keys (none for a range), then its rows, C order, little-endian."""
    fields, pieces = [], []
    for table, op, keys, rows in writes:
        rows = np.ascontiguousarray(rows)
        dtype = rows.dtype.name
        if dtype not in DTYPES:
            raise ValueError(f"a write to {table!r} in {dtype}: not a table dtype")
        if isinstance(keys, range):
            start = int(keys.start)
        else:
            start = None
            pieces.append(np.ascontiguousarray(keys, dtype="<i8").tobytes())
        pieces.append(rows.astype(rows.dtype.newbyteorder("<"), copy=False).tobytes())
        fields.append([table, op, int(rows.shape[0]), int(rows.shape[1]), dtype, start])
    return fields, b"".join(pieces)


def riding_writes(fields: Any, payload: bytes):
    """The writes :func:`riding_payload` encoded: ``(table, op, keys or slice, rows)``, rows a
    read-only view of ``payload``; raises ``ValueError`` on a malformed description."""
    if not isinstance(fields, list):
        raise ValueError("'writes' must be a list")
    view, pos = memoryview(payload), 0
    for field in fields:
        if not (isinstance(field, list) and len(field) == 6 and isinstance(field[0], str)
                and field[1] in ("put", "inc") and all(isinstance(x, int) and x >= 0 for x in field[2:4])
                and field[4] in DTYPES and (field[5] is None or isinstance(field[5], int) and field[5] >= 0)):
            raise ValueError(f"malformed write {field!r}")
        table, op, n, width, dtype, start = field
        if start is None:
            end = pos + 8 * n
            if end > len(view):
                raise ValueError("the writes' payload is shorter than they say")
            keys: Any = np.frombuffer(view[pos:end], dtype="<i8")
            pos = end
        else:
            keys = slice(start, start + n)
        itemsize = np.dtype(DTYPES[dtype][0]).itemsize
        end = pos + n * width * itemsize
        if end > len(view):
            raise ValueError("the writes' payload is shorter than they say")
        rows = np.frombuffer(view[pos:end], dtype=np.dtype(DTYPES[dtype][0]).newbyteorder("<")).reshape(n, width)
        pos = end
        yield table, op, keys, rows
    if pos != len(view):
        raise ValueError(f"the writes' payload has {len(view) - pos} bytes more than they say")


def encode_header(header: Dict[str, Any], payload: bytes = b"") -> bytes:
    """A request header as JSON (its ``token`` first: a shard reads no more of a long request
    than its start until the token there checks out), then ``payload`` after a NUL byte."""
    head = json.dumps(token_first(header), separators=(",", ":")).encode()
    return head + b"\0" + payload if payload else head


def token_first(body: Dict[str, Any]) -> Dict[str, Any]:
    """``body`` with its ``token`` field first (JSON keeps the order)."""
    if "token" not in body:
        return body
    return {"token": body["token"], **{k: v for k, v in body.items() if k != "token"}}


def decode_header(raw: bytes) -> Tuple[Dict[str, Any], bytes]:
    raw = bytes(raw)
    head, sep, payload = raw.partition(b"\0")
    try:
        header = json.loads(head.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"malformed request header: {exc}") from None
    if not isinstance(header, dict):
        raise ValueError("malformed request header: not a JSON object")
    return header, payload
