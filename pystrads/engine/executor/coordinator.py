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

Who does what (the client's side is :mod:`pystrads.engine.driver.relay`): the client starts the fit's shards (a Spark job), submits the fit's job and
reads its result, cancels it, and releases the shards through a Spark task afterwards
(:mod:`pystrads.ps.relay`), and relaunches a failed job; the coordinator runs the loop and
keeps its journal on shard 0 (:mod:`~pystrads.engine.scheduler.journal`: written at every step's commit
point), from which a relaunched coordinator carries on (a failed task ends the whole barrier
job, the coordinator with it).  Every relaunch has a new loop epoch, claimed on the shards
before it starts, so a coordinator whose job was lost can change nothing.  Programs run unmodified: ``schedule`` and
``after_step`` see the same :class:`~pystrads.engine.program.api.ScheduleContext`.
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import threading
import time
from typing import Any, Dict, Iterator, List, Optional

import numpy as np

from ...errors import ShardUnavailableError, StepFailedError
from ...ps.client import ShardGroup
from ...ps.partition import TableLayout
from ...ps.protocol import Action
from ..scheduler.checkpoints import program_state
from ..scheduler.journal import Journal, ShardStore, settle
from ..scheduler.loop import StepLoop, TrainingSummary, make_tables
from ..scheduler.progress import ProgressReporter
from ..scheduler.sealing import DRIVER
from ..scheduler.steps import WorkerJob

log = logging.getLogger(__name__)

#: bytes of the coordinator's pickled result per row of the job's output
RESULT_CHUNK_BYTES = 4 << 20


@dataclasses.dataclass
class CoordinatorSpec:
    """What the coordinator needs beyond the workers' :class:`~pystrads.engine.executor.worker.WorkerSpec`
    (which it shares: the program, the shards, the layouts): the settings, the tables to create,
    the checkpoints, the step limit and the credential that lets it install the program on the
    fit's own shards."""

    config: Dict[str, Any]
    tables: List[tuple]  # (shard, create_table keyword arguments), in order
    checkpoints: Any  # a Checkpointer, or None
    max_steps: Optional[int]
    admin_token: str
    program_name: str
    resume: bool = False  # a relaunch: carry on from the journal on shard 0
    epoch: int = 1  # this coordinator's loop epoch: one more for every relaunch

    def start(self, spec) -> "Coordinator":
        """Start the coordinator in the first worker's task (``spec``: the workers'
        :class:`~pystrads.engine.executor.worker.WorkerSpec`, which carries this)."""
        coordinator = Coordinator(spec, self)
        coordinator.start()
        return coordinator


class InJobWorkerJob(WorkerJob):
    """The :class:`WorkerJob` seen from inside the job: it never launches or cancels (the client
    does); the job is lost when this task is (``abandoned``)."""

    def __init__(self, spec, abandoned: threading.Event, epoch: int):
        super().__init__(spec.num_workers, spec.seed, spec.namespace, spec.timeout, spec.export, spec.threads, epoch)
        self.group = spec.group
        self.launches = spec.launch  # the launch this task belongs to
        self._posted_program = spec.program_hash  # every task unpickled it from the job's closure
        self.seals = spec.seals  # the fit's keys, as the client made them
        self._abandoned = abandoned

    def error(self) -> Optional[BaseException]:
        if self._abandoned.is_set():
            return StepFailedError("the first worker's task, which runs the coordinator, failed")
        return None

    def cancel(self) -> None:
        pass

    def finish(self, last_step: int) -> None:
        self.group.client(0).action(Action.POST, namespace=self.namespace, command=self.finish_command(last_step),
                                    epoch=self.epoch)
        if self.export is not None:
            self._wait_exports()


class Coordinator:
    """The coordinator thread of partition 0 (see the module docstring)."""

    def __init__(self, spec, coordinator: CoordinatorSpec):
        self.spec = spec
        self.cspec = coordinator
        self.abandoned = threading.Event()  # the task's worker failed: the job is lost
        self.result: Optional[Dict[str, Any]] = None
        self.failed: Optional[BaseException] = None  # a failure the client recovers from by a relaunch
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
                          self.cspec.admin_token, g.rpc_timeout, getattr(g, "client_cert", None))

    def _heartbeat(self) -> None:
        group = self.spec.group
        period = float(self.cspec.config["shard.heartbeatSeconds"])
        while not self._beats.wait(period):
            try:  # all at once, each bounded by a period: a frozen shard delays no other's lease
                group.heartbeat(max(0.5, period))
            except Exception:  # noqa: BLE001 -- the loop sees a lost shard in its next call
                pass

    def _run(self) -> None:
        t0 = time.perf_counter()
        summary = TrainingSummary()
        try:
            spec, cspec = self.spec, self.cspec
            program = pickle.loads(spec.program)
            group = self._group()
            # from here on no coordinator of an older epoch (one whose job was lost) changes the fit
            group.broadcast(Action.CLAIM, namespace=spec.namespace, epoch=cspec.epoch)
            job = InJobWorkerJob(spec, self.abandoned, cspec.epoch)
            job.group = group  # the coordinator's credential: it posts changed programs
            loop = StepLoop(_InJobOwner(group, spec.layouts, spec.namespace, cspec.program_name, spec.seals), program,
                            cspec.config, spec.num_workers, spec.seed, spec.namespace, job,
                            Journal(ShardStore(group, spec.namespace, cspec.epoch, spec.seals)), summary,
                            cspec.checkpoints)
            if not cspec.resume:
                make_tables(group, cspec.tables, spec.namespace, program)
                summary.fixed["table_create_s"] = time.perf_counter() - t0
            stopped = loop.drive(cspec.max_steps)
            self.result = {"stopped": stopped, "summary": _summary_state(summary),
                           "program": program_state(program), "position": dataclasses.asdict(loop.position),
                           "shards": group.broadcast(Action.STATS), "progress": loop.progress.report}
        except BaseException as exc:  # noqa: BLE001 -- handed to the client through the job
            log.warning("fit %s: the coordinator stopped on %r", self.spec.namespace, exc)
            if isinstance(exc, (StepFailedError, ShardUnavailableError)):
                # a lost task or shard: the job must fail (this task raises it at its next poll) and
                # the client relaunch it; the tables and the coordinator's state stay for that
                self.failed = exc
            else:  # the fit ends here: its error goes to the client as the job's result
                self.result = {"error": _picklable(exc), "summary": _summary_state(summary)}
                try:  # workers waiting for a command read "closed" and end their tasks
                    self.spec.group.broadcast(Action.DROP_TABLES, prefix=self.spec.namespace + "/",
                                              epoch=self.cspec.epoch)  # refused once a successor claimed the fit
                except Exception:  # noqa: BLE001 -- the job fails instead
                    pass
        finally:
            self._beats.set()

    def check(self) -> None:
        """Raise the coordinator's failure in the task (which then fails the job), if it had one."""
        if self.failed is not None:
            raise StepFailedError(f"the fit's coordinator stopped: {self.failed}") from self.failed

    def result_rows(self) -> Iterator[bytes]:
        """Wait for the coordinator; its result, pickled, in chunks (the job's rows)."""
        from pyspark import cloudpickle

        while self._thread.is_alive():
            self._thread.join(1.0)
        self.check()
        blob = cloudpickle.dumps(self.result)
        for i in range(0, max(1, len(blob)), RESULT_CHUNK_BYTES):
            yield blob[i:i + RESULT_CHUNK_BYTES]


def progress_key(namespace: str) -> str:
    return f"{namespace}/progress"


class SharedProgress(ProgressReporter):
    """The coordinator's progress: a log line on the executor, and the latest report left on
    shard 0 for the client's poll (:class:`ProgressPoll`)."""

    def __init__(self, name: str, group: ShardGroup, namespace: str, seals):
        super().__init__(name, "log")
        self.group, self.namespace, self.seq, self.seals = group, namespace, 0, seals
        self.report: Optional[Dict[str, Any]] = None

    def update(self, done, total, unit="iterations", **shown):
        line = super().update(done, total, unit, **shown)
        self.seq += 1
        report = self.report = {"seq": self.seq, "done": done, "total": total, "unit": unit, "shown": shown}
        try:
            key = progress_key(self.namespace)
            self.group.client(0).put_blob(key, self.seals.seal(DRIVER, key, pickle.dumps(report)))
        except Exception as exc:  # noqa: BLE001 -- progress never fails a fit
            log.debug("progress not shared: %s", exc)
        return line


def settle_for_relaunch(group: ShardGroup, namespace: str, epoch: int, seals, hold: float = 0.0) -> str:
    """Before the job is relaunched with a coordinator of ``epoch``: claim that epoch on every
    shard (the lost coordinator, if it still runs somewhere, can change nothing from now on) and
    close the step it left open as its journal decides (:func:`~pystrads.engine.scheduler.journal.settle`).
    The shards then wait ``hold`` seconds for a heartbeat, whatever their lease: nobody beats
    until the relaunched job's coordinator runs, and the job may wait that long for its task
    slots.  Returns what it did."""
    group.broadcast(Action.HEARTBEAT, hold=float(hold))
    entry = Journal(ShardStore(group, namespace, epoch, seals)).read()
    return settle(group, namespace, epoch, entry)


def fit_error(group: ShardGroup, namespace: str) -> Optional[str]:
    """The program error a worker of the fit reported (its hook, worker and traceback), or None."""
    return group.client(0).action(Action.FIT_ERROR, namespace=namespace).get("error")


def read_progress(group: ShardGroup, namespace: str, seals) -> Optional[Dict[str, Any]]:
    """The latest progress report of a fit's coordinator (on shard 0), or None."""
    key = progress_key(namespace)
    blob = group.client(0).get_blob(key)
    return None if blob is None else pickle.loads(seals.open(DRIVER, key, blob, f"{key!r} on shard 0"))


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


class _InJobOwner:
    """The coordinator as the step loop's owner (:class:`~pystrads.engine.scheduler.loop.LoopOwner`): the
    fit's shards, progress left on shard 0 for the client, and no recovery here -- a lost task or
    shard fails this task, so the job, and the client relaunches it."""

    def __init__(self, group: ShardGroup, layouts, namespace: str, program_name: str, seals):
        self.group, self.layouts = group, dict(layouts)
        self.namespace, self.program_name, self.seals = namespace, program_name, seals

    def recover(self, exc: BaseException) -> None:
        raise exc  # the client relaunches the job (this coordinator's task goes with it)

    def progress_reporter(self) -> ProgressReporter:
        return SharedProgress(f"{self.program_name} {self.namespace}", self.group, self.namespace, self.seals)


def _summary_state(summary: TrainingSummary) -> Dict[str, Any]:
    return {"rows": summary.rows, "iterations": summary.iterations, "fixed": summary.fixed}


def read_range(group, layout: TableLayout, start: int, stop: int) -> np.ndarray:
    """Rows ``[start, stop)`` of a fit's table, read in a Spark task for a client that cannot reach
    the shards (:class:`~pystrads.engine.driver.relay.RelayedTable`)."""
    return np.array(group.table(layout).read(range(start, stop)))
