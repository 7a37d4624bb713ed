"""A shard's mailbox for the workers (one long task per worker for a whole fit).

:class:`ResidentMailbox` is the part of :class:`~pystrads.ps.server.ShardServer`
that serves them: per fit namespace, the command the driver posted last
(``post``, or with ``begin_step``), the workers' ``hello`` (a newer task id
retires the worker's older ones), ``next`` (a worker waits for a command it has
not carried out), and the driver's waits ``wait_hellos`` and ``wait_blobs``.
"""

from __future__ import annotations

import time
from typing import Any, Dict

import pyarrow.flight as flight


class ResidentMailbox:
    """Resident workers' actions of :class:`~pystrads.ps.server.ShardServer` (a mixin: it
    uses the server's ``cond``, ``steps``, ``mailbox``, ``hellos``, ``closed``, ``newest_task``,
    ``blobs``, ``step`` and ``shard_id``)."""

    def _is_closed(self, namespace: str) -> bool:
        return namespace in self.closed  # a fit's mailbox is keyed by its namespace, dropped as "<ns>/"

    def _action_post(self, req):
        """The driver leaves a command for a fit's workers (``begin_step`` can carry
        one too, so a step's schedule costs no extra call)."""
        with self.cond:
            self._check_epoch(req.str("namespace"), req.get("epoch"), "a post")
            self._post(req.str("namespace"), req.dict("command"))
        return {}

    def _post(self, namespace: str, command: Dict[str, Any]) -> None:
        box = self.mailbox.setdefault(namespace, {"seq": 0})
        program = command.get("program")
        if program is not None:  # kept: a restarted task asks for it without knowing its hash
            box["program"], box["program_hash"] = program, command.get("program_hash")
            box["program_seal"] = command.get("program_seal")
        box["seq"] += 1
        box["command"] = {k: v for k, v in command.items() if k not in ("program", "program_seal")}
        self.cond.notify_all()

    def _action_hello(self, req):
        """A worker's task started (a newer task id retires the worker's older ones)."""
        namespace, worker, task = req.str("namespace"), req.int("worker"), req.int("task")
        with self.cond:
            key = (namespace, worker)
            if task < self.newest_task.get(key, -1):
                raise flight.FlightServerError(
                    f"shard {self.shard_id}: task {task} of worker {worker} is older than task "
                    f"{self.newest_task[key]}; refusing a zombie task")
            if self._is_closed(namespace):
                raise flight.FlightServerError(
                    f"shard {self.shard_id}: fit {namespace!r} has ended (its tables were dropped); "
                    f"task {task} of worker {worker} has nothing to do")
            self.newest_task[key] = task
            self.hellos.setdefault(namespace, {})[worker] = {"task": task, "fingerprint": req.get("fingerprint"),
                                                             "load_s": req.get("load_s"), "time": time.time()}
            self.cond.notify_all()
        return {}

    def _action_wait_hellos(self, req):
        """Block until ``num_workers`` workers of a fit said hello (or ``timeout``); their hellos."""
        namespace, n = req.str("namespace"), req.int("num_workers")
        deadline = time.monotonic() + req.num("timeout", 1.0)
        with self.cond:
            while len(self.hellos.get(namespace, {})) < n and time.monotonic() < deadline \
                    and namespace not in self.fit_errors:
                self.cond.wait(max(0.0, min(1.0, deadline - time.monotonic())))
            hellos = self.hellos.get(namespace, {})
            return {"hellos": {str(w): h for w, h in hellos.items()}, "complete": len(hellos) >= n,
                    "program_error": self.fit_errors.get(namespace)}

    def _action_wait_blobs(self, req):
        """Block until every blob of ``keys`` is stored here (or ``timeout``); the ones still missing."""
        keys = req.get("keys")
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise flight.FlightServerError("malformed request: field 'keys' must be a list of strings")
        deadline = time.monotonic() + req.num("timeout", 1.0)
        with self.cond:
            while True:
                missing = [k for k in keys if k not in self.blobs]
                left = deadline - time.monotonic()
                if not missing or left <= 0:
                    return {"missing": missing}
                self.cond.wait(min(left, 1.0))

    def _action_next(self, req):
        """A worker waits (up to ``timeout``) for a command it has not carried out:
        the open step when it is newer than ``done_step``, or ``finish``.  The program's bytes
        come along unless the worker already has them (``program_hash``)."""
        namespace, worker, task = req.str("namespace"), req.int("worker"), req.int("task")
        done_step = req.int("done_step", -1)
        deadline = time.monotonic() + req.num("timeout", 1.0)
        with self.cond:
            while True:
                if task < self.newest_task.get((namespace, worker), -1):
                    raise flight.FlightServerError(
                        f"shard {self.shard_id}: task {task} of worker {worker} was replaced by a newer "
                        "attempt; refusing a zombie task")
                if self._is_closed(namespace):  # released before this worker read ``finish``
                    return {"kind": "closed"}
                box = self.mailbox.get(namespace)
                command = box.get("command") if box else None
                if command is not None:
                    kind = command.get("kind")
                    st = self._step_of(namespace)
                    actionable = kind == "finish" or (
                        kind == "step" and st.open and st.namespace == namespace
                        and st.step == command.get("step") and command.get("step") > done_step
                        and worker not in st.done)
                    if actionable:
                        out = dict(command, seq=box["seq"])
                        if box.get("program_hash") != req.get("program_hash"):
                            out["program"], out["program_hash"] = box.get("program"), box.get("program_hash")
                            out["program_seal"] = box.get("program_seal")
                        return out
                left = deadline - time.monotonic()
                if left <= 0:
                    return {"kind": "wait"}
                self.cond.wait(min(left, 1.0))
