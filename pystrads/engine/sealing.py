"""Seals on what a fit's processes hand each other through the shards, so that only who may
write a payload can make another process unpickle it.

The shards store byte strings for the fit (:meth:`~pystrads.ps.client.ShardClient.put_blob`)
and carry the commands the scheduler posts to the workers.  Every caller of a shard holds the
run token, the shards themselves included, so the token cannot vouch for a payload.  Each fit
has two keys of its own, made by the driver and never sent to a shard:

* ``driver``: what the driver or the in-job coordinator writes -- the commands' programs and
  schedules, the coordinator's journal and progress reports;
* ``worker``: what the workers write -- their state snapshots, data summaries and exports.

They reach the fit's tasks inside the job's closure (Spark's channel, as the program itself
does).  A payload is stored as ``HMAC-SHA256(key, name NUL payload) || payload``, its name
being its blob key (or the command field's), so a sealed payload cannot be moved to another
name either; a reader checks the seal in constant time before unpickling, and refuses a
payload without one with :class:`~pystrads.errors.PayloadAuthenticationError` naming it.

Checkpoints keep the workers' states as sealed; the fit that resumes from one is told the
key they were sealed with (:meth:`Seals.wrap`), wrapped with its own worker key so that the
shard that carries the command cannot read it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Optional, Sequence

from ..errors import PayloadAuthenticationError

#: bytes of a seal (HMAC-SHA256)
TAG_BYTES = 32

DRIVER, WORKER = "driver", "worker"
_WRITERS = {DRIVER: "the fit's driver or coordinator", WORKER: "the fit's workers"}


class Seals:
    """The two keys of one fit (see the module docstring)."""

    __slots__ = ("driver", "worker")

    def __init__(self, driver: bytes, worker: bytes):
        self.driver, self.worker = bytes(driver), bytes(worker)

    @classmethod
    def new(cls) -> "Seals":
        return cls(secrets.token_bytes(32), secrets.token_bytes(32))

    def __getstate__(self):
        return (self.driver, self.worker)

    def __setstate__(self, state):
        self.driver, self.worker = state

    def __repr__(self) -> str:  # never the keys
        return "Seals(...)"

    def _key(self, role: str) -> bytes:
        return self.driver if role == DRIVER else self.worker

    def tag(self, role: str, name: str, parts: Sequence) -> bytes:
        """The seal of ``parts`` (buffers, in order) stored as ``name``."""
        mac = hmac.new(self._key(role), name.encode() + b"\0", hashlib.sha256)
        for part in parts:
            mac.update(part)
        return mac.digest()

    def seal(self, role: str, name: str, data) -> list:
        """``data`` (a bytes-like) sealed, as the buffers to store (the seal, then ``data``
        itself: no copy)."""
        return [self.tag(role, name, [data]), data]

    def open(self, role: str, name: str, blob, where: str = "") -> memoryview:
        """The payload of a sealed ``blob`` stored as ``name`` (a view, no copy); raises
        :class:`~pystrads.errors.PayloadAuthenticationError` naming it when the seal is missing or
        does not match (``where``: what was read where, for the message; default ``name``)."""
        view = memoryview(blob).cast("B") if blob is not None else memoryview(b"")
        if len(view) < TAG_BYTES or not hmac.compare_digest(
                bytes(view[:TAG_BYTES]), self.tag(role, name, [view[TAG_BYTES:]])):
            raise PayloadAuthenticationError(
                f"{where or repr(name)} is not sealed by {_WRITERS[role]}: refusing to "
                "unpickle it. Something that holds only the run token (or another fit) wrote it; see "
                "docs/deployment.md, 'Security'")
        return view[TAG_BYTES:]

    def field(self, role: str, name: str, text: str) -> str:
        """The seal of a command's text field, as hex (travels beside it)."""
        return self.tag(role, name, [text.encode()]).hex()

    def check_field(self, role: str, name: str, text: str, seal: Optional[str]) -> None:
        """Raise :class:`~pystrads.errors.PayloadAuthenticationError` unless ``seal`` is the
        seal of the command field ``text`` stored as ``name``."""
        if not isinstance(seal, str) or not hmac.compare_digest(seal, self.field(role, name, text)):
            raise PayloadAuthenticationError(
                f"command field {name!r} is not sealed by {_WRITERS[role]}: refusing to unpickle it. Something "
                "that holds only the run token posted it; see docs/deployment.md, 'Security'")

    def wrap(self, key: bytes, label: str) -> str:
        """``key`` (32 bytes) encrypted for this fit's workers (a one-time pad drawn from the
        worker key and ``label``, which must be used once), as hex."""
        pad = hmac.new(self.worker, b"wrap\0" + label.encode(), hashlib.sha256).digest()
        return bytes(a ^ b for a, b in zip(key, pad)).hex()

    def unwrap(self, wrapped: str, label: str) -> bytes:
        pad = hmac.new(self.worker, b"wrap\0" + label.encode(), hashlib.sha256).digest()
        return bytes(a ^ b for a, b in zip(bytes.fromhex(wrapped), pad))
