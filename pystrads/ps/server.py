"""A parameter-server shard: one Arrow Flight server process.

A shard holds contiguous row ranges of model tables as numpy arrays and
serves (see :mod:`pystrads.ps.protocol` for the wire format):

* ``do_get``  -- rows of a table, by key list or by row range;
* ``do_put``  -- ``put`` (overwrite), additive ``inc``, or ``contribute``
  (partial sums that the program's ``pull`` turns into new rows when a round
  completes: server-side aggregation next to the rows);
* ``do_exchange`` -- a worker's round: its contributions, its tick of the round
  clock and the rows the round's ``pull`` left; one call, or many rounds on one
  stream for a step;
* actions     -- table management, round clocks (BSP / SSP), step
  begin / enter / commit / abort with an undo log so a failed step can be
  rolled back exactly, per-round metrics, ``stats``, ``heartbeat`` and
  ``shutdown``.

Every call must carry the run's token (field ``token`` of the request
header: ticket, put descriptor or action body), checked in constant time
before anything else; calls of any other kind are refused.  (A gRPC-header
middleware does the same job but its Python hook costs about 0.5 ms per call
here -- as much as the rest of a small call -- so the token travels inside
the request instead, which is equally protected on the wire.)  The process exits on
``shutdown`` and on its own when no heartbeat arrived for ``--lease``
seconds, so a killed driver leaves nothing running.

Run as ``python -m pystrads.ps.server --host 127.0.0.1 --info-file F``; the
token comes from the environment variable ``PYSTRADS_SHARD_TOKEN``.

This module holds :class:`ShardServer` (reads, writes, table management,
lease and stats) and the process around it (:func:`serve`, :func:`main`).
The server composes the rest of a shard: :mod:`~pystrads.ps.state` (what it
holds: tables, programs, blobs, counters, the one condition variable),
:mod:`~pystrads.ps.steps` (step state, fences, round clocks),
:mod:`~pystrads.ps.mailbox` (the workers' commands) and :mod:`~pystrads.ps.snapshots`
(checkpoints); besides them :mod:`~pystrads.ps.table` (a table slice and its undo
log), :mod:`~pystrads.ps.request` (token checks and request decoding) and
:mod:`~pystrads.ps.memory` (available memory, malloc tuning).
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import pickle
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from . import protocol
from .mailbox import Mailbox
from .memory import _mem_available, _peak_rss_bytes, _rss_bytes, release_free_memory, tune_malloc
from .request import _refuse, _Request, authorize_payload, decode_action, decode_request
from .snapshots import TableSnapshots
from .steps import StepFences, _own, namespace_of
from .state import ShardState
from .table import KINDS, SPARSE_ROW_MAX_FILL, ShardTable, SparseShardTable

log = logging.getLogger("pystrads.ps.server")

TOKEN_ENV = "PYSTRADS_SHARD_TOKEN"
#: the driver's own credential: program payloads (pickles) are accepted only with it
ADMIN_TOKEN_ENV = "PYSTRADS_SHARD_ADMIN_TOKEN"
#: the run's client certificate (PEM; public): a TLS shard serves only clients that present it
CLIENT_CERT_ENV = "PYSTRADS_SHARD_CLIENT_CERT"


#: the longest a heartbeat's ``hold`` keeps a shard without heartbeats (a day)
MAX_HOLD_SECONDS = 86400.0

#: a released fit that freed at least this much hands the heap's free pages back to the kernel
RELEASE_FREE_BYTES = 64 << 20


class ShardServer(flight.FlightServerBase):
    """One shard (see the module docstring): reads, writes, table management, lease and stats
    here; what it holds in ``state``, steps in ``fences``, the workers' commands in ``mailbox``
    and checkpoints in ``snapshots``.  An action ``<name>`` is served by the part's method
    ``action_<name>`` (each name declared by exactly one part)."""

    def __init__(self, location: str, token: str, lease_seconds: float, shard_id: str = "",
                 tls_certificates: Optional[list] = None, watch_pid: int = 0, admin_token: Optional[str] = None,
                 client_cert: Optional[bytes] = None):
        if tls_certificates and client_cert:  # mutual TLS: only the run's clients complete a handshake
            super().__init__(location, tls_certificates=tls_certificates, verify_client=True,
                             root_certificates=client_cert)
        elif tls_certificates:
            super().__init__(location, tls_certificates=tls_certificates)
        else:
            super().__init__(location)
        self._token = token.encode()
        # None: payloads come with the run token (a server embedded in a trusted process);
        # "": no payloads at all; else only with this driver-held token (launched shards)
        self._admin = None if admin_token is None else admin_token.encode()
        self.shard_id = shard_id
        self.state = ShardState(shard_id)
        self.fences = StepFences(self.state)
        self.mailbox = Mailbox(self.state, self.fences)
        self.snapshots = TableSnapshots(self.state, self.fences)
        # each action's part (its method is looked up per call, so a patched method is the one served)
        self._parts = {name: method.__self__ for name, method in
                       _handlers(self.fences, self.mailbox, self.snapshots).items()}
        own = _handlers(self)
        twice = sorted(set(own) & set(self._parts))
        if twice:
            raise TypeError(f"shard actions declared twice: {twice}")
        self.lease_seconds = lease_seconds
        self.last_heartbeat = time.monotonic()
        self.held_until = 0.0  # a heartbeat's ``hold``: no exit for want of heartbeats before then
        self.started = time.time()
        self.kernels_ready_s: Optional[float] = None  # the kernel warm-up's seconds, once done
        self._stopping = False
        self.watch_pid = int(watch_pid)
        self._watch_start = _start_time(self.watch_pid) if self.watch_pid else None
        threading.Thread(target=self._watchdog, name="lease-watchdog", daemon=True).start()

    def _watchdog(self) -> None:
        while not self._stopping:
            time.sleep(min(0.5, self.lease_seconds / 4))
            now = time.monotonic()
            idle = now - self.last_heartbeat
            if idle > self.lease_seconds and now > self.held_until:
                log.warning("shard %s: no driver heartbeat for %.1f s (lease %.1f s); exiting",
                            self.shard_id, idle, self.lease_seconds)
                os._exit(3)
            if self.watch_pid and _start_time(self.watch_pid) != self._watch_start:
                # the executor JVM that started this shard is gone (killed by its cluster manager,
                # or lost with its host's worker): nobody will use this shard again
                log.warning("shard %s: executor process %d is gone; exiting", self.shard_id, self.watch_pid)
                os._exit(4)

    # ------------------------------------------------------------------ reads
    def do_get(self, context, ticket):
        header, payload = decode_request(ticket.ticket, self._token)
        if "blob" in header:  # a stored byte string (no chunks: none stored under that key)
            with self.state.cond:
                blob = self.state.blobs.get(header.str("blob"))
            parts = [] if blob is None else (blob.parts or [pa.py_buffer(b"")])
            self.state.count(requests=1, bytes_out=0 if blob is None else blob.nbytes)
            return flight.RecordBatchStream(pa.Table.from_batches(protocol.blob_batches(parts),
                                                                  schema=protocol.BLOB_SCHEMA))
        table = self.state.table(header.str("table", ""))
        chunk_bytes = header.int("chunk", protocol.CHUNK_BYTES)
        nonzero = bool(header.get("nonzero"))
        if nonzero and not header.get("sparse"):
            raise flight.FlightServerError("a nonzero read sends the rows' entries (sparse)")
        entries = None
        with table.lock:
            if "start" in header:
                start, stop = header.int("start"), header.int("stop")
                if not (table.row_start <= start <= stop <= table.row_stop):
                    raise flight.FlightServerError(
                        f"table {table.name!r}: range [{start}, {stop}) is outside this shard's rows "
                        f"[{table.row_start}, {table.row_stop})")
                index: Any = slice(start - table.row_start, stop - table.row_start)
            elif nonzero:
                raise flight.FlightServerError("a nonzero read takes a range (start, stop), not keys")
            else:
                if len(payload) % 8:
                    raise flight.FlightServerError(
                        f"malformed request: a key list of {len(payload)} bytes is not int64 keys")
                index = table.local(np.frombuffer(payload, dtype="<i8"))
            if nonzero:  # only the rows with a non-zero value, with their keys
                index = table.nonzero_rows(index.start, index.stop)
                keys = index + table.row_start
            if header.get("sparse"):  # each row as its non-zero entries (with its key for a nonzero read)
                entries = table.read_entries(index)
            else:
                rows = table.read(index)  # a range of a dense table: a zero-copy view
                if table.kind == "dense" and isinstance(index, slice) and "start" not in header:
                    rows = rows.copy()  # keys that happen to be one run: not a view that may change
        if entries is not None:
            schema = protocol.sparse_schema(table.dtype, with_keys=nonzero)
            batches = protocol.entry_batches(*entries, schema, max(1, chunk_bytes), keys=keys if nonzero else None)
            self.state.count(requests=1, bytes_out=sum(b.nbytes for b in batches), rows_out=len(entries[0]) - 1)
            return flight.RecordBatchStream(pa.Table.from_batches(batches, schema=schema))
        chunk = protocol.rows_per_chunk(table.width, table.dtype, max(1, chunk_bytes))
        schema = protocol.value_schema(table.dtype, table.width, with_keys=False)
        self.state.count(requests=1, bytes_out=rows.nbytes, rows_out=len(rows))
        # One zero-copy table of chunk-sized batches, streamed by C++ (no Python per batch).
        batches = [pa.record_batch([protocol.rows_to_array(rows[start:start + chunk])], schema=schema)
                   for start in range(0, max(len(rows), 1), chunk)]
        return flight.RecordBatchStream(pa.Table.from_batches(batches, schema=schema))

    # ------------------------------------------------------------------ writes
    def do_put(self, context, descriptor, reader, writer):
        t_start = time.perf_counter()
        header, _ = decode_request(descriptor.command, self._token)
        op = header.get("op")
        if op == "blob":
            self._put_blob(header, reader)
            self.state.count_time("put_s", time.perf_counter() - t_start)
            return
        if op not in ("put", "inc", "contribute"):
            raise flight.FlightServerError(f"unknown write op {op!r}; expected put, inc or contribute")
        table = self.state.table(header.str("table", ""))
        nbytes, nrows = self._receive_rows(header, table, op, reader)
        self.state.count(requests=1, bytes_in=nbytes, rows_in=nrows)
        self.state.count_time("put_s", time.perf_counter() - t_start)

    def _receive_rows(self, header, table, op: str, reader, keys_seen: Optional[list] = None) -> Tuple[int, int]:
        """Apply (``put`` / ``inc``) or queue (``contribute``) the rows a write stream carries,
        batch by batch; returns ``(bytes, rows)`` received (``keys_seen``: a list that gets
        each batch's keys)."""
        width = table.contrib_width if op == "contribute" else table.width
        dtype = "float64" if op == "contribute" else table.dtype
        nbytes = nrows = 0
        start = header.int("start", None)  # a contiguous row run: no key column
        round_index = header.int("round") if op == "contribute" else None
        sparse = bool(header.get("sparse"))
        if sparse and (op == "contribute" or start is not None):
            raise flight.FlightServerError("a sparse write is a put or an inc with a key column")
        expected = protocol.sparse_schema(dtype, with_keys=True) if sparse else \
            protocol.value_schema(dtype, width, with_keys=start is None)
        if not reader.schema.equals(expected):
            raise flight.FlightServerError(
                f"table {table.name!r}: a {op} stream must have the schema {expected.to_string(show_schema_metadata=False)!r}"
                f", got {reader.schema.to_string(show_schema_metadata=False)!r}")
        for chunk in reader:  # apply batch by batch: received buffers are freed as we go
            batch = chunk.data
            if sparse:
                keys = protocol.numpy_of(batch.column(0)).astype(np.int64, copy=False)
                try:
                    offsets, cols, vals = protocol.sparse_entries(batch.column(1), batch.column(2), dtype, width)
                except ValueError as exc:
                    raise flight.FlightServerError(f"table {table.name!r}: {exc}") from None
                nbytes += keys.nbytes + cols.nbytes + vals.nbytes
                nrows += len(keys)
                with self.state.cond:
                    st = self.fences.check_fence(header, namespace=namespace_of(table.name))
                    with table.lock:
                        index = table.local(keys)
                        if st.open:
                            table.remember(index)
                        table.add_entries(index, offsets, cols, vals, replace=op == "put")
                continue
            if start is not None:
                if batch.num_columns != 1:
                    raise flight.FlightServerError("a range write batch has exactly one column, value")
                rows = protocol.array_to_rows(batch.column(0), width, dtype)
                keys = slice(int(start) + nrows, int(start) + nrows + len(rows))
            else:
                if batch.num_columns != 2:
                    raise flight.FlightServerError("a write batch needs the columns key and value")
                keys = protocol.numpy_of(batch.column(0)).astype(np.int64, copy=False)
                rows = protocol.array_to_rows(batch.column(1), width, dtype)
                if rows.shape[0] != len(keys):
                    raise flight.FlightServerError(
                        f"table {table.name!r}: value width does not match the table's ({width})")
            nbytes += rows.nbytes + (0 if start is not None else keys.nbytes)
            nrows += len(rows)
            # The fence check and the write happen under one lock, so a retried step's
            # rollback can never be followed by a zombie's write.
            with self.state.cond:
                st = self.fences.check_fence(header, namespace=namespace_of(table.name))
                if op == "contribute":
                    if isinstance(keys, slice):
                        keys = np.arange(keys.start, keys.stop, dtype=np.int64)
                    table.local(keys)  # range check
                    if keys_seen is not None:
                        keys_seen.append(keys)
                    st.contrib.setdefault((table.name, round_index), []).append(
                        (keys.copy(), rows.copy()))
                    continue
                _apply_rows(st, table, op, keys, rows)
        return nbytes, nrows

    def _riding_writes(self, header: _Request, payload: bytes) -> Tuple[int, int]:
        """Apply the writes a round carries (``protocol.riding_writes``), fenced like a write
        stream's; returns ``(bytes, rows)``."""
        fields = {k: header[k] for k in ("namespace", "step", "worker", "task", "enter") if k in header}
        nbytes = nrows = 0
        try:
            writes = list(protocol.riding_writes(header.get("writes"), payload))
        except ValueError as exc:
            raise flight.FlightServerError(f"malformed request: {exc}") from None
        for name, op, keys, rows in writes:
            table = self.state.table(name)
            if rows.shape[1] != table.width or rows.dtype != np.dtype(protocol.DTYPES[table.dtype][0]):
                raise flight.FlightServerError(
                    f"table {table.name!r}: a write of {rows.shape[1]} {rows.dtype} columns, the table has "
                    f"{table.width} {table.dtype}")
            with self.state.cond:  # the fence check and the write under one lock, as in _receive_rows
                _apply_rows(self.fences.check_fence(_Request(fields), namespace=namespace_of(table.name)),
                            table, op, keys, rows)
            nbytes += rows.nbytes + (0 if isinstance(keys, slice) else keys.nbytes)
            nrows += len(rows)
        return nbytes, nrows

    def _put_blob(self, header, reader) -> None:
        """Store the byte string a stream of binary chunks carries under ``key``, as the buffers
        it arrived in; with a step fence, only the worker's current task may write (as for
        table writes).  ``drop_prefix`` / ``keep_after``: the series' blobs older than
        ``keep_after`` are dropped before the new one is received, so a worker's state
        snapshots never hold more than the one before and the one arriving."""
        key = header.str("key")
        if not reader.schema.equals(protocol.BLOB_SCHEMA):
            raise flight.FlightServerError("a blob stream has one binary column, chunk")
        prefix, keep_after = header.get("drop_prefix"), header.get("keep_after")
        with self.state.cond:
            if "step" in header:
                self.fences.check_fence(header, namespace=namespace_of(key))
            self.state.drop_series(prefix, keep_after)
        blob = protocol.Blob([protocol.binary_parts(chunk.data) for chunk in reader])
        with self.state.cond:
            if "step" in header:
                self.fences.check_fence(header, namespace=namespace_of(key))
            self.state.put_blob(key, blob)
        self.state.count(requests=1, bytes_in=len(blob))

    # ------------------------------------------------------------------ actions
    def list_actions(self, context):
        _refuse()  # nothing is served without a token, and this call cannot carry one

    def list_flights(self, context, criteria):
        _refuse()

    def get_flight_info(self, context, descriptor):
        _refuse()

    def get_schema(self, context, descriptor):
        _refuse()

    def do_exchange(self, context, descriptor, reader, writer):
        """A worker's rounds.  ``op: "round"``: one round in one call -- its partial sums for
        this round (``contribute``: the table, and ``start`` for a contiguous run), then its tick
        of the round clock (the fields of the ``tick`` action), then, with ``read_back``, the
        rows of the contributed keys as the round's ``pull`` left them.  ``op: "rounds"``: many
        rounds on one stream (:meth:`_round_stream`), so that a round pays no call set-up."""
        header, payload = decode_request(descriptor.command, self._token)
        op = header.get("op")
        if op == "rounds":
            self._round_stream(reader, writer)
            return
        if op != "round":
            raise flight.FlightServerError(f"unknown exchange op {op!r}; expected 'round' or 'rounds'")
        answer = self._round(header, reader, payload)
        if answer is not None:
            rows, table = answer
            schema = protocol.value_schema(table.dtype, rows.shape[1], with_keys=False)
            chunk = protocol.rows_per_chunk(rows.shape[1], table.dtype, max(1, header.int("chunk", protocol.CHUNK_BYTES)))
            writer.begin(schema)
            for start in range(0, len(rows), chunk):
                writer.write_batch(pa.record_batch([protocol.rows_to_array(rows[start:start + chunk])], schema=schema))

    def _round_stream(self, reader, writer) -> None:
        """A worker's rounds on one ``DoExchange`` stream (one step's, as the client keeps it).
        A round is its contribution's record batches (the stream's schema), then a
        metadata-only message holding the round's header (as ``op: "round"``'s descriptor,
        token checked).  The answer is metadata-only messages: the read-back rows' bytes (C
        order, the table's dtype; none without ``read_back``) in chunks of at most ``chunk``
        bytes, each after a flag byte, 1 on the round's last.  An error ends the stream."""
        self.state.count(round_streams=1, open_round_streams=1)
        try:
            self._serve_rounds(reader, writer)
        finally:
            self.state.count(open_round_streams=-1)

    def _serve_rounds(self, reader, writer) -> None:
        pending: List[Any] = []
        while True:
            try:
                chunk = reader.read_chunk()
            except StopIteration:  # the worker closed the stream: its step is over
                return
            if chunk.data is not None and chunk.data.num_rows:
                pending.append(chunk)
            if chunk.app_metadata is None:
                continue
            header, payload = decode_request(chunk.app_metadata, self._token)
            if header.get("op") == "action" and not pending:
                answer_bytes = json.dumps(self._stream_action(header)).encode()
                size = protocol.CHUNK_BYTES  # (the program's bytes may come along: chunked as rows are)
                for start in range(0, max(len(answer_bytes), 1), size):
                    flag = b"\x01" if start + size >= len(answer_bytes) else b"\x00"
                    writer.write_metadata(pa.py_buffer(flag + answer_bytes[start:start + size]))
                continue
            if header.get("op") != "round":
                raise flight.FlightServerError(f"a rounds stream carries rounds and {list(protocol.STREAM_ACTIONS)}, "
                                               f"not {header.get('op')!r}")
            answer = self._round(header, _Received(reader.schema, pending), payload)
            pending = []
            payload = memoryview(b"") if answer is None else memoryview(np.ascontiguousarray(answer[0])).cast("B")
            if not len(payload):
                writer.write_metadata(pa.py_buffer(b"\x01"))
                continue
            size = max(1, header.int("chunk", protocol.CHUNK_BYTES))
            for start in range(0, len(payload), size):
                flag = b"\x01" if start + size >= len(payload) else b"\x00"
                writer.write_metadata(pa.py_buffer(flag + payload[start:start + size]))

    def _stream_action(self, header: _Request) -> Dict[str, Any]:
        """An action a rounds stream carries (one of :data:`protocol.STREAM_ACTIONS`), answered
        as :meth:`do_action` would."""
        name = header.str("action")
        if name not in protocol.STREAM_ACTIONS:
            raise flight.FlightServerError(f"a rounds stream carries the actions {list(protocol.STREAM_ACTIONS)}, "
                                           f"not {name!r}")
        self.state.count(requests=1)
        answer = getattr(self._parts.get(name, self), "action_" + name)(header)
        return answer if answer is not None else {}

    def _round(self, header: _Request, reader, payload: bytes = b"") -> Optional[Tuple[np.ndarray, ShardTable]]:
        """One round of one worker (``reader``: its contribution's batches; ``payload``: the
        small writes its push held back, described by ``writes``, applied first); the read-back
        rows (``read_back``: true, or the columns to send) and their table when the round asks
        for them."""
        contrib = header.dict("contribute", None)
        nbytes = nrows = 0
        if "writes" in header:
            nbytes, nrows = self._riding_writes(header, payload)
        keys_seen: List[Any] = []
        table = None
        if contrib is not None:
            table = self.state.table(_Request(contrib).str("table"))
            fields = {k: header[k] for k in ("step", "worker", "task", "round", "enter") if k in header}
            got_bytes, got_rows = self._receive_rows(_Request(fields, **contrib), table, "contribute", reader,
                                                     keys_seen)
            nbytes, nrows = nbytes + got_bytes, nrows + got_rows
        else:
            for _ in reader:  # (none: the worker's end of the call, so the answer never overtakes it)
                pass
        self.fences.action_tick(header)
        answer = None
        columns = header.get("read_back")
        if columns and table is not None:
            if columns is not True and (not isinstance(columns, list) or not columns or any(
                    not isinstance(c, int) or not 0 <= c < table.width for c in columns)):
                raise flight.FlightServerError(
                    f"table {table.name!r}: read_back must be true or column indexes in [0, {table.width}), "
                    f"got {columns!r}")
            keys = np.concatenate(keys_seen) if keys_seen else np.zeros(0, np.int64)
            with table.lock:
                index = table.local(keys)
                rows = table.read(index)
                rows = _own(rows, index) if columns is True else np.take(rows, columns, axis=1)
            self.state.count(bytes_out=rows.nbytes, rows_out=len(rows))
            answer = (rows, table)
        self.state.count(requests=1, bytes_in=nbytes, rows_in=nrows)
        return answer

    def do_action(self, context, action):
        body = action.body if action.body is not None else b""
        request = decode_action(body, self._token)  # (a long body's start only, before its token checks out)
        part = self._parts.get(action.type, self)
        handler = getattr(part, "action_" + action.type, None)
        if handler is None:
            raise flight.FlightServerError(
                f"unknown action {action.type!r}; known: " + ", ".join(sorted({**self._parts, **_handlers(self)})))
        self.state.count(requests=1, bytes_in=body.size if hasattr(body, "size") else len(body))
        answer = handler(request)
        return [json.dumps(answer if answer is not None else {}).encode()]

    def action_ping(self, req):
        """Liveness and identity."""
        return {"pid": os.getpid(), "shard": self.shard_id, "tables": len(self.state.tables),
                "python": sys.version.split()[0], "uptime": time.time() - self.started}

    def action_heartbeat(self, req):
        """Renew the driver's lease; ``hold``: seconds during which the shard waits for the next
        heartbeat however long the lease (while a relaunched job's coordinator, which beats from
        then on, waits for its task slots), at most :data:`MAX_HOLD_SECONDS`."""
        now = time.monotonic()
        self.last_heartbeat = now
        hold = req.num("hold", 0.0)
        if not 0.0 <= hold <= MAX_HOLD_SECONDS:
            raise flight.FlightServerError(f"heartbeat: hold={hold} is outside [0, {MAX_HOLD_SECONDS}] seconds")
        self.held_until = max(self.held_until, now + hold)
        return {}

    def action_begin_step(self, req):
        """Open a fit's step (:meth:`StepFences.begin_step`) and post its ``command``, when
        given, to the fit's mailbox, in one call: a step's schedule costs no extra call."""
        with self.state.cond:
            answer = self.fences.begin_step(req)
            if req.get("command") is not None:
                self.mailbox.post(req.str("namespace"), req.dict("command"))
        return answer

    def action_create_table(self, req):
        """Create (or replace) this shard's slice of a table."""
        name = req.str("name")
        start, stop, width = req.int("row_start"), req.int("row_stop"), req.int("width")
        try:
            dtype = protocol.check_dtype(req.str("dtype", "float64"))
        except ValueError as exc:
            raise flight.FlightServerError(str(exc)) from None
        if not 0 <= start <= stop or width < 1:
            raise flight.FlightServerError(f"table {name!r}: bad shape rows [{start}, {stop}) x {width}")
        nbytes = (stop - start) * width * np.dtype(protocol.DTYPES[dtype][0]).itemsize
        available = _mem_available()
        if available and nbytes > available and req.str("storage", "dense") == "dense":
            raise flight.FlightServerError(
                f"table {name!r}: its {nbytes / 2 ** 30:.1f} GiB slice does not fit in shard {self.shard_id}'s "
                f"available memory ({available / 2 ** 30:.1f} GiB); spread the model over more executors or "
                "shards (spark.pystrads.shard.perExecutor) or give the executors more memoryOverhead")
        kind = req.str("storage", "dense")
        if kind not in KINDS:
            raise flight.FlightServerError(f"table {name!r}: unknown storage {kind!r}; use one of {list(KINDS)}")
        if kind == "sparse" and req.num("fill", 0) != 0:
            raise flight.FlightServerError(f"table {name!r}: a sparse table starts empty (fill 0), got "
                                           f"fill={req.num('fill', 0)}")
        values = None
        if req.get("initializer"):
            authorize_payload(req, self._admin)
            init = pickle.loads(base64.b64decode(req.str("initializer")))
            values = np.ascontiguousarray(init(start, stop), dtype=protocol.DTYPES[dtype][0])
            if values.shape != (stop - start, width):
                raise flight.FlightServerError(
                    f"table {name!r}: initializer returned shape {values.shape}, "
                    f"expected {(stop - start, width)}")
        elif kind == "dense":
            values = np.full((stop - start, width), req.num("fill", 0), dtype=protocol.DTYPES[dtype][0])
        table: ShardTable
        if kind == "sparse":
            table = SparseShardTable(name, start, stop, width, dtype, req.int("contrib_width", width),
                                     req.num("max_fill", SPARSE_ROW_MAX_FILL))
            if values is not None:
                table.write(slice(0, stop - start), values)
                del values
        else:
            table = ShardTable(name, start, stop, width, dtype, values, req.int("contrib_width", width))
        with self.state.cond:
            self.state.tables[name] = table
        return {"rows": stop - start, "bytes": table.nbytes}

    def action_drop_tables(self, req):
        """Drop every table whose name starts with ``prefix`` (and its program).  With an
        ``epoch`` (a fit's own step loop ending it) the drop is refused if a newer loop has
        claimed the fit: a coordinator whose job was lost must not take its successor's tables."""
        prefix = req.str("prefix")
        with self.state.cond:
            self.fences.check_epoch(prefix.rstrip("/"), req.get("epoch"), "a drop of the tables")
            names = [n for n in self.state.tables if n.startswith(prefix)]
            freed = sum(self.state.tables[n].nbytes for n in names) + sum(
                b.nbytes for k, b in self.state.blobs.items() if k.startswith(prefix))
            for n in names:
                del self.state.tables[n]
            self.state.programs.pop(prefix.rstrip("/"), None)
            for key in [k for k in self.state.blobs if k.startswith(prefix)]:
                del self.state.blobs[key]
            fit = prefix.rstrip("/")
            self.mailbox.forget_fit(fit)
            self.fences.forget_fit(fit)
            self.state.cond.notify_all()  # wake the fit's workers waiting in ``next``
        if freed >= RELEASE_FREE_BYTES:
            release_free_memory()
        return {"dropped": names}

    def action_register_program(self, req):
        """Install a fit's program object; its ``pull`` runs here."""
        authorize_payload(req, self._admin)
        program = pickle.loads(base64.b64decode(req.str("payload")))
        with self.state.cond:
            self.state.programs[req.str("namespace")] = program
        return {}

    def action_stats(self, req):
        """Rows, bytes and requests served, and resident memory."""
        out = self.state.counters(with_timers=True)
        out.update({
            "pid": os.getpid(), "shard": self.shard_id,
            "tables": {n: _table_stats(t) for n, t in list(self.state.tables.items())},
            "table_bytes": int(sum(t.nbytes for t in list(self.state.tables.values()))),
            "blob_bytes": int(sum(b.nbytes for b in list(self.state.blobs.values()))),
            "peak_blob_bytes": int(self.state.peak_blob_bytes),
            "rss_bytes": _rss_bytes(),
            "peak_rss_bytes": _peak_rss_bytes(),
            "kernels_ready_s": self.kernels_ready_s,
        })
        return out

    def warm_up(self) -> None:
        """Load numba and the table kernels while the shard waits for its first tables (a first
        sparse request would otherwise wait ~1 s for them, and its workers with it); the stats
        report the seconds it took (``kernels_ready_s``)."""
        from ..kernels import warm_up

        t0 = time.perf_counter()
        try:
            warm_up("rows", "sparse_rows")
        except Exception as exc:  # noqa: BLE001 - a failed warm-up only costs the first request what it saves
            log.warning("kernel warm-up failed (the first request loads them): %s", exc)
            return
        self.kernels_ready_s = time.perf_counter() - t0

    def action_shutdown(self, req):
        """Stop serving and exit."""
        self._stopping = True

        def stop():
            time.sleep(0.05)
            # serving stops once the calls in flight end; a worker's open rounds stream (or a
            # waiting tick) does not hold the exit up beyond a moment
            closing = threading.Thread(target=self.shutdown, name="pystrads-shutdown", daemon=True)
            closing.start()
            closing.join(2.0)
            os._exit(0)

        threading.Thread(target=stop, daemon=True).start()
        return {}


def _apply_rows(st, table: ShardTable, op: str, keys, rows: np.ndarray) -> None:
    """With the state's ``cond`` held and the fence checked (``st``: the fit's step state): ``put``
    or ``inc`` ``rows`` at ``keys`` (an index array or a slice), remembered for a roll-back while a
    step is open."""
    with table.lock:
        index = table.local(keys)
        if st.open:
            table.remember(index)
        if op == "put":
            table.write(index, rows)
        else:
            table.add(index, rows)


def _handlers(*parts: Any) -> Dict[str, Any]:
    """The actions ``parts`` serve: ``{name: bound method action_<name>}``."""
    out: Dict[str, Any] = {}
    for part in parts:
        for attr in dir(part):
            if attr.startswith("action_"):
                name = attr[len("action_"):]
                if name in out:
                    raise TypeError(f"shard action {name!r} declared twice")
                out[name] = getattr(part, attr)
    return out


class _Received:
    """Record batches already read off a stream, iterated as a Flight reader's chunks are."""

    def __init__(self, schema: pa.Schema, chunks: List[Any]):
        self.schema = schema
        self._chunks = chunks

    def __iter__(self):
        return iter(self._chunks)


def _table_stats(table: ShardTable) -> Dict[str, Any]:
    """A table's rows, bytes held and storage (a sparse table: its pairs, dense rows, non-zeros)."""
    out: Dict[str, Any] = {"rows": table.row_stop - table.row_start, "bytes": table.nbytes, "storage": table.kind}
    if isinstance(table, SparseShardTable):
        with table.lock:
            out.update(table.storage())
    return out


def _start_time(pid: int) -> Optional[str]:
    """The start time of process ``pid`` (/proc, clock ticks since boot), None when it does not
    exist: a pid reused by another process has another start time."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            raw = fh.read()
        return raw[raw.rindex(")") + 2:].split()[19]
    except (OSError, ValueError, IndexError):
        return None


def _listen(host: str, port: int, port_range: int, token: str, lease_seconds: float, shard_id: str,
            tls: Optional[Tuple[bytes, bytes]], watch_pid: int = 0,
            admin_token: Optional[str] = None, client_cert: Optional[bytes] = None) -> "ShardServer":
    """A server on ``host`` at ``port`` (any free port if 0), or the first free one of
    ``port .. port + port_range - 1``; ``grpc+tls`` with ``tls = (cert PEM, key PEM)``, asking
    its clients for ``client_cert`` when given."""
    kwargs: Dict[str, Any] = {"watch_pid": watch_pid, "admin_token": admin_token, "client_cert": client_cert}
    scheme = "grpc"
    if tls:
        kwargs["tls_certificates"] = [flight.CertKeyPair(*tls)]
        scheme = "grpc+tls"
    ports = [0] if port == 0 else list(range(port, port + max(1, port_range)))
    errors = []
    for candidate in ports:
        try:
            return ShardServer(f"{scheme}://{host}:{candidate}", token, lease_seconds, shard_id, **kwargs)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises a generic error when the port is taken
            errors.append(f"{candidate}: {str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__}")
    raise OSError(f"no free port for a shard on {host} in {ports[0]}..{ports[-1]} (spark.pystrads.shard.port / "
                  f"portRange): {'; '.join(errors[-3:])}")


def serve(host: str, port: int, token: str, lease_seconds: float, info_file: Optional[str] = None,
          shard_id: str = "", malloc_retain: int = 0, tls_cert: str = "", tls_key: str = "",
          advertise: str = "", port_range: int = 1, watch_pid: int = 0, tls_auto: bool = False,
          admin_token: Optional[str] = None, tls_lifetime: Optional[float] = None,
          client_cert: Optional[bytes] = None) -> None:
    """Listen and serve until shutdown. TLS from ``tls_cert`` / ``tls_key`` files, or with
    ``tls_auto`` a key pair made here for the advertised address (:mod:`pystrads.ps.tls`),
    valid ``tls_lifetime`` seconds: its certificate goes into the info file for the driver's
    trust store, the key nowhere.  With TLS and ``client_cert`` (the run's client
    certificate), mutual TLS."""
    tuned = tune_malloc(malloc_retain)
    tls: Optional[Tuple[bytes, bytes]] = None
    own_cert = ""
    if tls_cert:
        with open(tls_cert, "rb") as fh:
            cert = fh.read()
        with open(tls_key, "rb") as fh:
            tls = (cert, fh.read())
    elif tls_auto:
        from .tls import self_signed

        tls = self_signed(advertise or host, *([tls_lifetime] if tls_lifetime else []))
        own_cert = tls[0].decode()
    server = _listen(host, port, port_range, token, lease_seconds, shard_id, tls, watch_pid, admin_token,
                     client_cert if tls else None)
    info = {"host": advertise or host, "bind": host, "port": server.port, "pid": os.getpid(), "shard": shard_id,
            "python": sys.executable, "version": sys.version.split()[0], "tls": tls is not None,
            "cert": own_cert, "mutual": bool(tls and client_cert)}
    if info_file:
        tmp = info_file + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(info, fh)
        os.replace(tmp, info_file)
    log.info("shard %s listening on %s:%d (%s%s; malloc tuned: %s)", shard_id, host, server.port,
             "TLS, own certificate" if own_cert else "TLS" if tls else "plaintext",
             ", clients with the run's certificate only" if tls and client_cert else "", tuned)
    threading.Thread(target=server.warm_up, name="pystrads-warm-up", daemon=True).start()
    server.serve()


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description="pystrads parameter-server shard")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="first port to try (0 = any free port)")
    parser.add_argument("--port-range", type=int, default=1, help="ports tried from --port upwards")
    parser.add_argument("--advertise", default="", help="address clients dial (default: --host)")
    parser.add_argument("--watch-pid", type=int, default=0,
                        help="exit within a second when this process (the executor JVM) is gone")
    parser.add_argument("--lease", type=float, default=30.0)
    parser.add_argument("--info-file")
    parser.add_argument("--shard-id", default="")
    parser.add_argument("--malloc-retain", type=int, default=0,
                        help="bytes of freed heap to keep mapped (glibc; 0 = defaults)")
    parser.add_argument("--tls-cert", default="", help="PEM certificate: serve grpc+tls with it")
    parser.add_argument("--tls-key", default="", help="PEM private key of --tls-cert")
    parser.add_argument("--secrets-stdin", action="store_true",
                        help='read the tokens from the first line of standard input, {"token": .., "admin": ..}, '
                             f"instead of {TOKEN_ENV} and {ADMIN_TOKEN_ENV}")
    parser.add_argument("--tls-lifetime", type=float, default=0.0,
                        help="with --tls-auto: seconds its certificate is valid (default a week)")
    parser.add_argument("--tls-auto", action="store_true",
                        help="serve grpc+tls with a key pair made here for --advertise (its certificate "
                             "is written to --info-file)")
    args = parser.parse_args(argv)
    if bool(args.tls_cert) != bool(args.tls_key):
        sys.exit("--tls-cert and --tls-key go together")
    if args.tls_auto and args.tls_cert:
        sys.exit("--tls-auto and --tls-cert exclude each other")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    token = os.environ.pop(TOKEN_ENV, "")
    admin = os.environ.pop(ADMIN_TOKEN_ENV, "")  # empty: this shard takes no program payloads
    client_cert = os.environ.pop(CLIENT_CERT_ENV, "").encode() or None
    if args.secrets_stdin:  # a spawned shard: the tokens never enter its environment (/proc/<pid>/environ)
        try:
            secrets = json.loads(sys.stdin.buffer.readline(1 << 16) or b"{}")
        except ValueError:
            sys.exit("--secrets-stdin: the first line of standard input is not a JSON object")
        token, admin = str(secrets.get("token") or ""), str(secrets.get("admin") or "")
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
    if not token:
        sys.exit(f"{TOKEN_ENV} is not set, nor --secrets-stdin given: a shard never runs without a run token")
    serve(args.host, args.port, token, args.lease, args.info_file, args.shard_id, args.malloc_retain,
          args.tls_cert, args.tls_key, args.advertise, args.port_range, args.watch_pid, args.tls_auto, admin,
          args.tls_lifetime or None, client_cert)


if __name__ == "__main__":
    main()
