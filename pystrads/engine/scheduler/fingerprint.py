"""Deterministic fingerprints of worker data and program attributes (checkpoints compare them
on resume: a checkpoint's states only fit the data and the fit they were made with)."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import numpy as np


def _data_fingerprint(data: Any) -> str:
    """Hash of a worker's immutable data (its arrays' bytes): a checkpoint's states only fit
    the data they were made with."""
    h = hashlib.sha256()
    _hash_value(h, data)
    return h.hexdigest()


def _hash_value(h, value: Any, depth: int = 0) -> None:
    """Feed a program attribute into a fingerprint, deterministically across processes."""
    if isinstance(value, np.ndarray):
        h.update(f"{value.dtype}{value.shape}".encode())
        h.update(np.ascontiguousarray(value).tobytes())
    elif isinstance(value, (list, tuple)):
        h.update(f"{type(value).__name__}{len(value)}".encode())
        for item in value:
            _hash_value(h, item, depth + 1)
    elif isinstance(value, dict):
        for key in sorted(value, key=repr):
            h.update(repr(key).encode())
            _hash_value(h, value[key], depth + 1)
    elif hasattr(value, "__dict__") and not callable(value) and depth < 4:  # e.g. a data summary object
        h.update(type(value).__qualname__.encode())
        _hash_value(h, vars(value), depth + 1)
    else:
        h.update(re.sub(r"0x[0-9a-f]+", "0x", repr(value)).encode())
