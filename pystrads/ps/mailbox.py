"""A shard's mailbox for the workers (one long task per worker for a whole fit).

:class:`Mailbox` serves them (composed by :class:`~pystrads.ps.server.ShardServer`, beside
its :class:`~pystrads.ps.steps.StepFences`, on its :class:`~pystrads.ps.state.ShardState`): per fit namespace, the command the driver posted last
(``post``, or with ``begin_step``), the workers' ``hello`` (a newer task id
retires the worker's older ones, a newer launch of the fit's job every task of
the older launches), ``next`` (a worker waits for a command it has not carried
out), and the driver's waits ``wait_hellos`` and ``wait_blobs``.
"""

from __future__ import annotations

import base64
import binascii
import time
from typing import TYPE_CHECKING, Any, Dict

import pyarrow.flight as flight

from .protocol import Blob
from .request import _Request
from .state import in_fit
from .steps import namespace_of

if TYPE_CHECKING:
    from .steps import StepFences
    from .state import ShardState


class Mailbox:
    """The resident workers' commands and hellos, per fit namespace: the command the driver
    posted last (with the fit's program, kept for a restarted task) and the workers' hellos.
    Its methods named ``action_<name>`` serve the shard's actions of that name; it reads the
    fits' steps, epochs, task ids and errors from ``fences``."""

    def __init__(self, state: "ShardState", fences: "StepFences"):
        self.state = state
        self.fences = fences
        self.boxes: Dict[str, Dict[str, Any]] = {}
        self.hellos: Dict[str, Dict[int, Dict[str, Any]]] = {}
        # per fit namespace, the newest launch of its job a hello or a command said: the tasks of
        # an older launch are zombies (Spark kills a cancelled job's Python workers only after a while)
        self.launches: Dict[str, int] = {}

    def forget_fit(self, fit: str) -> None:
        """With the state's ``cond`` held: the fit ``fit`` ended; its boxes and hellos go."""
        for ns in [n for n in list(self.boxes) + list(self.hellos) + list(self.launches) if in_fit(n, fit)]:
            self.boxes.pop(ns, None)
            self.hellos.pop(ns, None)
            self.launches.pop(ns, None)

    def _keep_snapshot(self, fence: _Request, snapshot: _Request, blob: bytes) -> None:
        """With the state's ``cond`` held: keep a worker's state snapshot that rode its ``next``
        (fenced like the step's writes: only the worker's current task may leave it)."""
        key = snapshot.str("key")
        self.fences.check_fence(fence, namespace=namespace_of(key))
        self.state.drop_series(snapshot.get("drop_prefix"), snapshot.get("keep_after"))
        self.state.put_blob(key, Blob([blob]))
        self.state.count(bytes_in=len(blob))

    def action_post(self, req):
        """The driver leaves a command for a fit's workers (``begin_step`` can carry
        one too, so a step's schedule costs no extra call); ``wait_step``: then wait for
        that step as :meth:`StepFences.action_wait_step` does (up to ``timeout``) and answer
        as it does."""
        with self.state.cond:
            self.fences.check_epoch(req.str("namespace"), req.get("epoch"), "a post")
            self.post(req.str("namespace"), req.dict("command"))
        if req.get("wait_step") is None:
            return {}
        return self.fences.action_wait_step(_Request(namespace=req.str("namespace"), step=req.int("wait_step"),
                                                     timeout=req.num("timeout", 1.0)))

    def post(self, namespace: str, command: Dict[str, Any]) -> None:
        """Leave ``command`` for fit ``namespace``'s workers (its ``program``, when it carries
        one, is kept for a restarted task) and wake those waiting in ``next``."""
        with self.state.cond:
            box = self.boxes.setdefault(namespace, {"seq": 0})
            program = command.get("program")
            if program is not None:  # kept: a restarted task asks for it without knowing its hash
                box["program"], box["program_hash"] = program, command.get("program_hash")
                box["program_seal"] = command.get("program_seal")
            box["seq"] += 1
            box["command"] = {k: v for k, v in command.items() if k not in ("program", "program_seal")}
            self._see_launch(namespace, command.get("launch"))
            self.state.cond.notify_all()

    def _see_launch(self, namespace: str, launch: Any) -> None:
        """With the state's ``cond`` held: a hello or a command of ``launch``; a newer launch
        than any before forgets the older launch's hellos."""
        if isinstance(launch, int) and launch > self.launches.get(namespace, 0):
            self.launches[namespace] = launch
            self.hellos.pop(namespace, None)

    def _refuse_older_launch(self, namespace: str, worker: int, task: int, launch: int) -> None:
        newest = self.launches.get(namespace, 0)
        if launch < newest:
            raise flight.FlightServerError(
                f"shard {self.state.shard_id}: task {task} of worker {worker} belongs to launch {launch} of the "
                f"fit's job, which launch {newest} replaced; refusing a zombie task")

    def action_hello(self, req):
        """A worker's task started (a newer task id retires the worker's older ones, a newer
        ``launch`` of the job every task of the older launches)."""
        namespace, worker, task = req.str("namespace"), req.int("worker"), req.int("task")
        launch = req.int("launch", 0)
        with self.state.cond:
            key = (namespace, worker)
            if task < self.fences.newest_task.get(key, -1):
                raise flight.FlightServerError(
                    f"shard {self.state.shard_id}: task {task} of worker {worker} is older than task "
                    f"{self.fences.newest_task[key]}; refusing a zombie task")
            self._refuse_older_launch(namespace, worker, task, launch)
            self._see_launch(namespace, launch)
            if self.fences.is_closed(namespace):
                raise flight.FlightServerError(
                    f"shard {self.state.shard_id}: fit {namespace!r} has ended (its tables were dropped); "
                    f"task {task} of worker {worker} has nothing to do")
            self.fences.newest_task[key] = task
            self.hellos.setdefault(namespace, {})[worker] = {"task": task, "launch": launch,
                                                             "fingerprint": req.get("fingerprint"),
                                                             "load_s": req.get("load_s"), "time": time.time()}
            self.state.cond.notify_all()
        return {}

    def action_wait_hellos(self, req):
        """Block until ``num_workers`` workers of a fit's ``launch`` said hello (or ``timeout``);
        their hellos."""
        namespace, n, launch = req.str("namespace"), req.int("num_workers"), req.int("launch", 0)
        deadline = time.monotonic() + req.num("timeout", 1.0)

        def of_launch():
            return {w: h for w, h in self.hellos.get(namespace, {}).items() if h["launch"] == launch}

        with self.state.cond:
            while len(of_launch()) < n and time.monotonic() < deadline and namespace not in self.fences.fit_errors:
                self.state.cond.wait(max(0.0, min(1.0, deadline - time.monotonic())))
            hellos = of_launch()
            return {"hellos": {str(w): h for w, h in hellos.items()}, "complete": len(hellos) >= n,
                    "program_error": self.fences.fit_errors.get(namespace)}

    def action_wait_blobs(self, req):
        """Block until every blob of ``keys`` is stored here (or ``timeout``); the ones still missing."""
        keys = req.get("keys")
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise flight.FlightServerError("malformed request: field 'keys' must be a list of strings")
        deadline = time.monotonic() + req.num("timeout", 1.0)
        with self.state.cond:
            while True:
                missing = [k for k in keys if k not in self.state.blobs]
                left = deadline - time.monotonic()
                if not missing or left <= 0:
                    return {"missing": missing}
                self.state.cond.wait(min(left, 1.0))

    def action_next(self, req):
        """A worker waits (up to ``timeout``) for a command it has not carried out:
        the open step when it is newer than ``done_step``, or ``finish``.  The program's bytes
        come along unless the worker already has them (``program_hash``).  Handing out a step
        enters the worker's task in it here (:meth:`StepFences.check_fence`); ``done``: the fields
        of the worker's ``step_done`` for the step it just finished, carried out first, after
        storing ``snapshot`` (a small state snapshot of that step: ``key``, the sealed bytes in
        base64 as ``blob``, ``drop_prefix`` / ``keep_after`` as a blob put has them), so that the
        step is done only with its snapshot kept, in one call."""
        namespace, worker, task = req.str("namespace"), req.int("worker"), req.int("task")
        launch, done_step = req.int("launch", 0), req.int("done_step", -1)
        deadline = time.monotonic() + req.num("timeout", 1.0)
        done = req.dict("done", None)
        snapshot = req.dict("snapshot", None)
        if snapshot is not None and done is None:
            raise flight.FlightServerError("malformed request: a snapshot rides a poll that says its step is done")
        blob = None if snapshot is None else _decoded(_Request(snapshot).str("blob"))
        with self.state.cond:
            self._refuse_older_launch(namespace, worker, task, launch)
            if done is not None:  # the worker's step_done rides its first poll for the next command
                if snapshot is not None:
                    self._keep_snapshot(_Request(done), _Request(snapshot), blob)
                self.fences.action_step_done(_Request(done))
            while True:
                if task < self.fences.newest_task.get((namespace, worker), -1):
                    raise flight.FlightServerError(
                        f"shard {self.state.shard_id}: task {task} of worker {worker} was replaced by a newer "
                        "attempt; refusing a zombie task")
                self._refuse_older_launch(namespace, worker, task, launch)  # a newer launch's command came
                if self.fences.is_closed(namespace):  # released before this worker read ``finish``
                    return {"kind": "closed"}
                box = self.boxes.get(namespace)
                command = box.get("command") if box else None
                if command is not None:
                    kind = command.get("kind")
                    st = self.fences.step_of(namespace)
                    actionable = kind == "finish" or (
                        kind == "step" and st.open and st.namespace == namespace
                        and st.step == command.get("step") and command.get("step") > done_step
                        and worker not in st.done)
                    if actionable:
                        if kind == "step":  # the task enters the step here (a newer one rolls it back)
                            self.fences.check_fence(_Request(namespace=namespace, step=st.step, worker=worker,
                                                             task=task), entering=True)
                        out = dict(command, seq=box["seq"])
                        if box.get("program_hash") != req.get("program_hash"):
                            out["program"], out["program_hash"] = box.get("program"), box.get("program_hash")
                            out["program_seal"] = box.get("program_seal")
                        return out
                left = deadline - time.monotonic()
                if left <= 0:
                    return {"kind": "wait"}
                self.state.cond.wait(min(left, 1.0))


def _decoded(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise flight.FlightServerError("malformed request: a snapshot's blob is not base64") from None
