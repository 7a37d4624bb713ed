"""The scheduler in the fit's job (``spark.pystrads.scheduler.location=job``), on a classic
session: the same results as with the scheduler on the driver, the coordinator's errors raised on
the client, and a lost job relaunched from the coordinator's journal on the shards with no step
applied twice or in part -- including a coordinator that dies in ``after_step`` once it wrote a
table, or right after its step's commit point."""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np
import pytest
from pyspark import cloudpickle

from pystrads.engine import Engine
from pystrads.errors import ConfigurationError, ScheduleError
from pystrads.programs import examples as ex

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the test's programs travel by value

IN_JOB = {"scheduler.location": "job"}
ITERATIONS = 6


class FailOnce(ex.RotationSum):
    """RotationSum that fails once, the first time it reaches ``at_round``: in a worker's ``push``
    (its task's process dies: a lost executor, not a program error) or, with
    ``where="after_step"``, by killing the coordinator's process in that step's ``after_step``.  A marker file makes it fail only once across relaunches."""

    def __init__(self, num_keys, iterations, marker, at_round, where="push"):
        super().__init__(num_keys, iterations)
        self.marker, self.at_round, self.where = marker, at_round, where

    def _strike(self):
        if not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os._exit(3)  # the task's process dies: worker 1's (push), or the coordinator's (the first task's)

    def push(self, ctx, data, state, block):
        if self.where == "push" and ctx.worker == 1 and ctx.round >= self.at_round:
            self._strike()
        return super().push(ctx, data, state, block)

    def schedule(self, ctx):
        U = ctx.num_workers
        n = min(ctx.rounds_this_step(self.iterations * U, U), U)  # an iteration a step: many steps
        return ex.Schedule.per_worker([[(p + r) % U for p in range(U)] for r in range(n)]) if n else None

    def after_step(self, ctx, metrics):
        super().after_step(ctx, metrics)
        if self.where == "after_step" and ctx.rounds_done + len(metrics.rounds) >= self.at_round:
            self._strike()


class SideEffects(FailOnce):
    """FailOnce whose ``schedule`` and ``after_step`` write a table and bump attributes: a step
    replayed (or applied in part) shows in ``counts`` -- [after_step calls, schedule calls that
    ran a step] -- and in the attributes, which must equal the number of steps."""

    def __init__(self, num_keys, iterations, marker, at_round, where):
        super().__init__(num_keys, iterations, marker, at_round, where)
        self.after_steps = 0
        self.schedules = 0

    def tables(self):
        return super().tables() + [ex.Table("counts", 2, 1, "float64")]

    def schedule(self, ctx):
        schedule = super().schedule(ctx)
        if schedule is not None:
            self.schedules += 1
            ctx.table("counts").add([1], [[1.0]])
        return schedule

    def after_step(self, ctx, metrics):
        ctx.table("counts").add([0], [[1.0]])
        self.after_steps += 1
        ctx.record(after_steps=self.after_steps, schedules=self.schedules)
        if self.where == "after_write" and ctx.rounds_done + len(metrics.rounds) >= self.at_round:
            self._strike()  # dies with the table written and the attribute bumped, before the commit point
        super().after_step(ctx, metrics)  # where="after_step": dies once it returned


class BadSchedule(ex.RotationSum):
    def schedule(self, ctx):
        return [[0]]


@pytest.fixture(scope="module")
def data(spark):
    rng = np.random.default_rng(11)
    keys, vals = rng.integers(0, 200, 3000), rng.random(3000)
    df = spark.createDataFrame(list(zip(keys.tolist(), vals.tolist())), "key long, value double")
    return df, np.bincount(keys, vals, 200)


def _sums(program, df, config):
    engine = Engine(program, df, num_workers=2, seed=1, config=config)
    with engine.fit() as res:
        return res.read_table("sums")[:, 0], res.summary


def test_the_scheduler_in_the_job_gives_the_drivers_results(data):
    df, per_key = data
    on_driver, _ = _sums(ex.RotationSum(200, iterations=3), df, {"scheduler.location": "driver"})
    in_job, summary = _sums(ex.RotationSum(200, iterations=3), df, IN_JOB)
    np.testing.assert_array_equal(in_job, on_driver)
    np.testing.assert_allclose(in_job, 3 * per_key, atol=1e-9)
    assert summary.total_rounds == 6 and summary.fixed["shard_start_s"] > 0 and "init_s" in summary.fixed


def test_the_coordinators_errors_reach_the_client(data):
    df, _ = data
    with pytest.raises(ScheduleError, match="returned list; return a Schedule or None") as info:
        Engine(BadSchedule(200), df, num_workers=2, config=IN_JOB).fit()
    assert any("coordinator" in note for note in getattr(info.value, "__notes__", []))


def test_an_rdd_input_is_refused_with_the_setting_named(spark):
    rdd = spark.sparkContext.parallelize([(0, 1.0)], 1)
    with pytest.raises(ConfigurationError, match="scheduler.location=job.*DataFrame"):
        Engine(ex.RotationSum(1), rdd, config=IN_JOB)


@pytest.mark.parametrize("where, at_round", [("push", 5), pytest.param("after_step", 6, marks=pytest.mark.slow)])
def test_a_lost_job_resumes_from_the_coordinators_state_exactly(data, where, at_round):
    df, per_key = data
    marker = os.path.join(tempfile.mkdtemp(prefix="pystrads-coordinator-"), "struck")
    sums, summary = _sums(FailOnce(200, ITERATIONS, marker, at_round, where), df, IN_JOB)
    assert os.path.exists(marker)  # the fault happened
    assert summary.fixed.get("recoveries") == 1, summary.fixed
    # read-modify-write rotations: a step applied twice or lost would show in every key it touched
    np.testing.assert_allclose(sums, ITERATIONS * per_key, atol=1e-9)
    assert summary.total_rounds == 2 * ITERATIONS
    assert [row["step"] for row in summary.rows] == list(range(1, ITERATIONS + 1))


def _side_effects_fit(df, where, at_round):
    from pystrads.engine import Engine

    marker = os.path.join(tempfile.mkdtemp(prefix="pystrads-coordinator-"), "struck")
    engine = Engine(SideEffects(200, ITERATIONS, marker, at_round, where), df, num_workers=2, seed=1, config=IN_JOB)
    with engine.fit() as res:
        return marker, res.read_table("sums")[:, 0], res.read_table("counts")[:, 0], res.summary, engine.program


@pytest.mark.parametrize("where, at_round", [("after_write", 4), pytest.param("after_step", 4, marks=pytest.mark.slow),
                                             ("push", 5)])
def test_a_relaunch_applies_the_loops_own_writes_once(data, where, at_round):
    """The coordinator's process dies while ``after_step`` of step 2 runs, once it wrote a table
    (before the step's commit point), or right after it (once ``after_step`` returned: the journal
    entry may or may not be written), or a worker fails during step 3: the tables ``schedule``
    and ``after_step`` write, and the program's attributes, count each step once."""
    df, per_key = data
    marker, sums, counts, summary, program = _side_effects_fit(df, where, at_round)
    assert os.path.exists(marker)  # the fault happened
    assert summary.fixed.get("recoveries") == 1, summary.fixed
    np.testing.assert_allclose(sums, ITERATIONS * per_key, atol=1e-9)
    assert counts.tolist() == [ITERATIONS, ITERATIONS]  # after_step's and schedule's writes, each once a step
    assert program.after_steps == ITERATIONS and program.schedules == ITERATIONS
    assert [row["after_steps"] for row in summary.rows] == list(range(1, ITERATIONS + 1))
    assert [row["step"] for row in summary.rows] == list(range(1, ITERATIONS + 1))


def test_checkpoints_written_in_the_job_resume_a_later_fit(data):
    df, per_key = data
    directory = tempfile.mkdtemp(prefix="pystrads-coordinator-ckpt-")
    config = dict(IN_JOB, **{"checkpoint.dir": directory, "checkpoint.interval": 1})
    first, summary = _sums(ex.RotationSum(200, iterations=2), df, config)
    assert summary.fixed.get("checkpoints") == 2  # written by the coordinator, one a step
    (fit_dir,) = [d for d in os.listdir(directory) if d.startswith("pystrads-")]
    assert "LATEST" in os.listdir(os.path.join(directory, fit_dir))
    again, summary = _sums(ex.RotationSum(200, iterations=2), df, config)
    assert summary.fixed.get("resumed_from_step") == 2 and summary.total_rounds == 4  # nothing left to run
    np.testing.assert_allclose(again, first, atol=0)
    np.testing.assert_allclose(again, 2 * per_key, atol=1e-9)
