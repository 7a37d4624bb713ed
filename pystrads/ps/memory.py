"""A shard process's memory: what the kernel says is available and resident, and glibc's malloc tuning.

:func:`_mem_available` (``MemAvailable``: a table slice that does not fit is
refused), :func:`_rss_bytes` and
:func:`_peak_rss_bytes` (the ``stats`` action), :func:`tune_malloc`
(keep freed heap mapped between requests) and :func:`release_free_memory` (return it when
a fit is released).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os


def _kib_field(path: str, key: str) -> int:
    """The ``key:`` line of a /proc file given in kB (``MemAvailable``, ``VmHWM``), in bytes; 0 when unknown."""
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _mem_available() -> int:
    """Bytes the kernel says can be allocated without swapping (0 when unknown)."""
    return _kib_field("/proc/meminfo", "MemAvailable")


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _peak_rss_bytes() -> int:
    """The process's peak resident memory (``VmHWM``; 0 when unknown)."""
    return _kib_field("/proc/self/status", "VmHWM")


#: malloc arenas a shard keeps (glibc's M_ARENA_MAX); see :func:`tune_malloc`
MALLOC_ARENAS = 2


def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return ctypes.CDLL(ctypes.util.find_library("c"))


def release_free_memory() -> bool:
    """Give the heap's free pages back to the kernel (glibc's ``malloc_trim``; False off glibc).
    Freed blocks in the middle of the heap stay resident otherwise: a released MF fit left its
    shard at 3.7 GB with nothing stored."""
    try:
        return bool(_libc().malloc_trim(0))
    except (OSError, AttributeError, TypeError):
        return False


def tune_malloc(retain_bytes: int) -> bool:
    """Tune glibc's malloc for a shard; returns whether the allocator took the settings (False
    off glibc).

    * At most :data:`MALLOC_ARENAS` arenas: glibc gives threads arenas of their own (up to
      8 per core), and each keeps what its thread freed, so the gRPC handler threads of a
      shard serving LDA's sparse rows held 628 MiB for a 77 MiB table (441 MiB with two
      arenas, and the fit ran no slower).
    * Keep freed heap memory mapped (``retain_bytes`` > 0): gRPC's receive buffers and Arrow's
      decoded batches are freed after every write, and with glibc's defaults the next request
      faults fresh zeroed pages in again (measured: page faults were a third of a shard's
      time on 16 MiB puts).  Blocks under 32 MiB (glibc's largest mmap threshold) come from
      the heap, and up to ``retain_bytes`` of free heap stays mapped.
    """
    try:
        mallopt = _libc().mallopt
    except (OSError, AttributeError, TypeError):
        return False
    m_trim_threshold, m_mmap_threshold, m_arena_max = -1, -3, -8
    ok = mallopt(m_arena_max, MALLOC_ARENAS) == 1
    if retain_bytes <= 0:
        return ok
    ok = mallopt(m_mmap_threshold, 32 * 1024 * 1024) == 1 and ok
    return mallopt(m_trim_threshold, int(min(retain_bytes, 2 ** 31 - 1))) == 1 and ok
