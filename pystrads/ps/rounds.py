"""A worker's round as one request per shard: its partial sums, its clock tick and the rows
the round's ``pull`` left, in one Flight ``DoExchange`` (the shard side is
``ShardServer.do_exchange``; the resident runtime's tick sends it)."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from ..errors import ShardUnavailableError
from . import protocol
from .client import ShardClient, _translate


def round_exchange(client: ShardClient, tick: Dict[str, Any], table: Optional[str] = None,
                   keys: Optional[np.ndarray] = None, values: Optional[np.ndarray] = None,
                   start: Optional[int] = None, read_back: Optional[Tuple[int, str]] = None) -> Optional[np.ndarray]:
    """A worker's round in one request: ``contribute`` ``values`` (partial sums) at the
    sorted unique ``keys`` (or rows ``start, ...``) of ``table``, then ``tick`` (``tick``:
    the action's fields), then -- ``read_back=(width, dtype)`` -- the rows of those keys
    once the clock let the tick through (the round's ``pull`` applied when ``wait_for``
    is the round).  Without a table it is a plain tick."""
    head = dict(tick, op="round", token=client._token, chunk=client.chunk_bytes)
    width = values.shape[1] if values is not None else 0
    if table is not None:
        if start is None and len(keys) > 0 and int(keys[-1]) - int(keys[0]) + 1 == len(keys):
            start = int(keys[0])
        head["contribute"] = {"table": table, **({"start": int(start)} if start is not None else {})}
        if read_back is not None:
            head["read_back"] = True
    n = len(values) if values is not None else 0
    descriptor = flight.FlightDescriptor.for_command(protocol.encode_header(head))
    schema = protocol.value_schema("float64", max(width, 1), with_keys=start is None)
    try:
        writer, reader = client._client.do_exchange(descriptor, client._options)
        writer.begin(schema)
        if table is not None:
            contiguous = start is not None
            chunk = protocol.rows_per_chunk(width, "float64", client.chunk_bytes)
            ks = np.empty(n, dtype=np.int64) if contiguous else keys
            for k, v in protocol.iter_chunks(ks, values, chunk):
                columns = [protocol.rows_to_array(v)] if contiguous else [pa.array(k, pa.int64()),
                                                                         protocol.rows_to_array(v)]
                writer.write_batch(pa.record_batch(columns, schema=schema))
        writer.done_writing()
        out = None
        if table is not None and read_back is not None:
            rb_width, rb_dtype = read_back
            out = np.empty((n, rb_width), dtype=protocol.DTYPES[rb_dtype][0])
            pos = 0
            for chunk in reader:
                rows = protocol.array_to_rows(chunk.data.column(0), rb_width, rb_dtype)
                out[pos:pos + len(rows)] = rows
                pos += len(rows)
            if pos != n:
                raise ShardUnavailableError(f"round exchange with {client.uri}: {pos} rows back, expected {n}")
        writer.close()
    except flight.FlightError as exc:
        raise _translate(exc, client.uri, "action 'tick'" if table is None else f"round of table {table!r}") \
            from None
    return out
