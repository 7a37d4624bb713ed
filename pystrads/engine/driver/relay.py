"""The client's side of a fit whose scheduler runs in its job (Spark Connect): the fit's progress
polled by Spark tasks (:class:`ProgressPoll`) and its tables read by them (:class:`RelayedTable`);
the coordinator that runs the loop in the job is :mod:`pystrads.engine.executor.coordinator`.
"""

from __future__ import annotations

import logging
from typing import Optional

import numpy as np

from ...ps.partition import TableLayout
from ..executor.coordinator import read_progress, read_range

log = logging.getLogger(__name__)


class ProgressPoll:
    """While a fit whose scheduler runs in its job is running: every ``progress.pollSeconds`` a
    Spark task reads the progress the coordinator leaves on shard 0 and shows what is new here
    (log line, notebook bar).  The task needs a free task slot beside the fit's workers; with
    none (every slot runs a worker) it would wait for the fit's end, so there is no poll and the
    progress shows when the fit ends."""

    def __init__(self, engine):
        import threading

        self.engine = engine
        self.seen = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"pystrads-progress-{engine.namespace}", daemon=True)
        self.polls = 0

    def __enter__(self) -> "ProgressPoll":
        from .preflight import free_slots

        engine = self.engine
        if engine.config["progress"] == "off" or engine.config["progress.pollSeconds"] <= 0:
            return self
        free = free_slots(engine.spark, engine.num_workers)
        if free is not None and free < 1:
            log.info("fit %s: every task slot runs a worker, so its progress shows when it ends (leave a slot "
                     "free, numWorkers <= %d, to see it while it runs)", engine.namespace,
                     max(1, engine.num_workers - 1))
            return self
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        from ...ps.relay import through_spark

        engine = self.engine
        while not self._stop.wait(engine.config["progress.pollSeconds"]):
            try:
                got = through_spark(engine.spark, engine.group, read_progress, engine.namespace, engine.job.seals)
            except Exception as exc:  # noqa: BLE001 -- the fit's own result says what went wrong
                log.debug("progress poll failed: %s", exc)
                continue
            self.polls += 1
            if got is not None and got["seq"] > self.seen and not self._stop.is_set():
                self.seen = got["seq"]
                engine.progress.update(got["done"], got["total"], got["unit"], **got["shown"])


class RelayedTable:
    """A fit's table read by a Spark task (:func:`~pystrads.ps.relay.through_spark`), for a client
    that cannot reach the shards; each read is a Spark job, so read small tables this way and large
    ones with :func:`~pystrads.engine.driver.frames.shard_frame`."""

    def __init__(self, spark, group, layout: TableLayout):
        self.spark, self.group, self.layout = spark, group, layout

    @property
    def name(self) -> str:
        return self.layout.name

    def read(self, where: Optional[range] = None) -> np.ndarray:
        """The rows of ``where`` (a ``range``; ``None``: the whole table), as
        :meth:`TableHandle.read <pystrads.ps.client.TableHandle.read>` gives them."""
        from ...ps.relay import through_spark

        if where is not None and (not isinstance(where, range) or where.step != 1):
            raise TypeError(f"table {self.layout.short_name!r}: a relayed read takes a range of rows or None, "
                            f"got {where!r}")
        where = range(0, self.layout.num_rows) if where is None else where
        return through_spark(self.spark, self.group, read_range, self.layout, where.start, where.stop)

    def __getattr__(self, attr: str):
        raise AttributeError(f"{attr}: a table of a fit whose scheduler ran in its job is read from here with "
                             "read() or read(range(start, stop)) (each a Spark job); read large tables on the "
                             "executors with pystrads.engine.driver.frames.shard_frame")
