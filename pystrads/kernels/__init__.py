"""numba kernels: numpy in, numpy out; no Spark, no Arrow.

Every kernel is compiled with ``nogil=True``: some run on the driver (the
schedule's round planning, the working-set solver), where the shards'
heartbeat thread must keep running however long a solve takes, or the
shards' lease lapses and they exit mid-fit.

numba caches compiled kernels next to their module; where that folder is not
writable (a read-only site-packages on a cluster), the cache goes to
``<tmp>/pystrads-numba-<uid>`` unless ``NUMBA_CACHE_DIR`` is set. This must
happen before numba is first imported, which importing this package does.
"""

import os
import tempfile

if "NUMBA_CACHE_DIR" not in os.environ and not os.access(os.path.dirname(os.path.abspath(__file__)), os.W_OK):
    os.environ["NUMBA_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), f"pystrads-numba-{os.getuid()}")


def warm_up(*modules: str) -> None:
    """Import numba, ready its CPU target and import the kernel ``modules`` (names under this
    package): what a process's first kernel call otherwise pays (~0.5-1.5 s, most of it numba
    importing the typing and lowering registries of its whole numpy support).  Compiles
    nothing, so it costs no more on a machine whose kernel cache is empty.  Safe beside
    kernel calls in other threads: it holds numba's compiler lock while the target loads."""
    import importlib

    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.registry import cpu_target

    with global_compiler_lock:
        cpu_target.target_context.refresh()
    for name in modules:
        importlib.import_module(f"{__name__}.{name}")
