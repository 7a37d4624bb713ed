"""Models saved by an earlier pystrads load and transform as they did, and models saved now are
laid out the same way (metadata keys, data folders, parquet schemas): the persistence base
(pystrads/ml/_persistence.py) must keep the on-disk format.  The stored models and how they
were made: tests/saved_models.py."""

import json
import os

import numpy as np
import pytest

import pystrads.ml as ml
from saved_models import MODELS, inputs, outputs

STORED = os.path.join(os.path.dirname(__file__), "data", "saved_models")


@pytest.fixture(scope="module")
def data(spark):
    return inputs(spark)


def _metadata(spark, path):
    return json.loads(spark.read.text(os.path.join(path, "metadata")).first()[0])


def _folders(path):
    return sorted(d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d)))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_model_saved_by_an_earlier_version_loads_and_transforms_as_then(spark, data, name, tmp_path):
    cls, params, source, columns = MODELS[name]
    stored = os.path.join(STORED, name)
    model = getattr(ml, cls + "Model").load(stored)
    expected = json.load(open(os.path.join(STORED, "outputs.json")))[name]
    got = outputs(model, data[source], columns)
    assert [r[0] for r in got] == [r[0] for r in expected]
    for g, e in zip(got, expected):
        for a, b in zip(g[1], e[1]):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9, err_msg=f"{name} row {g[0]}")
    old = _metadata(spark, stored)
    assert model.uid == old["uid"] and all(model.getOrDefault(k) == v for k, v in old["paramMap"].items())

    model.save(str(tmp_path / name))  # saved again now: the same layout
    new = _metadata(spark, str(tmp_path / name))
    assert sorted(new) == sorted(old) and new["class"] == old["class"]
    assert _folders(str(tmp_path / name)) == _folders(stored)
    for folder in _folders(stored):
        if folder != "metadata":
            assert spark.read.parquet(str(tmp_path / name / folder)).schema == \
                spark.read.parquet(os.path.join(stored, folder)).schema, folder
