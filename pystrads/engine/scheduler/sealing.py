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
does).  A payload is stored after its seal: a random nonce and the payload's name (its blob
key, or the command field's) encrypted with AES-256-GCM under the role's key, the payload
itself authenticated as associated data (GMAC: ~7 GB/s here, against ~1.1 GB/s for
HMAC-SHA256, which a worker's state snapshot after every step would feel).  A reader
decrypts the name, which must be the name it read, before unpickling -- so a sealed payload
cannot be moved to another name either -- and refuses a payload without a valid seal with
:class:`~pystrads.errors.PayloadAuthenticationError` naming it.  ``cryptography`` (already
the dependency of :mod:`pystrads.ps.tls`) provides AES-GCM.

Checkpoints keep the workers' states as sealed; the fit that resumes from one is told the
key they were sealed with (:meth:`Seals.wrap`), wrapped with its own worker key so that the
shard that carries the command cannot read it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import struct
from typing import Optional, Tuple

from ...errors import PayloadAuthenticationError

NONCE_BYTES = 12
#: a seal's bytes: nonce, the encrypted name's length (2 bytes), the encrypted name and its tag
_HEAD = struct.Struct("<H")

DRIVER, WORKER = "driver", "worker"
_WRITERS = {DRIVER: "the fit's driver or coordinator", WORKER: "the fit's workers"}


class Seals:
    """The two keys of one fit (see the module docstring)."""

    __slots__ = ("driver", "worker", "_ciphers")

    def __init__(self, driver: bytes, worker: bytes):
        self.driver, self.worker = bytes(driver), bytes(worker)
        self._ciphers = {}

    @classmethod
    def new(cls) -> "Seals":
        return cls(secrets.token_bytes(32), secrets.token_bytes(32))

    def __getstate__(self):
        return (self.driver, self.worker)

    def __setstate__(self, state):
        self.driver, self.worker = state
        self._ciphers = {}

    def __repr__(self) -> str:  # never the keys
        return "Seals(...)"

    def _cipher(self, role: str):
        cipher = self._ciphers.get(role)
        if cipher is None:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM

            cipher = self._ciphers[role] = AESGCM(self.driver if role == DRIVER else self.worker)
        return cipher

    def tag(self, role: str, name: str, data) -> bytes:
        """The seal of ``data`` (a bytes-like) stored as ``name``."""
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._cipher(role).encrypt(nonce, name.encode(), data)
        return nonce + _HEAD.pack(len(sealed)) + sealed

    def _split(self, view: memoryview) -> Optional[Tuple[bytes, bytes, memoryview]]:
        """``(nonce, encrypted name, payload)`` of a sealed blob, or None when it has no seal."""
        start = NONCE_BYTES + _HEAD.size
        if len(view) < start:
            return None
        n = _HEAD.unpack(view[NONCE_BYTES:start])[0]
        if len(view) < start + n:
            return None
        return bytes(view[:NONCE_BYTES]), bytes(view[start:start + n]), view[start + n:]

    def _valid(self, role: str, name: str, nonce: bytes, sealed: bytes, data) -> bool:
        from cryptography.exceptions import InvalidTag

        try:
            got = self._cipher(role).decrypt(nonce, sealed, data)
        except (InvalidTag, ValueError):
            return False
        return hmac.compare_digest(got, name.encode())

    def seal(self, role: str, name: str, data) -> list:
        """``data`` (a bytes-like) sealed, as the buffers to store (the seal, then ``data``
        itself: no copy)."""
        return [self.tag(role, name, data), data]

    def open(self, role: str, name: str, blob, where: str = "") -> memoryview:
        """The payload of a sealed ``blob`` stored as ``name`` (a view, no copy); raises
        :class:`~pystrads.errors.PayloadAuthenticationError` naming it when the seal is missing or
        does not match (``where``: what was read where, for the message; default ``name``)."""
        view = memoryview(blob).cast("B") if blob is not None else memoryview(b"")
        parts = self._split(view)
        if parts is None or not self._valid(role, name, *parts):
            raise PayloadAuthenticationError(
                f"{where or repr(name)} is not sealed by {_WRITERS[role]}: refusing to "
                "unpickle it. Something that holds only the run token (or another fit) wrote it; see "
                "docs/deployment.md, 'Security'")
        return parts[2]

    def field(self, role: str, name: str, text: str) -> str:
        """The seal of a command's text field, as hex (travels beside it)."""
        return self.tag(role, name, text.encode()).hex()

    def check_field(self, role: str, name: str, text: str, seal: Optional[str]) -> None:
        """Raise :class:`~pystrads.errors.PayloadAuthenticationError` unless ``seal`` is the
        seal of the command field ``text`` stored as ``name``."""
        try:
            parts = self._split(memoryview(bytes.fromhex(seal)) if isinstance(seal, str) else memoryview(b""))
        except ValueError:
            parts = None
        if parts is None or parts[2].nbytes or not self._valid(role, name, parts[0], parts[1], text.encode()):
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
