"""What one shard holds, which every part of it reads: :class:`ShardState`.

The state has the shard's tables (by name, ``<fit namespace>/<table>``), the fits' programs
(whose ``pull`` runs here), the blobs (opaque byte strings by key: the workers' state
snapshots), the request counters, and the one condition variable under which the parts of
the shard (:mod:`~pystrads.ps.steps`, :mod:`~pystrads.ps.mailbox`,
:mod:`~pystrads.ps.snapshots` and the server's reads and writes) change them together.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List

import pyarrow.flight as flight

from .protocol import Blob
from .table import ShardTable

#: the counters a shard's ``stats`` report
COUNTERS = ("requests", "bytes_in", "bytes_out", "rows_in", "rows_out", "round_streams", "open_round_streams")


def in_fit(name: str, fit: str) -> bool:
    """Whether a namespace (or a table's name, a blob's key) belongs to the fit ``fit``."""
    return name == fit or name.startswith(fit + "/")


class ShardState:
    """A shard's tables, programs and blobs, its counters, and the condition ``cond`` (a
    re-entrant lock) that every change of them and of the parts' own state happens under."""

    def __init__(self, shard_id: str = ""):
        self.shard_id = shard_id
        self.cond = threading.Condition()
        self.tables: Dict[str, ShardTable] = {}
        self.programs: Dict[str, Any] = {}  # per fit namespace: its program object
        self.blobs: Dict[str, Blob] = {}
        self.peak_blob_bytes = 0  # the most the blobs held at once
        self._counters = {key: 0 for key in COUNTERS}
        self._timers: Dict[str, float] = {}  # seconds spent in handlers
        self._counter_lock = threading.Lock()

    def table(self, name: str) -> ShardTable:
        table = self.tables.get(name)
        if table is None:
            raise flight.FlightServerError(
                f"shard {self.shard_id}: no table {name!r} (tables: {sorted(self.tables)[:10]}); "
                "was it dropped, or did the shard restart?")
        return table

    def fit_tables(self, namespace: str) -> List[ShardTable]:
        """The tables of fit ``namespace`` (every table when it is empty)."""
        prefix = namespace + "/"
        return [t for n, t in self.tables.items() if not namespace or n.startswith(prefix)]

    def put_blob(self, key: str, blob: Blob) -> None:
        """With ``cond`` held: keep ``blob`` under ``key`` and wake whoever waits for it."""
        self.blobs[key] = blob
        self.peak_blob_bytes = max(self.peak_blob_bytes, sum(b.nbytes for b in self.blobs.values()))
        self.cond.notify_all()

    def drop_series(self, prefix: Any, keep_after: Any) -> None:
        """With ``cond`` held: drop the blobs ``<prefix><n>`` with ``n < keep_after`` (a worker's
        older state snapshots); a no-op unless ``prefix`` is a string and ``keep_after`` an int."""
        if isinstance(prefix, str) and isinstance(keep_after, int):
            for old in [k for k in self.blobs if k.startswith(prefix)]:
                tail = old[len(prefix):]
                if tail.isdigit() and int(tail) < keep_after:
                    del self.blobs[old]

    def count(self, **deltas: int) -> None:
        with self._counter_lock:
            for key, value in deltas.items():
                self._counters[key] += value

    def count_time(self, key: str, seconds: float) -> None:
        with self._counter_lock:
            self._timers[key] = self._timers.get(key, 0.0) + seconds

    def counters(self, with_timers: bool = False) -> Dict[str, Any]:
        """A copy of the counters (and of the handlers' seconds, under ``handler_seconds``)."""
        with self._counter_lock:
            out: Dict[str, Any] = dict(self._counters)
            if with_timers:
                out["handler_seconds"] = dict(self._timers)
        return out
