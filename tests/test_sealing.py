"""What a fit's processes unpickle from the shards is sealed by the role that may write it:
a payload written with the run token alone is refused, naming it, before it is unpickled."""

import base64
import pickle

import pytest

from pystrads.engine.executor.coordinator import read_progress, progress_key
from pystrads.engine.driver.launch import BarrierJob, WorkerInput
from pystrads.engine.scheduler.journal import Journal, ShardStore, journal_key
from pystrads.engine.scheduler.sealing import DRIVER, WORKER, Seals
from pystrads.engine.executor.worker import WorkerSpec, _Worker, export_key, state_key
from pystrads.errors import PayloadAuthenticationError
from pystrads.ps.client import ShardGroup, ShardInfo
from pystrads.ps.server import ShardServer

TOKEN = "sealing-token"


class _Trap:
    """Unpickling it creates a file: proof that a payload was unpickled."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


@pytest.fixture()
def group():
    servers = [ShardServer("grpc://127.0.0.1:0", TOKEN, 1e9, f"s{i}") for i in range(2)]
    yield ShardGroup([ShardInfo("127.0.0.1", s.port, 0, "exec", f"s{i}") for i, s in enumerate(servers)], TOKEN)
    for s in servers:
        s.shutdown()


def test_a_seal_opens_only_its_own_payload_under_its_own_name():
    seals, other = Seals.new(), Seals.new()
    sealed = b"".join(bytes(p) for p in seals.seal(WORKER, "fit/summary/0", b"payload"))
    assert bytes(seals.open(WORKER, "fit/summary/0", sealed)) == b"payload"
    refusals = {"no seal": (seals, WORKER, "fit/summary/0", b"payload"),
                "another fit's key": (other, WORKER, "fit/summary/0", sealed),
                "the other role's key": (seals, DRIVER, "fit/summary/0", sealed),
                "moved to another name": (seals, WORKER, "fit/summary/1", sealed),
                "one byte changed": (seals, WORKER, "fit/summary/0", sealed[:-1] + b"!"),
                "empty": (seals, WORKER, "fit/summary/0", b"")}
    for why, (s, role, name, blob) in refusals.items():
        with pytest.raises(PayloadAuthenticationError, match=rf"'{name}' is not sealed by the fit's"):
            s.open(role, name, blob)
    assert "key" not in repr(seals) and seals.driver.hex() not in repr(seals)
    assert pickle.loads(pickle.dumps(seals)).worker == seals.worker  # travels to the tasks whole
    wrapped = seals.wrap(other.worker, "fit/restored/3")
    assert wrapped != other.worker.hex() and seals.unwrap(wrapped, "fit/restored/3") == other.worker


def test_every_reader_refuses_a_blob_written_with_the_run_token_alone(group, tmp_path):
    """The forger holds the run token (every task and every shard does) but not the fit's keys: it
    replaces each kind of blob the fit's processes unpickle.  Each reader refuses it naming the
    blob, and nothing is unpickled."""
    seals, ns = Seals.new(), "fit"
    trap = tmp_path / "unpickled"
    forged = pickle.dumps(_Trap(trap))
    forger = ShardGroup(group.shards, TOKEN)  # the run token, nothing else
    spec = WorkerSpec(pickle.dumps(None), "", group, {}, 2, 0, 30, ns, False, seals=seals)
    job = BarrierJob(None, WorkerInput(), 2, 0, ns, 30.0, False, export=lambda w, d, s: None)
    job.seals, job.group = seals, group

    def worker_state():
        forger.client(0).put_blob(state_key(ns, 0, 3), forged)
        _Worker(spec, 0, 1, 0).restore(3)

    def exports():
        for w in range(2):
            forger.client(w % 2).put_blob(export_key(ns, w), forged)
        job.fetch_exports()

    def journal():
        forger.client(0).put_blob(journal_key(ns), forged)
        Journal(ShardStore(group, ns, 1, seals)).read()

    def progress():
        forger.client(0).put_blob(progress_key(ns), forged)
        read_progress(group, ns, seals)

    cases = {"worker state": (worker_state, rf"'{ns}/state/0/3' on grpc://127.0.0.1:\d+ is not sealed by the fit's workers"),
             "export": (exports, rf"'{ns}/export/0' is not sealed by the fit's workers"),
             "journal": (journal, rf"'{ns}/loop/journal' on shard 0 is not sealed by the fit's driver or coordinator"),
             "progress": (progress, rf"'{ns}/progress' on shard 0 is not sealed by the fit's driver or coordinator")}
    for name, (read, message) in cases.items():
        with pytest.raises(PayloadAuthenticationError, match=message):
            read()
        assert not trap.exists(), f"the forged {name} was unpickled"
    # the same readers take what the fit's own processes sealed
    key = journal_key(ns)
    group.client(0).put_blob(key, seals.seal(DRIVER, key, pickle.dumps({"ok": 1})))
    assert pickle.loads(ShardStore(group, ns, 1, seals).read()) == {"ok": 1}


def test_a_worker_refuses_a_program_or_schedule_posted_with_the_run_token_alone(group, tmp_path):
    seals, ns = Seals.new(), "fit"
    trap = tmp_path / "unpickled"
    evil = base64.b64encode(pickle.dumps(_Trap(trap))).decode()
    forger = ShardGroup(group.shards, TOKEN)
    group.broadcast("begin_step", step=1, num_workers=1, namespace=ns)
    spec = WorkerSpec(pickle.dumps(None), "h0", group, {}, 1, 0, 30, ns, False, seals=seals)
    worker = _Worker(spec, 0, 1, 0)
    forger.client(0).action("post", namespace=ns, command={"kind": "step", "step": 1, "program": evil,
                                                           "program_hash": "h1", "program_seal": "00" * 32})
    with pytest.raises(PayloadAuthenticationError, match=rf"'{ns}/program/h1' is not sealed by the fit's driver"):
        worker.next_command(0)
    cmd = {"kind": "step", "step": 1, "round_offset": 0, "schedule": evil}
    with pytest.raises(PayloadAuthenticationError, match=rf"'{ns}/schedule/1' is not sealed by the fit's driver"):
        worker.run_step(cmd, None, None)
    assert not trap.exists()
