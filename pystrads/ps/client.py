"""Client side of the parameter server.

* :class:`ShardClient` -- one authenticated connection to one shard; the only
  place that talks Flight.  Errors come back as :mod:`pystrads.errors` types.
* :class:`ShardGroup` -- a small picklable handle (addresses + token) that
  travels in Spark closures; connections are opened lazily, once per process.
* :class:`TableHandle` -- a model table spread over the shards by a
  :class:`~pystrads.ps.partition.TableLayout`: ``read`` / ``read_entries``, ``write``,
  additive ``add`` and ``contribute`` on keys or a range of rows, dense or as entries,
  one request per shard touched.

A worker's round travels as one exchange per shard (:meth:`ShardClient.exchange_round`): its
contributions, the small writes its push held back (:class:`RidingWrites`), its clock tick and
the rows the round's ``pull`` left; while the worker is in a fit, on a stream kept open for its
rounds (:meth:`ShardClient.stream_rounds`), which also carries its polls for the next command
(:meth:`ShardClient.poll`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from ..errors import PystradsError, RoundTimeoutError, ShardUnavailableError
from . import protocol
from .protocol import Action
from .partition import TableLayout
from .table import RowEntries

#: the deadline of a control call when nothing says otherwise (``spark.pystrads.rpc.timeoutSeconds``)
RPC_TIMEOUT_SECONDS = 10.0

#: bulk reads and writes get one more second of deadline per this many bytes (a slow network's
#: floor: loopback moves ~500 MB/s, a congested 1 Gb/s link still ~50 MB/s)
BULK_BYTES_PER_SECOND = 8 << 20

#: a liveness check asks a shard whose connection fails (refused, reset) this many times, the
#: first retry after this many seconds and each next one four times later (0.25 + 1 s in all)
PING_ATTEMPTS = 3
PING_BACKOFF_SECONDS = 0.25

#: a blob's read bound when its size is not known in advance (worker state snapshots)
BLOB_READ_BOUND_BYTES = 1 << 32

#: actions whose work on the shard grows with the data (writing or reading a checkpoint, creating
#: or dropping large tables): a deadline of this many control deadlines
BULK_ACTIONS = {Action.CREATE_TABLE: 60, Action.DROP_TABLES: 60, Action.SNAPSHOT: 60, Action.RESTORE: 60,
                Action.REGISTER_PROGRAM: 6, Action.STATS: 6}

_CONNECTIONS: Dict[Tuple[Any, ...], "ShardClient"] = {}
_CONNECTIONS_LOCK = threading.Lock()
_POOL: Optional[concurrent.futures.ThreadPoolExecutor] = None


def fan_out(calls: Sequence[Any]) -> List[Any]:
    """Run zero-argument ``calls`` at once (Flight calls release the GIL) and return their
    results in order; the first error is raised after every call has returned, so no call
    is left running behind the caller's back."""
    global _POOL
    if len(calls) <= 1:
        return [call() for call in calls]
    with _CONNECTIONS_LOCK:
        if _POOL is None:
            _POOL = concurrent.futures.ThreadPoolExecutor(max_workers=32, thread_name_prefix="pystrads-fanout")
    futures: List[Any] = []
    for call in calls[1:]:
        try:
            futures.append(_POOL.submit(call))
        except RuntimeError:  # the interpreter is exiting: its pools take no new work, run it here
            futures.append(call)
    results, error = [], None
    for pending in [calls[0]] + futures:
        try:
            results.append(pending.result() if isinstance(pending, concurrent.futures.Future) else pending())
        except Exception as exc:  # noqa: BLE001 -- re-raised below
            error = error or exc
    if error is not None:
        raise error
    return results


def _deadline_missed(exc: Exception) -> bool:
    """``exc`` says the call's own deadline passed (the shard did not answer in time), as opposed
    to a timeout the shard itself reported (a round's)."""
    return isinstance(exc, flight.FlightTimedOutError) and "deadline" in str(exc).lower() \
        and "round timeout" not in str(exc)


def _translate(exc: Exception, uri: str, what: str, deadline: Optional[float] = None) -> Exception:
    text = str(exc).split("\n")[0]
    if deadline is not None and _deadline_missed(exc):
        return ShardUnavailableError(
            f"{what}: shard {uri} did not answer within its deadline of {deadline:.0f} s; it is taken for lost "
            "(a paused host, a frozen process or a network that drops packets). Raise "
            "spark.pystrads.rpc.timeoutSeconds if the shard is only slow")
    if isinstance(exc, flight.FlightTimedOutError) or "round timeout" in text:
        return RoundTimeoutError(f"{what} on shard {uri}: {text}")
    if isinstance(exc, flight.FlightUnauthenticatedError):
        return ShardUnavailableError(f"{what} on shard {uri} was refused: {text}")
    if isinstance(exc, flight.FlightUnavailableError) and ("Ssl" in text or "SSL" in text or "handshake" in text):
        return ShardUnavailableError(
            f"{what}: the TLS handshake with shard {uri} failed ({text}); the client must trust the shard's "
            "certificate: the run's own certificates travel with the run, a configured certificate needs "
            "spark.pystrads.shard.tls.caFile (or certFile) to name it and the address the client dials")
    if isinstance(exc, flight.FlightUnavailableError):
        return ShardUnavailableError(
            f"{what}: shard {uri} is unreachable ({text}); the shard process died or its lease "
            "expired (see spark.pystrads.shard.leaseSeconds), or the network between executors "
            "blocks its port")
    return ShardUnavailableError(f"{what} on shard {uri} failed: {text}")


def _seconds(nbytes: float) -> float:
    """The deadline a read or write of ``nbytes`` adds to a control call's."""
    return float(nbytes) / BULK_BYTES_PER_SECOND


def _run_start(keys: Optional[np.ndarray], start: Optional[int]) -> Optional[int]:
    """``start`` when given, else the first key when the sorted unique ``keys`` are one run of
    rows (a run travels as a range, without a key column), else None."""
    if start is None and keys is not None and len(keys) > 0 and int(keys[-1]) - int(keys[0]) + 1 == len(keys):
        return int(keys[0])
    return start


class ShardClient:
    """One authenticated Flight connection to one shard.

    Every call has a deadline: ``rpc_timeout`` for a control call, plus the wait a long poll asks
    the shard for (``timeout`` in its body), plus a second per :data:`BULK_BYTES_PER_SECOND` of a
    read or write.  A shard that misses a whole control deadline is *lost*: every later call to
    it fails at once with :class:`~pystrads.errors.ShardUnavailableError`, as for a killed shard
    (its fit recovers on new shards or fails naming it)."""

    def __init__(self, uri: str, token: str, chunk_bytes: int = protocol.CHUNK_BYTES,
                 tls_root_certs: Optional[bytes] = None, admin_token: Optional[str] = None,
                 rpc_timeout: float = RPC_TIMEOUT_SECONDS, client_cert: Optional[Tuple[bytes, bytes]] = None):
        self.uri = uri
        self.rpc_timeout = float(rpc_timeout)
        self.lost: Optional[str] = None  # why the shard is taken for lost (it missed a deadline)
        self.silent_since: Optional[float] = None  # the first heartbeat it missed since its last answer
        self.chunk_bytes = chunk_bytes
        if uri.startswith("grpc+tls://"):
            # the shards' certificate (or its CA) must be trusted: no unverified TLS; and the shards
            # ask for the run's client certificate (mutual TLS, pystrads.ps.tls.client_identity)
            kwargs: Dict[str, Any] = {"tls_root_certs": tls_root_certs} if tls_root_certs else {}
            if client_cert:
                kwargs.update(cert_chain=client_cert[0], private_key=client_cert[1])
            self._client = flight.FlightClient(uri, **kwargs)
        else:
            self._client = flight.FlightClient(uri)
        self._token = token  # travels in every request header (see pystrads.ps.server)
        self._admin = admin_token  # the driver's only: lets actions carry program payloads
        self._options = flight.FlightCallOptions(timeout=self.rpc_timeout)
        # rounds streams by contribution schema while a worker is in a fit (see stream_rounds);
        # None: every round is a call of its own
        self._streams: Optional[Dict[Tuple[int, bool], "_RoundStream"]] = None
        self._streams_lock = threading.Lock()

    @classmethod
    def cached(cls, uri: str, token: str, chunk_bytes: int = protocol.CHUNK_BYTES,
               tls_root_certs: Optional[bytes] = None, admin_token: Optional[str] = None,
               rpc_timeout: float = RPC_TIMEOUT_SECONDS,
               client_cert: Optional[Tuple[bytes, bytes]] = None) -> "ShardClient":
        key = (uri, token, admin_token, tls_root_certs, float(rpc_timeout), client_cert)
        with _CONNECTIONS_LOCK:
            client = _CONNECTIONS.get(key)
            if client is None:
                client = _CONNECTIONS[key] = cls(uri, token, chunk_bytes, tls_root_certs, admin_token, rpc_timeout,
                                                 client_cert)
            return client

    def _call(self, what: str, extra_seconds: float = 0.0):
        """``(options, deadline)`` of a call that may take ``extra_seconds`` beyond a control
        call's deadline; raises at once when the shard is lost."""
        if self.lost is not None:
            raise ShardUnavailableError(f"{what}: shard {self.uri} is lost ({self.lost})")
        if extra_seconds <= 0:
            return self._options, self.rpc_timeout
        deadline = self.rpc_timeout + float(extra_seconds)
        return flight.FlightCallOptions(timeout=deadline), deadline

    def _failed(self, exc: Exception, what: str, deadline: Optional[float]) -> Exception:
        """The error to raise for a failed call; a missed deadline marks the shard lost."""
        error = _translate(exc, self.uri, what, deadline)
        if deadline is not None and _deadline_missed(exc):
            self.lost = f"it missed a deadline of {deadline:.0f} s"
        return error

    def action(self, action_type: "Action | str", deadline: Optional[float] = None, **body: Any) -> Dict[str, Any]:
        """Run action ``action_type`` (an :class:`~pystrads.ps.protocol.Action`; a name that is not
        one is a ``ValueError``) with ``body``; its deadline is a control call's (more for the
        actions in :data:`BULK_ACTIONS`, plus the ``timeout`` a long poll asks for), or
        ``deadline`` seconds -- a call that misses a given shorter ``deadline`` (a heartbeat)
        does not mark the shard lost."""
        action_type = Action.of(action_type)
        what = f"action {action_type.value!r}"
        if deadline is not None:
            if self.lost is not None:
                raise ShardUnavailableError(f"{what}: shard {self.uri} is lost ({self.lost})")
            options, limit = flight.FlightCallOptions(timeout=float(deadline)), None
        else:
            wait = body.get("timeout", 0.0)
            extra = (BULK_ACTIONS.get(action_type, 1) - 1) * self.rpc_timeout
            options, limit = self._call(what, extra + (float(wait) if isinstance(wait, (int, float)) else 0.0))
        body = {"token": self._token, **body}  # first: see protocol.encode_header
        if self._admin:
            body["admin"] = self._admin
        payload = json.dumps(body, separators=(",", ":")).encode()
        try:
            results = list(self._client.do_action(flight.Action(action_type.value, payload), options))
        except flight.FlightError as exc:
            raise self._failed(exc, what, limit) from None
        return json.loads(results[0].body.to_pybytes()) if results else {}

    def get_rows(self, table: str, width: int, dtype: str, keys: Optional[np.ndarray] = None,
                 start: int = 0, stop: int = 0, out: Optional[np.ndarray] = None,
                 view: bool = False) -> np.ndarray:
        """Rows by key list (any order) or by range ``[start, stop)``.

        ``view``: ask for one batch and return it as a read-only numpy view of the
        received Arrow buffer (no copy, no fresh memory); ``out`` must be None.
        """
        chunk_bytes = self.chunk_bytes
        if view:
            n_rows = len(keys) if keys is not None else stop - start
            chunk_bytes = max(chunk_bytes, n_rows * (width * np.dtype(protocol.DTYPES[dtype][0]).itemsize + 8) + 1)
        header: Dict[str, Any] = {"table": table, "chunk": chunk_bytes, "token": self._token}
        if keys is None:
            header.update(start=int(start), stop=int(stop))
            ticket = protocol.encode_header(header)
            n = stop - start
        else:
            keys = np.ascontiguousarray(keys, dtype="<i8")
            ticket = protocol.encode_header(header, keys.tobytes())
            n = len(keys)
        what = f"get from table {table!r}"
        options, limit = self._call(what, _seconds(n * width * 8))
        try:
            batches = (chunk.data for chunk in self._client.do_get(flight.Ticket(ticket), options))
            if view:
                batches = list(batches)
                if len(batches) == 1 and batches[0].num_rows == n:
                    return protocol.array_to_rows(batches[0].column(0), width, dtype)
            if out is None:
                out = np.empty((n, width), dtype=protocol.DTYPES[dtype][0])
            pos = 0
            for batch in batches:
                rows = protocol.array_to_rows(batch.column(0), width, dtype)
                out[pos:pos + len(rows)] = rows
                pos += len(rows)
        except flight.FlightError as exc:
            raise self._failed(exc, what, limit) from None
        if pos != n:
            raise ShardUnavailableError(f"get from table {table!r} on {self.uri}: {pos} rows, expected {n}")
        return out

    def write_rows(self, op: str, table: str, keys: Optional[np.ndarray], values: np.ndarray, dtype: str,
                   header: Optional[Dict[str, Any]] = None, start: Optional[int] = None) -> None:
        """``put`` / ``inc`` / ``contribute`` rows ``values[i]`` at sorted unique ``keys[i]``,
        or at rows ``start, start + 1, ...`` (a contiguous run travels as a range,
        without a key column)."""
        width = values.shape[1]
        head = dict(header or {}, op=op, table=table, token=self._token)
        start = _run_start(keys, start)
        if start is not None:
            head["start"] = int(start)
        descriptor = flight.FlightDescriptor.for_command(protocol.encode_header(head))
        schema = protocol.value_schema(dtype, width, with_keys=start is None)
        what = f"{op} into table {table!r}"
        options, limit = self._call(what, _seconds(values.nbytes + (0 if keys is None else 8 * len(keys))))
        try:
            writer, _ = self._client.do_put(descriptor, schema, options)
            self._write_batches(writer, schema, keys, values, start is not None, dtype)
            writer.close()
        except flight.FlightError as exc:
            raise self._failed(exc, what, limit) from None

    def write_entries(self, op: str, table: str, keys: np.ndarray, offsets: np.ndarray, cols: np.ndarray,
                      vals: np.ndarray, dtype: str, header: Optional[Dict[str, Any]] = None) -> None:
        """``put`` / ``inc`` the rows at sorted unique ``keys`` given as their entries (CSR: row i
        holds ``cols[offsets[i]:offsets[i + 1]]`` with ``vals`` of that range), in batches cut
        by the entries they carry."""
        head = dict(header or {}, op=op, table=table, token=self._token, sparse=True)
        descriptor = flight.FlightDescriptor.for_command(protocol.encode_header(head))
        schema = protocol.sparse_schema(dtype, with_keys=True)
        vals = np.asarray(vals, dtype=protocol.DTYPES[dtype][0])
        what = f"{op} into table {table!r}"
        options, limit = self._call(what, _seconds(vals.nbytes + 4 * len(cols) + 16 * len(keys)))
        try:
            writer, _ = self._client.do_put(descriptor, schema, options)
            for batch in protocol.entry_batches(offsets, cols, vals, schema, self.chunk_bytes,
                                                keys=np.asarray(keys, dtype=np.int64)):
                if batch.num_rows:
                    writer.write_batch(batch)
            writer.close()
        except flight.FlightError as exc:
            raise self._failed(exc, what, limit) from None

    def get_entries(self, table: str, width: int, dtype: str, keys: Optional[np.ndarray] = None,
                    start: int = 0, stop: int = 0) -> RowEntries:
        """Rows as their non-zero entries (CSR) with their keys: the rows at ``keys`` (in that
        order, empty ones included), or the rows in ``[start, stop)`` that hold a non-zero
        value (the shard filters, and only their entries travel)."""
        header: Dict[str, Any] = {"table": table, "chunk": self.chunk_bytes, "token": self._token, "sparse": True}
        if keys is None:
            header.update(start=int(start), stop=int(stop), nonzero=True)
            ticket = protocol.encode_header(header)
        else:
            keys = np.ascontiguousarray(keys, dtype="<i8")
            ticket = protocol.encode_header(header, keys.tobytes())
        got_keys, parts = [np.zeros(0, np.int64)], []
        what = f"get from table {table!r}"
        options, limit = self._call(what, _seconds(BLOB_READ_BOUND_BYTES))  # entries: no size known in advance
        try:
            for chunk in self._client.do_get(flight.Ticket(ticket), options):
                batch = chunk.data
                if not batch.num_rows:
                    continue
                if keys is None:  # a nonzero read carries its keys first
                    got_keys.append(protocol.numpy_of(batch.column(0)).astype(np.int64, copy=False))
                    batch = batch.select([1, 2])
                parts.append(protocol.sparse_entries(batch.column(0), batch.column(1), dtype, 1 << 30))
        except flight.FlightError as exc:
            raise self._failed(exc, what, limit) from None
        offsets, cols, vals = protocol.concat_entries(parts, protocol.DTYPES[dtype][0])
        if keys is None:
            return RowEntries(offsets, cols, vals, width, np.concatenate(got_keys))
        if len(offsets) - 1 != len(keys):
            raise ShardUnavailableError(f"get from table {table!r} on {self.uri}: {len(offsets) - 1} rows, "
                                        f"expected {len(keys)}")
        return RowEntries(offsets, cols, vals, width, keys)

    def _write_batches(self, writer, schema, keys, values: np.ndarray, contiguous: bool, dtype: str) -> None:
        """``values`` (with their ``keys`` unless ``contiguous``) as record batches of at most
        ``chunk_bytes``."""
        chunk = protocol.rows_per_chunk(values.shape[1], dtype, self.chunk_bytes)
        keys = np.empty(len(values), dtype=np.int64) if contiguous else keys  # (only its length is used)
        for k, v in protocol.iter_chunks(keys, values, chunk):
            columns = [protocol.rows_to_array(v)] if contiguous else [protocol.numbers(k, pa.int64()), protocol.rows_to_array(v)]
            writer.write_batch(pa.record_batch(columns, schema=schema))

    @property
    def streaming(self) -> bool:
        """Whether :meth:`stream_rounds` is on."""
        return self._streams is not None

    def stream_rounds(self, on: bool) -> None:
        """From ``on``, :meth:`exchange_round` keeps one ``DoExchange`` stream per contribution
        schema open to this shard and sends each round on it (no call set-up per round); off,
        it closes them, which ends their handlers on the shard.  A worker turns it on while it
        is in a fit and off when it leaves: a stream must not outlive its task's part in the
        fit, since an open stream holds a shard's shutdown up."""
        with self._streams_lock:
            streams, self._streams = self._streams, ({} if on else None)
        for stream in (streams or {}).values():
            stream.close()

    def exchange_round(self, tick: Dict[str, Any], table: Optional[str] = None, keys=None,
                       values: Optional[np.ndarray] = None, read_back: Optional[Tuple[int, str]] = None,
                       columns: Optional[Sequence[int]] = None,
                       writes: Sequence[Tuple[str, str, Any, np.ndarray]] = ()) -> Optional[np.ndarray]:
        """A worker's round in one request (Flight ``DoExchange``; the shard side is
        ``ShardServer.do_exchange``): ``contribute`` ``values`` (partial sums) at the sorted unique
        ``keys`` (or the ``range`` of rows) of ``table``, then ``tick`` (``tick``: the action's
        fields), then -- ``read_back=(width, dtype)`` -- the rows of those keys once the clock let
        the tick through (the round's ``pull`` applied when ``wait_for`` is the round), or only
        their ``columns`` (in that order).  Without a table it is a plain tick.  On a rounds
        stream while :meth:`stream_rounds` is on.
        ``writes``: small writes ``(table, op, keys or range, rows)`` the worker held back
        (:class:`RidingWrites`), applied before the contribution and the tick."""
        start = None
        if isinstance(keys, range):
            start, keys = keys.start, None
        head = dict(tick, op="round", token=self._token, chunk=self.chunk_bytes)
        payload = b""
        if writes:
            head["writes"], payload = protocol.riding_payload(writes)
        width = values.shape[1] if values is not None else 0
        if table is not None:
            start = _run_start(keys, start)
            head["contribute"] = {"table": table, **({"start": int(start)} if start is not None else {})}
            if read_back is not None:
                head["read_back"] = [int(c) for c in columns] if columns is not None else True
                if columns is not None:
                    read_back = (len(head["read_back"]), read_back[1])
        n = len(values) if values is not None else 0
        schema = protocol.value_schema("float64", max(width, 1), with_keys=start is None)
        what = "action 'tick'" if table is None else f"round of table {table!r}"
        if self._streams is not None:
            return self._round_on_stream(head, payload, schema, (max(width, 1), start is None), table, keys, values,
                                         start, read_back if table is not None else None, n, what)
        descriptor = flight.FlightDescriptor.for_command(protocol.encode_header(head, payload))
        writer = None
        wait = float(tick.get("timeout", 0.0) or 0.0)
        options, limit = self._call(what, wait + _seconds((values.nbytes if values is not None else 0) * 2))
        try:
            writer, reader = self._client.do_exchange(descriptor, options)
            writer.begin(schema)
            if table is not None:
                self._write_batches(writer, schema, keys, values, start is not None, "float64")
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
                    raise ShardUnavailableError(f"round exchange with {self.uri}: {pos} rows back, expected {n}")
            writer.close()
        except flight.FlightError as exc:
            if writer is not None:  # (an unclosed writer logs its error again when collected)
                _close_quietly(writer.close)
            raise self._failed(exc, what, limit) from None
        return out

    def _round_on_stream(self, head, payload, schema, kind, table, keys, values, start, read_back, n, what):
        """:meth:`exchange_round` on this client's rounds stream of ``kind`` (opened on first
        use; the wire format is ``ShardServer._round_stream``'s).  A stream that failed is
        dropped (the shard ended it), so the next round opens a new one."""
        out = None
        if read_back is not None:
            rb_width, rb_dtype = read_back
            out = np.empty((n, rb_width), dtype=protocol.DTYPES[rb_dtype][0])

        def send(stream):
            if table is not None:
                self._write_batches(stream.writer, schema, keys, values, start is not None, "float64")
            stream.writer.write_metadata(pa.py_buffer(protocol.encode_header(head, payload)))

        received = self._on_stream(kind, schema, float(head.get("timeout", 0.0) or 0.0), what, send,
                                   lambda stream: stream.answer(out))
        if out is not None and received != out.nbytes:
            raise ShardUnavailableError(f"round exchange with {self.uri}: {received} bytes back, expected {out.nbytes}")
        return out

    def _on_stream(self, kind, schema, wait: float, what: str, send, receive):
        """``receive(stream)`` once ``send(stream)`` went out on this client's rounds stream of
        ``kind`` (opened on first use, with ``schema``).  A stream's deadline covers two waits of
        ``wait``; one past half its life, or with too little left for this wait, makes way for a
        new one.  A stream that failed is dropped (the shard ended it)."""
        with self._streams_lock:  # taken while in use: a concurrent round opens a stream of its own
            stream = self._streams.pop(kind, None) if self._streams is not None else None
        now = time.monotonic()
        if stream is not None and (now - stream.opened > stream.life / 2
                                   or stream.opened + stream.life - now < wait + 2 * self.rpc_timeout):
            stream.close()
            stream = None
        limit = None
        try:
            if stream is None:
                options, limit = self._call(what, 2 * (wait + self.rpc_timeout) + 60.0 - self.rpc_timeout)
                stream = _RoundStream(self._client, options, self._token, schema)
            limit = stream.life
            send(stream)
            result = receive(stream)
        except flight.FlightError as exc:
            if stream is not None:
                stream.close()
            raise self._failed(exc, what, limit) from None
        except BaseException:
            if stream is not None:
                stream.close()
            raise
        with self._streams_lock:
            if self._streams is not None and kind not in self._streams:
                self._streams[kind], stream = stream, None
        if stream is not None:
            stream.close()
        return result

    def poll(self, action_type: "Action | str", **body: Any) -> Dict[str, Any]:
        """:meth:`action` for the actions a shard serves on a rounds stream too
        (:data:`protocol.STREAM_ACTIONS`: a worker's ``next``): on the stream while
        :meth:`stream_rounds` is on (no call set-up), else a call."""
        action_type = Action.of(action_type)
        if self._streams is None or action_type.value not in protocol.STREAM_ACTIONS:
            return self.action(action_type, **body)
        head = dict(body, op="action", action=action_type.value, token=self._token)
        wait = float(body.get("timeout", 0.0) or 0.0)
        answer = self._on_stream((1, True), protocol.value_schema("float64", 1, with_keys=True), wait,
                                 f"action {action_type.value!r}",
                                 lambda stream: stream.writer.write_metadata(pa.py_buffer(protocol.encode_header(head))),
                                 lambda stream: stream.answer_bytes())
        return json.loads(answer) if answer else {}

    def put_blob(self, key: str, blob, header: Optional[Dict[str, Any]] = None) -> None:
        """Store a byte string under ``key`` (a bytes-like, or a list of them stored one after
        the other without joining them; in chunks; ``header``: a step fence and
        ``drop_prefix`` / ``keep_after`` to drop the older blobs of a series)."""
        head = dict(header or {}, op="blob", key=key, token=self._token)
        descriptor = flight.FlightDescriptor.for_command(protocol.encode_header(head))
        views = [memoryview(p).cast("B") for p in (blob if isinstance(blob, (list, tuple)) else [blob])]
        chunks = [v[i:i + protocol.BLOB_CHUNK] for v in views for i in range(0, len(v), protocol.BLOB_CHUNK)]
        total = sum(len(v) for v in views)
        what = f"store {key!r}"
        options, limit = self._call(what, _seconds(total))
        try:
            writer, _ = self._client.do_put(descriptor, protocol.BLOB_SCHEMA, options)
            for i in range(0, len(chunks), 4):
                writer.write_batch(pa.record_batch([protocol.binary_array(chunks[i:i + 4])],
                                                   schema=protocol.BLOB_SCHEMA))
            writer.close()
        except flight.FlightError as exc:
            raise self._failed(exc, what, limit) from None

    def get_blob(self, key: str) -> Optional[bytes]:
        """The byte string stored under ``key``, or None."""
        ticket = protocol.encode_header({"blob": key, "token": self._token})
        what = f"read {key!r}"
        options, limit = self._call(what, _seconds(BLOB_READ_BOUND_BYTES))  # its size is not known in advance
        try:
            parts = [protocol.binary_parts(chunk.data)
                     for chunk in self._client.do_get(flight.Ticket(ticket), options)]
        except flight.FlightError as exc:
            raise self._failed(exc, what, limit) from None
        return b"".join(parts) if parts else None  # one copy of the received buffers

    def close(self) -> None:
        self._client.close()


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """Where one shard listens and which executor it belongs to."""

    host: str
    port: int
    pid: int
    executor: str
    shard_id: str
    python: str = ""
    tls: bool = False

    @property
    def uri(self) -> str:
        return f"{'grpc+tls' if self.tls else 'grpc'}://{self.host}:{self.port}"


def _close_quietly(end) -> None:
    """Call ``end`` (a stream's ``done_writing`` / ``close``), ignoring the error of a stream
    that already failed (it was raised where it happened)."""
    try:
        end()
    except (flight.FlightError, pa.ArrowException, OSError):
        pass


class _RoundStream:
    """One open ``DoExchange`` carrying a worker's rounds to one shard (``op: "rounds"``; the
    shard side is ``ShardServer._round_stream``), its contributions in ``schema``."""

    def __init__(self, client: flight.FlightClient, options: flight.FlightCallOptions, token: str,
                 schema: pa.Schema):
        self.opened = time.monotonic()
        self.life = options.timeout
        head = protocol.encode_header({"op": "rounds", "token": token})
        self.writer, self.reader = client.do_exchange(flight.FlightDescriptor.for_command(head), options)
        self.writer.begin(schema)

    def answer(self, out: Optional[np.ndarray]) -> int:
        """Read a round's answer into ``out`` (the read-back rows, or None); returns its bytes."""
        target = out.reshape(-1).view(np.uint8) if out is not None else None
        got = 0
        while True:
            try:
                chunk = self.reader.read_chunk()
            except StopIteration:
                raise ShardUnavailableError("the shard ended a rounds stream mid-round") from None
            message = memoryview(chunk.app_metadata if chunk.app_metadata is not None else b"")
            if not len(message):
                raise ShardUnavailableError("a rounds stream answered without its metadata")
            body = message[1:]
            if len(body):
                if target is None or got + len(body) > len(target):
                    raise ShardUnavailableError("a rounds stream answered more bytes than the round's rows")
                target[got:got + len(body)] = np.frombuffer(body, dtype=np.uint8)
                got += len(body)
            if message[0] == 1:
                return got

    def answer_bytes(self) -> bytes:
        """Read an action's answer (its JSON)."""
        parts = []
        while True:
            try:
                chunk = self.reader.read_chunk()
            except StopIteration:
                raise ShardUnavailableError("the shard ended a rounds stream mid-answer") from None
            message = chunk.app_metadata.to_pybytes() if chunk.app_metadata is not None else b""
            if not message:
                raise ShardUnavailableError("a rounds stream answered without its metadata")
            parts.append(message[1:])
            if message[0] == 1:
                return b"".join(parts)

    def close(self) -> None:
        """End the stream (its shard-side handler returns); a failed stream is just let go."""
        _close_quietly(self.writer.done_writing)
        _close_quietly(self.writer.close)  # even when done_writing failed


class ShardGroup:
    """The shards of one run: addresses plus the run token (and, for TLS shards, the run's
    client certificate and key: ``client_cert``). Small and picklable.

    ``admin_token`` (the driver's credential for program payloads) stays in the process that
    made the group: it is dropped when the group is pickled into tasks."""

    def __init__(self, shards: Sequence[ShardInfo], token: str, chunk_bytes: int = protocol.CHUNK_BYTES,
                 max_keys: int = 262144, tls_root_certs: Optional[bytes] = None,
                 admin_token: Optional[str] = None, rpc_timeout: float = RPC_TIMEOUT_SECONDS,
                 client_cert: Optional[Tuple[bytes, bytes]] = None):
        self.shards = tuple(shards)
        self.rpc_timeout = float(rpc_timeout)  # a control call's deadline (ShardClient)
        self.token = token
        self.chunk_bytes = chunk_bytes
        self.max_keys = max_keys
        self.tls_root_certs = tls_root_certs  # PEM the clients trust for grpc+tls shards
        self.admin_token = admin_token
        self.client_cert = client_cert

    def __getstate__(self):
        state = dict(self.__dict__)
        state["admin_token"] = None  # never shipped: tasks cannot install programs
        return state

    def __len__(self) -> int:
        return len(self.shards)

    def client(self, index: int) -> ShardClient:
        return ShardClient.cached(self.shards[index].uri, self.token, self.chunk_bytes,
                                  getattr(self, "tls_root_certs", None), getattr(self, "admin_token", None),
                                  getattr(self, "rpc_timeout", RPC_TIMEOUT_SECONDS), getattr(self, "client_cert", None))

    def stream_rounds(self, on: bool) -> None:
        """:meth:`ShardClient.stream_rounds` on every shard's client in this process."""
        for i in range(len(self.shards)):
            self.client(i).stream_rounds(on)

    def broadcast(self, action_type: "Action | str", **body: Any) -> List[Dict[str, Any]]:
        """Send one action to every shard at once; return their answers in shard order."""
        return fan_out([lambda i=i: self.client(i).action(action_type, **body) for i in range(len(self.shards))])

    def heartbeat(self, deadline: float) -> List[int]:
        """Renew every shard's lease at once, each call with its own ``deadline``: a shard that
        does not answer delays no other.  A shard that has answered no beat for a whole control
        deadline (``rpc_timeout``) is taken for lost, so the fit's next call to it fails at once.
        Returns the shards that did not answer."""
        def beat(i):
            client = self.client(i)
            try:
                client.action(Action.HEARTBEAT, deadline=deadline)
                client.silent_since = None
                return None
            except PystradsError:  # unreachable, or it missed the beat's deadline
                now = time.monotonic()
                client.silent_since = client.silent_since or now
                if client.lost is None and now - client.silent_since >= client.rpc_timeout:
                    client.lost = f"it answered no heartbeat for {now - client.silent_since:.0f} s"
                return i

        return [i for i in fan_out([lambda i=i: beat(i) for i in range(len(self.shards))]) if i is not None]

    def unreachable(self, attempts: int = PING_ATTEMPTS, backoff: float = PING_BACKOFF_SECONDS) -> List[int]:
        """The shards that answer no ping, all asked at once.  A refused or reset connection (a
        network that flapped, a shard slow to accept) is asked again, up to ``attempts`` times,
        ``backoff`` seconds apart and four times longer each time; a shard that missed a whole
        deadline, or is already taken for lost, has had its time and is not asked again."""
        def probe(i):
            client = self.client(i)
            wait = backoff
            for attempt in range(attempts):
                try:
                    client.action(Action.PING)
                    return None
                except ShardUnavailableError:
                    if client.lost is not None or attempt == attempts - 1:
                        return i
                    time.sleep(wait)
                    wait *= 4
            return i

        return [i for i in fan_out([lambda i=i: probe(i) for i in range(len(self.shards))]) if i is not None]

    def table(self, layout: TableLayout) -> "TableHandle":
        return TableHandle(self, layout)

    def exchange_round(self, heads: Dict[int, Dict[str, Any]], contributions: Sequence[Tuple[Any, ...]],
                       writes: Optional[Dict[int, list]] = None) -> List[Tuple[str, np.ndarray, np.ndarray]]:
        """A worker's round on the shards of ``heads`` (shard -> its tick's fields), all at once:
        ``contributions`` are ``(handle, where, partials, read_back, columns)`` as
        :meth:`TableHandle.contribute` takes them, each cut by shard; a shard receiving any gets
        them with its tick in one :meth:`ShardClient.exchange_round` (a second table's part is
        sent first), and so do the small writes held back for it (``writes``: shard -> ``(table,
        op, keys, rows)``, :meth:`RidingWrites.take`).  Returns the rows read back (``read_back``:
        the round's ``pull`` applied; ``columns``: only those) as ``(table short name, keys,
        rows)`` pieces."""
        parts: Dict[int, list] = {i: [] for i in heads}
        for handle, where, partials, read_back, columns in contributions:
            for shard, keys, rows in handle._contribution_parts(where, partials):
                parts[shard].append((handle, keys, rows, read_back, columns))
        writes = writes or {}
        if set(writes) - set(heads):
            raise ValueError(f"writes held back for shards {sorted(set(writes) - set(heads))} that get no tick")

        def call(i):
            head, client = heads[i], self.client(i)
            mine = sorted(parts[i], key=lambda p: not p[3])  # a read-back part rides the exchange
            if not mine:
                if writes.get(i) or client.streaming:  # a plain tick rides the stream too
                    client.exchange_round(head, writes=writes.get(i, ()))
                else:
                    client.action(Action.TICK, **head)
                return []
            for handle, keys, rows, _, _ in mine[1:]:
                handle._send(i, "contribute", keys, rows, "float64", dict(handle._fence or {}, round=head["round"]))
            handle, keys, rows, read_back, columns = mine[0]
            pulled = client.exchange_round(head, handle.name, keys, rows,
                                           (handle.layout.width, handle.layout.dtype) if read_back else None,
                                           columns=columns, writes=writes.get(i, ()))
            back = [(handle.layout.short_name, np.asarray(keys), pulled)] if read_back else []
            for h, k, _, rb, cols in mine[1:]:
                if rb:
                    k = np.asarray(k, dtype=np.int64)
                    got = client.get_rows(h.name, h.layout.width, h.layout.dtype, keys=k)
                    back.append((h.layout.short_name, k,
                                 got if cols is None else np.ascontiguousarray(got[:, list(cols)])))
            return back

        return [piece for back in fan_out([lambda i=i: call(i) for i in heads]) for piece in back]

    def __repr__(self) -> str:
        return f"ShardGroup({[s.uri for s in self.shards]})"


#: Largest block ``read(range, copy=False)`` asks for as one message (one zero-copy
#: view); larger reads stream in ``rpc.chunkBytes`` batches into a new array
#: (measured: single messages of 64 MiB are slower than chunked streams).
VIEW_MAX_BYTES = 16 << 20


def _as_keys(keys) -> np.ndarray:
    keys = np.asarray(keys)
    if keys.ndim != 1:
        raise ValueError(f"keys must be one-dimensional, got shape {keys.shape}")
    if keys.dtype.kind not in "iu":
        raise TypeError(f"keys must be integers, got dtype {keys.dtype}")
    return keys.astype(np.int64, copy=False)


class RidingWrites:
    """The small dense writes (``write`` / ``add``) a worker's ``push`` makes, held back to
    travel with the round's clock tick to their shards (:meth:`ShardGroup.exchange_round`)
    instead of costing a call each.  Held only while :meth:`hold` is on, only on the thread
    that turned it on, and up to ``limit`` bytes a round; any other write, and any read
    through the step's handles, sends what is held first (in order), so that a worker reads
    its own writes and the shards apply them in the order made."""

    def __init__(self, limit: int = protocol.RIDING_BYTES):
        self.limit = int(limit)
        self._lock = threading.RLock()
        self._held: List[Tuple["TableHandle", int, str, Any, np.ndarray]] = []
        self._bytes = 0
        self._owner: Optional[int] = None  # the thread whose writes are held (None: none are)

    def hold(self, on: bool) -> None:
        """From ``on``, hold the calling thread's small writes; off, hold no more (what is held
        stays until :meth:`take` or :meth:`flush`)."""
        with self._lock:
            self._owner = threading.get_ident() if on else None

    def keep(self, handle: "TableHandle", op: str, parts: List[Tuple[int, Any, np.ndarray]]) -> bool:
        """Hold a write's ``(shard, keys, rows)`` parts (copies: the caller may reuse its arrays);
        False when it must go at once -- after :meth:`flush`, done here."""
        size = sum(v.nbytes + (0 if isinstance(k, range) else 8 * len(k)) for _, k, v in parts)
        with self._lock:
            if self._owner == threading.get_ident() and self._bytes + size <= self.limit:
                for shard, keys, rows in parts:
                    self._held.append((handle, shard, op, keys if isinstance(keys, range) else np.array(keys),
                                       np.array(rows)))
                self._bytes += size
                return True
            self.flush()
            return False

    def take(self) -> Dict[int, List[Tuple[str, str, Any, np.ndarray]]]:
        """What is held, by shard, as ``(table, op, keys, rows)`` (for the round's tick); none after."""
        with self._lock:
            held, self._held, self._bytes = self._held, [], 0
        out: Dict[int, List[Tuple[str, str, Any, np.ndarray]]] = {}
        for handle, shard, op, keys, rows in held:
            out.setdefault(shard, []).append((handle.name, op, keys, rows))
        return out

    def flush(self) -> None:
        """Send what is held now, a call per write and shard, in the order made."""
        with self._lock:
            held, self._held, self._bytes = self._held, [], 0
            for handle, shard, op, keys, rows in held:
                handle._send(shard, op, keys, rows, handle.layout.dtype, dict(handle._fence or {}))

    def discard(self) -> None:
        """Drop what is held (the step failed: its writes are rolled back anyway)."""
        with self._lock:
            self._held, self._bytes, self._owner = [], 0, None


class TableHandle:
    """A model table spread over shards. Picklable; travels in closures.

    ``where`` names rows the same way for every call: an integer key array, a ``range`` of rows
    (step 1), or ``None`` for the whole table.  Data is dense or sparse by its type: a
    ``(rows, width)`` array, or :class:`~pystrads.ps.table.RowEntries` (the rows' non-zero
    entries).  Six calls: :meth:`read` and :meth:`read_entries`; :meth:`write` (overwrite),
    :meth:`add` and :meth:`contribute` (a round's partial sums); :meth:`fenced` (the worker's
    handle).  Each costs one request per shard touched (more only when a request exceeds the
    chunking limits).
    """

    def __init__(self, group: ShardGroup, layout: TableLayout, fence: Optional[Dict[str, int]] = None,
                 riding: Optional[RidingWrites] = None):
        self.group = group
        self.layout = layout
        self._fence = fence
        self._riding = riding  # a worker's step: small writes may wait for the round's tick

    def __getstate__(self):
        return {**self.__dict__, "_riding": None}  # a held write never travels to another process

    @property
    def name(self) -> str:
        return self.layout.name

    @property
    def shape(self) -> Tuple[int, int]:
        return (self.layout.num_rows, self.layout.width)

    def fenced(self, riding: Optional[RidingWrites] = None, **fence: int) -> "TableHandle":
        """This handle with every write tagged with the step attempt (worker side); ``riding``:
        where its small writes wait for the round's tick while that holds them."""
        return TableHandle(self.group, self.layout, dict(self._fence or {}, **fence), riding)

    def _reading(self) -> None:
        if self._riding is not None:
            self._riding.flush()  # a worker reads its own writes

    # -- reads
    def read(self, where=None, out: Optional[np.ndarray] = None, copy: bool = True) -> np.ndarray:
        """The rows at ``where`` as a dense ``(n, width)`` array, in the order asked (keys may
        repeat).

        ``out``: an existing C-contiguous array of that shape and the table's dtype to fill
        (reusing one buffer across rounds avoids fresh-memory page faults).  ``copy=False``
        with a range: a **read-only** array that may be a view of the received Arrow buffer --
        no copy and no fresh memory when the range lies on one shard and is at most
        :data:`VIEW_MAX_BYTES` (else a new array as usual)."""
        self._reading()
        where = self._where(where)
        dtype = protocol.DTYPES[self.layout.dtype][0]
        n = len(where)
        shape = (n, self.layout.width)
        if out is not None and (out.shape != shape or out.dtype != dtype):
            raise ValueError(f"table {self.layout.short_name!r}: out has shape {out.shape} and dtype {out.dtype}; "
                             f"need {shape} {self.layout.dtype}")
        if isinstance(where, range):
            start, stop = where.start, where.stop
            if not copy and out is None:
                parts = list(self._range_parts(start, stop))
                if len(parts) == 1 and n * self.layout.width * np.dtype(dtype).itemsize <= VIEW_MAX_BYTES:
                    return self.group.client(parts[0][0]).get_rows(
                        self.layout.name, self.layout.width, self.layout.dtype, start=start, stop=stop, view=True)
            out = np.empty(shape, dtype=dtype) if out is None else out
            for shard, lo, hi in self._range_parts(start, stop):
                self.group.client(shard).get_rows(self.layout.name, self.layout.width, self.layout.dtype,
                                                  start=lo, stop=hi, out=out[lo - start:hi - start])
            return out
        keys = where
        out = np.empty(shape, dtype=dtype) if out is None else out
        if n == 0:
            return out
        ordered = bool(np.all(keys[1:] >= keys[:-1]))
        order = None if ordered else np.argsort(keys, kind="stable")
        sorted_keys = keys if ordered else keys[order]
        buf = out if ordered else np.empty_like(out)
        step = self.group.max_keys
        for part, lo, hi in self._segments(sorted_keys):
            client = self.group.client(self.layout.shards[part])
            for a in range(lo, hi, step):
                b = min(hi, a + step)
                seg = sorted_keys[a:b]
                if len(seg) > 1 and seg[-1] - seg[0] + 1 == len(seg) and np.all(np.diff(seg) == 1):
                    client.get_rows(self.layout.name, self.layout.width, self.layout.dtype,
                                    start=int(seg[0]), stop=int(seg[-1]) + 1, out=buf[a:b])
                else:
                    client.get_rows(self.layout.name, self.layout.width, self.layout.dtype, keys=seg, out=buf[a:b])
        if not ordered:
            out[order] = buf
        return out

    def read_entries(self, where=None) -> RowEntries:
        """The rows at ``where`` as their non-zero entries (columns ascending within a row), with
        their ``keys``: for a key array (strictly increasing) every key's row, empty or not; for
        a range (or the whole table) only the rows holding a non-zero value -- each shard
        filters, so a mostly-zero range costs the caller (and the network) its non-zero
        entries only."""
        self._reading()
        where = self._where(where)
        vals_dtype = protocol.DTYPES[self.layout.dtype][0]
        if isinstance(where, range):
            parts = [self.group.client(shard).get_entries(self.layout.name, self.layout.width, self.layout.dtype,
                                                          start=lo, stop=hi)
                     for shard, lo, hi in self._range_parts(where.start, where.stop)]
        else:
            keys = where
            if len(keys) > 1 and not bool(np.all(keys[1:] > keys[:-1])):
                raise ValueError(f"table {self.layout.short_name!r}: read_entries takes strictly increasing keys")
            parts, step = [], self.group.max_keys
            for part, lo, hi in self._segments(keys):
                client = self.group.client(self.layout.shards[part])
                for a in range(lo, hi, step):
                    parts.append(client.get_entries(self.layout.name, self.layout.width, self.layout.dtype,
                                                    keys=keys[a:min(hi, a + step)]))
        if len(parts) == 1:
            return parts[0]
        return RowEntries(*protocol.concat_entries([p.csr for p in parts], vals_dtype), self.layout.width,
                          np.concatenate([np.zeros(0, np.int64)] + [p.keys for p in parts]))

    # -- writes
    def write(self, where, values) -> None:
        """Overwrite the rows at ``where`` (distinct keys, or a range) with ``values``: a
        ``(n, width)`` array, or :class:`RowEntries` (the rows become exactly those entries;
        only the entries travel)."""
        self._write("put", where, values)

    def add(self, where, deltas) -> None:
        """Add ``deltas`` to the rows at ``where`` (keys -- repeated keys add up -- or a range):
        a ``(n, width)`` array, or :class:`RowEntries` (only the entries travel)."""
        self._write("inc", where, deltas)

    def contribute(self, where, partials, round_index: int) -> None:
        """Send partial sums (a ``(n, contrib_width)`` array) for the rows at ``where`` (keys,
        or a range: e.g. partial sums over a whole table) in round ``round_index``; when every
        worker has finished the round, the shard sums the contributions and the program's
        ``pull`` turns them into the new rows."""
        header = dict(self._fence or {}, round=int(round_index))
        for shard, k, v in self._contribution_parts(where, partials):
            self._send(shard, "contribute", k, v, "float64", header)

    # -- helpers
    def _where(self, where):
        """``where`` as a ``range`` within the table or an int64 key array within it."""
        if where is None:
            return range(0, self.layout.num_rows)
        if isinstance(where, range):
            if where.step != 1:
                raise ValueError(f"table {self.layout.short_name!r}: a range of rows needs step 1, got {where}")
            if not 0 <= where.start <= where.stop <= self.layout.num_rows:
                raise IndexError(f"table {self.layout.short_name!r}: range [{where.start}, {where.stop}) outside "
                                 f"[0, {self.layout.num_rows})")
            return where
        keys = _as_keys(where)
        if len(keys) and (keys.min() < 0 or keys.max() >= self.layout.num_rows):
            bad = keys[(keys < 0) | (keys >= self.layout.num_rows)][:5].tolist()
            raise IndexError(f"table {self.layout.short_name!r}: keys {bad} outside [0, {self.layout.num_rows})")
        return keys

    def _segments(self, sorted_keys: np.ndarray):
        """(range index, lo, hi) slices of sorted keys falling in each row range."""
        cuts = np.searchsorted(sorted_keys, self.layout.bounds)
        for part in range(len(self.layout.bounds) - 1):
            lo, hi = int(cuts[part]), int(cuts[part + 1])
            if hi > lo:
                yield part, lo, hi

    def _range_parts(self, start: int, stop: int):
        """(shard index, lo, hi) of the non-empty pieces of rows ``[start, stop)``."""
        bounds = self.layout.bounds
        for part in range(len(bounds) - 1):
            lo, hi = max(start, bounds[part]), min(stop, bounds[part + 1])
            if hi > lo:
                yield self.layout.shards[part], lo, hi

    def _values(self, values, n: int, width: int, dtype: str) -> np.ndarray:
        values = np.asarray(values, dtype=protocol.DTYPES[dtype][0])
        if values.ndim == 1 and width == 1:
            values = values.reshape(-1, 1)
        if values.shape != (n, width):
            raise ValueError(f"table {self.layout.short_name!r}: values of shape {values.shape}, "
                             f"expected {(n, width)}")
        return values

    def _parts(self, op: str, where, values, width: int, dtype: str) -> List[Tuple[int, Any, np.ndarray]]:
        """``[(shard, keys, values)]``: a write of ``values`` at ``where`` cut by shard, in key
        order.  Keys in any order (duplicates add up, except for ``put``); a range stays a
        range in each part."""
        where = self._where(where)
        values = self._values(values, len(where), width, dtype)
        if isinstance(where, range):
            return [(shard, range(lo, hi), values[lo - where.start:hi - where.start])
                    for shard, lo, hi in self._range_parts(where.start, where.stop)]
        keys = where
        if len(keys) and not bool(np.all(keys[1:] > keys[:-1])):  # sort; merge duplicates
            order = np.argsort(keys, kind="stable")
            keys, values = keys[order], values[order]
            starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
            if len(starts) != len(keys):
                if op == "put":
                    raise ValueError(f"write into {self.layout.short_name!r}: duplicate keys")
                values = np.add.reduceat(values, starts, axis=0)
                keys = keys[starts]
        return [(self.layout.shards[part], keys[lo:hi], values[lo:hi]) for part, lo, hi in self._segments(keys)]

    def _contribution_parts(self, where, partials) -> List[Tuple[int, Any, np.ndarray]]:
        """``[(shard, keys, partials)]``: what :meth:`contribute` sends to each shard (keys
        sorted, duplicates summed; a range stays a range), in key order."""
        return self._parts("contribute", where, partials, self.layout.contrib_width, "float64")

    def _send(self, shard: int, op: str, keys, values: np.ndarray, dtype: str, header: Dict[str, Any]) -> None:
        client = self.group.client(shard)
        if isinstance(keys, range):
            client.write_rows(op, self.layout.name, None, values, dtype, header, start=keys.start)
        else:
            client.write_rows(op, self.layout.name, keys, values, dtype, header)

    def _write(self, op: str, where, values) -> None:
        header = dict(self._fence or {})
        if isinstance(values, RowEntries):
            if self._riding is not None:
                self._riding.flush()
            self._write_entries(op, where, values, header)
            return
        parts = self._parts(op, where, values, self.layout.width, self.layout.dtype)
        if self._riding is not None and self._riding.keep(self, op, parts):
            return
        for shard, k, v in parts:
            self._send(shard, op, k, v, self.layout.dtype, header)

    def _write_entries(self, op: str, where, entries: RowEntries, header: Dict[str, Any]) -> None:
        where = self._where(where)
        keys = np.arange(where.start, where.stop, dtype=np.int64) if isinstance(where, range) else where
        if len(keys) > 1 and not bool(np.all(keys[1:] > keys[:-1])):
            raise ValueError(f"table {self.layout.short_name!r}: entries are written at strictly increasing keys")
        offsets = np.asarray(entries.offsets, dtype=np.int64)
        if len(offsets) != len(keys) + 1:
            raise ValueError(f"table {self.layout.short_name!r}: {len(keys)} keys need entries of {len(keys)} rows "
                             f"({len(keys) + 1} offsets), got {len(offsets)} offsets")
        if entries.width != self.layout.width:
            raise ValueError(f"table {self.layout.short_name!r}: entries of width {entries.width}, "
                             f"the table's is {self.layout.width}")
        if entries.keys is not None and not np.array_equal(entries.keys, keys):
            raise ValueError(f"table {self.layout.short_name!r}: the entries carry keys other than where they "
                             f"are written ({np.asarray(entries.keys)[:5].tolist()}... against "
                             f"{keys[:5].tolist()}...); pass where=entries.keys")
        for part, lo, hi in self._segments(keys):
            a, b = int(offsets[lo]), int(offsets[hi])
            self.group.client(self.layout.shards[part]).write_entries(
                op, self.layout.name, keys[lo:hi], offsets[lo:hi + 1] - a, entries.cols[a:b], entries.vals[a:b],
                self.layout.dtype, header)

    def __repr__(self) -> str:
        return f"TableHandle({self.layout.short_name!r}, shape={self.shape}, dtype={self.layout.dtype})"
