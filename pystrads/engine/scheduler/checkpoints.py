"""Checkpoints of a fit: where they go, writing one, and resuming from the latest.

A checkpoint is the shards' table snapshots, written where the rows live, the workers' state
snapshots (also written by the shards that keep them) and the driver's state (program
attributes, summary, step, and the manifest of the table files), under
``<checkpoint.dir>/pystrads-<fingerprint>/step-<n>-<random>``: a directory never used before,
so no file of another checkpoint (another shard layout, another fit) is ever read with it.
``LATEST`` names it and is written last, once every file is on the disk; restore reads the
files the manifest lists.  A fit started again with the same program, data, workers and seed
resumes from the latest.

The root belongs to one live fit at a time: the loop claims it (``OWNER``: the fit, and a beat
it renews every few seconds) and releases it when the fit ends.  A second identical fit that
finds the beat moving takes the next root (``<root>-2``, ``-3``...); one that finds it still
takes the root over, so a driver submitted again after a crash resumes where it stopped.
:class:`Checkpointer` owns those directories; deciding what to do after a failed step
(recovery) is the loop's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import pickle
import secrets
import socket
import threading
import time
from typing import Any, Dict, List, Optional

from ...config import Config
from ...errors import ConfigurationError, PystradsError, python_cause
from ...ps import storage
from .fingerprint import _hash_value

log = logging.getLogger(__name__)


def program_state(program) -> Dict[str, Any]:
    """The program's attributes that identify the fit and carry its driver-side state."""
    ignore = set(getattr(program, "checkpoint_ignore", ()))
    return {k: v for k, v in vars(program).items() if k not in ignore}


def program_attributes(program) -> bytes:
    """:func:`program_state` pickled (to put the program back as it was before the first step)."""
    from pyspark import cloudpickle

    return cloudpickle.dumps(program_state(program))


@dataclasses.dataclass
class Position:
    """Where a fit stands between steps: the next step's number, the rounds run so far, the
    rounds the next step should run (``ctx.rounds_hint``) and, in serial mode, the rounds run
    beyond the program's own (its rounds split by ``serial_rounds``)."""

    step: int
    rounds_done: int
    rounds_hint: int
    serial_extra: int = 0


@dataclasses.dataclass
class Resumed:
    """What a checkpoint gave back: the position and the history up to it."""

    position: Position
    step: int  # the checkpoint's last step
    rows: List[Dict[str, Any]]
    iterations: List[Dict[str, Any]]


#: seconds between renewals of a checkpoint root's ``OWNER`` beat
OWNER_BEAT_SECONDS = 4.0

#: roots a fit tries (the derived one, then ``-2``...) before giving up on a free one
OWNER_ROOTS = 8


#: module paths a checkpoint's pickles may name, and the modules that hold those classes
MOVED_MODULES = {"pystrads.engine.stopping": "pystrads.engine.program.stopping",
                 "pystrads.engine.program": "pystrads.engine.program.api"}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        return super().find_class(MOVED_MODULES.get(module, module), name)


def load_driver_state(blob: bytes) -> Dict[str, Any]:
    """A checkpoint's ``driver.pkl``: the loop's position and the program's attributes."""
    import io

    return _Unpickler(io.BytesIO(blob)).load()


class Checkpointer:
    """A fit's checkpoint directory (``root``: ``<checkpoint.dir>/pystrads-<fingerprint>``).

    Use :meth:`of` to make one: it returns None when the fit keeps no checkpoints.
    """

    def __init__(self, root: str, num_workers: int):
        self.root = root
        self.base = root  # the root derived from the settings (``root`` is another when it was taken)
        self.num_workers = num_workers
        self.saved = 0  # checkpoints written by this fit
        self.failures = 0  # checkpoints that failed (the previous one stayed the latest)
        self.seconds = 0.0  # time spent writing them
        self._owner: Optional[str] = None
        self._stop_beat: Optional[threading.Event] = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_stop_beat"] = None  # the beat is the claiming process's
        return state

    # ------------------------------------------------------------------ ownership
    def _read_owner(self, root: str) -> Optional[Dict[str, Any]]:
        try:
            return json.loads(storage.read_bytes(storage.join(root, "OWNER")).decode())
        except (FileNotFoundError, OSError, ValueError):
            return None

    def _write_owner(self, root: str, beat: int) -> None:
        storage.write_atomic(storage.join(root, "OWNER"), json.dumps(
            {"owner": self._owner, "beat": beat, "host": socket.gethostname(), "pid": os.getpid(),
             "time": time.time()}).encode())

    def claim(self, owner: str, beat_seconds: float = OWNER_BEAT_SECONDS) -> str:
        """Hold a root for fit ``owner`` while it runs (see the module docstring): the derived
        root unless another live fit holds it, then the next free one; starts the beat.  Returns
        the root.  A fit of the same ``owner`` (a relaunched coordinator) takes its root back."""
        self._owner = owner
        for n in range(OWNER_ROOTS):
            root = self.base if n == 0 else f"{self.base}-{n + 1}"
            held = self._read_owner(root)
            if held is not None and held.get("owner") != owner:
                time.sleep(2.5 * beat_seconds)  # a live owner renews its beat meanwhile
                again = self._read_owner(root)
                if again is not None and (again.get("owner") != held.get("owner")
                                          or again.get("beat") != held.get("beat")):
                    log.info("checkpoint root %s is held by the live fit %s; trying the next", root,
                             again.get("owner"))
                    continue
                if again is not None:
                    log.warning("checkpoint root %s was held by fit %s, whose beat stopped; taking it over", root,
                                held.get("owner"))
            self._write_owner(root, 0)
            time.sleep(min(0.25, beat_seconds / 4))  # two claims at once: the last writer keeps it
            mine = self._read_owner(root)
            if mine is None or mine.get("owner") != owner:
                continue
            if root != self.root:
                log.warning("checkpoint root %s is in use by another live fit of the same settings; this fit "
                            "checkpoints to %s", self.base, root)
            self.root = root
            self._start_beat(beat_seconds)
            return root
        raise ConfigurationError(
            f"checkpoints: {OWNER_ROOTS} live fits of the same program, data, workers and seed hold "
            f"{self.base} and the roots after it; end one, or give this fit another checkpoint.dir")

    def _start_beat(self, beat_seconds: float) -> None:
        stop = self._stop_beat = threading.Event()
        root = self.root

        def beat():
            n = 0
            while not stop.wait(beat_seconds):
                n += 1
                try:
                    self._write_owner(root, n)
                except Exception as exc:  # noqa: BLE001 -- a missed beat; the next one may land
                    log.debug("checkpoint owner beat failed: %s", exc)

        threading.Thread(target=beat, name="pystrads-checkpoint-owner", daemon=True).start()

    def release(self) -> None:
        """Stop the beat and give the root up (the fit ended)."""
        if self._stop_beat is not None:
            self._stop_beat.set()
            self._stop_beat = None
            held = self._read_owner(self.root)
            if held is not None and held.get("owner") == self._owner:
                storage.delete_file(storage.join(self.root, "OWNER"))

    @classmethod
    def of(cls, config: Config, sc, program, num_workers: int, seed: int) -> Optional["Checkpointer"]:
        """The fit's checkpoints, or None when ``checkpoint.interval`` is 0 or no directory is set
        (``spark.pystrads.checkpoint.dir``, else the SparkContext's checkpoint directory).  The
        fingerprint covers the program's parameters, the number of workers and the seed, so only
        the same fit resumes from it."""
        if config["checkpoint.interval"] <= 0:
            return None
        root = config["checkpoint.dir"]
        if not root and sc is not None:
            try:
                opt = sc._jsc.sc().getCheckpointDir()
                # Spark appends a random per-application directory to the one given to
                # setCheckpointDir; a resumed fit is another application: use the given one
                root = opt.get().rstrip("/").rsplit("/", 1)[0] if opt.isDefined() else ""
            except Exception:  # noqa: BLE001 -- no JVM view (tests with stand-in contexts)
                root = ""
        if not root:
            log.info("no checkpoints: neither spark.pystrads.checkpoint.dir nor SparkContext.setCheckpointDir "
                     "is set")
            return None
        h = hashlib.sha256(type(program).__module__.encode() + type(program).__qualname__.encode())
        for key, value in sorted(program_state(program).items()):
            h.update(key.encode())
            _hash_value(h, value)
        h.update(f"workers={num_workers};seed={seed}".encode())
        return cls(storage.join(root, "pystrads-" + h.hexdigest()[:20]), num_workers)

    def try_save(self, job, program, position: Position, summary) -> None:
        """:meth:`save`, except that a checkpoint that fails (a lost shard, a failed write) leaves
        the previous one in place: training goes on, and a lost shard shows in the next step."""
        try:
            self.save(job, program, position, summary)
        except Exception as exc:  # noqa: BLE001 -- the fit must not die for a checkpoint
            self.failures += 1
            log.warning("checkpoint after step %d failed (the previous one stays the latest): %s", position.step - 1,
                        exc if isinstance(exc, PystradsError) else python_cause(exc))

    def save(self, job, program, position: Position, summary) -> None:
        """Tables and worker states (written by the shards, where they are) and the driver's state,
        then ``LATEST`` -- atomically, last."""
        from pyspark import cloudpickle

        t0 = time.perf_counter()
        last = position.step - 1
        name = f"step-{last:08d}-{secrets.token_hex(4)}"  # never reused: no file of another checkpoint in it
        target = storage.join(self.root, name)
        saved = job.save_states(target, last)
        written = saved["bytes"]
        driver = {"step": position.step, "rounds_done": position.rounds_done, "rounds_hint": position.rounds_hint,
                  "serial_extra": position.serial_extra,
                  "rows": summary.rows, "iterations": summary.iterations, "data_fingerprints": job.fingerprints(),
                  "program": program_state(program), "num_workers": self.num_workers, "files": saved["files"],
                  "states_key": saved.get("states_key")}  # the workers' states are sealed with it
        storage.write_bytes(storage.join(target, "driver.pkl"), cloudpickle.dumps(driver))
        storage.write_atomic(storage.join(self.root, "LATEST"), json.dumps(
            {"dir": name, "step": last, "rounds_done": position.rounds_done, "time": time.time()}).encode())
        for old in storage.list_names(self.root):
            if old.startswith("step-") and old != name:
                storage.delete_dir(storage.join(self.root, old))
        elapsed = time.perf_counter() - t0
        self.saved += 1
        self.seconds += elapsed
        log.info("checkpoint after step %d: %s (%.1f MiB in %.2f s)", last, target, written / 2 ** 20, elapsed)

    def resume(self, job, program) -> Optional[Resumed]:
        """Put the tables, the workers' states and the program's attributes back as the latest
        checkpoint of this fit has them; None when there is none, or when it was made from other
        input data."""
        latest = storage.join(self.root, "LATEST")
        if not storage.exists(latest):
            return None
        meta = json.loads(storage.read_bytes(latest).decode())
        source = storage.join(self.root, meta["dir"])
        driver = load_driver_state(storage.read_bytes(storage.join(source, "driver.pkl")))
        if driver["num_workers"] != self.num_workers:
            raise ConfigurationError(f"checkpoint {source} has {driver['num_workers']} workers, this fit "
                                     f"{self.num_workers}")
        current = job.fingerprints()
        if current != driver["data_fingerprints"]:
            differ = [i for i, (a, b) in enumerate(zip(current, driver["data_fingerprints"])) if a != b]
            log.warning("checkpoint %s was made from other input data (workers %s differ); not resuming from it",
                        source, differ)
            return None
        job.restore_states(source, meta["step"], driver.get("files"), driver.get("states_key"))
        vars(program).update(driver["program"])
        position = Position(driver["step"], driver["rounds_done"], int(driver.get("rounds_hint", self.num_workers)),
                            int(driver.get("serial_extra", 0)))
        log.info("resumed from checkpoint %s (step %d, %d rounds done)", source, meta["step"], position.rounds_done)
        return Resumed(position, meta["step"], driver["rows"], driver["iterations"])
