"""A shard's checkpoints: writing its rows of a fit's tables to storage, and reading them back.

:class:`TableSnapshots` is the part of :class:`~pystrads.ps.server.ShardServer`
that serves the actions ``snapshot`` (between steps: one
``<table>.<row_start>-<row_stop>.npy`` per table, and the workers'
state snapshots) and ``restore`` (from the files of any number of shards that
overlap this shard's rows), through :mod:`pystrads.ps.storage`.
"""

from __future__ import annotations

from typing import Dict

import numpy as np
import pyarrow.flight as flight


class TableSnapshots:
    """Checkpoint actions of :class:`~pystrads.ps.server.ShardServer` (a mixin: it uses
    the server's ``cond``, ``step``, ``tables``, ``blobs`` and ``shard_id``)."""

    def _action_snapshot(self, req):
        """Write this shard's rows of every table under ``prefix`` to ``dir`` (between steps):
        one ``<table>.<row_start>-<row_stop>.npy`` per table, named by the part after the prefix."""
        from . import storage

        prefix, target = req.str("prefix"), req.str("dir")
        written = {}
        with self.cond:
            if self.step.open:
                raise flight.FlightServerError(
                    f"shard {self.shard_id}: snapshot while step {self.step.step} is open; snapshots are taken "
                    "between steps")
            tables = [t for n, t in self.tables.items() if n.startswith(prefix)]
            for t in tables:
                short = t.name[len(prefix):]
                with t.lock:
                    written[short] = storage.save_array(
                        storage.join(target, f"{short}.{t.row_start}-{t.row_stop}.npy"), t.values)
            states = self._state_blobs(req)
        states_dir = req.str("states_dir", target)
        for worker, blob in states.items():  # the workers' state snapshots of that step
            storage.write_bytes(storage.join(states_dir, f"state-{worker:05d}.pkl"), blob)
            written[f"state-{worker:05d}"] = len(blob)
        return {"bytes": int(sum(written.values())), "tables": sorted(written), "states": sorted(states)}

    def _state_blobs(self, req) -> Dict[int, bytes]:
        """With ``self.cond`` held: the state snapshots of step ``states_step`` kept here under
        ``states_prefix`` (``<prefix><worker>/<step>``), by worker."""
        prefix, step = req.get("states_prefix"), req.get("states_step")
        if not isinstance(prefix, str) or not isinstance(step, int):
            return {}
        out = {}
        for key, blob in self.blobs.items():
            if key.startswith(prefix):
                worker, _, at = key[len(prefix):].partition("/")
                if worker.isdigit() and at == str(step):
                    out[int(worker)] = blob
        return out

    def _action_restore(self, req):
        """Fill this shard's rows of every table under ``prefix`` from a snapshot in ``dir``
        (written by any number of shards: the files overlapping this shard's rows are read)."""
        from . import storage

        prefix, source = req.str("prefix"), req.str("dir")
        names = storage.list_names(source)
        restored = {}
        with self.cond:
            if self.step.open:
                raise flight.FlightServerError(
                    f"shard {self.shard_id}: restore while step {self.step.step} is open")
            for t in [t for n, t in self.tables.items() if n.startswith(prefix)]:
                short = t.name[len(prefix):]
                covered = np.zeros(t.row_stop - t.row_start, dtype=bool)
                for fname in names:
                    stem, _, ext = fname.rpartition(".")
                    table_name, _, rows = stem.rpartition(".")
                    if ext != "npy" or table_name != short or "-" not in rows:
                        continue
                    lo, hi = (int(x) for x in rows.split("-"))
                    a, b = max(lo, t.row_start), min(hi, t.row_stop)
                    if a >= b:
                        continue
                    values = storage.load_array(storage.join(source, fname))
                    if values.shape != (hi - lo, t.width):
                        raise flight.FlightServerError(
                            f"snapshot {fname} in {source} has shape {values.shape}, expected {(hi - lo, t.width)}")
                    with t.lock:
                        t.values[a - t.row_start:b - t.row_start] = values[a - lo:b - lo]
                    covered[a - t.row_start:b - t.row_start] = True
                if not covered.all():
                    missing = int(np.flatnonzero(~covered)[0]) + t.row_start
                    raise flight.FlightServerError(
                        f"snapshot in {source} lacks rows of table {short!r} from row {missing}; the checkpoint "
                        "is incomplete or belongs to another model")
                restored[short] = t.row_stop - t.row_start
        prefix, step = req.get("states_prefix"), req.get("states_step")
        loaded = []
        if isinstance(prefix, str) and isinstance(step, int):  # the workers' state snapshots
            for worker in req.get("states_workers") or []:
                blob = storage.read_bytes(storage.join(req.str("states_dir", source), f"state-{int(worker):05d}.pkl"))
                with self.cond:
                    self.blobs[f"{prefix}{int(worker)}/{step}"] = blob
                loaded.append(int(worker))
        return {"rows": restored, "states": loaded}
