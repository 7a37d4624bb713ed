"""Talking to the shards from a process that cannot reach them, through a Spark task.

A client that reaches only Spark (a Spark Connect client outside the cluster's network) starts
the shards through a Spark job and reads what it needs from them the same way:
:func:`through_spark` runs ``fn(group, *args)`` in one executor task, which does reach the
shards, and brings its result back as the job's result.  Each call costs a Spark job, so this
serves the calls around a fit (reading a small table, the workers' exports, releasing the fit),
never the step loop, which runs inside the fit's job (:mod:`pystrads.engine.executor.coordinator`).
Every call also renews the shards' lease, as the driver's heartbeat does on the classic path.
"""

from __future__ import annotations

from typing import Any, Callable

from .client import ShardGroup
from .protocol import Action


def through_spark(spark, group: ShardGroup, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(group, *args)`` run in one Spark task on an executor; its (picklable) result here."""
    from ..spark import handle_of

    def task(_index):
        for i in range(len(group.shards)):
            try:
                group.client(i).action(Action.HEARTBEAT)
            except Exception:  # noqa: BLE001 -- fn says what a lost shard means
                pass
        return [fn(group, *args)]

    (result,) = handle_of(spark).run_tasks(task, 1)
    return result
