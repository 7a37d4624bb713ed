"""Spark's Python worker daemon, with numba loaded once before it forks any worker, and the
executor's shards forked from it too.

Spark starts one daemon per executor (``python -m pyspark.daemon``) at the first Python task
and forks every Python worker from it; each new worker of a fit then imports numba and readies
its CPU target (~0.5-1.5 s of CPU each, as much as a small fit's steps on 2 cores).  Set
``spark.python.daemon.module=pystrads.daemon`` (:func:`pystrads.session.spark_session` does)
and the daemon pays that once, before its first fork, so that every worker it forks starts with
numba ready.  It loads only what starts no thread (numpy, numba and pystrads' kernel modules:
no pyarrow, pandas or gRPC, which Spark's daemon also leaves to the workers because of their
threads), and a failed load only leaves the workers to load what they need, as before.  Every
executor must have pystrads installed (the daemon is this module).

Once loaded, the daemon also starts the executor's shard forker (:mod:`pystrads.ps.forker`), so
that shards are forked from an interpreter that has numba ready too.
"""

from __future__ import annotations

import sys

#: kernel modules the shipped programs and the shards call
KERNEL_MODULES = ("cd", "lda", "mf", "offsets", "random", "rows", "sets", "sparse_rows")


def preload() -> None:
    """numpy, numba with its CPU target ready, and the kernel modules (compiles nothing)."""
    try:
        from .kernels import warm_up

        warm_up(*KERNEL_MODULES)
    except Exception as exc:  # noqa: BLE001 - the workers load what they need themselves
        print(f"pystrads.daemon: preloading numba failed ({exc}); workers load it themselves", file=sys.stderr)


if __name__ == "__main__":
    from .ps.forker import start_forker

    preload()
    start_forker()
    from pyspark.daemon import manager

    manager()
