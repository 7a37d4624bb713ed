"""A task lost in any phase of a fit -- while the workers load their data, while the loop checks
it, in the init step, in the rounds -- is recovered, on the classic path and with the scheduler in
the job, and the fit ends equal to the fault-free one: the phases before the first step are
inside the same recovery as the steps."""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np
import pytest
from pyspark import cloudpickle

from pystrads.engine import Engine
from pystrads.programs import examples as ex

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the test's programs travel by value

ITERATIONS = 3


class LosesATask(ex.RotationSum):
    """RotationSum whose worker 1 loses its process (``os._exit``: a lost executor or Python
    worker, not a program error) once, in ``phase``; with ``check``, the loop checks the data."""

    def __init__(self, marker, phase):
        super().__init__(60, ITERATIONS)
        self.marker, self.phase = marker, phase

    def _strike(self, ctx, phase):
        if phase == self.phase and ctx.worker == 1 and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os._exit(3)

    def load(self, ctx, records):
        self._strike(ctx, "load")
        return super().load(ctx, records)

    def data_summary(self, ctx, data):
        self._strike(ctx, "check")
        return float(data["local"].sum())

    def check_data(self, summaries):
        self.total = sum(summaries)

    def init_state(self, ctx, data):
        self._strike(ctx, "init")
        return None

    def push(self, ctx, data, state, block):
        if ctx.round == 3:
            self._strike(ctx, "rounds")
        return super().push(ctx, data, state, block)


@pytest.fixture(scope="module")
def frame(spark):
    rng = np.random.default_rng(21)
    keys, vals = rng.integers(0, 60, 900), rng.random(900)
    return spark.createDataFrame(list(zip(keys.tolist(), vals.tolist())), "key long, value double"), \
        np.bincount(keys, vals, 60)


@pytest.mark.parametrize("phase, location", [pytest.param("load", "driver", marks=pytest.mark.slow), ("check", "driver"),
                                             ("init", "driver"), ("rounds", "driver"),
                                             ("load", "job"), ("init", "job")])
def test_a_task_lost_in_any_phase_is_recovered_exactly(frame, phase, location):
    df, per_key = frame
    marker = os.path.join(tempfile.mkdtemp(prefix="pystrads-phase-"), "struck")
    program = LosesATask(marker, phase)
    engine = Engine(program, df, num_workers=2, seed=1, config={"scheduler.location": location})
    with engine.fit() as res:
        sums = res.read_table("sums")[:, 0]
        summary = res.summary
    assert os.path.exists(marker)  # the task was lost
    assert summary.fixed.get("recoveries") == 1, summary.fixed
    np.testing.assert_allclose(sums, ITERATIONS * per_key, atol=1e-9)
    assert summary.total_rounds == 2 * ITERATIONS
    assert engine.program.total == pytest.approx(per_key.sum())
