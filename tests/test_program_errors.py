"""The program's own errors end a fit at once, with the hook, the worker and the traceback
(:class:`~pystrads.errors.ProgramError`): they are not lost tasks, so they are never retried;
and a validation set with nothing to score is refused naming ``validationIndicatorCol``."""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest
from pyspark import cloudpickle

from pystrads.engine import Engine
from pystrads.errors import InputError, ProgramError
from pystrads.programs import examples as ex

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the test's programs travel by value


class FailsIn(ex.RotationSum):
    """RotationSum whose ``hook`` raises a ValueError on worker 1 (``load``, or ``push`` from
    global round ``at_round`` on)."""

    def __init__(self, hook, at_round=0):
        super().__init__(40, iterations=4)
        self.hook, self.at_round = hook, at_round

    def load(self, ctx, records):
        if self.hook == "load" and ctx.worker == 1:
            raise ValueError("bad record 17")
        return super().load(ctx, records)

    def push(self, ctx, data, state, block):
        if self.hook == "push" and ctx.worker == 1 and ctx.round >= self.at_round:
            raise ValueError(f"cannot push block {block}")
        return super().push(ctx, data, state, block)


class ContributeInApply(ex.RotationSum):
    def __init__(self):
        super().__init__(40, iterations=2)

    def tables(self):
        return super().tables() + [ex.Table("x", 4, 1, "float64")]

    def apply(self, ctx, data, state, block):
        ctx.contribute("x", np.arange(4), np.ones((4, 1)))
        return state


@pytest.fixture(scope="module")
def frame(spark):
    rng = np.random.default_rng(3)
    return spark.createDataFrame([(int(k), float(v)) for k, v in zip(rng.integers(0, 40, 400), rng.random(400))],
                                 "key long, value double")


@pytest.mark.parametrize("hook, location", [("push", "driver"), ("load", "driver"), ("push", "job")])
def test_a_program_error_ends_the_fit_at_once_naming_the_hook_and_its_traceback(frame, hook, location):
    engine = Engine(FailsIn(hook, at_round=3), frame, num_workers=2, seed=1,
                    config={"scheduler.location": location, "recovery.maxAttempts": 3})
    t0 = time.monotonic()
    with pytest.raises(ProgramError) as info:
        engine.fit()
    message = str(info.value)
    assert f"FailsIn.{hook} raised in worker 1" in message, message
    assert "ValueError" in message and "Traceback" in message and "test_program_errors.py" in message, message
    assert len(engine.job_groups) == 1, engine.job_groups  # never relaunched as a lost task
    assert time.monotonic() - t0 < 60


def test_contribute_in_apply_is_refused_naming_push(frame):
    engine = Engine(ContributeInApply(), frame, num_workers=2, seed=1)
    with pytest.raises(ProgramError, match=r"contribute\('x', \.\.\.\) in apply.*Contribute in push"):
        engine.fit()


def test_mf_validation_with_no_rating_to_score_is_refused_naming_the_column(spark):
    from pystrads.ml import StradsMF

    train = [(u, i, float(1 + (u + i) % 5), False) for u in range(6) for i in range(5)]
    none_marked = spark.createDataFrame(train, "user long, item long, rating double, v boolean")
    cold = spark.createDataFrame(train + [(9, 0, 3.0, True), (2, 9, 3.0, True)],  # user 9 / item 9: cold
                                 "user long, item long, rating double, v boolean")
    mf = StradsMF(rank=2, maxIter=3, seed=1, validationIndicatorCol="v", numWorkers=2)
    with pytest.raises(InputError, match=r"validationIndicatorCol 'v' marks no rating for validation .*false or null"):
        mf.fit(none_marked)
    with pytest.raises(InputError, match=r"validationIndicatorCol 'v': none of its 2 validation ratings can be "
                                         r"scored, every one is a cold start"):
        mf.fit(cold)


def test_lasso_and_lda_validation_that_marks_nothing_is_refused_naming_the_column(spark):
    from pyspark.ml.linalg import Vectors, VectorUDT
    from pyspark.sql import types as T

    from pystrads.ml import StradsLasso, StradsLDA

    def schema(*first):
        return T.StructType([*first, T.StructField("features", VectorUDT()), T.StructField("v", T.BooleanType())])

    lin = spark.createDataFrame([(float(i % 3), Vectors.dense([1.0, float(i)]), None if i == 0 else False)
                                 for i in range(8)], schema(T.StructField("label", T.DoubleType())))
    with pytest.raises(InputError, match=r"validationIndicatorCol 'v' marks no row for validation"):
        StradsLasso(regParam=0.1, validationIndicatorCol="v").fit(lin)
    corpus = spark.createDataFrame([(Vectors.dense([1.0, 2.0, 0.0]), False), (Vectors.dense([0.0, 1.0, 3.0]), False),
                                    (Vectors.dense([0.0, 0.0, 0.0]), True)], schema())
    with pytest.raises(InputError, match=r"validationIndicatorCol 'v' marks no non-empty document for validation"):
        StradsLDA(k=2, maxIter=3, validationIndicatorCol="v").fit(corpus)
