"""A shard's checkpoints: writing its rows of a fit's tables to storage, and reading them back.

:class:`TableSnapshots` (composed by :class:`~pystrads.ps.server.ShardServer`, on its
:class:`~pystrads.ps.state.ShardState`) serves the actions ``snapshot`` (between steps: one
``<table>.<row_start>-<row_stop>.npy`` per dense table, ``.npz`` with the rows' entries
(``offsets``, ``cols``, ``vals``) per sparse table, and the workers' state snapshots) and ``restore`` (from the files of any number of shards that
overlap this shard's rows), through :mod:`pystrads.ps.storage`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict

import numpy as np
import pyarrow.flight as flight

from .protocol import Blob

if TYPE_CHECKING:
    from .steps import StepFences
    from .state import ShardState


class TableSnapshots:
    """A shard's checkpoint actions (``action_snapshot``, ``action_restore``): taken and
    restored between steps only, which ``fences`` tells."""

    def __init__(self, state: "ShardState", fences: "StepFences"):
        self.state = state
        self.fences = fences

    def action_snapshot(self, req):
        """Write this shard's rows of every table under ``prefix`` to ``dir`` (between steps):
        one ``<table>.<row_start>-<row_stop>.npy`` per table, named by the part after the prefix."""
        from . import storage

        prefix, target = req.str("prefix"), req.str("dir")
        written, files = {}, []
        with self.state.cond:
            st = self.fences.step_of(prefix.rstrip("/"))
            if st.open:
                raise flight.FlightServerError(
                    f"shard {self.state.shard_id}: snapshot while step {st.step} is open; snapshots are taken "
                    "between steps")
            tables = [t for n, t in self.state.tables.items() if n.startswith(prefix)]
            for t in tables:
                short = t.name[len(prefix):]
                with t.lock:
                    fname = f"{short}.{t.row_start}-{t.row_stop}.{'npz' if t.kind == 'sparse' else 'npy'}"
                    if t.kind == "sparse":
                        written[short] = storage.save_arrays(
                            storage.join(target, fname),
                            dict(zip(("offsets", "cols", "vals"),
                                     t.read_entries(slice(0, t.row_stop - t.row_start)))))
                    else:
                        written[short] = storage.save_array(storage.join(target, fname), t.values)
                    files.append(fname)
            states = self._state_blobs(req)
        states_dir = req.str("states_dir", target)
        for worker, blob in states.items():  # the workers' state snapshots of that step
            storage.write_bytes(storage.join(states_dir, f"state-{worker:05d}.pkl"), blob.parts)
            written[f"state-{worker:05d}"] = len(blob)
        return {"bytes": int(sum(written.values())), "tables": sorted(written), "states": sorted(states),
                "files": files}

    def _state_blobs(self, req) -> Dict[int, Blob]:
        """With ``self.state.cond`` held: the state snapshots of step ``states_step`` kept here under
        ``states_prefix`` (``<prefix><worker>/<step>``), by worker."""
        prefix, step = req.get("states_prefix"), req.get("states_step")
        if not isinstance(prefix, str) or not isinstance(step, int):
            return {}
        out = {}
        for key, blob in self.state.blobs.items():
            if key.startswith(prefix):
                worker, _, at = key[len(prefix):].partition("/")
                if worker.isdigit() and at == str(step):
                    out[int(worker)] = blob
        return out

    def action_restore(self, req):
        """Fill this shard's rows of every table under ``prefix`` from a snapshot in ``dir``
        (written by any number of shards: the files overlapping this shard's rows are read --
        only those ``files`` names, the checkpoint's manifest, when it is given)."""
        from . import storage

        prefix, source = req.str("prefix"), req.str("dir")
        files = req.get("files")
        if files is not None and (not isinstance(files, list) or not all(isinstance(f, str) for f in files)):
            raise flight.FlightServerError("malformed request: field 'files' must be a list of strings")
        names = files if files is not None else storage.list_names(source)
        restored = {}
        with self.state.cond:
            st = self.fences.step_of(prefix.rstrip("/"))
            if st.open:
                raise flight.FlightServerError(
                    f"shard {self.state.shard_id}: restore while step {st.step} is open")
            for t in [t for n, t in self.state.tables.items() if n.startswith(prefix)]:
                short = t.name[len(prefix):]
                covered = np.zeros(t.row_stop - t.row_start, dtype=bool)
                for fname in names:
                    stem, _, ext = fname.rpartition(".")
                    table_name, _, rows = stem.rpartition(".")
                    if ext not in ("npy", "npz") or table_name != short or "-" not in rows:
                        continue
                    lo, hi = (int(x) for x in rows.split("-"))
                    a, b = max(lo, t.row_start), min(hi, t.row_stop)
                    if a >= b:
                        continue
                    part = _read_part(storage, storage.join(source, fname), ext, hi - lo, t.width)
                    with t.lock:
                        _restore_rows(t, part, a - lo, b - lo, slice(a - t.row_start, b - t.row_start))
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
                with self.state.cond:
                    self.state.put_blob(f"{prefix}{int(worker)}/{step}", Blob([blob]))
                loaded.append(int(worker))
        return {"rows": restored, "states": loaded}


def _read_part(storage, uri: str, ext: str, n_rows: int, width: int):
    """A snapshot file's rows: a dense block (``.npy``) or ``(offsets, cols, vals)`` (``.npz``),
    checked against the table's shape."""
    if ext == "npy":
        values = storage.load_array(uri)
        if values.shape != (n_rows, width):
            raise flight.FlightServerError(f"snapshot {uri} has shape {values.shape}, expected {(n_rows, width)}")
        return values
    parts = storage.load_arrays(uri)
    offsets, cols = parts["offsets"].astype(np.int64), parts["cols"]
    if len(offsets) != n_rows + 1 or offsets[-1] != len(cols) or len(cols) != len(parts["vals"]) \
            or (len(cols) and (int(cols.min()) < 0 or int(cols.max()) >= width)):
        raise flight.FlightServerError(
            f"snapshot {uri} does not hold {n_rows} rows of {width} columns; it belongs to another model")
    return offsets, cols, parts["vals"]


def _restore_rows(table, part, lo: int, hi: int, index: slice) -> None:
    """Rows ``[lo, hi)`` of a snapshot part into the table's rows at ``index`` (either storage
    into either kind of table: a model whose table changed kind still resumes)."""
    from ..kernels.rows import csr_into, to_csr

    if isinstance(part, np.ndarray):
        if table.kind == "dense":
            table.write(index, part[lo:hi])
        else:
            table.add_entries(index, *to_csr(np.ascontiguousarray(part[lo:hi])), replace=True)
        return
    offsets, cols, vals = part
    a, b = int(offsets[lo]), int(offsets[hi])
    sub = (offsets[lo:hi + 1] - a, cols[a:b], vals[a:b])
    if table.kind == "sparse":
        table.add_entries(index, *sub, replace=True)
    else:
        block = np.empty((hi - lo, table.width), dtype=table.values.dtype)
        csr_into(*sub, block, 0)
        table.write(index, block)
