"""The step loop's journal keeps the summary's growing lists in chunks written once: an entry costs
what its step added, and every entry reads back whole, in both stores."""

import pickle

import numpy as np
import pytest

from pystrads.engine.scheduler.journal import ROWS_CHUNK, Journal, JournalEntry, MemoryStore, ShardStore
from pystrads.engine.scheduler.sealing import Seals
from pystrads.ps.client import ShardGroup, ShardInfo
from pystrads.ps.server import ShardServer

TOKEN = "journal-token"


@pytest.fixture()
def group():
    server = ShardServer("grpc://127.0.0.1:0", TOKEN, 1e9, "s0")
    yield ShardGroup([ShardInfo("127.0.0.1", server.port, 0, "exec", "s0")], TOKEN)
    server.shutdown()


def _row(step):
    return {"step": step, "seconds": 0.001 * step, "rounds": 1, "name": f"r{step}"}


def _entry(step, rows, iterations, frozen):
    return JournalEntry(step, {"step": step}, {"big": frozen, "counter": step},
                        {"rows": rows, "iterations": iterations, "fixed": {"load_s": 0.5}})


@pytest.mark.parametrize("kind", ["memory", "shard"])
def test_entries_cost_what_their_step_added_and_read_back_whole(kind, group):
    store = MemoryStore() if kind == "memory" else ShardStore(group, "fit", 1, Seals.new())
    journal = Journal(store)
    frozen = np.arange(1 << 18, dtype=np.float64)  # 2 MiB, read-only: kept once, by reference
    frozen.flags.writeable = False
    rows, iterations, sizes = [], [], {}
    for step in range(3 * ROWS_CHUNK + 10):
        rows.append(_row(step))
        iterations.extend([{"iteration": 2 * step}, {"iteration": 2 * step + 1}])
        journal.write(_entry(step, rows, iterations, frozen), None)  # no step open on the shard
        rows[-1]["bytes_in"] = step  # the loop adds the step's traffic after the commit point
        sizes[step] = len(store.read())
        if step % 37 == 0 or step == 3 * ROWS_CHUNK + 9:
            entry = journal.read()
            # every row as the entry was written: the newest without the traffic added after it
            assert entry.summary["rows"] == [dict(r) if i < step else _row(step) for i, r in enumerate(rows)]
            assert entry.summary["iterations"] == iterations
            assert entry.summary["rows"][0] is not rows[0]  # fresh objects: the loop may change them
            np.testing.assert_array_equal(entry.program["big"], frozen)
            assert entry.program["counter"] == step and entry.summary["fixed"] == {"load_s": 0.5}
    # an entry holds at most a chunk of each list, whatever the fit's length
    assert max(sizes[s] for s in range(2 * ROWS_CHUNK, 3 * ROWS_CHUNK + 10)) < 2 * max(sizes[s] for s in range(ROWS_CHUNK))
    whole = len(pickle.dumps({"rows": rows, "iterations": iterations}))
    assert sizes[3 * ROWS_CHUNK + 9] < whole / 3


def test_a_list_put_back_from_the_journal_is_chunked_afresh():
    """After a failure the loop puts the journal's rows back (new objects) and goes on, and a resume
    from a checkpoint puts other rows in their place: the next entries read back whole."""
    journal = Journal(MemoryStore())
    rows = [_row(s) for s in range(2 * ROWS_CHUNK + 5)]
    journal.write(_entry(1, rows, [], None), 1)
    rows[:] = journal.read().summary["rows"]  # as loop._restore does
    rows[-1]["bytes_in"] = 7
    rows.append(_row(len(rows)))
    journal.write(_entry(2, rows, [], None), 2)
    assert journal.read().summary["rows"] == rows
    rows[:] = [dict(r, seconds=-1.0) for r in rows[:2 * ROWS_CHUNK + 2]]  # as a resume from a checkpoint
    journal.write(_entry(3, rows, [], None), 3)
    assert journal.read().summary["rows"] == rows
    rows[:] = rows[:ROWS_CHUNK - 3]  # shorter than a chunk written before
    journal.write(_entry(3, rows, [], None), 3)
    assert journal.read().summary["rows"] == rows
    journal.clear()
    assert journal.read() is None
