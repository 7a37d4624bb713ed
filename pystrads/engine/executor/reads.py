"""What an executor task may read from a finished fit: its tables and its workers' exports.

A :class:`ShardReader` travels in the closures of the driver's frames
(:mod:`pystrads.engine.driver.frames`) and of its relayed reads; on the executor it reads
through the Flight client.
"""

from __future__ import annotations

import pickle
from typing import Any


from ...errors import PystradsError
from ...ps.client import ShardGroup, TableHandle
from ...ps.partition import TableLayout
from ..scheduler.sealing import WORKER
from ..scheduler.steps import export_key


class ShardReader:
    """What an executor task may read from a finished fit: its tables and its workers' exports.
    Small and picklable (addresses, the run token, the table layouts)."""

    def __init__(self, group: ShardGroup, layouts: dict, namespace: str, num_workers: int, seals=None):
        self.group = group
        self.seals = seals  # the fit's (sealing.py): the workers' exports are sealed with them
        self.layouts = dict(layouts)
        self.namespace = namespace
        self.num_workers = num_workers

    def table(self, name: str) -> TableHandle:
        """The handle of the fit's table ``name`` (reads only)."""
        try:
            layout: TableLayout = self.layouts[name]
        except KeyError:
            raise KeyError(f"no table {name!r}; the fit has {sorted(self.layouts)}") from None
        return self.group.table(layout)

    def export(self, worker: int) -> Any:
        """Worker ``worker``'s ``export`` result, read from the shard it left it on."""
        blob = self.group.client(worker % len(self.group.shards)).get_blob(export_key(self.namespace, worker))
        if blob is None:
            raise PystradsError(f"worker {worker}'s export is not on the shards any more: the fit was released "
                                "before this frame was materialised (keep_frame), or its shard restarted")
        return pickle.loads(self.seals.open(WORKER, export_key(self.namespace, worker), blob))
