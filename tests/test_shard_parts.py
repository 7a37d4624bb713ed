"""The parts a shard server composes, each on its own (no Flight server, no Spark): the state,
the step fences, the workers' mailbox and the snapshots."""

import numpy as np
import pyarrow.flight as flight
import pytest

from pystrads.ps.mailbox import Mailbox
from pystrads.ps.request import _Request
from pystrads.ps.server import ShardServer
from pystrads.ps.snapshots import TableSnapshots
from pystrads.ps.steps import CLOSED_FITS_KEPT, StepFences
from pystrads.ps.state import ShardState
from pystrads.ps.table import ShardTable


class AddPull:
    def pull(self, table, keys, partials, current):
        return current + partials


def parts(rows=4):
    state = ShardState("s0")
    state.tables["fit/t"] = ShardTable("fit/t", 0, rows, 1, "float64", np.zeros((rows, 1)), 1)
    state.programs["fit"] = AddPull()
    fences = StepFences(state)
    return state, fences, Mailbox(state, fences), TableSnapshots(state, fences)


def req(**fields):
    return _Request(fields)


def test_a_step_commits_its_rounds_and_a_retried_task_rolls_it_back():
    state, fences, _, _ = parts()
    fences.begin_step(req(namespace="fit", step=0, num_workers=1))
    with state.cond:
        st = fences.check_fence(req(namespace="fit", step=0, worker=0, task=7), entering=True)
        st.contrib[("fit/t", 0)] = [(np.array([1, 2]), np.array([[1.0], [2.0]]))]
    assert fences.action_tick(req(namespace="fit", step=0, worker=0, task=7, round=0)) == {"committed": 0}
    assert state.tables["fit/t"].values[:, 0].tolist() == [0.0, 1.0, 2.0, 0.0]
    # the same worker again with a newer task: the stage was retried -- the step's writes go
    assert fences.action_enter(req(namespace="fit", step=0, worker=0, task=9)) == {"epoch": 1}
    assert state.tables["fit/t"].values[:, 0].tolist() == [0.0] * 4
    with pytest.raises(flight.FlightServerError, match="task 7 of worker 0 belongs to a failed attempt"):
        fences.action_enter(req(namespace="fit", step=0, worker=0, task=7))
    assert fences.action_commit_step(req(namespace="fit", step=0))["requests"] == 0  # the state's counters
    assert fences.step_of("fit").kept and not fences.step_of("fit").open


def test_an_older_loop_epoch_is_refused_and_an_ended_fit_keeps_its_error():
    state, fences, _, _ = parts()
    assert fences.action_claim(req(namespace="fit", epoch=2))["epoch"] == 2
    with pytest.raises(flight.FlightServerError, match="from loop epoch 1 refused: epoch 2 has taken the fit over"):
        fences.begin_step(req(namespace="fit", step=0, num_workers=1, epoch=1))
    fences.action_worker_error(req(namespace="fit", worker=0, task=1, error="ValueError in push"))
    fences.forget_fit("fit")
    assert fences.is_closed("fit") and "fit" not in fences.loop_epochs and "fit" not in fences.fit_errors
    assert fences.action_fit_error(req(namespace="fit")) == {"error": "ValueError in push"}
    for i in range(CLOSED_FITS_KEPT):
        fences.forget_fit(f"other{i}")
    assert not fences.is_closed("fit") and fences.is_closed(f"other{CLOSED_FITS_KEPT - 1}")


def test_the_mailbox_hands_a_worker_the_open_steps_command_once():
    state, fences, mailbox, _ = parts()
    mailbox.action_hello(req(namespace="fit", worker=0, task=5, fingerprint="f", load_s=0.1))
    with pytest.raises(flight.FlightServerError, match="task 4 of worker 0 is older than task 5"):
        mailbox.action_hello(req(namespace="fit", worker=0, task=4))
    assert mailbox.action_wait_hellos(req(namespace="fit", num_workers=1, timeout=0.0))["complete"]
    fences.begin_step(req(namespace="fit", step=3, num_workers=1))
    mailbox.post("fit", {"kind": "step", "step": 3, "program": b"p", "program_hash": "h"})
    command = mailbox.action_next(req(namespace="fit", worker=0, task=5, done_step=2, timeout=0.0))
    assert (command["kind"], command["step"], command["program"]) == ("step", 3, b"p")
    again = mailbox.action_next(req(namespace="fit", worker=0, task=5, done_step=3, program_hash="h", timeout=0.0))
    assert again == {"kind": "wait"}  # done already: nothing to carry out
    mailbox.forget_fit("fit")
    fences.forget_fit("fit")
    assert mailbox.boxes == {} and mailbox.hellos == {}
    assert mailbox.action_next(req(namespace="fit", worker=0, task=5, timeout=0.0)) == {"kind": "closed"}


def test_a_task_enters_a_step_as_next_hands_it_out_or_with_its_first_request_elsewhere():
    """No call of its own: ``next`` enters the task on shard 0, a request saying ``enter`` on any
    shard; a newer task's entry rolls the step back, an older task is refused, and a request that
    does not say ``enter`` from a task that never entered is refused."""
    state, fences, mailbox, _ = parts()
    fences.begin_step(req(namespace="fit", step=0, num_workers=2))
    mailbox.post("fit", {"kind": "step", "step": 0})
    assert mailbox.action_next(req(namespace="fit", worker=0, task=5, timeout=0.0))["step"] == 0
    assert fences.step_of("fit").registered == {0: 5}
    with pytest.raises(flight.FlightServerError, match="task 6 of worker 1 did not enter step 0"):
        fences.action_tick(req(namespace="fit", step=0, worker=1, task=6, round=0, timeout=0.0))
    with state.cond:  # worker 1's first request here says enter; it writes
        fences.check_fence(req(namespace="fit", step=0, worker=1, task=6, enter=True))
        state.tables["fit/t"].remember(np.array([3]))
        state.tables["fit/t"].values[3, 0] = 5.0
    assert fences.step_of("fit").registered == {0: 5, 1: 6}
    # worker 1's stage was retried: its new task's first request rolls the step back, even before
    # next hands the new task the step on shard 0
    with state.cond:
        fences.check_fence(req(namespace="fit", step=0, worker=1, task=8, enter=True))
    assert state.tables["fit/t"].values[:, 0].tolist() == [0.0] * 4 and fences.step_of("fit").epoch == 1
    with pytest.raises(flight.FlightServerError, match="task 6 of worker 1 belongs to a failed attempt"):
        fences.action_tick(req(namespace="fit", step=0, worker=1, task=6, round=0, enter=True, timeout=0.0))
    # the new epoch's tasks enter afresh; a newer task of worker 0 enters as next hands it the step,
    # which starts another epoch
    assert mailbox.action_next(req(namespace="fit", worker=0, task=7, timeout=0.0))["step"] == 0
    assert fences.step_of("fit").epoch == 1 and fences.step_of("fit").registered == {1: 8, 0: 7}
    assert mailbox.action_next(req(namespace="fit", worker=0, task=9, timeout=0.0))["step"] == 0
    assert fences.step_of("fit").epoch == 2 and fences.step_of("fit").registered == {0: 9}
    with pytest.raises(flight.FlightServerError, match="task 7 of worker 0 was replaced by a newer attempt"):
        mailbox.action_next(req(namespace="fit", worker=0, task=7, timeout=0.0))


def test_a_step_done_rides_the_next_poll_and_a_post_waits_for_its_step():
    """``next`` carries out the ``done`` it carries before it waits; ``post`` with ``wait_step``
    answers as ``wait_step`` does: not done within its timeout, then done with the rounds' metrics."""
    state, fences, mailbox, _ = parts()
    fences.begin_step(req(namespace="fit", step=1, num_workers=2))
    waiting = mailbox.action_post(req(namespace="fit", command={"kind": "step", "step": 1}, wait_step=1, timeout=0.0))
    assert (waiting["done"], waiting["entered"]) == (False, 0)
    assert mailbox.action_post(req(namespace="fit", command={"kind": "step", "step": 1})) == {}
    for worker, task in ((0, 5), (1, 6)):
        assert mailbox.action_next(req(namespace="fit", worker=worker, task=task, timeout=0.0))["step"] == 1
    fence = dict(namespace="fit", step=1, worker=0, task=5, enter=True)
    got = mailbox.action_next(req(namespace="fit", worker=0, task=5, done_step=1, timeout=0.0,
                                  done=dict(fence, late={"_snapshot_s": 0.5}, late_round=0)))
    assert got == {"kind": "wait"} and fences.step_of("fit").done == {0: 5}
    with pytest.raises(flight.FlightServerError, match="task 4 of worker 1 belongs to a failed attempt"):
        mailbox.action_next(req(namespace="fit", worker=1, task=6, done_step=1, timeout=0.0,
                                done=dict(fence, worker=1, task=4)))
    mailbox.action_next(req(namespace="fit", worker=1, task=6, done_step=1, timeout=0.0,
                            done=dict(fence, worker=1, task=6)))
    answer = fences.action_wait_step(req(namespace="fit", step=1, timeout=0.0))
    assert answer["done"] and answer["rounds"] == {"0": {"_snapshot_s": 0.5}}


def test_snapshots_are_taken_between_steps_and_restore_the_rows(tmp_path):
    state, fences, _, snapshots = parts()
    state.tables["fit/t"].values[:, 0] = [1.0, 2.0, 3.0, 4.0]
    fences.begin_step(req(namespace="fit", step=0, num_workers=1))
    with pytest.raises(flight.FlightServerError, match="snapshot while step 0 is open"):
        snapshots.action_snapshot(req(prefix="fit/", dir=str(tmp_path)))
    fences.action_commit_step(req(namespace="fit", step=0))
    assert snapshots.action_snapshot(req(prefix="fit/", dir=str(tmp_path)))["files"] == ["t.0-4.npy"]
    state.tables["fit/t"].values[:] = 0.0
    assert snapshots.action_restore(req(prefix="fit/", dir=str(tmp_path)))["rows"] == {"t": 4}
    assert state.tables["fit/t"].values[:, 0].tolist() == [1.0, 2.0, 3.0, 4.0]


def test_the_server_serves_each_action_from_exactly_one_part():
    server = ShardServer("grpc://127.0.0.1:0", "t", 1e9, "s0")
    try:
        own = {n[len("action_"):] for n in dir(server) if n.startswith("action_")}
        parted = set(server._parts)
        assert {"begin_step", "stats", "heartbeat"} <= own and not own & parted
        assert {"tick", "commit_step", "hello", "next", "snapshot", "restore"} <= parted
        assert "begin_step" not in parted  # the fences' begin_step is the server's, with its post
    finally:
        server.shutdown()


def test_every_declared_action_is_served_and_no_other_is_sent():
    """protocol.Action declares each action once: the server serves exactly those, and the
    client refuses any other name before a call."""
    from pystrads.ps.client import ShardClient
    from pystrads.ps.protocol import Action

    server = ShardServer("grpc://127.0.0.1:0", "t", 1e9, "s0")
    try:
        own = {n[len("action_"):] for n in dir(server) if n.startswith("action_")}
        assert own | set(server._parts) == {a.value for a in Action}
        client = ShardClient(f"grpc://127.0.0.1:{server.port}", "t")
        assert client.action(Action.PING)["shard"] == "s0" and client.action("ping")["shard"] == "s0"
        with pytest.raises(ValueError, match="unknown shard action 'pong'; known: ping, heartbeat"):
            client.action("pong")
        assert server.state.counters()["requests"] == 2  # the refused name never reached the shard
    finally:
        server.shutdown()


def test_row_entries_join_in_one_place():
    """protocol.concat_entries: the rows of several CSR parts, in order, offsets shifted by the
    entries before them; no parts is no rows of the given value type."""
    from pystrads.ps.protocol import concat_entries

    a = (np.array([0, 2, 2, 3]), np.array([1, 4, 0], np.int32), np.array([1.0, 2.0, 3.0]))
    b = (np.array([0, 1]), np.array([7], np.int32), np.array([9.0]))
    offsets, cols, vals = concat_entries([a, b, (np.zeros(1, np.int64), np.zeros(0, np.int32), np.zeros(0))])
    assert offsets.tolist() == [0, 2, 2, 3, 4] and offsets.dtype == np.int64
    assert cols.tolist() == [1, 4, 0, 7] and vals.tolist() == [1.0, 2.0, 3.0, 9.0]
    offsets, cols, vals = concat_entries([], np.int32)
    assert offsets.tolist() == [0] and len(cols) == 0 and vals.dtype == np.int32
