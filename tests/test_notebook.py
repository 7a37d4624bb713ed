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
    import nbformat

    assert build.main(["--check"]) == 0, "pystrads_tour.ipynb is stale: run python jobs/notebooks/build.py"
    cells = build.parse_databricks(open(build.SOURCE).read())
    assert [c["type"] for c in cells].count("code") == 6 and cells[0]["type"] == "markdown"
    with pytest.raises(ValueError, match="Databricks notebook source"):
        build.parse_databricks("print(1)\n")
    nb = nbformat.read(build.NOTEBOOK, as_version=4)
    nbformat.validate(nb)  # nbformat 4.5: cell ids
    assert len({c.id for c in nb.cells}) == len(nb.cells)


def test_the_notebook_uses_nothing_spark_connect_refuses():
    """Databricks serverless notebooks are Spark Connect clients: no SparkContext, no RDDs."""
    source = open(build.SOURCE).read()
    for refused in ("sparkContext", ".rdd", "SparkContext", "parallelize", "setCheckpointDir"):
        assert refused not in source, refused


def test_a_failing_cell_stops_the_run_with_its_error():
    nb = build.to_ipynb([{"type": "code", "source": "x = 1\nprint('before')"},
                         {"type": "code", "source": "raise KeyError('boom')"},
                         {"type": "code", "source": "print('never')"}])
    with pytest.raises(RuntimeError, match="cell 2 failed: KeyError"):
        build.execute(nb, session="")
    assert nb["cells"][0]["outputs"][0]["text"] == "before\n"
    assert nb["cells"][1]["outputs"][-1]["ename"] == "KeyError" and nb["cells"][2]["outputs"] == []


@pytest.mark.slow
@pytest.mark.parametrize("session", ["classic", "connect"])
def test_the_notebook_runs_in_a_jupyter_kernel_on_both_session_kinds(session, tmp_path):
    """The tour in a real kernel (nbclient, ipykernel) whose ``spark`` exists before the first
    cell, as on Databricks: a classic session and a Spark Connect one (a local Connect server)."""
    import pyspark

    nb = json.load(open(build.NOTEBOOK))
    done = build.execute(copy.deepcopy(nb), session=session, master="local[2]")
    outputs = [o for c in done["cells"] if c["cell_type"] == "code" for o in c["outputs"]]
    assert not [o for o in outputs if o["output_type"] == "error"]
    text = "".join(o["text"] for o in outputs if o["output_type"] == "stream" and o["name"] == "stdout")
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert f"on Spark {pyspark.__version__}, master local[2]" in text, text[:500]
    assert len(re.findall(r"^topic \d: (\w+ ){7}\w+$", text, re.M)) == 8, text
    assert 5.0 < float(re.search(r"log-perplexity on the training documents: ([\d.]+)", text).group(1)) < 8.0
    rmse, baseline = map(float, re.search(r"test RMSE ([\d.]+) \(predicting the mean: ([\d.]+)\)", text).groups())
    assert rmse < 0.75 * baseline
    kept, words = map(int, re.search(r"(\d+) of (\d+) words have a non-zero coefficient", text).groups())
    assert 0 < kept < 0.2 * words  # the L1 penalty keeps a few words
    assert float(re.search(r"training AUC ([\d.]+)", text).group(1)) > 0.9
    found, true = map(int, re.search(r"(\d+) of the (\d+) true ones", text).groups())
    assert true == 40 and found >= 30
    assert len(images) == 2  # the LDA and the Lasso convergence plots
    (tmp_path / "executed.ipynb").write_text(json.dumps(done))
