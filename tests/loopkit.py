"""A fit's step loop without Spark, and faults struck in any of its phases.

:class:`ThreadJob` is the fit's job with its workers as threads of this process running the real
worker code (:func:`~pystrads.engine.executor.worker.run_worker`) against real shards served in this
process (:class:`LocalShards`); the :class:`~pystrads.engine.scheduler.loop.StepLoop` runs on it as it runs
on Spark.  :func:`run_fit` drives one fit with the scheduler on the driver (the loop recovers in
place, its journal in memory) or in the job (a coordinator that dies is replaced by a new loop of
the next epoch, which settles the open step and carries on from the journal on shard 0), with a
:class:`Faults` plan that loses a worker's task, or the coordinator, once in a named phase.
"""

from __future__ import annotations

import itertools
import pickle
import threading
from typing import Any, Callable, Dict, List, Optional

from pyspark import cloudpickle

from pystrads.config import Config
from pystrads.engine.executor import worker as worker_module
from pystrads.engine.scheduler.checkpoints import program_attributes
from pystrads.engine.scheduler.steps import WorkerJob
from pystrads.engine.scheduler.journal import Journal, MemoryStore, ShardStore, settle
from pystrads.engine.scheduler.loop import StepLoop, TrainingSummary, make_tables, plan_tables
from pystrads.engine.scheduler.progress import ProgressReporter
from pystrads.engine.scheduler.sealing import Seals
from pystrads.engine.executor.worker import WorkerSpec, program_hash, run_worker
from pystrads.errors import ShardUnavailableError, StepFailedError
from pystrads.ps.client import ShardGroup, ShardInfo
from pystrads.ps.partition import TableLayout
from pystrads.ps.protocol import Action
from pystrads.ps.server import ShardServer

TOKEN = "loopkit"
_IDENTITY = threading.local()
_TASK_IDS = itertools.count(1)


class LostTask(ConnectionError):
    """A worker's task is lost (its executor died): not the program's error, so recovered."""


class CoordinatorDied(BaseException):
    """The process that ran the loop in the job died (nothing of it runs on)."""


def _identity():
    return _IDENTITY.partition, _IDENTITY.task, 0


class LocalShards:
    """``count`` shards served in this process, and the fit's tables laid out over them."""

    def __init__(self, count: int = 2):
        self.servers = [ShardServer("grpc://127.0.0.1:0", TOKEN, 1e9, f"s{i}") for i in range(count)]
        self.group = ShardGroup([ShardInfo("127.0.0.1", s.port, 0, "local", s.shard_id) for s in self.servers],
                                TOKEN, admin_token=None)

    def create(self, program, namespace: str) -> Dict[str, TableLayout]:
        layouts, creations = plan_tables(program, namespace, len(self.servers), 0.25)
        make_tables(self.group, creations, namespace, program)
        return layouts

    def read(self, layouts) -> Dict[str, Any]:
        return {name: self.group.table(layout).read() for name, layout in layouts.items()}

    def close(self) -> None:
        for s in self.servers:
            s.shutdown()


class ThreadJob(WorkerJob):
    """The fit's job with its workers as threads of this process (see the module docstring)."""

    def __init__(self, records: List[List[Any]], seed: int, namespace: str, epoch: int = 1, timeout: float = 20.0):
        super().__init__(len(records), seed, namespace, timeout, None, 1, epoch)
        self.records = records
        self._threads: List[threading.Thread] = []
        self._errors: List[BaseException] = []
        self._cancelled = threading.Event()
        self._lost: Optional[str] = None

    def launch(self, program, group, layouts, fingerprint=False, new_shards=False, coordinator=None) -> float:
        self.cancel()
        self.group = group
        self.launches += 1
        blob = cloudpickle.dumps(program)
        digest = program_hash(blob)
        spec = WorkerSpec(blob, digest, group, dict(layouts), self.num_workers, self.seed, self.timeout,
                          self.namespace, fingerprint, False, None, 1, None, self.seals, self.launches)
        self._posted_program = None if new_shards else digest
        self._fingerprints = None
        cancelled, errors = threading.Event(), []
        self._cancelled, self._errors, self._lost = cancelled, errors, None

        def check():
            if cancelled.is_set():
                raise LostTask("the job was cancelled")

        def run(p: int, task: int) -> None:
            _IDENTITY.partition, _IDENTITY.task = p, task
            try:
                for _ in run_worker(spec, iter(self.records[p]), check):
                    pass
            except BaseException as exc:  # noqa: BLE001 -- the job's failure
                errors.append(exc)

        self._threads = [threading.Thread(target=run, args=(p, next(_TASK_IDS)), daemon=True)
                         for p in range(self.num_workers)]
        for t in self._threads:
            t.start()
        return 0.0

    def lose(self, why: str) -> None:
        """The job is lost (an executor died): its tasks end, the loop's next wait fails."""
        self._lost = why
        self._cancelled.set()

    def error(self) -> Optional[BaseException]:
        if self._lost:
            return StepFailedError(f"the fit's job failed: {self._lost}")
        if self._errors:
            return StepFailedError(f"the fit's job failed: {self._errors[0]!r}")
        return None

    def cancel(self) -> None:
        self._cancelled.set()
        for t in self._threads:
            t.join(30)
        self._threads = []

    def finish(self, last_step: int) -> None:
        self.group.client(0).action("post", namespace=self.namespace, command=self.finish_command(last_step),
                                    epoch=self.epoch)
        for t in self._threads:
            t.join(30)


class Faults:
    """Where a fit is struck, once: ``phase`` is ``load``, ``init``, ``rounds`` (a worker's task
    lost: raised in the program's hook on worker 1), ``done`` (worker 1's task lost once the poll
    that says its part of ``at_step`` is done -- with its state snapshot when small -- reached shard
    0, before it read the answer), ``after_step`` (the job lost, or with the
    scheduler in the job the coordinator dead, in ``after_step`` of ``at_step`` once it wrote its
    table), ``checkpoint`` (while the checkpoint after ``at_step`` is written), ``commit`` (after
    the journal entry of ``at_step`` was written, before its commit) or ``commit_partly`` (the
    commit that also opens the next step reached shard 0 only)."""

    def __init__(self, phase: Optional[str], at_step: int = 2, location: str = "driver"):
        self.phase, self.at_step, self.location = phase, at_step, location
        self.struck = threading.Event()

    def due(self, phase: str, step: int) -> bool:
        """The plan strikes ``phase`` at ``step`` (not struck yet)."""
        return phase == self.phase and step == self.at_step and not self.struck.is_set()

    def strike(self, phase: str, step: int = -1, worker: int = 1, job: Optional[ThreadJob] = None) -> None:
        if phase != self.phase or self.struck.is_set() or worker != 1:
            return
        if phase in ("after_step", "checkpoint", "commit", "commit_partly") and step != self.at_step:
            return
        if phase in ("rounds", "done") and step != self.at_step:
            return
        self.struck.set()
        if phase in ("load", "init", "rounds", "done"):
            raise LostTask(f"worker 1's task is lost in {phase}")
        if self.location == "job":
            raise CoordinatorDied(f"the coordinator died in {phase} of step {step}")
        if phase == "after_step":
            job.lose("an executor was lost while after_step ran")
        else:
            raise ShardUnavailableError(f"a shard stopped answering in {phase} of step {step}")


def struck_program(base_cls):
    """``base_cls`` with the plan's faults in its hooks (``self.faults`` / ``self.job`` set by
    :func:`run_fit`; they never travel with the program: its copies -- the workers', the shards',
    a relaunched loop's -- find them in this module).  The class is this module's attribute
    ``Struck<base>``, so that pickles name it."""

    class Struck(base_cls):
        checkpoint_ignore = tuple(getattr(base_cls, "checkpoint_ignore", ())) + ("faults", "job")

        def load(self, ctx, records):
            self.faults.strike("load", worker=ctx.worker)
            return super().load(ctx, records)

        def init_state(self, ctx, data):
            self.faults.strike("init", worker=ctx.worker)
            return super().init_state(ctx, data)

        def push(self, ctx, data, state, work):
            if ctx.local_round == 0:
                self.faults.strike("rounds", step=ctx.step, worker=ctx.worker)
            return super().push(ctx, data, state, work)

        def after_step(self, ctx, metrics):
            super().after_step(ctx, metrics)
            self.faults.strike("after_step", step=ctx.step, job=self.job[0])

        def __getstate__(self):
            state = dict(self.__dict__)
            state.pop("faults", None)
            state.pop("job", None)
            return state

        def __setstate__(self, state):
            self.__dict__.update(state)
            self.faults = _SHARED["faults"]
            self.job = _SHARED["job"]

    Struck.__name__ = Struck.__qualname__ = f"Struck{base_cls.__name__}"
    Struck.__module__ = __name__
    globals()[Struck.__name__] = Struck
    return Struck


_SHARED: Dict[str, Any] = {}


class _Owner:
    """The loop's owner for the scheduler on the driver: recovery relaunches the job in place."""

    def __init__(self, shards: LocalShards, layouts, program, job: ThreadJob, max_recoveries: int = 3):
        self.group, self.layouts = shards.group, layouts
        self.program, self.job = program, job
        self.recoveries, self.max_recoveries = 0, max_recoveries
        self.initial = program_attributes(program)
        self.loop: Optional[StepLoop] = None

    def recover(self, exc: BaseException) -> None:
        self.recoveries += 1
        if self.recoveries > self.max_recoveries:
            raise exc
        self.job.cancel()
        self.job.launch(self.program, self.group, self.layouts)
        if self.loop.journal.read() is None:
            vars(self.program).update(pickle.loads(self.initial))
            self.loop.summary.rows.clear()
            self.loop.summary.iterations.clear()

    def progress_reporter(self) -> ProgressReporter:
        return ProgressReporter("loopkit", "off")


class _JobOwner(_Owner):
    """The loop's owner for the scheduler in the job: no recovery in place (the job fails)."""

    def recover(self, exc: BaseException) -> None:
        raise exc


class Result:
    def __init__(self, tables, program, summary, stopped, job_launches, epochs):
        self.tables, self.program, self.summary, self.stopped = tables, program, summary, stopped
        self.job_launches, self.epochs = job_launches, epochs


def run_fit(program, records: List[List[Any]], config: Optional[Dict[str, Any]] = None,
            faults: Optional[Faults] = None, location: str = "driver", seed: int = 1,
            checkpoint_dir: Optional[str] = None, max_relaunches: int = 3, shards: int = 2,
            max_steps: Optional[int] = None) -> Result:
    """One fit of ``program`` over ``records`` (one list per worker) on ``shards`` local shards
    (see the module docstring), at most ``max_steps`` steps; ``faults`` strikes it once."""
    from pystrads.engine.scheduler.checkpoints import Checkpointer

    worker_module._task_identity = _identity  # this process's worker threads tell themselves apart so
    _strike_done(worker_module._Worker)
    faults = faults or Faults(None, location=location)
    faults.location = location
    cfg = Config.resolve(overrides=dict({"progress": "off", "step.targetSeconds": 3600.0, "step.maxRounds": 4,
                                         "scheduler.planAhead": True}, **(config or {})))
    if checkpoint_dir:
        cfg = Config.resolve(overrides=dict(dict(cfg), **{"checkpoint.dir": checkpoint_dir,
                                                          "checkpoint.interval": 1}))
    namespace = "fit-loopkit"
    shards = LocalShards(shards)
    blob = cloudpickle.dumps(program)
    job_ref: List[Optional[ThreadJob]] = [None]
    _SHARED.update(faults=faults, job=job_ref)
    program.faults, program.job = faults, job_ref
    try:
        layouts = shards.create(program, namespace)
        checkpoints = Checkpointer.of(cfg, None, program, len(records), seed)
        jobs, epoch = [], 1
        seals = Seals.new()  # the fit's: a relaunched coordinator reads the journal its predecessor sealed
        while True:
            if epoch > 1:  # a relaunch after the coordinator died: a new program object, as unpickled
                program = pickle.loads(blob)
                program.faults, program.job = faults, job_ref
            job = ThreadJob(records, seed, namespace, epoch)
            job.seals = seals
            job.launches = jobs[-1].launches if jobs else 0  # the client's launches go on counting, as the engine's do
            job_ref[0] = job
            jobs.append(job)
            owner = (_Owner if location == "driver" else _JobOwner)(shards, layouts, program, job)
            journal = Journal(MemoryStore() if location == "driver" else ShardStore(shards.group, namespace, epoch, seals))
            if location == "job":
                shards.group.broadcast("claim", namespace=namespace, epoch=epoch)
            loop = owner.loop = StepLoop(owner, program, cfg, len(records), seed, namespace, job, journal,
                                         TrainingSummary(), checkpoints)
            _strike_commit_and_checkpoint(loop, job, faults)
            job.launch(program, shards.group, layouts)
            try:
                stopped = loop.drive(max_steps)
                break
            except (CoordinatorDied, StepFailedError, ShardUnavailableError):
                if location != "job" or epoch > max_relaunches:
                    raise
                epoch += 1  # the client: claim the next epoch, settle the open step by the journal, relaunch
                settle(shards.group, namespace, epoch, Journal(ShardStore(shards.group, namespace, epoch, seals)).read())
                job.cancel()
        tables = shards.read(layouts)
        return Result(tables, program, loop.summary, stopped, jobs[-1].launches, epoch)
    finally:
        shards.close()


def _strike_done(worker_cls) -> None:
    """The ``done`` fault: the worker's poll saying its step is done (and carrying its small
    snapshot) is carried out on shard 0, then the task is lost before it reads the answer."""
    if getattr(worker_cls.next_command, "_struck", False):
        return
    plain = worker_cls.next_command

    def next_command(self, done_step, done=None, snapshot=None):
        faults = _SHARED.get("faults")
        if done is not None and faults is not None and self.worker == 1 and faults.due("done", done_step):
            extra = {} if snapshot is None else {"snapshot": snapshot}
            self.group.client(0).action(Action.NEXT, namespace=self.spec.namespace, worker=self.worker, task=self.task,
                                        launch=self.spec.launch, done_step=done_step, program_hash=self.program_hash,
                                        timeout=0.0, done=done, **extra)
            faults.strike("done", step=done_step, worker=self.worker)
        return plain(self, done_step, done, snapshot)

    next_command._struck = True
    worker_cls.next_command = next_command


def _strike_commit_and_checkpoint(loop: StepLoop, job: ThreadJob, faults: Faults) -> None:
    """Faults in the job's commit (after the journal entry was written) and checkpoint writes."""
    commit, save = job.commit_step, job.save_states

    def commit_step(step: int, next_offset=None) -> None:
        faults.strike("commit", step=step, job=job)
        if next_offset is not None and faults.due("commit_partly", step):
            # the commit that also opens the next step reaches shard 0 only: the journalled step
            # stays open on the other shards, the next one is open on shard 0
            job.group.client(0).action(Action.COMMIT_STEP, step=step, namespace=job.namespace, epoch=job.epoch,
                                       open_next={"step": step + 1, "num_workers": job.num_workers,
                                                  "round_offset": int(next_offset)})
            faults.strike("commit_partly", step=step, job=job)
        commit(step, next_offset)

    def save_states(target: str, step: int):
        faults.strike("checkpoint", step=step, job=job)
        return save(target, step)

    job.commit_step, job.save_states = commit_step, save_states
