"""Checkpoints and recovery of a fit (a mixin of :class:`~pystrads.engine.driver.Engine`).

A checkpoint is the shards' table snapshots, written where the rows live,
the workers' states and the driver's state (program attributes, summary,
step), under ``<checkpoint.dir>/pystrads-<fingerprint>/<step>``; a fit
started again with the same program, data, workers and seed resumes from
the latest.  :meth:`CheckpointMixin._recover` decides, after a failed step,
whether to restart lost shards and worker states from the latest checkpoint
(or from the start) and run the step again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import pickle
import time
from typing import Any, Dict, Optional

from ..errors import ConfigurationError, PystradsError, StepFailedError
from ..ps import storage
from .fingerprint import _data_fingerprint, _hash_value
from .preflight import _python_cause

log = logging.getLogger("pystrads.engine.driver")


def _program_state(program) -> Dict[str, Any]:
    """The program's attributes that identify the fit and carry its driver-side state."""
    ignore = set(getattr(program, "checkpoint_ignore", ()))
    return {k: v for k, v in vars(program).items() if k not in ignore}


def _program_attributes(program) -> bytes:
    from pyspark import cloudpickle

    return cloudpickle.dumps(_program_state(program))


#: Failure causes meaning cached worker states are gone (an executor died), so the
#: step cannot simply be run again from the pre-step states.
_LOST_STATE_MARKERS = ("Checkpoint block", "ExecutorLostFailure", "FetchFailed", "could not be found",
                       "was lost", "not found")


class CheckpointMixin:
    """Checkpoint, resume and recovery steps of :class:`~pystrads.engine.driver.Engine`
    (uses its ``config``, ``group``, ``program``, ``summary``, ``num_workers``, ``seed`` and
    step state)."""

    def _resolve_checkpoint_dir(self) -> Optional[str]:
        """``<checkpoint.dir>/pystrads-<fingerprint>`` or None (no checkpoints).  The
        fingerprint covers the program's parameters and data summaries, the number of
        workers and the seed, so only the same fit resumes from it."""
        if self.config["checkpoint.interval"] <= 0:
            return None
        root = self.config["checkpoint.dir"]
        if not root:
            try:  # (none through Spark Connect: set spark.pystrads.checkpoint.dir)
                opt = self.sc._jsc.sc().getCheckpointDir()
                # Spark appends a random per-application directory to the one given to
                # setCheckpointDir; a resumed fit is another application: use the given one
                root = opt.get().rstrip("/").rsplit("/", 1)[0] if opt.isDefined() else ""
            except Exception:  # no JVM view (tests with stand-in contexts)
                root = ""
        if not root:
            log.info("no checkpoints: neither spark.pystrads.checkpoint.dir nor SparkContext.setCheckpointDir "
                     "is set")
            return None
        return storage.join(root, "pystrads-" + self._fingerprint())

    def _fingerprint(self) -> str:
        h = hashlib.sha256(type(self.program).__module__.encode() + type(self.program).__qualname__.encode())
        for key, value in sorted(_program_state(self.program).items()):
            h.update(key.encode())
            _hash_value(h, value)
        h.update(f"workers={self.num_workers};seed={self.seed}".encode())
        return h.hexdigest()[:20]

    def _try_checkpoint(self) -> None:
        """A checkpoint that fails (a lost shard, a failed job) leaves the previous one
        in place; training goes on, and a lost shard shows in the next step."""
        try:
            self._checkpoint()
        except Exception as exc:  # noqa: BLE001 -- the fit must not die for a checkpoint
            self.summary.fixed["checkpoint_failures"] = self.summary.fixed.get("checkpoint_failures", 0) + 1
            log.warning("checkpoint after step %d failed (the previous one stays the latest): %s", self._step - 1,
                        _python_cause(exc) if not isinstance(exc, PystradsError) else exc)

    def _checkpoint(self) -> None:
        """Tables (written by the shards, where the rows are), worker states (by the
        workers) and the driver's state, then ``LATEST`` -- atomically, last."""
        from pyspark import cloudpickle

        t0 = time.perf_counter()
        root = self._checkpoint_dir
        name = f"step-{self._step - 1:08d}"
        target = storage.join(root, name)
        if self.resident:
            written = self._resident_checkpoint(target)
        else:
            written = self._save_states(target)
        driver = {"step": self._step, "rounds_done": self._rounds_done, "rounds_hint": self._rounds_hint,
                  "rows": self.summary.rows,
                  "data_fingerprints": self._data_fingerprints,
                  "iterations": self.summary.iterations, "program": _program_state(self.program),
                  "num_workers": self.num_workers}
        storage.write_bytes(storage.join(target, "driver.pkl"), cloudpickle.dumps(driver))
        storage.write_atomic(storage.join(root, "LATEST"), json.dumps(
            {"dir": name, "step": self._step - 1, "rounds_done": self._rounds_done, "time": time.time()}).encode())
        for old in storage.list_names(root):
            if old.startswith("step-") and old != name:
                storage.delete_dir(storage.join(root, old))
        elapsed = time.perf_counter() - t0
        self.summary.fixed["checkpoint_s"] = self.summary.fixed.get("checkpoint_s", 0.0) + elapsed
        self.summary.fixed["checkpoints"] = self.summary.fixed.get("checkpoints", 0) + 1
        log.info("checkpoint after step %d: %s (%.1f MiB in %.2f s)", self._step - 1, target, written / 2 ** 20,
                 elapsed)

    def _save_states(self, target: str) -> int:
        """Step runtime: shards write their tables, a job writes the cached worker states."""
        from pyspark import cloudpickle

        written = sum(r["bytes"] for r in self.group.broadcast(
            "snapshot", prefix=self.namespace + "/", dir=storage.join(target, "tables")))

        need_fingerprints = self._data_fingerprints is None

        def save(index, pairs):
            for data, state in pairs:
                blob = cloudpickle.dumps(state)
                storage.write_bytes(storage.join(target, f"state-{index:05d}.pkl"), blob)
                yield index, len(blob), _data_fingerprint(data) if need_fingerprints else None

        saved = sorted(self._zip(self._data_rdd, self._state_rdd).mapPartitionsWithIndex(save).collect())
        if [i for i, _, _ in saved] != list(range(self.num_workers)):
            raise StepFailedError(f"checkpoint {target}: states of workers {[i for i, _, _ in saved]} were "
                                  f"saved, expected 0..{self.num_workers - 1}")
        if need_fingerprints:  # data is immutable: hashed once per fit
            self._data_fingerprints = [fp for _, _, fp in saved]
        return written + sum(n for _, n, _ in saved)

    def _resume(self) -> bool:
        """Restore tables, worker states and driver state from the latest checkpoint of this
        fit, if there is one."""
        from pyspark import StorageLevel

        root = self._checkpoint_dir
        latest = storage.join(root, "LATEST")
        if not storage.exists(latest):
            return False
        t0 = time.perf_counter()
        meta = json.loads(storage.read_bytes(latest).decode())
        source = storage.join(root, meta["dir"])
        driver = pickle.loads(storage.read_bytes(storage.join(source, "driver.pkl")))
        if driver["num_workers"] != self.num_workers:
            raise ConfigurationError(f"checkpoint {source} has {driver['num_workers']} workers, this fit "
                                     f"{self.num_workers}")
        if self.resident:
            current, restore = self._resident_resume(source, meta["step"])
        else:
            current = [fp for _, fp in sorted(self._data_rdd.mapPartitionsWithIndex(
                lambda index, datas: [(index, _data_fingerprint(d)) for d in datas]).collect())]
        if current != driver["data_fingerprints"]:
            differ = [i for i, (a, b) in enumerate(zip(current, driver["data_fingerprints"])) if a != b]
            log.warning("checkpoint %s was made from other input data (workers %s differ); not resuming from it",
                        source, differ)
            return False
        self._data_fingerprints = current
        if self.resident:  # tables and the workers' snapshots go back onto the shards
            restore()
        else:
            self.group.broadcast("restore", prefix=self.namespace + "/", dir=storage.join(source, "tables"))

            def load(index, _data):
                yield pickle.loads(storage.read_bytes(storage.join(source, f"state-{index:05d}.pkl")))

            state = self._data_rdd.mapPartitionsWithIndex(load)
            state.persist(StorageLevel.MEMORY_AND_DISK)
            state.localCheckpoint()
            self._materialize(state)
            for old in self._old_rdds:
                old.unpersist()
            self._state_rdd = state
            self._old_rdds = [state]
        vars(self.program).update(driver["program"])
        self._step, self._rounds_done = driver["step"], driver["rounds_done"]
        self._rounds_hint = int(driver.get("rounds_hint", self.num_workers))
        self.summary.rows[:] = driver["rows"]
        self.summary.iterations[:] = driver["iterations"]
        self.summary.fixed["resumed_from_step"] = meta["step"]
        self.summary.fixed["resume_s"] = time.perf_counter() - t0
        log.info("fit %s resumed from checkpoint %s (step %d, %d rounds done) in %.1f s", self.namespace, source,
                 meta["step"], self._rounds_done, time.perf_counter() - t0)
        return True

    def _recover(self, exc: BaseException) -> bool:
        """After a failed step: when shards died or worker states were lost with an
        executor, restart what is gone and continue from the latest checkpoint (or from
        the start when there is none).  Anything else is re-raised.  Returns True when the
        failed step is to run again as it was (resident runtime: the shards kept every
        worker's state snapshot, so a relaunched job resumes right before that step)."""
        shards_alive = self.manager is not None and self.manager.alive()
        cause = str(exc) + " " + str(exc.__cause__ or "")
        states_lost = any(marker in cause for marker in _LOST_STATE_MARKERS)
        # a DataFrame input's job is a barrier result stage, which Spark never retries: a failed
        # task ends the job, and the driver relaunches it (what Spark does for an RDD input's stage)
        job_failed = self.frame is not None and "barrier ResultStage" in cause
        if shards_alive and not states_lost and not job_failed:
            raise exc
        self._recoveries += 1
        limit = self.config["recovery.maxAttempts"]
        if self._recoveries > limit:
            raise StepFailedError(f"gave up after {limit} recoveries (spark.pystrads.recovery.maxAttempts); last "
                                  f"failure: {cause}") from exc
        t0 = time.perf_counter()
        what = ("shards were lost" if not shards_alive else "worker states were lost with an executor" if states_lost
                else "its barrier job failed (a failed task ends a DataFrame input's job)")
        log.warning("step %d failed and %s; recovering (%d of at most %d) from %s", self._step, what,
                    self._recoveries, limit, "the latest checkpoint" if self._checkpoint_dir else "the start")
        if self.resident:
            self._cancel_job()
            if shards_alive:  # only the job was lost: its tasks restart from the shards' snapshots
                self._launch_job()
                self.summary.fixed["recoveries"] = self._recoveries
                self.summary.fixed["recovery_s"] = self.summary.fixed.get("recovery_s", 0.0) + \
                    time.perf_counter() - t0
                return True
            self._start()
            self._launch_job()
            self._posted_program = None  # new shards: the first command carries the program
        elif not shards_alive:
            self._start()  # new shards with freshly created tables
        if not (self._checkpoint_dir and self._resume()):
            if shards_alive:
                self._create_tables()
            vars(self.program).update(pickle.loads(self._program_initial))
            self.summary.rows.clear()
            self.summary.iterations.clear()
            self._init_state()
        self.summary.fixed["recoveries"] = self._recoveries
        self.summary.fixed["recovery_s"] = self.summary.fixed.get("recovery_s", 0.0) + time.perf_counter() - t0
        return False
