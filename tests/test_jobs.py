"""The spark-submit jobs run end to end (as the README and docs/user-guide.md run them)."""

import json
import os
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def job_module(name):
    """``jobs/<name>.py`` imported as a module (its ``main(argv)`` runs on the active session)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"pystrads_job_{name}", os.path.join(ROOT, "jobs", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_lda_job_on_the_bundled_sample_writes_model_metrics_topics_and_plot(spark):
    out = tempfile.mkdtemp()
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "jobs", "lda.py"), "-k", "8", "--max-iter", "12",
                           "--output", out], capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env=dict(os.environ, PYSPARK_PYTHON=sys.executable))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "topic   7:" in proc.stdout
    metrics = json.load(open(os.path.join(out, "metrics.json")))
    assert len(metrics["iterations"]) == 12 and metrics["documents"] == 2500
    assert metrics["iterations"][-1]["log_likelihood"] > metrics["iterations"][0]["log_likelihood"]
    assert len(open(os.path.join(out, "topics.txt")).read().splitlines()) == 8
    assert os.path.getsize(os.path.join(out, "convergence.png")) > 1000
    from pyspark.ml import PipelineModel

    model = PipelineModel.load(os.path.join(out, "model"))
    assert model.stages[-1].topicsMatrix().toArray().sum() == metrics["tokens"]


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["cd", "sgd", "implicit"])
def test_mf_job_on_a_ratings_csv_writes_model_metrics_and_recommendations(spark, algorithm):
    import numpy as np

    work = tempfile.mkdtemp()
    rng = np.random.default_rng(0)
    with open(os.path.join(work, "ratings.csv"), "w") as fh:
        fh.write("userId,movieId,rating\n")
        for u in range(30):
            for i in range(20):
                if rng.random() < 0.6:
                    fh.write(f"{u},{i + 100},{rng.integers(1, 6)}\n")
    out = os.path.join(work, "out")
    argv = ["--input", os.path.join(work, "ratings.csv"), "--rank", "4", "--max-iter", "5", "--test-fraction", "0.2",
            "--output", out] + (["--implicit-prefs", "--alpha", "10"] if algorithm == "implicit"
                                else ["--algorithm", algorithm])
    if algorithm == "cd":  # as spark-submit runs it: its own driver process
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "jobs", "mf.py")] + argv, capture_output=True,
                              text=True, timeout=600, cwd=ROOT, env=dict(os.environ, PYSPARK_PYTHON=sys.executable))
        assert proc.returncode == 0, proc.stderr[-3000:]
    else:  # the other solvers through main() on the running session (a driver's start saved), which
        assert job_module("mf").main(argv) == 0  # the job leaves running, as it did not start it
        assert spark.range(3).count() == 3
    metrics = json.load(open(os.path.join(out, "metrics.json")))
    if algorithm == "implicit":  # no RMSE of preferences; the objective never increases
        objective = [row["objective"] for row in metrics["iterations"]]
        assert len(objective) == 5 and all(b <= a for a, b in zip(objective, objective[1:])), objective
        assert "test_rmse" not in metrics
    else:
        assert len(metrics["iterations"]) == 5 and 0 < metrics["test_rmse"] < 3 and metrics["algorithm"] == algorithm
    recs = json.load(open(os.path.join(out, "recommendations.json")))
    assert len(recs) == 5 and all(len(v) == 10 for v in recs.values())
    from pystrads.ml import StradsMFModel

    assert StradsMFModel.load(os.path.join(out, "model")).rank == 4


@pytest.mark.slow
def test_lasso_job_on_a_libsvm_file_writes_model_metrics_and_plot(spark):
    import numpy as np

    from pystrads.datasets.synthetic import strads_lasso_problem

    work = tempfile.mkdtemp()
    prob = strads_lasso_problem(300, 500, nnz_per_col=10, seed=3)
    with open(os.path.join(work, "data.libsvm"), "w") as fh:  # one-based indices, as Spark's reader
        for y, idx, val in prob.rows():
            order = np.argsort(idx)
            fh.write(f"{y:.17g} " + " ".join(f"{i + 1}:{v:.17g}" for i, v in zip(idx[order], val[order])) + "\n")
    out = os.path.join(work, "out")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "jobs", "lasso.py"), "--input",
                           os.path.join(work, "data.libsvm"), "--reg-ratio", "0.05", "--output", out],
                          capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env=dict(os.environ, PYSPARK_PYTHON=sys.executable))
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.load(open(os.path.join(out, "metrics.json")))
    assert metrics["stop_reason"] == "converged" and 0 < metrics["nonzeros"] < 500
    objectives = [it["objective"] for it in metrics["iterations"]]
    assert objectives[-1] < objectives[0]
    assert os.path.getsize(os.path.join(out, "convergence.png")) > 1000
    from pystrads.ml import StradsLassoModel

    model = StradsLassoModel.load(os.path.join(out, "model"))
    assert model.numFeatures == 500 and np.count_nonzero(model.coefficients.toArray()) == metrics["nonzeros"]
