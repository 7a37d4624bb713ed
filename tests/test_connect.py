"""Spark Connect (Databricks serverless and standard-access compute): a local Connect
server (``SparkSession.builder.remote("local[2]")``) in a driver subprocess of its own
(``connect_driver.py``), which uses only the Connect session's API."""

import json
import math
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def connect_results(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("connect") / "results.json")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    env.pop("SPARK_REMOTE", None)
    proc = subprocess.run([sys.executable, os.path.join(HERE, "connect_driver.py"), out, "rotation", "refusals", "lda", "lasso", "mf"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert os.path.exists(out), f"the Connect driver wrote no results (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    with open(out) as fh:
        return json.load(fh)


def _case(results, name):
    got = results.get(name)
    assert got is not None, f"case {name} did not run: {sorted(results)}"
    assert "exception" not in got, got["exception"]
    return got


def test_the_engine_runs_a_program_on_a_connect_dataframe(connect_results):
    got = _case(connect_results, "rotation")
    assert got["type"] == "pyspark.sql.connect.session"  # the fit really ran through Connect
    assert got["workers"] == 2 and got["steps"] >= 1
    assert got["error"] < 1e-9, got  # the rotation sums are exact
    assert got["exported"] == pytest.approx(got["expected_exported"], abs=1e-9)  # every row reached one worker
    assert got["shards"] and all(uri.startswith("grpc") for uri in got["shards"])


def test_connect_fits_refuse_what_needs_a_spark_context_before_any_job(connect_results):
    got = _case(connect_results, "refusals")
    assert "keep_states=True needs an RDD input" in got["keep_states"] and "export=" in got["keep_states"]
    assert "num_workers=3 needs 3 task slots" in got["slots"] and "offers 2" in got["slots"]


def test_strads_lda_fits_transforms_scores_and_persists_through_connect(connect_results):
    got = _case(connect_results, "lda")
    assert got["tokens"] == got["expected_tokens"]  # the word-topic counts hold every token exactly once
    assert sorted(got["top"]) == [list(range(10)), list(range(10, 20))]  # the two planted topics, one each
    assert got["rows"] == 300 and got["theta_sum_range"] == pytest.approx([1.0, 1.0], abs=1e-9)
    assert got["separated"] > 0.6  # each document leans to its own topic (alpha = 25 smooths it)
    assert 0 < got["log_perplexity"] < math.log(20)  # better than uniform over the 20 words
    assert got["loaded_equal"] and got["summary_iterations"] == 30
    assert got["joined_equal"]  # the joined fold-in (large models) gives the same mixtures


def test_strads_lasso_matches_mllib_through_connect(connect_results):
    got = _case(connect_results, "lasso")
    assert "mllib" in got, got.get("mllib_error")  # MLlib's LinearRegression runs on Connect too
    diff = max(abs(a - b) for a, b in zip(got["ours"], got["mllib"]))
    assert diff < 1e-3, (got["ours"], got["mllib"])  # the same L1 optimum
    assert [i for i, c in enumerate(got["ours"]) if c != 0] == [1, 4, 7]  # the planted support
    assert got["rmse"] < 0.2 and got["loaded_equal"]


def test_strads_mf_fits_predicts_recommends_and_persists_through_connect(connect_results):
    got = _case(connect_results, "mf")
    assert got["predictions"] == got["ratings"] and got["rmse"] < 0.05  # planted rank-3 ratings recovered
    assert got["users_recommended"] == 60 and got["recs_equal_brute_force"]
    assert got["loaded_equal"]
