"""The four program shapes end to end on local[2], plus atomicity and pre-flight checks."""

import os
import sys
import tempfile
import time

import numpy as np
import pytest
from pyspark import cloudpickle

from pystrads.engine import Engine, Program, Schedule, Table
from pystrads.errors import ConfigurationError, ProgramError, PystradsError, ScheduleError
from pystrads.programs import examples as ex

from shapes import run_block_lstsq, run_priority_lasso, run_rotation, run_sgd

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # test programs travel by value


def test_static_rotation_gives_exact_block_sums(sc):
    got, expected, summary = run_rotation(sc)
    assert np.allclose(got, expected, rtol=0, atol=1e-9)
    assert summary.total_rounds == 3 * 2
    assert summary.rows[-1]["iteration"] == 3


def test_alternating_blocks_reach_lstsq(sc):
    x, ref, summary = run_block_lstsq(sc)
    assert np.allclose(x, ref, atol=1e-8), np.abs(x - ref).max()
    objectives = [r["objective"] for r in summary.rows]
    assert all(b <= a + 1e-9 for a, b in zip(objectives, objectives[1:])), "BCD never increases the loss"


def test_dynamic_pipelined_schedule_reaches_lasso_optimum(sc):
    x, ref, summary, (a, b, lam) = run_priority_lasso(sc)
    obj = lambda v: 0.5 * np.sum((a @ v - b) ** 2) + lam * np.abs(v).sum()
    assert obj(x) <= obj(ref) * (1 + 1e-9)
    assert np.allclose(x, ref, atol=1e-6), np.abs(x - ref).max()
    assert summary.rows[0]["rounds"] == 40  # pipeline depth = rounds shipped per step


def test_data_parallel_ssp_reaches_known_weights(sc):
    w, w_true, summary = run_sgd(sc)
    assert np.allclose(w, w_true, atol=1e-6), np.abs(w - w_true).max()
    assert summary.rows[-1]["objective"] < 1e-10


def test_counter_table_is_exact(sc):
    program = ex.CounterProgram(num_keys=7, rounds_per_step=5, steps=3)
    with Engine(program, sc.parallelize(range(10), 2)).fit() as res:
        assert np.array_equal(res.read_table("counter")[:, 0], program.expected(2))
        states = res.map_states(lambda worker, data, state: (worker, data, state))
    assert states == [(0, 5, 15), (1, 5, 15)]


class FailingCounter(ex.CounterProgram):
    """Fails once, in the middle of step 2 on worker 1, after some of its writes."""

    def __init__(self, marker, **kw):
        super().__init__(**kw)
        self.marker = marker

    def push(self, ctx, data, state, work):
        out = super().push(ctx, data, state, work)
        if ctx.step == 2 and ctx.worker == 1 and ctx.local_round == 3 and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os._exit(3)  # the task's process dies (a raised error would be the program's own, never retried)
        return out


def test_the_model_the_states_and_the_exports_are_exact(sc):
    """Static rotation sums, the counter program's table, states and exports are exact."""
    rng = np.random.default_rng(0)
    keys, vals = rng.integers(0, 300, 5000), rng.random(5000)
    rdd = sc.parallelize(list(zip(keys.tolist(), vals.tolist())), 2)
    with Engine(ex.RotationSum(300, iterations=3), rdd, seed=1).fit() as res:
        np.testing.assert_allclose(res.read_table("sums")[:, 0], 3 * np.bincount(keys, vals, 300), rtol=0, atol=1e-9)
    program = ex.CounterProgram(num_keys=7, rounds_per_step=5, steps=3)
    engine = Engine(program, sc.parallelize(range(10), 2), export=lambda worker, data, state: (worker, data, state))
    with engine.fit() as res:
        assert np.array_equal(res.read_table("counter")[:, 0], program.expected(2))
        assert res.exports == res.map_states(lambda worker, data, state: (worker, data, state)) \
            == [(0, 5, 15), (1, 5, 15)]
    assert len(res.summary.rows) == 3


class SummarisedCounter(ex.CounterProgram):
    """The counter, whose workers summarise their loaded data for the driver's check_data;
    ``refuse``: the check refuses the data (init_state would leave ``marker``)."""

    def __init__(self, marker, refuse=False, **kw):
        super().__init__(**kw)
        self.marker, self.refuse = marker, refuse
        self.seen = None

    def load(self, ctx, records):
        return sorted(records)

    def data_summary(self, ctx, data):
        return {"worker": ctx.worker, "count": len(data), "sum": sum(data)}

    def check_data(self, summaries):
        self.seen = summaries
        if self.refuse:
            raise ValueError(f"worker sums {[s['sum'] for s in summaries]}: refused")

    def init_state(self, ctx, data):
        open(self.marker, "a").close()
        return super().init_state(ctx, data)


def test_the_driver_checks_every_workers_data_summary_before_the_init_step(sc, tmp_path):
    """``data_summary`` runs on each worker once its data is loaded; ``check_data`` gets them
    in worker order on the driver before the init step, and an exception there ends the fit
    before any worker's init_state ran, with no task left running."""
    import time

    program = SummarisedCounter(str(tmp_path / "init-ran"), num_keys=5, rounds_per_step=2, steps=1)
    with Engine(program, sc.parallelize(range(10), 2)).fit() as res:
        assert np.array_equal(res.read_table("counter")[:, 0], program.expected(2))
    assert program.seen == [{"worker": 0, "count": 5, "sum": 10}, {"worker": 1, "count": 5, "sum": 35}]
    marker = tmp_path / "refused-init-ran"
    program = SummarisedCounter(str(marker), refuse=True, num_keys=5, rounds_per_step=2, steps=1)
    with pytest.raises(ValueError, match=r"worker sums \[10, 35\]: refused"):
        Engine(program, sc.parallelize(range(10), 2)).fit()
    assert not marker.exists()
    tracker = sc.statusTracker()
    deadline = time.monotonic() + 20
    while tracker.getActiveJobsIds() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not tracker.getActiveJobsIds()


def test_a_fit_without_kept_states_refuses_map_states_and_says_how(sc):
    program = ex.CounterProgram(num_keys=7, rounds_per_step=5, steps=2)
    with Engine(program, sc.parallelize(range(10), 2), keep_states=False).fit() as res:
        assert np.array_equal(res.read_table("counter")[:, 0], program.expected(2))
        with pytest.raises(PystradsError, match="keep_states=False.*keep_states=True"):
            res.map_states(lambda worker, data, state: state)


def test_exports_hand_each_workers_results_over_when_the_fit_ends(sc):
    """``export=fn`` runs on every worker at the end of the fit; the results come back in worker
    order, equal to what map_states reads from the kept states."""
    program = ex.CounterProgram(num_keys=7, rounds_per_step=5, steps=3)
    engine = Engine(program, sc.parallelize(range(10), 2), export=lambda worker, data, state: (worker, data, state))
    with engine.fit() as res:
        exported = res.exports
        assert exported == res.map_states(lambda worker, data, state: (worker, data, state))
    assert exported == [(0, 5, 15), (1, 5, 15)]


def test_failed_step_is_rerun_without_lost_or_doubled_updates(sc):
    marker = os.path.join(tempfile.mkdtemp(), "failed-once")
    program = FailingCounter(marker, num_keys=7, rounds_per_step=6, steps=3)
    with Engine(program, sc.parallelize(range(10), 2)).fit() as res:
        got = res.read_table("counter")[:, 0]
    assert os.path.exists(marker), "the failure was injected"
    assert np.array_equal(got, program.expected(2))


class AlwaysFailing(ex.CounterProgram):
    def push(self, ctx, data, state, work):
        super().push(ctx, data, state, work)
        if ctx.step == 2 and ctx.local_round == 1:
            raise ValueError("broken program")
        return state + 1


def test_a_program_error_fails_the_fit_at_once_and_names_the_cause(sc):
    """An error the program raises is not a lost task: no attempt runs again (the shards roll
    the step back) and the error names the hook, the worker and the cause."""
    program = AlwaysFailing(num_keys=5, rounds_per_step=4, steps=3)
    engine = Engine(program, sc.parallelize(range(4), 2))
    with pytest.raises(ProgramError, match=r"AlwaysFailing\.push raised in worker \d \(task \d+, step 2\).*broken program"):
        engine.fit()
    assert "recoveries" not in engine.summary.fixed


def test_preflight_refuses_more_workers_than_slots(sc):
    engine = Engine(ex.EmptyProgram(10), sc.parallelize(range(10), 4), num_workers=3)
    with pytest.raises(ConfigurationError, match=r"num_workers=3 needs 3 task slots.*offers 2"):
        engine.fit()


class BadSchedule(ex.EmptyProgram):
    def schedule(self, ctx):
        return Schedule.per_worker([[0]])  # one work item for two workers


def test_bad_schedule_is_refused_before_the_step(sc):
    with pytest.raises(ScheduleError, match="1 work items for 2 workers"):
        Engine(BadSchedule(10), sc.parallelize(range(4), 2)).fit()


class ApplyWithStaleness(ex.BlockLeastSquares):
    staleness = 1


def test_apply_with_staleness_is_refused(sc):
    with pytest.raises(ConfigurationError, match="staleness must be 0"):
        Engine(ApplyWithStaleness(3, [[0, 1, 2]]), sc.parallelize(range(4), 2))


def _jobs(sc, engine):
    tracker = sc.statusTracker()
    return [j for g in engine.job_groups for j in tracker.getJobIdsForGroup(g)]


def test_a_fit_runs_as_one_spark_job_whatever_its_steps(sc):
    """1,200 rounds in three steps of 400, all inside one Spark job (the workers'):
    rounds are synchronised by the shards' clocks and steps are epochs on the shards, not a
    Spark job each; no other job starts during the fit.  (How many rounds per second that gives
    is measured by ``jobs/bench_runtime.py``, not here.)"""
    Engine(ex.EmptyProgram(2), sc.parallelize(range(4), 2)).fit().release()  # shards up
    tracker = sc.statusTracker()
    # job ids only grow, and the tracker forgets the oldest jobs (spark.ui.retainedJobs): new ids only
    last = max(tracker.getJobIdsForGroup(None), default=-1)
    engine = Engine(ex.EmptyProgram(1200, rounds_per_step=400), sc.parallelize(range(4), 2))
    with engine.fit() as res:
        rows = res.summary.rows
    assert [r["rounds"] for r in rows] == [400, 400, 400]
    assert len(_jobs(sc, engine)) == 1, (engine.job_groups, _jobs(sc, engine))
    started = [j for j in tracker.getJobIdsForGroup(None) if j > last]
    assert started == []  # shards were already up: no launch job, no other job


def test_a_scheduler_deciding_every_round_sees_every_update(sc):
    """One round per step, the driver reading the table before each (a dynamic scheduler in the
    loop): 150 steps in one Spark job, every worker's update of every step on the shards, and
    the least-visited-row rule visiting the 64 rows evenly."""
    program = ex.EveryRoundProgram(rounds=150, num_rows=64, block_bytes=1 << 16)
    engine = Engine(program, sc.parallelize(range(2), 2))
    with engine.fit() as res:
        visits = res.read_table("score")[:, 0]
        states = res.map_states(lambda worker, data, state: state)
        steps = len(res.summary.rows)
    assert steps == 150 and states == [150, 150]
    assert visits.sum() == 2 * 150
    assert visits.max() - visits.min() <= 2, visits  # argmin over fresh values each round
    assert len(_jobs(sc, engine)) == 1


def _rotation_data(sc, seed):
    rng = np.random.default_rng(seed)
    keys, vals = rng.integers(0, 300, 5000), rng.random(5000)
    return sc.parallelize(list(zip(keys.tolist(), vals.tolist())), 2), 3 * np.bincount(keys, vals, 300)


def test_two_fits_from_two_threads_of_one_driver_equal_sequential_fits(sc):
    """Two fits of the same program on different data, started at the same moment from two
    threads of one driver (what ``CrossValidator(parallelism=2)`` does): they share the shards,
    each under its own table namespace, and each model -- read once both fits are done and
    still held -- is what its fit gives alone."""
    import threading
    import time

    seeds = (11, 12)
    alone = {}
    for seed in seeds:
        rdd, _ = _rotation_data(sc, seed)
        with Engine(ex.RotationSum(300, iterations=3), rdd, seed=seed).fit() as res:
            alone[seed] = res.read_table("sums")[:, 0]
    start, fitted = threading.Barrier(2), threading.Barrier(2)
    results, windows, errors = {}, {}, []

    def fit(seed):
        try:
            rdd, exact = _rotation_data(sc, seed)
            start.wait(timeout=60)
            t0 = time.monotonic()
            with Engine(ex.RotationSum(300, iterations=3), rdd, seed=seed).fit() as res:
                windows[seed] = (t0, time.monotonic())
                fitted.wait(timeout=600)  # both models are on the shards at once
                results[seed] = (res.read_table("sums")[:, 0], exact)
        except BaseException as exc:  # noqa: BLE001 -- reported below with the thread's seed
            errors.append((seed, repr(exc)))

    threads = [threading.Thread(target=fit, args=(seed,)) for seed in seeds]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not errors, errors
    (a0, a1), (b0, b1) = windows[11], windows[12]
    assert a0 < b1 and b0 < a1, windows  # the two fits were in flight at the same time
    for seed, value in alone.items():
        got, exact = results[seed]
        np.testing.assert_allclose(got, value, rtol=0, atol=1e-12, err_msg=str(seed))
        np.testing.assert_allclose(got, exact, rtol=0, atol=1e-9, err_msg=str(seed))


class LateReader(ex.CounterProgram):
    """Its workers ask for their next command 1.5 s late once they finished a step: the driver
    has then committed, posted ``finish`` and (the caller) released the fit."""

    def __setstate__(self, state):
        self.__dict__.update(state)
        from pystrads.engine.executor import worker as worker_module

        if not getattr(worker_module._Worker.next_command, "_late", False):
            plain = worker_module._Worker.next_command

            def next_command(worker, done_step, done=None, snapshot=None):
                if isinstance(worker.program, LateReader) and done_step >= 0:
                    if done is not None:  # the step is done at once; only the next poll is late
                        import base64

                        from pystrads.ps.protocol import Action

                        if snapshot is not None:  # (a small snapshot rides the poll: stored first)
                            fence = {k: done[k] for k in ("namespace", "step", "worker", "task")}
                            worker.group.client(0).put_blob(snapshot["key"], base64.b64decode(snapshot["blob"]), dict(
                                fence, drop_prefix=snapshot["drop_prefix"], keep_after=snapshot["keep_after"]))
                        worker.group.client(0).action(Action.STEP_DONE, **done)
                        done = snapshot = None
                    __import__("time").sleep(1.5)
                return plain(worker, done_step, done, snapshot)

            next_command._late = True
            worker_module._Worker.next_command = next_command


@pytest.mark.slow  # several seconds; the README's command keeps a faster test of the same kind
def test_fits_released_at_once_leave_no_task_running(sc):
    """A fit whose states nobody keeps returns without waiting for its job's teardown, and the
    caller may drop its tables at once: a worker that had not yet read ``finish`` must then end
    (it used to wait for ever, holding its task slot, so the next fit's barrier job never ran)."""
    import time

    tracker = sc.statusTracker()
    for i in range(2):
        program = LateReader(num_keys=7, rounds_per_step=2, steps=1)
        engine = Engine(program, sc.parallelize(range(10), 2), keep_states=False, seed=i)
        with engine.fit() as res:
            assert np.array_equal(res.read_table("counter")[:, 0], program.expected(2))
    deadline = time.monotonic() + 20
    while tracker.getActiveJobsIds() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not tracker.getActiveJobsIds(), [tracker.getJobInfo(j) for j in tracker.getActiveJobsIds()]


def test_a_fit_whose_tasks_get_no_slots_fails_clearly_instead_of_waiting(sc, monkeypatch):
    """Another job holds every task slot: the fit's barrier job cannot start, and the fit says so
    (warning, then failing after round.timeoutSeconds) instead of waiting for ever."""
    import threading

    from pystrads.engine.driver import launch

    monkeypatch.setattr(launch, "SLOT_WAIT_WARN_SECONDS", 0.5)
    release = threading.Event()

    def hog():
        sc.setJobGroup("slot-hog", "holds both task slots", interruptOnCancel=True)
        try:
            sc.parallelize(range(2), 2).foreach(lambda _: __import__("time").sleep(120))
        except Exception:  # noqa: BLE001 -- cancelled below
            pass
        release.set()

    t = threading.Thread(target=hog, daemon=True)
    t.start()
    try:
        __import__("time").sleep(2)  # the hog's tasks are running
        engine = Engine(ex.CounterProgram(num_keys=3, rounds_per_step=1, steps=1), sc.parallelize(range(4), 2),
                        config={"round.timeoutSeconds": 3.0, "recovery.maxAttempts": 0})
        with pytest.raises(ConfigurationError, match=r"waited \d+ s for task slots: 0 of its 2 tasks run.*numWorkers"):
            engine.fit()
    finally:
        sc.cancelJobGroup("slot-hog")
        release.wait(30)


def test_a_dataframe_input_gives_the_same_exact_model_as_its_rdd(spark):
    """A DataFrame runs through one ``mapInArrow(barrier=True)`` job (what Spark Connect
    offers): rows arrive as tuples, the rotation sums are exact, exports come back, and what
    an RDD-only feature needs is refused with the fix."""
    rng = np.random.default_rng(3)
    keys, vals = rng.integers(0, 300, 5000), rng.random(5000)
    df = spark.createDataFrame(list(zip(keys.tolist(), vals.tolist())), "key long, value double")
    exact = 3 * np.bincount(keys, vals, 300)
    engine = Engine(ex.RotationSum(300, iterations=3), df, num_workers=2, seed=1,
                    export=lambda worker, data, state: (worker, float(data["local"].sum())))
    with engine.fit() as res:
        np.testing.assert_allclose(res.read_table("sums")[:, 0], exact, rtol=0, atol=1e-9)
        assert [w for w, _ in res.exports] == [0, 1]
        assert abs(sum(v for _, v in res.exports) - vals.sum()) < 1e-9  # every row reached a worker once
        with pytest.raises(PystradsError, match="keep_states=False"):
            res.map_states(lambda worker, data, state: state)
    # one launch: the barrier job (and the repartition's shuffle, which adaptive execution runs as
    # a job of its own)
    assert len(engine.job_groups) == 1 and len(_jobs(spark.sparkContext, engine)) <= 2
    # already partitioned by key: used as it is (each worker holds whole keys)
    by_key = df.repartition(2, "key")
    with Engine(ex.RotationSum(300, iterations=2), by_key, num_workers=2, seed=1, prepartitioned=True).fit() as res:
        np.testing.assert_allclose(res.read_table("sums")[:, 0], exact * 2 / 3, rtol=0, atol=1e-9)
    # decode_batch: each Arrow batch becomes the records (here every value doubled)
    doubled = Engine(ex.RotationSum(300, iterations=1), df, num_workers=2, seed=1,
                     decode_batch=lambda b: zip(b.column(0).to_pylist(), (2 * b.column(1).to_numpy()).tolist()))
    with doubled.fit() as res:
        np.testing.assert_allclose(res.read_table("sums")[:, 0], exact * 2 / 3, rtol=0, atol=1e-9)
    with pytest.raises(ConfigurationError, match="decode= .per row. or decode_batch= .per Arrow batch., not both"):
        Engine(ex.RotationSum(300), df, num_workers=2, decode=tuple, decode_batch=list)
    with pytest.raises(ConfigurationError, match="decode_batch= applies to DataFrame inputs"):
        Engine(ex.RotationSum(300), spark.sparkContext.parallelize([(1, 1.0)]), num_workers=2, decode_batch=list)
    with pytest.raises(ConfigurationError, match="keep_states=True needs an RDD.*export="):
        Engine(ex.RotationSum(300), df, num_workers=2, keep_states=True)


def test_a_failed_task_of_a_dataframe_fit_is_relaunched_without_lost_or_doubled_updates(spark):
    """A DataFrame input's job is a barrier *result* stage, which Spark does not retry: the
    driver relaunches the job and reruns the step from the workers' snapshots, exactly."""
    marker = os.path.join(tempfile.mkdtemp(), "failed-once")
    program = FailingCounter(marker, num_keys=7, rounds_per_step=6, steps=3)
    engine = Engine(program, spark.range(10).selectExpr("id"), num_workers=2, keep_states=False)
    with engine.fit() as res:
        got = res.read_table("counter")[:, 0]
        recoveries = res.summary.fixed.get("recoveries")
    assert os.path.exists(marker), "the failure was injected"
    assert np.array_equal(got, program.expected(2))
    assert recoveries == 1 and len(engine.job_groups) == 2  # relaunched once by the driver
    # a program that raises is never relaunched: its error is named at once
    engine = Engine(AlwaysFailing(num_keys=5, rounds_per_step=4, steps=3), spark.range(4).selectExpr("id"),
                    num_workers=2, keep_states=False, config={"recovery.maxAttempts": 1})
    with pytest.raises(ProgramError, match="AlwaysFailing.push raised.*broken program"):
        engine.fit()
    assert len(engine.job_groups) == 1


@pytest.mark.parametrize("done, hint, expected", [
    (0, 1, 3),       # at least one whole iteration
    (0, 7, 6),       # whole iterations only, below the hint
    (0, 100, 12),    # never past the total
    (9, 100, 3),     # what is left
    (12, 5, 0),      # all ran
])
def test_rounds_this_step_sizes_whole_iterations_near_the_hint(done, hint, expected):
    from types import SimpleNamespace

    from pystrads.engine.program import ScheduleContext

    ctx = ScheduleContext(SimpleNamespace(num_workers=3, seed=0))
    ctx.rounds_done, ctx.rounds_hint = done, hint
    assert ctx.rounds_this_step(12, 3) == expected


def test_background_work_is_done_and_its_error_raised_before_a_call_counts_as_done():
    """``ctx.background``: a round's push may leave reads and writes running on a thread; the
    worker waits for all of them (and raises the first error) before the round's metrics --
    and so its clock tick -- go out."""
    import threading
    import time

    from pystrads.engine.program import WorkerContext

    ctx = WorkerContext(0, 1, 1, 0, {}, 0, 0)
    done = threading.Event()

    def slow():
        time.sleep(0.2)
        done.set()
        return 7

    future = ctx.background(slow)
    ctx.report(x=1.0)
    assert ctx._take_metrics() == {"x": 1.0} and done.is_set() and future.result() == 7

    def fail():
        raise ValueError("write refused")

    ctx.background(fail)
    ctx.background(slow)
    done.clear()
    with pytest.raises(ValueError, match="write refused"):
        ctx._take_metrics()
    assert done.is_set()  # the other call still ran to the end
    assert ctx._take_metrics() == {}  # nothing left pending


class _ReadBackProgram(Program):
    """Each round every worker contributes ones at unsorted, repeated keys
    (``read_back=True``); ``apply`` compares ``ctx.pulled`` with a ``get`` of the same
    keys and notes whether the rows had come back with the tick."""

    def __init__(self, rows=40, rounds=6):
        self.rows, self.rounds = rows, rounds

    def tables(self):
        return [Table("x", self.rows, 2, "float64", contrib_width=1)]

    def load(self, ctx, records):
        return list(records)

    def init_state(self, ctx, data):
        return {"mismatch": 0, "fused": 0, "post": 0}

    def schedule(self, ctx):
        return Schedule.shared(list(range(self.rounds))) if ctx.rounds_done == 0 else None

    def keys(self, worker, rnd):
        rng = np.random.default_rng([worker, rnd])
        return rng.integers(0, self.rows, 25)  # unsorted, with repeats

    def push(self, ctx, data, state, work):
        keys = self.keys(ctx.worker, work)
        ctx.contribute("x", keys, np.ones((len(keys), 1)), read_back=True)
        return state

    def pull(self, table, keys, partials, current):
        return current + np.column_stack([partials[:, 0], np.ones(len(keys))])

    def apply(self, ctx, data, state, work):
        keys = self.keys(ctx.worker, work)
        state["fused"] += int("x" in ctx._pulled)  # there before apply asked: came with the tick
        back = ctx.pulled("x")
        state["mismatch"] += int(not np.array_equal(back, ctx.table("x").read(keys)))
        state["post"] += int(back[:, 1].min() >= 1)  # every key went through this round's pull
        return state


def test_rows_read_back_with_the_tick_are_the_rows_a_get_reads_after_the_round(sc):
    """``contribute(..., read_back=True)`` + ``ctx.pulled``: the runtime brings the rows back
    with the round's tick; they equal a ``get`` of the same (unsorted, repeated) keys after the
    round's pull.  (Two shards: ``test_shard.py``'s round exchange test.)"""
    program = _ReadBackProgram()
    with Engine(program, sc.parallelize(range(4), 2)).fit() as res:
        table = res.read_table("x")
        states = res.map_states(lambda worker, data, state: state)
    expected = np.zeros(program.rows)
    for w in range(2):
        for r in range(program.rounds):
            np.add.at(expected, program.keys(w, r), 1.0)
    np.testing.assert_array_equal(table[:, 0], expected)
    assert [s["mismatch"] for s in states] == [0, 0]
    assert [s["fused"] for s in states] == [program.rounds] * 2
    assert [s["post"] for s in states] == [program.rounds] * 2


class PlannedCounter(ex.CounterProgram):
    """A counter whose schedule takes a while and may be planned while the step before runs;
    its ``after_step`` ends the fit after ``steps`` steps, so the step planned meanwhile must
    never run.  ``calls`` is the order of its driver-side hooks."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.calls = []

    def plans_ahead(self, ctx):
        return True

    def schedule(self, ctx):
        self.calls.append(("schedule", ctx.step))
        time.sleep(0.3)
        ctx.record(planned_for=ctx.step)
        return Schedule.data_parallel(self.rounds_per_step)

    def push(self, ctx, data, state, work):
        time.sleep(0.25)  # a step of 3 rounds outlasts the schedule
        return super().push(ctx, data, state, work)

    def after_step(self, ctx, metrics):
        self.calls.append(("after", ctx.step))
        if ctx.step >= self.steps:
            ctx.stop("done")


@pytest.mark.parametrize("ahead", [True, False])
def test_a_schedule_planned_while_the_step_before_runs_hides_its_time_and_changes_no_update(sc, ahead):
    program = PlannedCounter(num_keys=5, rounds_per_step=3, steps=3)
    engine = Engine(program, sc.parallelize(range(10), 2), num_workers=2, config={"scheduler.planAhead": ahead})
    with engine.fit() as res:
        counter = res.read_table("counter")[:, 0]
        rows, fixed = res.summary.rows, res.summary.fixed
    assert np.array_equal(counter, program.expected(2))  # the step planned after the stop never ran
    assert [r["planned_for"] for r in rows] == [1, 2, 3]  # what schedule recorded lands in its own step's row
    if ahead:  # schedule(s + 1) runs during step s, and before after_step(s)
        assert program.calls == [("schedule", 1), ("schedule", 2), ("after", 1), ("schedule", 3), ("after", 2),
                                 ("schedule", 4), ("after", 3)]
        assert [r["planned_ahead"] for r in rows] == [False, True, True]
        # each planned-ahead schedule (0.3 s of sleep) ran during a step (0.75 s of pushes): the
        # loop waited for at most half of it (a 2x margin on a loaded machine)
        assert all(r["schedule_s"] >= 0.3 and r["schedule_wait_s"] < 0.5 * r["schedule_s"] for r in rows[1:]), rows
        assert fixed["schedule_wait_s"] < 0.5 * fixed["schedule_s"], fixed
    else:
        assert program.calls == [("schedule", 1), ("after", 1), ("schedule", 2), ("after", 2), ("schedule", 3),
                                 ("after", 3)]
        assert not any(r["planned_ahead"] for r in rows)
        assert all(r["schedule_wait_s"] == r["schedule_s"] >= 0.3 for r in rows)
