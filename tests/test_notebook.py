"""The example notebook: its .ipynb is the build of its Databricks source, and it runs
headlessly on the test session's existing `spark` with the outputs it promises."""

import copy
import importlib.util
import json
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("nb_build", os.path.join(ROOT, "jobs", "notebooks", "build.py"))
build = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build)


def test_ipynb_is_the_build_of_the_databricks_source():
    assert build.main(["--check"]) == 0, "pystrads_tour.ipynb is stale: run python jobs/notebooks/build.py"
    cells = build.parse_databricks(open(build.SOURCE).read())
    assert [c["type"] for c in cells].count("code") == 6 and cells[0]["type"] == "markdown"
    with pytest.raises(ValueError, match="Databricks notebook source"):
        build.parse_databricks("print(1)\n")


def test_a_failing_cell_stops_the_run_with_its_error():
    nb = build.to_ipynb([{"type": "code", "source": "x = 1\nprint('before')"},
                         {"type": "code", "source": "raise KeyError('boom')"},
                         {"type": "code", "source": "print('never')"}])
    with pytest.raises(RuntimeError, match="cell 2 failed: KeyError"):
        build.execute(nb, master="")
    assert nb["cells"][0]["outputs"][0]["text"] == "before\n"
    assert nb["cells"][1]["outputs"][-1]["ename"] == "KeyError" and nb["cells"][2]["outputs"] == []


@pytest.mark.slow
def test_notebook_runs_headlessly_on_the_existing_session(spark, tmp_path):
    nb = json.load(open(build.NOTEBOOK))
    done = build.execute(copy.deepcopy(nb), master="")  # no master: the notebook finds `spark`
    text = "".join(o.get("text", "") for c in done["cells"] if c["cell_type"] == "code" for o in c["outputs"])
    images = [o for c in done["cells"] if c["cell_type"] == "code" for o in c["outputs"] if "image/png" in o.get("data", {})]
    assert f"on Spark {spark.version}" in text
    assert len(re.findall(r"^topic \d: (\w+ ){7}\w+$", text, re.M)) == 8, text
    rmse, baseline = map(float, re.search(r"test RMSE ([\d.]+) \(predicting the mean: ([\d.]+)\)", text).groups())
    assert rmse < 0.75 * baseline
    assert float(re.search(r"training AUC ([\d.]+)", text).group(1)) > 0.9
    found, true = map(int, re.search(r"(\d+) of the (\d+) true ones", text).groups())
    assert true == 40 and found >= 30
    assert len(images) == 2
    (tmp_path / "executed.ipynb").write_text(json.dumps(done))
