"""Requests to a shard: the run token's checks and the decoding of request headers and action bodies.

Every call carries the run's token in its header (ticket, put descriptor or
action body), checked in constant time before anything else
(:func:`decode_request`, :func:`decode_action`).  A request longer than
:data:`MAX_UNCHECKED_BYTES` must start with its token (clients write it first,
:func:`~pystrads.ps.protocol.token_first`): only that start is read before the
check, so a peer without the token cannot make a shard copy or parse a large
request; program payloads (pickles)
need the driver's admin token besides (:func:`authorize_payload`).  A decoded
header is a :class:`_Request`, whose typed getters turn a missing or mistyped
field into a clear error for the caller instead of a crash of the shard.
"""

from __future__ import annotations

import hmac
import json
import math
from typing import Any, Dict, Optional, Tuple

import pyarrow as pa
import pyarrow.flight as flight

from . import protocol


def _refuse() -> None:
    raise flight.FlightUnauthenticatedError(
        "pystrads shard: missing or wrong run token; only the fit that started this shard may call it")


def _refuse_payload() -> None:
    raise flight.FlightUnauthenticatedError(
        "pystrads shard: program payloads are accepted only from the driver that started this shard "
        "(its admin token is missing or wrong)")


#: bytes of a request (ticket, put descriptor, exchange metadata, action body) a shard copies
#: and parses before its token is checked; a longer one must begin ``{"token":"<token>"``
MAX_UNCHECKED_BYTES = 1 << 20


def check_size(raw, token: bytes) -> None:
    """Refuse a request over :data:`MAX_UNCHECKED_BYTES` that does not start with ``token``
    (``raw``: bytes or a :class:`pyarrow.Buffer`; only its start is read)."""
    size = raw.size if isinstance(raw, pa.Buffer) else len(raw)
    if size <= MAX_UNCHECKED_BYTES:
        return
    prefix = b'{"token":"' + token + b'"'
    head = raw.slice(0, len(prefix)).to_pybytes() if isinstance(raw, pa.Buffer) else bytes(raw[:len(prefix)])
    if not hmac.compare_digest(head, prefix):
        raise flight.FlightUnauthenticatedError(
            f"pystrads shard: a request of {size} bytes (over {MAX_UNCHECKED_BYTES}) that does not start with "
            "the run token; refused unread")


_MISSING = object()

_INT64 = 2 ** 63


class _Request(dict):
    """A decoded request header or action body whose fields are read with clear errors
    (a missing or mistyped field is the caller's mistake, never a crash of the shard)."""

    def __missing__(self, key):
        raise flight.FlightServerError(f"malformed request: field {key!r} is missing")

    def _get(self, key, default):
        if key in self:
            return self[key]
        if default is _MISSING:
            raise flight.FlightServerError(f"malformed request: field {key!r} is missing")
        return default

    def int(self, key: str, default: Any = _MISSING) -> Any:
        value = self._get(key, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, bool) or not isinstance(value, int) or not -_INT64 <= value < _INT64:
            raise flight.FlightServerError(
                f"malformed request: field {key!r} must be a 64-bit integer, got {str(value)[:40]!r}")
        return value

    def num(self, key: str, default: Any = _MISSING) -> float:
        value = self._get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise flight.FlightServerError(
                f"malformed request: field {key!r} must be a finite number, got {str(value)[:40]!r}")
        return float(value)

    def str(self, key: str, default: Any = _MISSING) -> str:
        value = self._get(key, default)
        if not isinstance(value, str):
            raise flight.FlightServerError(
                f"malformed request: field {key!r} must be a string, got {str(value)[:40]!r}")
        return value

    def dict(self, key: str, default: Any = _MISSING) -> Dict[str, Any]:
        value = self._get(key, default)
        if value is None and default is not _MISSING:  # an explicit null: the default
            return default
        if not isinstance(value, dict):
            raise flight.FlightServerError(
                f"malformed request: field {key!r} must be an object, got {str(value)[:40]!r}")
        return value


def authorize(header: Dict[str, Any], token: bytes) -> None:
    """Refuse a request that does not carry the run's ``token``."""
    given = header.get("token")
    if not isinstance(given, str) or not hmac.compare_digest(given.encode(), token):
        _refuse()


def authorize_payload(req: _Request, admin: Optional[bytes]) -> None:
    """Program payloads are unpickled here: only the driver may send them, never a task
    (tasks hold the run token, not the driver's admin token).  ``admin``: None, payloads
    come with the run token; empty, none are taken; else the token they need."""
    if admin is None:
        return
    given = req.get("admin")
    if not admin or not isinstance(given, str) or not hmac.compare_digest(given.encode(), admin):
        _refuse_payload()


def decode_request(raw, token: bytes) -> Tuple[_Request, bytes]:
    """The header of a ticket or put descriptor, once its token is checked, and the bytes after it."""
    check_size(raw, token)
    try:
        header, payload = protocol.decode_header(raw)
    except ValueError:
        _refuse()  # no readable header: no token
    authorize(header, token)
    return _Request(header), payload


def decode_action(body, token: bytes) -> _Request:
    """An action's JSON body (bytes or a :class:`pyarrow.Buffer`; empty: no fields), once its
    token is checked."""
    check_size(body, token)
    if not isinstance(body, bytes):
        body = body.to_pybytes()
    try:
        request = json.loads(body.decode()) if body else {}
    except (UnicodeDecodeError, json.JSONDecodeError):
        _refuse()
    if not isinstance(request, dict):
        _refuse()
    request = _Request(request)
    authorize(request, token)
    return request
