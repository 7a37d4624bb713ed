"""The step loop's journal: the one record of where a fit stands, written as each step's commit point.

A step changes several things: the shards' tables (the workers' rounds, and what ``schedule`` and
``after_step`` write), the program's driver-side state (what ``schedule`` and ``after_step``
leave in its attributes), the loop's position and the fit's summary.  They form one unit.  The
loop writes a :class:`JournalEntry` holding everything outside the shards *after* ``after_step``
and *before* it commits the step on the shards; that write is the step's commit point:

* a failure before it leaves the step uncommitted everywhere: the shards roll it back
  (``abort_step``) and the loop goes back to the previous entry (state, position, summary), so
  the step runs again from its ``schedule``;
* a failure after it completes the step: whoever carries on commits it on the shards that
  have not (``commit_step`` is a no-op where it was) and takes the entry's state.

:func:`settle` makes that decision for a step left open.  The entry also carries the next
step's schedule when it was planned while the step ran (``planned``): its planning changed the
program's state, so a replay uses it instead of planning again.

Where the entry lives: in the loop's process for the driver (:class:`MemoryStore`, which a
restarted driver does not need: it resumes from checkpoints), and on shard 0 for the
coordinator in the fit's job (:class:`ShardStore`), whose relaunched successor reads it.  A
shard store writes with the loop's epoch, so a coordinator that lost its job cannot overwrite
its successor's entry.
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import secrets
from typing import Any, Dict, List, Optional

from ...ps.client import fan_out
from ...ps.protocol import Action

log = logging.getLogger(__name__)


@dataclasses.dataclass
class JournalEntry:
    """Where a fit stands after step ``step`` committed (0: the init step).

    ``position``: the loop's :class:`~pystrads.engine.scheduler.checkpoints.Position` as a dict;
    ``program``: the program's state (:func:`~pystrads.engine.scheduler.checkpoints.program_state`);
    ``summary``: the summary's ``rows``, ``iterations`` and ``fixed``; ``planned``: the next
    step's schedule planned while this one ran, as ``(schedule, times, records, stop_reason)``;
    ``ended``: the fit ended with this step, ``stopped``: why (``ctx.stop``'s reason; None when
    ``schedule`` returned None); ``checkpoints``: the fit's
    :class:`~pystrads.engine.scheduler.checkpoints.Checkpointer` (its counters travel with it)."""

    step: int
    position: Dict[str, Any]
    program: Dict[str, Any]
    summary: Dict[str, Any]
    planned: Optional[Any] = None
    ended: bool = False
    stopped: Optional[str] = None
    checkpoints: Any = None


def journal_key(namespace: str) -> str:
    """The journal's blob key on shard 0."""
    return f"{namespace}/loop/journal"


#: a read-only numpy array of at least this many bytes is taken as never changing: each entry
#: refers to it instead of holding a copy (the data summaries a program keeps, blocks unpickled
#: from the shards), so an entry costs what the step changed, not the program's whole state
FROZEN_MIN_BYTES = 1 << 20


#: the summary's lists that only grow during a fit (the steps' rows, the programs' iteration
#: rows): the journal keeps them as chunks of :data:`ROWS_CHUNK` rows, each pickled once and kept
#: like a frozen array, and pickles only the rows after the last full chunk with each entry --
#: an entry costs what the step added, not the fit's whole history (whole lists pickled with
#: every entry would cost ~7 ms a step after 300 steps, a third of a small step's time)
GROWING = ("rows", "iterations")
ROWS_CHUNK = 64


class _Rows:
    """A growing summary list in a journal entry: the keys of its full chunks (frozen pieces of
    the store) and the pickled rows after them."""

    def __init__(self, chunks: List[str], tail: bytes):
        self.chunks, self.tail = chunks, tail


def _dumps(rows: List[Any]) -> bytes:
    """Summary rows pickled by the C pickler (numbers and strings: no hook per object); cloudpickle
    for what it cannot pickle."""
    try:
        return pickle.dumps(rows, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 -- a row value only cloudpickle handles
        from pyspark import cloudpickle

        return cloudpickle.dumps(rows, protocol=pickle.HIGHEST_PROTOCOL)


def _frozen(obj: Any) -> bool:
    import numpy as np

    return isinstance(obj, np.ndarray) and not obj.flags.writeable and obj.nbytes >= FROZEN_MIN_BYTES


class MemoryStore:
    """The journal of a loop whose successor runs in the same process (the driver); a frozen
    array stays a reference, and the entry's other large arrays are kept out of band (pickle
    protocol 5): each copied once into a buffer of its own, not into the pickle stream and out
    again (26 MB a step for the default StradsLasso on the 20k x 200k benchmark: 13-28 ms in
    band)."""

    out_of_band = True

    def __init__(self):
        self._blob: Optional[bytes] = None
        self._buffers: List[bytearray] = []
        self._frozen: Dict[str, Any] = {}

    def write(self, blob: bytes, open_step: Optional[int], frozen: Dict[str, Any],
              buffers: Optional[List[bytearray]] = None) -> None:
        self._frozen.update(frozen)
        self._blob, self._buffers = blob, list(buffers or [])

    def read(self) -> Optional[bytes]:
        return self._blob

    def buffers(self) -> List[bytearray]:
        """Copies of the last entry's out-of-band buffers (the arrays read back own them: a
        program that changes them in place never changes the entry)."""
        return [bytearray(b) for b in self._buffers]

    def frozen(self, key: str) -> Any:
        return self._frozen[key]

    def clear(self) -> None:
        self._blob, self._frozen = None, {}


class ShardStore:
    """The journal on shard 0 of the fit's group (the coordinator in the fit's job), written
    under the open step's fence with the loop's epoch and sealed with the fit's driver key
    (:mod:`~pystrads.engine.scheduler.sealing`: only the fit's coordinator or driver can write an entry
    that its successor unpickles); each frozen array is a blob of its own, written once."""

    def __init__(self, group, namespace: str, epoch: int, seals):
        self.group, self.namespace, self.epoch, self.seals = group, namespace, int(epoch), seals
        self._frozen: Dict[str, Any] = {}

    def _fence(self, open_step: Optional[int]) -> Dict[str, Any]:
        fence: Dict[str, Any] = {"epoch": self.epoch, "namespace": self.namespace}
        if open_step is not None:
            fence["step"] = int(open_step)
        return fence

    def write(self, blob: bytes, open_step: Optional[int], frozen: Dict[str, Any]) -> None:
        from .sealing import DRIVER

        for key, array in frozen.items():  # before the entry that refers to them
            name = f"{journal_key(self.namespace)}/{key}"
            self.group.client(0).put_blob(name, self.seals.seal(DRIVER, name, pickle.dumps(
                array, protocol=pickle.HIGHEST_PROTOCOL)), self._fence(open_step))
        name = journal_key(self.namespace)
        self.group.client(0).put_blob(name, self.seals.seal(DRIVER, name, blob), self._fence(open_step))

    def read(self):
        from .sealing import DRIVER

        name = journal_key(self.namespace)
        blob = self.group.client(0).get_blob(name)
        return None if blob is None else self.seals.open(DRIVER, name, blob, f"{name!r} on shard 0")

    def frozen(self, key: str) -> Any:
        from .sealing import DRIVER

        if key not in self._frozen:
            name = f"{journal_key(self.namespace)}/{key}"
            blob = self.group.client(0).get_blob(name)
            if blob is None:
                raise RuntimeError(f"the journal of fit {self.namespace!r} refers to an array that is not on "
                                   f"shard 0 ({key})")
            self._frozen[key] = pickle.loads(self.seals.open(DRIVER, name, blob, f"{name!r} on shard 0"))
        return self._frozen[key]

    def clear(self) -> None:
        pass  # the blobs go with the fit's tables


class Journal:
    """The loop's journal over a store (see the module docstring)."""

    def __init__(self, store):
        self.store = store
        self._keys: Dict[int, tuple] = {}  # id(frozen array) -> (the array, its key): written once
        # a growing list's name -> its full chunks written, as (key, the chunk's last row object):
        # a chunk is reused while the list still holds that very row at its end
        self._chunks: Dict[str, List[tuple]] = {}

    def _pack(self, summary: Dict[str, Any], new: Dict[str, Any]) -> tuple:
        """``summary`` with its growing lists as :class:`_Rows` (new full chunks added to ``new``),
        and the chunk lists to keep once the entry is written.  The newest row always stays in
        the pickled tail: the loop still adds the step's traffic to it after the commit point."""
        packed, chunks_after = dict(summary), {}
        for name in GROWING:
            rows = summary.get(name)
            if not isinstance(rows, list):
                continue
            chunks = list(self._chunks.get(name, []))
            for i, (_, last) in enumerate(chunks):  # keep the chunks this list still starts with
                end = (i + 1) * ROWS_CHUNK
                if end > len(rows) or rows[end - 1] is not last:
                    del chunks[i:]
                    break
            while (len(chunks) + 1) * ROWS_CHUNK < len(rows):
                start = len(chunks) * ROWS_CHUNK
                piece = rows[start:start + ROWS_CHUNK]
                key = secrets.token_hex(8)
                new[key] = _dumps(piece)
                chunks.append((key, piece[-1]))
            packed[name] = _Rows([key for key, _ in chunks], _dumps(rows[len(chunks) * ROWS_CHUNK:]))
            chunks_after[name] = chunks
        return packed, chunks_after

    def _unpack(self, summary: Dict[str, Any]) -> Dict[str, Any]:
        """``summary`` with its :class:`_Rows` back as lists of fresh rows."""
        out = dict(summary)
        for name, value in summary.items():
            if isinstance(value, _Rows):
                rows: List[Any] = []
                for key in value.chunks:
                    rows.extend(pickle.loads(self.store.frozen(key)))
                rows.extend(pickle.loads(value.tail))
                out[name] = rows
        return out

    def write(self, entry: JournalEntry, open_step: Optional[int]) -> None:
        """Record ``entry``: the commit point of step ``entry.step``, which is open on the shards
        while this runs (``open_step``; None: no step is open, as after a resume from a
        checkpoint)."""
        import io

        from pyspark import cloudpickle

        keys, new = dict(self._keys), {}  # taken over once the store has the entry
        summary, chunks = self._pack(entry.summary, new)
        entry = dataclasses.replace(entry, summary=summary)

        class _Pickler(cloudpickle.CloudPickler):
            def persistent_id(self, obj):
                if not _frozen(obj):
                    return None
                known = keys.get(id(obj))
                if known is None or known[0] is not obj:
                    known = keys[id(obj)] = (obj, secrets.token_hex(8))
                    new[known[1]] = obj
                return known[1]

        out = io.BytesIO()
        if getattr(self.store, "out_of_band", False):
            buffers: List[bytearray] = []
            _Pickler(out, protocol=5, buffer_callback=lambda b: buffers.append(bytearray(b.raw()))).dump(entry)
            self.store.write(out.getvalue(), open_step, new, buffers)
        else:
            _Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(entry)
            self.store.write(out.getvalue(), open_step, new)
        self._keys, self._chunks = keys, chunks

    def read(self) -> Optional[JournalEntry]:
        """The last entry written, as a fresh object (None: no step committed yet)."""
        import io

        blob = self.store.read()
        if blob is None:
            return None
        store = self.store

        class _Unpickler(pickle.Unpickler):
            def persistent_load(self, key):
                return store.frozen(key)

        buffers = self.store.buffers() if getattr(self.store, "out_of_band", False) else None
        entry = _Unpickler(io.BytesIO(blob), buffers=buffers).load()
        return dataclasses.replace(entry, summary=self._unpack(entry.summary))

    def clear(self) -> None:
        """Forget every entry (the fit starts over on new shards)."""
        self.store.clear()
        self._keys, self._chunks = {}, {}


def settle(group, namespace: str, epoch: int, entry: Optional[JournalEntry]) -> str:
    """Close the step a lost loop or job left open, as ``entry`` (the journal's last) decides:
    commit it everywhere when the journal holds it, else roll it back.  Claims ``epoch`` on every
    shard first, so a loop of an older epoch can change nothing afterwards.  Returns what it did."""
    status = group.broadcast(Action.CLAIM, namespace=namespace, epoch=int(epoch))
    open_steps = {i: s["step"] for i, s in enumerate(status) if s["open"]}
    if not open_steps:
        return "none open"
    # each shard as the journal decides for the step open there: a commit that also opened the
    # next step may have reached some shards only, leaving the journalled step open on the others
    # and the next one (never journalled) open where it arrived
    journalled = entry.step if entry is not None else None
    fan_out([lambda i=i, step=step: group.client(i).action(
        Action.COMMIT_STEP if step == journalled else Action.ABORT_STEP, step=step, namespace=namespace,
        epoch=int(epoch)) for i, step in open_steps.items()])
    done = [f"{'committed' if step == journalled else 'rolled back'} step {step} on shard {i}"
            for i, step in sorted(open_steps.items())]
    return "; ".join(done) + (" (its journal entry was written)" if journalled in open_steps.values() else "")
