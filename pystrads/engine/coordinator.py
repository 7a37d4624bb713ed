"""The fit's scheduler inside its barrier job, for clients that reach only Spark.

On the classic path the process that calls ``fit`` is the scheduler and talks to the shards
directly.  A Spark Connect client outside the cluster's network reaches only the Connect
endpoint, so there the step loop moves into the fit's job, where xgboost.spark puts its
tracker: the first worker's task (partition 0) also runs the *coordinator*, a thread that owns
the loop the driver owns on the classic path -- the tables' creation, the init step, every
``schedule`` / step / ``after_step``, step sizing, checkpoints -- against the same shards, and
keeps their lease while the job runs.  When the fit ends the task returns the coordinator's
result (the summary, the program's attributes, why it stopped, or the error it stopped on) as
the job's rows; the client reads them from the job and never opens a connection to an executor.

Who does what: the client starts the fit's shards (a Spark job), submits the fit's job and
reads its result, cancels it, and releases the shards through a Spark task afterwards
(:mod:`pystrads.ps.relay`); the coordinator runs the loop; a failed task ends the whole job
(barrier mode), the coordinator with it.  Programs run unmodified: ``schedule`` and
``after_step`` see the same :class:`~pystrads.engine.program.ScheduleContext`.
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import threading
import time
from typing import Any, Dict, Iterator, List, Optional

from ..errors import StepFailedError
from ..ps.client import ShardGroup
from .checkpoints import Position, program_attributes, program_state
from .driver import Engine, TrainingSummary, make_tables
from .job import WorkerJob
from .progress import ProgressReporter

log = logging.getLogger(__name__)

#: bytes of the coordinator's pickled result per row of the job's output
RESULT_CHUNK_BYTES = 4 << 20


@dataclasses.dataclass
class CoordinatorSpec:
    """What the coordinator needs beyond the workers' :class:`~pystrads.engine.worker.WorkerSpec`
    (which it shares: the program, the shards, the layouts): the settings, the tables to create,
    the checkpoints, the step limit and the credential that lets it install the program on the
    fit's own shards."""

    config: Dict[str, Any]
    tables: List[tuple]  # (shard, create_table keyword arguments), in order
    checkpoints: Any  # a Checkpointer, or None
    max_steps: Optional[int]
    admin_token: str
    program_name: str


class InJobWorkerJob(WorkerJob):
    """The :class:`WorkerJob` seen from inside the job: it never launches or cancels (the client
    does); the job is lost when this task is (``abandoned``)."""

    def __init__(self, spec, abandoned: threading.Event):
        super().__init__(None, None, spec.num_workers, spec.seed, spec.namespace, spec.timeout, False,
                         spec.export, spec.threads)
        self.group = spec.group
        self._posted_program = spec.program_hash  # every task unpickled it from the job's closure
        self._abandoned = abandoned

    def error(self) -> Optional[BaseException]:
        if self._abandoned.is_set():
            return StepFailedError("the first worker's task, which runs the coordinator, failed")
        return None

    def cancel(self) -> None:
        pass

    def finish(self, last_step: int) -> None:
        self.group.client(0).action("post", namespace=self.namespace, command={"kind": "finish", "step": last_step})
        if self.export is None:
            return
        from .worker import export_key

        S = len(self.group.shards)
        keys = {w: export_key(self.namespace, w) for w in range(self.num_workers)}
        while True:
            missing = sum((self.group.client(i).action(
                "wait_blobs", keys=[k for w, k in keys.items() if w % S == i], timeout=1.0)["missing"]
                for i in range(S)), [])
            if not missing:
                return
            error = self.error()
            if error is not None:
                raise error


class Coordinator:
    """The coordinator thread of partition 0 (see the module docstring)."""

    def __init__(self, spec, coordinator: CoordinatorSpec):
        self.spec = spec
        self.cspec = coordinator
        self.abandoned = threading.Event()  # the task's worker failed: the job is lost
        self.result: Optional[Dict[str, Any]] = None
        self._thread = threading.Thread(target=self._run, name="pystrads-coordinator", daemon=True)
        self._beats = threading.Event()

    def start(self) -> None:
        self._thread.start()
        threading.Thread(target=self._heartbeat, name="pystrads-coordinator-heartbeat", daemon=True).start()

    def abandon(self) -> None:
        self.abandoned.set()
        self._beats.set()

    def _group(self) -> ShardGroup:
        g = self.spec.group
        return ShardGroup(g.shards, g.token, g.chunk_bytes, g.max_keys, getattr(g, "tls_root_certs", None),
                          self.cspec.admin_token)

    def _heartbeat(self) -> None:
        group = self.spec.group
        period = float(self.cspec.config["shard.heartbeatSeconds"])
        while not self._beats.wait(period):
            for i in range(len(group.shards)):
                try:
                    group.client(i).action("heartbeat")
                except Exception:  # noqa: BLE001 -- the loop sees a lost shard in its next call
                    pass

    def _run(self) -> None:
        t0 = time.perf_counter()
        engine = None
        try:
            program = pickle.loads(self.spec.program)
            group = self._group()
            engine = _InJobEngine(self.spec, self.cspec, program, group, self.abandoned)
            make_tables(group, self.cspec.tables, self.spec.namespace, program)
            engine.summary.fixed["table_create_s"] = time.perf_counter() - t0
            stopped = engine.drive(self.cspec.max_steps)
            self.result = {"stopped": stopped, "summary": engine.summary_state(),
                           "program": program_state(program), "position": dataclasses.asdict(engine._position),
                           "shards": group.broadcast("stats"), "progress": engine.progress.report}
        except BaseException as exc:  # noqa: BLE001 -- handed to the client through the job
            log.warning("fit %s: the coordinator stopped on %r", self.spec.namespace, exc)
            self.result = {"error": _picklable(exc), "summary": engine.summary_state() if engine else None}
            try:  # workers waiting for a command read "closed" and end their tasks
                self.spec.group.broadcast("drop_tables", prefix=self.spec.namespace + "/")
            except Exception:  # noqa: BLE001 -- the job fails instead
                pass
        finally:
            self._beats.set()

    def result_rows(self) -> Iterator[bytes]:
        """Wait for the coordinator; its result, pickled, in chunks (the job's rows)."""
        from pyspark import cloudpickle

        while self._thread.is_alive():
            self._thread.join(1.0)
        blob = cloudpickle.dumps(self.result)
        for i in range(0, max(1, len(blob)), RESULT_CHUNK_BYTES):
            yield blob[i:i + RESULT_CHUNK_BYTES]


def progress_key(namespace: str) -> str:
    return f"{namespace}/progress"


class SharedProgress(ProgressReporter):
    """The coordinator's progress: a log line on the executor, and the latest report left on
    shard 0 for the client's poll (:class:`~pystrads.engine.driver.ProgressPoll`)."""

    def __init__(self, name: str, group: ShardGroup, namespace: str):
        super().__init__(name, "log")
        self.group, self.namespace, self.seq = group, namespace, 0
        self.report: Optional[Dict[str, Any]] = None

    def update(self, done, total, unit="iterations", **shown):
        line = super().update(done, total, unit, **shown)
        self.seq += 1
        report = self.report = {"seq": self.seq, "done": done, "total": total, "unit": unit, "shown": shown}
        try:
            self.group.client(0).put_blob(progress_key(self.namespace), pickle.dumps(report))
        except Exception as exc:  # noqa: BLE001 -- progress never fails a fit
            log.debug("progress not shared: %s", exc)
        return line


def read_progress(group: ShardGroup, namespace: str) -> Optional[Dict[str, Any]]:
    """The latest progress report of a fit's coordinator (on shard 0), or None."""
    blob = group.client(0).get_blob(progress_key(namespace))
    return None if blob is None else pickle.loads(blob)


def _picklable(exc: BaseException) -> BaseException:
    """``exc`` (with the coordinator's traceback as a note) if it survives pickling, else a
    StepFailedError with its text."""
    import traceback

    from pyspark import cloudpickle

    if hasattr(exc, "add_note"):
        exc.add_note("raised in the fit's coordinator (the scheduler in the fit's job):\n"
                     + "".join(traceback.format_exception(exc)).rstrip())
    try:
        pickle.loads(cloudpickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001
        return StepFailedError(f"{type(exc).__name__}: {exc}")


class _InJobEngine(Engine):
    """The :class:`~pystrads.engine.driver.Engine`'s loop with the coordinator as its owner: no
    Spark here, the job is the one this task belongs to, and a failure that needs the job
    relaunched is the client's to handle."""

    def __init__(self, spec, cspec: CoordinatorSpec, program, group: ShardGroup, abandoned: threading.Event):
        self.setup = None
        self.program = program
        self.spark = self.sc = None
        self.config = cspec.config
        self.num_workers = spec.num_workers
        self.seed = spec.seed
        self.threads = spec.threads
        self.summary = TrainingSummary()
        self.manager = None
        self.group = group
        self.layouts = dict(spec.layouts)
        self.namespace = spec.namespace
        self.in_job = False  # this is the job: tables are read directly
        self.job = InJobWorkerJob(spec, abandoned)
        self.job.group = group  # the coordinator's credential: it posts changed programs
        self.checkpoints = cspec.checkpoints
        self.progress = None
        self._position = Position(0, 0, self.num_workers)
        self._program_initial = program_attributes(program)
        self._recoveries = 0
        self._name = cspec.program_name

    def _recover(self, exc: BaseException) -> bool:
        raise exc

    def _progress_reporter(self) -> ProgressReporter:
        return SharedProgress(f"{self._name} {self.namespace}", self.job.group, self.namespace)

    def summary_state(self) -> Dict[str, Any]:
        s = self.summary
        return {"rows": s.rows, "iterations": s.iterations, "fixed": s.fixed}
