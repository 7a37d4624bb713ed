"""The MLlib conformance suite (pystrads.testing) against every pystrads Estimator.

One test per (estimator, check); the dataset and the fitted model are shared
per estimator.  A failing check names what is wrong (see pystrads/testing.py).
"""

import pytest

from pystrads.testing import CHECKS, Conformance, builtin_specs

SPECS = builtin_specs()
_RUNNERS = {}


def _runner(name, spark):
    if name not in _RUNNERS:
        _RUNNERS[name] = Conformance(SPECS[name], spark)
    return _RUNNERS[name]


@pytest.mark.slow
@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("estimator", sorted(SPECS))
def test_conformance(spark, estimator, check):
    result = _runner(estimator, spark).run([check])[0]
    assert result.ok, f"{estimator} / {check}: {result.detail}"


@pytest.mark.slow
def test_a_broken_estimator_fails_the_checks(spark):
    """The suite can fail: an estimator whose setters are missing, whose bad params train
    anyway, whose outputs differ from MLlib's and whose model ignores a setter is caught by the
    params, invalid_params, output_schema and model_setters checks."""
    import dataclasses

    from pyspark.ml.regression import LinearRegression

    from pystrads.ml import StradsLasso, StradsLassoModel

    class SloppyModel(StradsLassoModel):
        def setFeaturesCol(self, value):  # a setter that does nothing
            return self

    class Sloppy(StradsLasso):
        setTol = None  # no setter

        @property
        def params(self):  # one of MLlib's params missing
            return [p for p in super().params if p.name != "epsilon"]

        def _fit(self, dataset):  # no validation: trains whatever it is given
            model = super()._fit(dataset)
            model.__class__ = SloppyModel
            return model

        def _check_params(self):
            pass

    spec = dataclasses.replace(
        SPECS["StradsLasso"], name="Sloppy", make_estimator=lambda: Sloppy(regParam=0.05, maxIter=5),
        invalid=[("regParam", -0.1)],
        make_counterpart=lambda: LinearRegression(regParam=0.05, maxIter=5, predictionCol="other"),
        default_exceptions={"maxIter": "stale"})
    report = Conformance(spec, spark).run(["params", "invalid_params", "output_schema", "model_setters"])
    failed = {r.check: r.detail for r in report.failures}
    assert set(failed) == {"params", "invalid_params", "output_schema", "model_setters"}, str(report)
    assert "features_moved" in failed["model_setters"] or "featuresCol" in failed["model_setters"], \
        failed["model_setters"]
    assert "tol: no setter setTol" in failed["params"] and "maxIter: listed as a default exception" in failed["params"]
    assert "MLlib's params ['epsilon'] are missing" in failed["params"]
    assert failed["invalid_params"].startswith("regParam=-0.1")
    assert "other" in failed["output_schema"]
