"""Files for checkpoints, on any filesystem pyarrow reaches: local paths, ``file://``,
``hdfs://`` (with libhdfs), ``s3://``, ``gs://``, and mounts such as ``/dbfs/...``.

Used by the shards (table snapshots, written where the rows live) and by the
driver and workers (manifests, worker states).  Writers that publish a file
others may read concurrently go through :func:`write_atomic`.  On a local path
(a bare path or ``file:``) every file written is flushed to the disk (``fsync``,
the file and its directory) before the call returns, so a checkpoint that a
later ``LATEST`` names survives a machine's crash; object stores and HDFS make
a file durable when its stream closes.
"""

from __future__ import annotations

import os
import re
import secrets
from typing import List, Tuple

import numpy as np


_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:")  # "hdfs:", "s3:", "file:" (Spark writes file:/x)


def has_scheme(uri: str) -> bool:
    """Whether ``uri`` names its filesystem (``hdfs://``, ``s3://``, ``file:///``...) rather than
    being a bare path, which means each host's own disk."""
    return bool(_SCHEME.match(uri))


def filesystem(uri: str) -> Tuple[object, str]:
    """``(pyarrow FileSystem, path)`` for a URI (``file:/x``, ``file:///x``, ``hdfs://...``)
    or a local path."""
    from pyarrow import fs

    if has_scheme(uri):
        return fs.FileSystem.from_uri(uri)
    return fs.LocalFileSystem(), os.path.abspath(uri)


def _local_path(uri: str):
    """The local path of ``uri`` (a bare path or ``file:``), else None."""
    if not has_scheme(uri):
        return os.path.abspath(uri)
    if uri.startswith("file:"):
        return filesystem(uri)[1]
    return None


def sync(uri: str) -> None:
    """Flush a local file (and its directory entry) to the disk; nothing elsewhere."""
    path = _local_path(uri)
    if path is None:
        return
    for target, flags in ((path, os.O_RDONLY), (os.path.dirname(path) or ".", os.O_RDONLY)):
        try:
            fd = os.open(target, flags)
        except OSError:
            continue
        try:
            os.fsync(fd)
        except OSError:  # a filesystem without fsync on directories
            pass
        finally:
            os.close(fd)


def join(uri: str, *parts: str) -> str:
    return "/".join([uri.rstrip("/")] + [p.strip("/") for p in parts])


def makedirs(uri: str) -> None:
    fsys, path = filesystem(uri)
    fsys.create_dir(path, recursive=True)


def exists(uri: str) -> bool:
    from pyarrow import fs

    fsys, path = filesystem(uri)
    return fsys.get_file_info(path).type != fs.FileType.NotFound


def write_bytes(uri: str, data) -> None:
    """Write ``data``: a bytes-like object, or a list of them written one after another."""
    fsys, path = filesystem(uri)
    fsys.create_dir(os.path.dirname(path), recursive=True)
    with fsys.open_output_stream(path) as out:
        for part in data if isinstance(data, list) else [data]:
            out.write(part)
    sync(uri)


def write_atomic(uri: str, data: bytes) -> None:
    """Write then rename, so readers see the old file or the whole new one."""
    fsys, path = filesystem(uri)
    fsys.create_dir(os.path.dirname(path), recursive=True)
    tmp = f"{path}.tmp-{secrets.token_hex(4)}"
    with fsys.open_output_stream(tmp) as out:
        out.write(data)
    if _local_path(uri) is not None:
        sync(tmp)
    fsys.move(tmp, path)
    sync(uri)


def read_bytes(uri: str) -> bytes:
    fsys, path = filesystem(uri)
    with fsys.open_input_stream(path) as src:
        return src.read()


def list_names(uri: str) -> List[str]:
    """Names of the entries of a directory (empty if it does not exist)."""
    from pyarrow import fs

    fsys, path = filesystem(uri)
    if fsys.get_file_info(path).type == fs.FileType.NotFound:
        return []
    infos = fsys.get_file_info(fs.FileSelector(path, allow_not_found=True))
    return sorted(os.path.basename(i.path.rstrip("/")) for i in infos)


def delete_file(uri: str) -> None:
    fsys, path = filesystem(uri)
    try:
        fsys.delete_file(path)
    except (FileNotFoundError, OSError):
        pass


def delete_dir(uri: str) -> None:
    fsys, path = filesystem(uri)
    try:
        fsys.delete_dir(path)
    except (FileNotFoundError, OSError):
        pass


def save_array(uri: str, array: np.ndarray) -> int:
    """Stream an array to ``uri`` in ``.npy`` format (no second copy in memory)."""
    fsys, path = filesystem(uri)
    fsys.create_dir(os.path.dirname(path), recursive=True)
    with fsys.open_output_stream(path) as out:
        np.save(out, np.ascontiguousarray(array), allow_pickle=False)
    sync(uri)
    return int(array.nbytes)


def load_array(uri: str) -> np.ndarray:
    fsys, path = filesystem(uri)
    with fsys.open_input_file(path) as src:
        return np.load(src, allow_pickle=False)


def save_arrays(uri: str, arrays: dict) -> int:
    """Several named arrays to ``uri`` as one uncompressed ``.npz``; returns their bytes."""
    fsys, path = filesystem(uri)
    fsys.create_dir(os.path.dirname(path), recursive=True)
    with fsys.open_output_stream(path) as out:
        np.savez(out, **{k: np.ascontiguousarray(v) for k, v in arrays.items()})
    sync(uri)
    return int(sum(np.asarray(v).nbytes for v in arrays.values()))


def load_arrays(uri: str) -> dict:
    """The named arrays of an ``.npz`` written by :func:`save_arrays`."""
    import io

    fsys, path = filesystem(uri)
    with fsys.open_input_file(path) as src:
        with np.load(io.BytesIO(src.read()), allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
