"""The Engine's owned parts on their own, without Spark: the checkpoints (:class:`Checkpointer`)
and the worker job's step seam and traffic accounting (:class:`WorkerJob`)."""

import os

import numpy as np
import pytest

from pystrads.config import Config
from pystrads.engine.scheduler import steps as job_module
from pystrads.engine.scheduler.checkpoints import Checkpointer, Position
from pystrads.engine.driver.engine import TrainingSummary
from pystrads.engine.driver.launch import BarrierJob, WorkerInput
from pystrads.engine.scheduler.steps import WorkerJob
from pystrads.programs.examples import CounterProgram
from pystrads.testing import around_steps


class _FakeJob:
    """What a Checkpointer asks of the worker job: the shards' snapshots (here files) and the
    workers' data fingerprints."""

    def __init__(self, fingerprints):
        self._fingerprints = list(fingerprints)
        self.saved, self.restored = [], []

    def save_states(self, target, step):
        os.makedirs(target, exist_ok=True)
        with open(os.path.join(target, "states"), "w") as fh:
            fh.write(str(step))
        self.saved.append((target, step))
        return {"bytes": 10, "files": ["t.0-5.npy"], "states_key": b"k" * 32}

    def restore_states(self, source, step, files=None, states_key=None):
        assert files == ["t.0-5.npy"]  # the checkpoint's manifest
        assert states_key == b"k" * 32  # the key that sealed the saved states travels with them
        with open(os.path.join(source, "states")) as fh:
            assert int(fh.read()) == step
        self.restored.append((source, step))

    def fingerprints(self):
        return self._fingerprints


def _checkpointer(tmp_path, program, workers=2, seed=1, interval=2):
    config = Config.resolve(overrides={"checkpoint.dir": str(tmp_path), "checkpoint.interval": interval})
    return Checkpointer.of(config, None, program, workers, seed)


def test_a_checkpoint_directory_names_the_program_the_workers_and_the_seed(tmp_path):
    a = _checkpointer(tmp_path, CounterProgram(num_keys=5))
    assert a.root.startswith(str(tmp_path)) and os.path.basename(a.root).startswith("pystrads-")
    assert _checkpointer(tmp_path, CounterProgram(num_keys=5)).root == a.root  # the same fit: the same place
    others = {_checkpointer(tmp_path, CounterProgram(num_keys=6)).root, _checkpointer(tmp_path, program=CounterProgram(
        num_keys=5), workers=3).root, _checkpointer(tmp_path, CounterProgram(num_keys=5), seed=2).root}
    assert a.root not in others and len(others) == 3
    assert _checkpointer(tmp_path, CounterProgram(), interval=0) is None
    assert Checkpointer.of(Config.resolve(overrides={"checkpoint.interval": 2}), None, CounterProgram(), 2, 1) is None


def test_a_fit_resumes_from_its_latest_checkpoint_with_its_program_and_history(tmp_path):
    program = CounterProgram(num_keys=5)
    checkpoints = _checkpointer(tmp_path, program)
    job = _FakeJob(["f0", "f1"])
    summary = TrainingSummary()
    for step in (1, 2, 3):
        summary.rows.append({"step": step})
        program.steps = 10 + step  # the driver's state moves with the fit
        checkpoints.save(job, program, Position(step + 1, 4 * step, 7), summary)
    assert checkpoints.saved == 3 and [s for _, s in job.saved] == [1, 2, 3]
    (latest,) = [n for n in os.listdir(checkpoints.root) if n.startswith("step-")]
    assert latest.startswith("step-00000003-")  # the older ones deleted once LATEST named the newest
    with open(os.path.join(checkpoints.root, "LATEST")) as fh:
        assert f'"dir": "{latest}"' in fh.read()
    checkpoints.save(job, program, Position(4, 12, 7), summary)  # the same step again: a directory never used
    (newer,) = [n for n in os.listdir(checkpoints.root) if n.startswith("step-")]
    assert newer.startswith("step-00000003-") and newer != latest

    fresh = CounterProgram(num_keys=5)
    resumed = checkpoints.resume(_FakeJob(["f0", "f1"]), fresh)
    assert resumed.position == Position(4, 12, 7) and resumed.step == 3
    assert resumed.rows == [{"step": 1}, {"step": 2}, {"step": 3}] and fresh.steps == 13
    other_data = _FakeJob(["f0", "changed"])
    assert checkpoints.resume(other_data, CounterProgram(num_keys=5)) is None and not other_data.restored


def test_a_failed_checkpoint_keeps_the_previous_one_and_is_counted(tmp_path):
    program = CounterProgram(num_keys=5)
    checkpoints = _checkpointer(tmp_path, program)
    checkpoints.save(_FakeJob(["f0", "f1"]), program, Position(2, 4, 7), TrainingSummary())

    class Broken(_FakeJob):
        def save_states(self, target, step):
            raise OSError("disk full")

    checkpoints.try_save(Broken(["f0", "f1"]), program, Position(3, 8, 7), TrainingSummary())
    assert checkpoints.failures == 1 and checkpoints.saved == 1
    assert checkpoints.resume(_FakeJob(["f0", "f1"]), CounterProgram(num_keys=5)).step == 1


def test_a_checkpoint_root_belongs_to_one_live_fit(tmp_path):
    """A second identical fit finds the root held (its owner's beat moves) and takes the next
    root; once the owner releases it, or its beat stops (a killed driver), a fit takes it; a
    fit of the same owner (a relaunched coordinator) takes its own root back at once."""
    import time

    program = CounterProgram(num_keys=5)
    first, second, third = (_checkpointer(tmp_path, program) for _ in range(3))
    assert first.claim("fit-a", beat_seconds=0.5) == first.base
    assert second.claim("fit-b", beat_seconds=0.5) == first.base + "-2"  # the beat moved: a live fit
    t0 = time.monotonic()
    relaunched = _checkpointer(tmp_path, program)
    assert relaunched.claim("fit-a", beat_seconds=0.5) == first.base  # its own: at once
    assert time.monotonic() - t0 < 0.4
    for killed in (first, relaunched):  # fit-a's processes are killed: its OWNER stays, its beat stops
        killed._stop_beat.set()
        killed._stop_beat = None
    time.sleep(0.6)  # a beat being written as they stopped lands first
    assert third.claim("fit-c", beat_seconds=0.5) == first.base  # taken over
    third.release()
    second.release()
    assert not os.path.exists(os.path.join(first.base, "OWNER"))
    assert not os.path.exists(os.path.join(first.base + "-2", "OWNER"))
    assert _checkpointer(tmp_path, program).claim("fit-d", beat_seconds=0.5) == first.base


def test_restore_reads_only_the_files_of_the_checkpoints_manifest(tmp_path):
    """A file of another shard layout beside a checkpoint's files (a directory written twice) is
    never read: restore reads the files the manifest lists."""
    from pystrads.ps.client import ShardGroup, ShardInfo
    from pystrads.ps.partition import TableLayout
    from pystrads.ps.server import ShardServer

    server = ShardServer("grpc://127.0.0.1:0", "t", 1e9, "s0")
    try:
        group = ShardGroup([ShardInfo("127.0.0.1", server.port, 0, "e", "s0")], "t")
        layout = TableLayout("fit/x", 6, 1, "float64", (0, 6), (0,), 1)
        group.client(0).action("create_table", name="fit/x", row_start=0, row_stop=6, width=1, dtype="float64")
        group.table(layout).write(np.arange(6), np.arange(6.0).reshape(6, 1))
        answer = group.client(0).action("snapshot", prefix="fit/", dir=str(tmp_path))
        assert answer["files"] == ["x.0-6.npy"]
        np.save(tmp_path / "x.0-3.npy", np.full((3, 1), -1.0))  # stale: another layout's rows 0-3
        group.table(layout).write(np.arange(6), np.zeros((6, 1)))
        group.client(0).action("restore", prefix="fit/", dir=str(tmp_path), files=answer["files"])
        np.testing.assert_array_equal(group.table(layout).read()[:, 0], np.arange(6.0))
        group.client(0).action("restore", prefix="fit/", dir=str(tmp_path))  # without a manifest: every file
        assert group.table(layout).read()[0, 0] in (-1.0, 0.0)
    finally:
        server.shutdown()


def _job():
    class Handle:
        connect = True

    return BarrierJob(Handle(), WorkerInput(), num_workers=2, seed=0, namespace="fit-test", timeout=5.0,
                     keep_states=False, export=None)


def test_step_hooks_wrap_every_step_in_order_and_are_removed_after_the_block(monkeypatch):
    job = _job()
    calls = []
    monkeypatch.setattr(WorkerJob, "_run_step", lambda self, step, offset, command, close: calls.append("step") or
                        {"step": step})

    def outer(j, step, run):
        calls.append(("outer", step))
        return run()

    def inner(j, step, run):
        assert j is job
        calls.append(("inner", step))
        answer = run()
        return dict(answer, seen=True)

    with around_steps(inner), around_steps(outer):
        assert job.run_step(5, 0, {}) == {"step": 5, "seen": True}
    assert calls == [("outer", 5), ("inner", 5), "step"]
    assert job_module.STEP_HOOKS == []
    assert job.run_step(6, 0, {}) == {"step": 6}


def test_traffic_is_the_difference_between_two_commits():
    job = _job()
    job._traffic_at_commit = [{"bytes_in": 10, "bytes_out": 5, "requests": 2}, {"bytes_in": 1, "bytes_out": 1,
                                                                              "requests": 1}]
    assert job.traffic() == {"bytes_in": 0, "bytes_out": 0, "requests": 0}  # the first call sets the origin
    job._traffic_at_commit = [{"bytes_in": 30, "bytes_out": 6, "requests": 5}, {"bytes_in": 2, "bytes_out": 1,
                                                                              "requests": 4}]
    assert job.traffic() == {"bytes_in": 21, "bytes_out": 1, "requests": 6}


def test_a_job_that_is_not_running_says_so():
    with pytest.raises(Exception, match="no exports"):
        _job().fetch_exports()
    assert "not running" in str(_job().error())


def test_split_cuts_groups_into_ranges_of_about_equal_mass():
    from pystrads.engine.program import split_ranges

    assert split_ranges(10, 3) == [range(0, 3), range(3, 6), range(6, 10)]
    assert split_ranges(2, 4) == [range(0, 1), range(1, 2)]  # never an empty range
    assert split_ranges(0, 2) == []
    # CSR pointers: ratings per user 5, 1, 1, 13 -> the heavy last user alone
    assert split_ranges(np.array([0, 5, 6, 7, 20]), 2) == [range(0, 3), range(3, 4)]
    ptr = np.concatenate(([0], np.cumsum(np.random.default_rng(0).integers(1, 50, 1000))))
    parts = split_ranges(ptr, 4)
    assert [r.start for r in parts[1:]] == [r.stop for r in parts[:-1]] and parts[-1].stop == 1000
    mass = [ptr[r.stop] - ptr[r.start] for r in parts]
    assert max(mass) - min(mass) <= 2 * 50, mass


def test_parallel_runs_the_items_on_the_workers_threads_in_order_and_raises_their_error():
    import threading

    from pystrads.engine.program import WorkerContext

    ctx = WorkerContext(0, 1, 1, 0, {}, 0, 0, threads=3)
    arrived, release = [], threading.Event()

    def item(i):
        arrived.append(threading.current_thread().name)
        if len(arrived) == 3:
            release.set()
        assert release.wait(10), "the three items did not run at once"
        return i * i

    assert ctx.parallel(item, range(3)) == [0, 1, 4]
    assert len(set(arrived)) == 3 and all(n.startswith("pystrads-compute") for n in arrived)
    import numba

    assert ctx.parallel(lambda i: numba.get_num_threads(), range(3)) == [1, 1, 1]  # the items are the parallelism
    assert ctx.split(7) == [range(0, 2), range(2, 4), range(4, 7)]

    def fails(i):
        if i == 1:
            raise ValueError("item 1 failed")
        return i
    with pytest.raises(ValueError, match="item 1 failed"):
        ctx.parallel(fails, range(3))
    one = WorkerContext(0, 1, 1, 0, {}, 0, 0)
    assert one.threads == 1 and one.parallel(lambda i: threading.current_thread().name, [0, 1]) == \
        [threading.current_thread().name] * 2


def test_shards_another_fit_holds_outlive_a_fit_that_found_one_gone(monkeypatch):
    """Two fits of one application on one shard group; the second finds a shard gone: new
    shards replace the group for it (and for later fits), while the old group -- which the
    first fit still runs on -- is not shut down until that fit lets go of it too."""
    import types
    import weakref

    from pystrads import spark as spark_module
    from pystrads.ps import launcher

    class FakeManager:
        made = []

        def __init__(self, spark, config):
            self.holders, self.up, self.stopped, self.run_id = weakref.WeakSet(), True, 0, f"run-{len(self.made)}"
            self.due = False
            FakeManager.made.append(self)

        def start(self, expected_executors):
            pass

        def alive(self):
            return self.up

        def renewal_due(self):  # its certificates past half their life
            return self.due

        def shutdown(self):
            self.stopped += 1

    monkeypatch.setattr(launcher, "ShardManager", FakeManager)
    monkeypatch.setattr(launcher, "_MANAGERS", {})
    monkeypatch.setattr(launcher, "_RETIRED", [])
    monkeypatch.setattr(spark_module, "handle_of", lambda spark: spark)
    app = types.SimpleNamespace(key=7)
    class Fit:  # a holder (an Engine)
        pass

    fit_a, fit_b, fit_c = Fit(), Fit(), Fit()
    old = launcher.get_shards(app, {}, 1, holder=fit_a)
    assert launcher.get_shards(app, {}, 1, holder=fit_b) is old and set(old.holders) == {fit_a, fit_b}
    old.up = False  # fit B's step fails on a lost shard; its recovery lets go and asks again
    launcher.release_shards(old, fit_b)
    new = launcher.get_shards(app, {}, 1, holder=fit_b)
    assert new is not old and old.stopped == 0 and launcher._RETIRED == [old]  # fit A still runs on it
    assert launcher.get_shards(app, {}, 1, holder=fit_c) is new  # later fits get the new group
    launcher.release_shards(old, fit_a)  # fit A ends (or recovers onto the new group)
    assert old.stopped == 1 and launcher._RETIRED == [] and new.stopped == 0
    launcher.release_shards(new, fit_b)
    assert new.stopped == 0  # the group of the application stays for the next fit
    lone = launcher.get_shards(types.SimpleNamespace(key=8), {}, 1, holder=fit_a)
    lone.up = False
    launcher.release_shards(lone, fit_a)
    assert launcher.get_shards(types.SimpleNamespace(key=8), {}, 1, holder=fit_a) is not lone
    assert lone.stopped == 1  # nobody else held it: stopped at once
    # certificates past half their life: the next fit gets new shards, the fit on the old ones keeps them
    aging = launcher.get_shards(types.SimpleNamespace(key=9), {}, 1, holder=fit_a)
    aging.due = True
    renewed = launcher.get_shards(types.SimpleNamespace(key=9), {}, 1, holder=fit_b)
    assert renewed is not aging and aging.stopped == 0 and aging in launcher._RETIRED
    launcher.release_shards(aging, fit_a)
    assert aging.stopped == 1


def test_a_checkpoint_naming_the_engines_old_module_paths_still_loads():
    """A checkpoint written before the engine was split into its parts names the early-stopping
    rule by its old module; resuming it finds the class where it lives now."""
    import pickle

    from pystrads.engine.program.stopping import EarlyStopping
    from pystrads.engine.scheduler.checkpoints import load_driver_state

    rule = EarlyStopping("validation_rmse", rounds=3)
    rule.best_value = 1.5
    blob = pickle.dumps({"program": {"stopping": rule}, "num_workers": 2}, protocol=0)  # names as text
    old = blob.replace(b"pystrads.engine.program.stopping", b"pystrads.engine.stopping")
    assert old != blob and b"pystrads.engine.program.stopping" not in old
    with pytest.raises(ModuleNotFoundError):
        pickle.loads(old)  # what a plain unpickler makes of it
    state = load_driver_state(old)
    assert isinstance(state["program"]["stopping"], EarlyStopping) and state["program"]["stopping"].best_value == 1.5
    assert state["num_workers"] == 2
