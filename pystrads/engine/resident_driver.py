"""The driver's side of the resident runtime (a mixin of :class:`~pystrads.engine.driver.Engine`).

One barrier job per fit (:class:`_ResidentJob`, collected in a driver thread)
whose tasks are the workers (:mod:`pystrads.engine.resident`): the driver
launches it, waits for every worker's hello on shard 0, posts each step's
command and gathers the answers, watches for a job that waits for task
slots, and at the end waits for the workers' exports (left on the shards, fetched only
when asked for) and collects the states kept for ``map_states``.  Checkpoints of the resident workers' states go through the
shards' blob store.
"""

from __future__ import annotations

import base64
import logging
import pickle
import secrets
import threading
import time
from typing import Any, Dict, List, Optional

from ..errors import PystradsError, StepFailedError
from ..ps import storage
from .preflight import to_workers
from .preflight import _python_cause
from .program import Schedule, StepMetrics
from .resident import (ResidentSpec, program_hash, run_resident, run_resident_arrow, states_prefix,
                       summary_key)
from .worker import run_summary

log = logging.getLogger("pystrads.engine.driver")

#: after this long without every worker's task running, the driver checks for (and warns about)
#: a barrier job waiting for task slots
SLOT_WAIT_WARN_SECONDS = 30.0


class ResidentMixin:
    """The resident runtime's steps of :class:`~pystrads.engine.driver.Engine`."""

    def _launch_job(self) -> None:
        """Start the fit's one barrier job (in a driver thread): every worker's task loads its
        partition, says hello on shard 0 and then carries out the posted commands."""
        from pyspark import StorageLevel, cloudpickle

        t0 = time.perf_counter()
        self._cancel_job()
        blob = cloudpickle.dumps(self.program)
        digest = program_hash(blob)
        spec = ResidentSpec(blob, digest, self.group, dict(self.layouts), self.num_workers, self.seed,
                            self.config["round.timeoutSeconds"], self.namespace, bool(self._checkpoint_dir),
                            self.keep_states, self.export)
        if self.frame is not None:
            frame = self.frame
            if not self.prepartitioned and not (self.sc is not None  # classic: partitions known without a job
                                                and frame.rdd.getNumPartitions() == self.num_workers):
                frame = frame.repartition(self.num_workers)
            # a barrier result stage: Spark does not retry it, the driver relaunches the job (from
            # the snapshots) as it does for any failed resident job
            decode, decode_batch = self.decode, self.decode_batch
            out = frame.mapInArrow(lambda batches: run_resident_arrow(spec, batches, decode, decode_batch),
                                   "unused binary", barrier=True)
        else:
            rdd = to_workers(self.rdd, self.num_workers)
            out = rdd.barrier().mapPartitions(lambda it: run_resident(spec, it))
            if self.keep_states:  # the finished tasks' (data, state), read by map_states
                out.persist(StorageLevel.MEMORY_AND_DISK)
        self._posted_program = digest
        self._job = _ResidentJob(self, out)
        self.job_groups.append(self._job.group_id)
        self._job.start()
        self.summary.fixed["launch_s"] = self.summary.fixed.get("launch_s", 0.0) + time.perf_counter() - t0

    def _cancel_job(self) -> None:
        job, self._job = self._job, None
        if job is not None:
            job.cancel()


    def _job_error(self) -> Optional[BaseException]:
        """Why the fit's job cannot go on (it ended, or its tasks never got task slots), or None."""
        job = self._job
        if job is None:
            return StepFailedError("the fit's barrier job is not running")
        if not job.thread.is_alive():
            return job.error
        return self._slot_wait_error(job)

    def _slot_wait_error(self, job: "_ResidentJob") -> Optional[BaseException]:
        """A barrier job runs only when all its tasks get slots at once; while another job holds
        them it waits.  Warn every 30 s, and fail after ``round.timeoutSeconds`` instead of waiting
        for ever."""
        if job.started:
            return None
        waited = time.monotonic() - job.t_launch
        if waited < SLOT_WAIT_WARN_SECONDS:
            return None
        running = job.running_tasks()
        if running >= self.num_workers:
            job.started = True
            return None
        message = (f"the fit's barrier job has waited {waited:.0f} s for task slots: {running} of its "
                   f"{self.num_workers} tasks run (a barrier stage starts only when every task has a slot). "
                   f"Another Spark job holds them (a concurrent fit or job of this application?); free them, "
                   f"give the application at least {self.num_workers} task slots, or lower numWorkers")
        if waited > self.config["round.timeoutSeconds"]:
            self._cancel_job()
            return StepFailedError(message + " (gave up after spark.pystrads.round.timeoutSeconds)")
        if waited - job.warned >= SLOT_WAIT_WARN_SECONDS:
            job.warned = waited
            log.warning("fit %s: %s", self.namespace, message)
        return None

    def _hellos(self) -> Dict[int, Dict[str, Any]]:
        """Wait until every worker's task said hello (data loaded); their hellos by worker."""
        while True:
            answer = self.group.client(0).action("wait_hellos", namespace=self.namespace,
                                                 num_workers=self.num_workers, timeout=1.0)
            if answer["complete"]:
                return {int(w): h for w, h in answer["hellos"].items()}
            error = self._job_error()
            if error is not None:
                raise StepFailedError(f"the fit's barrier job ended before every worker loaded its data. "
                                      f"Cause: {_python_cause(error)}") from error

    def _check_data(self) -> None:
        """Hand every worker's ``data_summary`` to the program's ``check_data`` (driver side,
        before the init step): from the shards' blob store once every resident worker said
        hello, or by a job over the loaded data (steps runtime)."""
        if not self.program.checks_data():
            return
        t0 = time.perf_counter()
        if self.resident:
            from ..ps.client import fan_out

            self._hellos()
            shards = len(self.group.shards)
            blobs = fan_out([lambda w=w: self.group.client(w % shards).get_blob(summary_key(self.namespace, w))
                             for w in range(self.num_workers)])
            if any(b is None for b in blobs):
                raise StepFailedError(f"workers {[w for w, b in enumerate(blobs) if b is None]} said hello without "
                                      "leaving their data summary on the shards (was a shard restarted?)")
        else:
            spec = self._spec(0, None)
            blobs = self._data_rdd.mapPartitionsWithIndex(lambda index, datas: run_summary(spec, index, datas)) \
                .collect()
        self.program.check_data([pickle.loads(b) for b in blobs])
        self.summary.fixed["check_data_s"] = time.perf_counter() - t0  # (resident: the loads' wait included)

    def _command(self, step: int, schedule: Optional[Schedule]) -> Dict[str, Any]:
        from pyspark import cloudpickle

        blob = cloudpickle.dumps(self.program)
        digest = program_hash(blob)
        command: Dict[str, Any] = {"kind": "step", "step": step, "round_offset": self._rounds_done,
                                   "staleness": int(getattr(self.program, "staleness", 0)),
                                   "program_hash": digest}
        if digest != self._posted_program:
            command["program"] = base64.b64encode(blob).decode()
        if schedule is None:
            command["init"] = True
        else:
            command["schedule"] = base64.b64encode(cloudpickle.dumps(schedule)).decode()
        return command

    def _run_resident_step(self, step: int, command: Dict[str, Any]) -> Dict[str, Any]:
        """Open the step on every shard (shard 0 last, with the command), wait until every
        worker finished it, then commit (or, on failure, roll back and raise)."""
        group = self.group
        body = dict(step=step, num_workers=self.num_workers, namespace=self.namespace, round_offset=self._rounds_done)
        try:
            from ..ps.client import fan_out

            fan_out([lambda i=i: group.client(i).action("begin_step", **body) for i in range(1, len(group.shards))])
            group.client(0).action("begin_step", command=command, **body)
            if "program" in command:
                self._posted_program = command["program_hash"]
            while True:
                answer = group.client(0).action("wait_step", step=step, timeout=1.0)
                if answer["done"]:
                    break
                if answer.get("error"):
                    raise StepFailedError(answer["error"])
                error = self._job_error()
                if error is not None:
                    raise error
        except BaseException as exc:
            try:
                group.broadcast("abort_step", step=step)
            except PystradsError as abort_exc:
                log.warning("step %d: could not roll back every shard: %s", step, abort_exc)
            if isinstance(exc, KeyboardInterrupt):
                self._cancel_job()
                raise
            raise StepFailedError(
                f"step {step} failed; the model tables were rolled back to their state before the step. "
                f"Cause: {exc if isinstance(exc, PystradsError) else _python_cause(exc)}") from exc
        counters = group.broadcast("commit_step", step=step)
        self._last_counters = counters
        return answer

    def _resident_metrics(self, answer: Dict[str, Any]) -> StepMetrics:
        if getattr(self.program, "shard_metrics_every", 0):
            return self._collect_metrics()
        merged = {int(k): v for k, v in answer.get("rounds", {}).items()}
        n = max(merged, default=-1) + 1
        return StepMetrics([merged.get(i, {}) for i in range(n)])

    def _traffic(self) -> Dict[str, int]:
        """Shards' traffic since the previous call (from the counters commit_step returned)."""
        total = {"bytes_in": 0, "bytes_out": 0, "requests": 0}
        for c in getattr(self, "_last_counters", None) or []:
            for k in total:
                total[k] += c.get(k, 0)
        before, self._counters = self._counters or total, total
        return {k: total[k] - before[k] for k in total}

    def _resident_init(self) -> None:
        t0 = time.perf_counter()
        self._step, self._rounds_done, self._rounds_hint = 0, 0, self.num_workers
        answer = self._run_job(0, self._command(0, None))
        metrics = self._resident_metrics(answer)
        self._traffic()
        loads = [h.get("load_s") or 0.0 for h in self._hellos().values()]
        self.summary.fixed["load_s"] = float(max(loads, default=0.0))  # inside the job, before the init step
        self.summary.fixed["init_s"] = time.perf_counter() - t0
        self.summary.fixed["init_compute_s"] = metrics.total("_compute_s") / self.num_workers
        self._step = 1

    def _resident_finish(self) -> None:
        """Tell the tasks the fit is over; they hand their (data, state) to Spark's cache
        (for :meth:`map_states`) and the job ends."""
        t0 = time.perf_counter()
        self.group.client(0).action("post", namespace=self.namespace,
                                    command={"kind": "finish", "step": self._step - 1})
        job = self._job
        if self.export is not None:  # left on the shards until asked for (fetch_exports, engine.frames)
            self._wait_exports(job)
        if not self.keep_states:
            # nothing to hand over: the tasks end on their own (~0.3 s of Spark's job teardown the
            # fit need not wait for; a failure then is only logged)
            job.detached = True
            self._job = None
            self.summary.fixed["finish_s"] = time.perf_counter() - t0
            return
        job.thread.join()
        if job.error is not None:
            raise StepFailedError(f"the fit's barrier job failed while finishing: {_python_cause(job.error)}") \
                from job.error
        self._result_rdd = job.rdd
        self._job = None
        self.summary.fixed["finish_s"] = time.perf_counter() - t0

    def _wait_exports(self, job) -> None:
        """Wait until every worker has left its ``export`` result on its shard."""
        from .resident import export_key

        S = len(self.group.shards)
        keys = {w: export_key(self.namespace, w) for w in range(self.num_workers)}
        while True:
            missing = sum((self.group.client(i).action(
                "wait_blobs", keys=[k for w, k in keys.items() if w % S == i], timeout=1.0)["missing"]
                for i in range(S)), [])
            if not missing:
                break
            if not job.thread.is_alive():
                raise StepFailedError(f"the fit's job ended before every worker exported its results (missing "
                                      f"{missing}): {_python_cause(job.error) if job.error else 'no error'}")

    def fetch_exports(self) -> List[Any]:
        """Each worker's ``export`` result on the driver, read once from the shards (resident
        runtime) or kept from the states (the first runtime)."""
        from ..ps.client import fan_out
        from .resident import export_key

        if self.exports is None and self.resident and self.export is not None and self.group is not None:
            S = len(self.group.shards)
            blobs = fan_out([lambda w=w: self.group.client(w % S).get_blob(export_key(self.namespace, w))
                             for w in range(self.num_workers)])
            if any(b is None for b in blobs):
                raise PystradsError("the workers' exports are gone from the shards (was the fit released?)")
            self.exports = [pickle.loads(b) for b in blobs]
        if self.exports is None:
            raise PystradsError("no exports: make the Engine with export=fn(worker, data, state) (resident runtime)")
        return self.exports

    def _resident_checkpoint(self, target: str) -> int:
        """Shards write their tables and the workers' state snapshots of the last step."""
        answers = self.group.broadcast("snapshot", prefix=self.namespace + "/", dir=storage.join(target, "tables"),
                                       states_prefix=states_prefix(self.namespace), states_step=self._step - 1,
                                       states_dir=target)
        saved = sorted(w for a in answers for w in a.get("states", []))
        if saved != list(range(self.num_workers)):
            raise StepFailedError(f"checkpoint {target}: states of workers {saved} were saved, expected "
                                  f"0..{self.num_workers - 1}")
        if self._data_fingerprints is None:
            hellos = self._hellos()
            self._data_fingerprints = [hellos[w]["fingerprint"] for w in range(self.num_workers)]
        return sum(a["bytes"] for a in answers)

    def _resident_resume(self, source: str, step: int) -> bool:
        from ..ps.client import fan_out

        hellos = self._hellos()
        current = [hellos[w]["fingerprint"] for w in range(self.num_workers)]
        return current, (lambda: fan_out([
            lambda i=i: self.group.client(i).action(
                "restore", prefix=self.namespace + "/", dir=storage.join(source, "tables"),
                states_prefix=states_prefix(self.namespace), states_step=step, states_dir=source,
                states_workers=[w for w in range(self.num_workers) if w % len(self.group.shards) == i])
            for i in range(len(self.group.shards))]))


class _ResidentJob:
    """The fit's barrier job, collected in a driver thread (its own Spark job group, or job
    tag under Spark Connect, so that it can be cancelled).  ``rdd``: the job's RDD or DataFrame."""

    def __init__(self, engine, rdd):
        self.engine = engine
        self.rdd = rdd
        self.group_id = f"pystrads-{engine.namespace}-{secrets.token_hex(3)}"
        self.error: Optional[BaseException] = None
        self.thread = None
        self.detached = False  # the fit is over and no longer waits for this job
        self.t_launch = time.monotonic()
        self.started = False  # every task was seen running (checked only while a wait lasts)
        self.warned = 0.0

    def running_tasks(self) -> int:
        """The most tasks running at once in any stage of this job (its barrier stage's, once it runs)."""
        engine = self.engine
        if engine.sc is None:  # Spark Connect: no status tracker; nothing to warn about
            return engine.num_workers
        try:
            tracker = engine.sc.statusTracker()
            most = 0
            for job_id in tracker.getJobIdsForGroup(self.group_id):
                info = tracker.getJobInfo(job_id)
                for stage_id in (info.stageIds if info else []):
                    stage = tracker.getStageInfo(stage_id)
                    if stage is not None:
                        most = max(most, stage.numActiveTasks)
            return most
        except Exception:  # noqa: BLE001 -- no status (the SparkContext is gone): do not fail on that
            return engine.num_workers

    def start(self) -> None:
        engine = self.engine
        connect = engine.sc is None

        def run():
            try:
                if connect:  # job tags are per thread and session; interruptTag cancels the job
                    engine.spark.spark.addTag(self.group_id)
                else:
                    engine.sc.setJobGroup(self.group_id, f"pystrads fit {engine.namespace}: resident workers",
                                          interruptOnCancel=True)
                if engine.frame is not None:
                    self.rdd.collect()  # a DataFrame whose tasks return no rows
                else:
                    engine._materialize(self.rdd)
            except BaseException as exc:  # noqa: BLE001 -- reported to the driver's loop
                self.error = exc
                if self.detached:
                    log.warning("fit %s: its job failed after the fit had finished: %s", engine.namespace,
                                _python_cause(exc))
            finally:
                if connect:
                    try:
                        engine.spark.spark.removeTag(self.group_id)
                    except Exception:  # noqa: BLE001 -- the session may be gone
                        pass

        if connect:
            self.thread = threading.Thread(target=run, name=f"pystrads-job-{engine.namespace}", daemon=True)
        else:
            from pyspark import InheritableThread

            self.thread = InheritableThread(target=run, name=f"pystrads-job-{engine.namespace}", daemon=True)
        self.thread.start()

    def cancel(self) -> None:
        engine = self.engine
        if self.thread is not None and self.thread.is_alive():
            try:
                if engine.sc is None:
                    engine.spark.spark.interruptTag(self.group_id)
                else:
                    engine.sc.cancelJobGroup(self.group_id)
            except Exception:  # noqa: BLE001 -- the SparkContext may be gone
                pass
            self.thread.join(timeout=60)
        if engine.frame is None:
            try:
                self.rdd.unpersist()
            except Exception:  # noqa: BLE001
                pass
