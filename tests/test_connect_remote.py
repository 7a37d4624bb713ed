"""Spark Connect, as on Databricks serverless and standard-access compute.

From a client that reaches only the Connect endpoint: a Connect server (``local[2]``: executors,
Python workers and shards) in one network namespace, the client in another on a network of its
own, and a relay in the root namespace that forwards the Connect port and nothing else
(``netns.NetnsConnectServer``).  The client runs ``connect_driver.py`` there; the fits' schedulers
run in their jobs, and the client must open no Flight connection at all.  The same fits on a
classic local session (``local``) are the reference.  Where network namespaces are unavailable
(not root), the Connect checks that need no second network run on a local Connect server
(``SparkSession.builder.remote("local[2]")``) in a driver subprocess instead, and the
network checks skip.
"""

import json
import math
import os
import sys
import time

import numpy as np
import pytest

import netns

# a Connect server and a client in network namespaces of their own, ~3 min: the second step of .ci/run
pytestmark = pytest.mark.slow

HERE = os.path.dirname(os.path.abspath(__file__))
FITS = ["rotation", "lda", "lasso", "mf", "implicit", "logistic", "tuning"]
#: the interrupt last: the shards must then all be gone
CASES = FITS + ["refusals", "fault", "progress", "interrupt"]
#: what runs on a local Connect server where namespaces are unavailable
LOCAL_CONNECT_CASES = ["rotation", "refusals", "lda", "lasso", "mf"]


def _case(results, name):
    got = results.get(name)
    assert got is not None, f"case {name} did not run: {sorted(results)}"
    assert "exception" not in got, got["exception"]
    return got


def _shards(hosts):
    """The shard processes running on the server's host."""
    found = []
    for pid in hosts.pids("server"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if b"pystrads.ps.server" in fh.read():
                    found.append(pid)
        except OSError:
            pass
    return found


def _run_driver(cmd_prefix, out, cases, env):
    import subprocess

    proc = subprocess.run(cmd_prefix + [sys.executable, os.path.join(HERE, "connect_driver.py"), out, *cases],
                          env=env, capture_output=True, text=True, timeout=1200)
    assert os.path.exists(out), f"the driver wrote no results (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    with open(out) as fh:
        return json.load(fh)


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """The same fits on a classic local session with the scheduler on the driver."""
    out = str(tmp_path_factory.mktemp("connect-local") / "results.json")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSTRADS_TEST_CLASSIC="1")
    env.pop("SPARK_REMOTE", None)
    return _run_driver([], out, FITS, env)


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    if netns.available() is not None:
        pytest.skip(f"network namespaces: {netns.available()}")
    out = str(tmp_path_factory.mktemp("connect-remote") / "results.json")
    with netns.NetnsConnectServer() as hosts:
        env = dict(hosts.env(), PYSTRADS_TEST_REMOTE=hosts.remote,
                   PYSTRADS_TEST_UNREACHABLE=f"{hosts.address['server']}:{hosts.PORT}")
        routes = hosts.run("client", ["ip", "-4", "route"]).stdout
        results = _run_driver(hosts.command("client", []), out, CASES, env)
        client_exit = time.time()
        left = _shards(hosts)  # the fits' shards: released by each fit, the interrupted one on its lease
        while left and time.time() - results["interrupt"]["returned"] < 40:
            time.sleep(1)
            left = _shards(hosts)
        results.update(routes=routes, relayed=hosts.relay.connections, server_subnet=hosts.subnets[0],
                       shards_left=len(left), shards_gone_after=time.time() - results["interrupt"]["returned"],
                       client_exit=client_exit)
    return results


@pytest.fixture(scope="module")
def connect_results(request, tmp_path_factory):
    """The remote client's results, or (no namespaces) a local Connect server's."""
    if netns.available() is None:
        return request.getfixturevalue("remote")
    out = str(tmp_path_factory.mktemp("connect") / "results.json")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    env.pop("SPARK_REMOTE", None)
    return _run_driver([], out, LOCAL_CONNECT_CASES, env)


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


def test_the_client_reaches_only_the_connect_port(remote):
    assert remote["server_subnet"] not in remote["routes"], remote["routes"]  # no route to the server's network
    assert "unreachable" in remote["reached_server_network"].lower(), remote["reached_server_network"]
    assert remote["relayed"] >= 1  # the session went through the relay


def test_the_remote_client_opens_no_flight_connection(remote):
    for case in CASES:
        _case(remote, case)  # every case ran
    assert remote["flight_connections"] == []


def test_the_engine_runs_a_program_from_the_remote_client(remote, local):
    got = _case(remote, "rotation")
    assert got["type"] == "pyspark.sql.connect.session" and got["workers"] == 2 and got["steps"] >= 1
    assert got["error"] < 1e-9, got  # the rotation sums are exact
    assert got["exported"] == pytest.approx(got["expected_exported"], abs=1e-9)
    assert _case(local, "rotation")["error"] < 1e-9


def test_strads_lda_from_the_remote_client_equals_local_mode(remote, local):
    got, ref = _case(remote, "lda"), _case(local, "lda")
    assert got["tokens"] == got["expected_tokens"]
    assert got["counts"] == ref["counts"]  # the same sampler draws: the same counts, exactly
    assert sorted(got["top"]) == [list(range(10)), list(range(10, 20))]
    assert got["rows"] == 300 and got["theta_sum_range"] == pytest.approx([1.0, 1.0], abs=1e-9)
    assert got["loaded_equal"] and got["summary_iterations"] == 30 and got["joined_equal"]


def test_strads_lasso_from_the_remote_client_equals_local_mode(remote, local):
    got, ref = _case(remote, "lasso"), _case(local, "lasso")
    np.testing.assert_allclose(got["ours"], ref["ours"], atol=1e-7)
    diff = max(abs(a - b) for a, b in zip(got["ours"], got["mllib"]))
    assert diff < 1e-3, (got["ours"], got["mllib"])
    assert [i for i, c in enumerate(got["ours"]) if c != 0] == [1, 4, 7]
    assert got["rmse"] < 0.2 and got["loaded_equal"]
    # evaluate() and the training summary: MLlib's types and values through Connect as on a classic session
    assert got["evaluation_is_mllib"] and got["summary_is_mllib"] and ref["evaluation_is_mllib"]
    for key in ("r2", "eval_rmse", "summary_r2"):
        assert got[key] == pytest.approx(ref[key], abs=1e-9), key
    assert got["deviance"] == pytest.approx(ref["deviance"], abs=1e-9) and got["summary_rows"] == 400
    assert got["eval_rmse"] == pytest.approx(got["rmse"], rel=1e-9)


def test_strads_mf_from_the_remote_client_equals_local_mode(remote, local):
    got, ref = _case(remote, "mf"), _case(local, "mf")
    np.testing.assert_allclose(got["users"], ref["users"], atol=1e-6)
    np.testing.assert_allclose(got["items"], ref["items"], atol=1e-6)
    assert got["predictions"] == got["ratings"] and got["rmse"] < 0.05
    assert got["users_recommended"] == 60 and got["recs_equal_brute_force"] and got["loaded_equal"]


def test_implicit_mf_from_the_remote_client_equals_local_mode(remote, local):
    got, ref = _case(remote, "implicit"), _case(local, "implicit")
    assert len(got["users"]) == 50 and len(got["items"]) == 30
    assert [u for u, _ in got["users"]] == [u for u, _ in ref["users"]]
    np.testing.assert_allclose([f for _, f in got["users"]], [f for _, f in ref["users"]], atol=1e-6)
    np.testing.assert_allclose([f for _, f in got["items"]], [f for _, f in ref["items"]], atol=1e-6)
    assert got["scored"] == got["rows"] and got["loaded_equal"]  # transform, overwrite and load


def test_logistic_regression_from_the_remote_client_equals_local_mode(remote, local):
    got, ref = _case(remote, "logistic"), _case(local, "logistic")
    np.testing.assert_allclose(got["coef"], ref["coef"], atol=1e-7)
    assert got["intercept"] == pytest.approx(ref["intercept"], abs=1e-7)
    assert got["accuracy"] > 0.9 and got["loaded_equal"]
    assert got["evaluation_is_mllib"] and got["summary_is_mllib"] and ref["evaluation_is_mllib"]
    assert got["eval_accuracy"] == got["summary_accuracy"] == got["accuracy"] == ref["eval_accuracy"]
    assert got["auc"] == pytest.approx(ref["auc"], abs=0.01) and got["auc"] > 0.9


def test_a_pipeline_and_a_cross_validator_from_the_remote_client(remote, local):
    got, ref = _case(remote, "tuning"), _case(local, "tuning")
    np.testing.assert_allclose(got["coef"], ref["coef"], atol=1e-7)
    assert abs(got["coef"][1]) < 0.05 and got["coef"][2] == pytest.approx(-2.0, abs=0.1)
    # the folds come from a seeded random split, which follows the input's partitions (a Connect
    # session and a classic one partition createDataFrame's rows differently): similar, not equal
    np.testing.assert_allclose(got["avg_metrics"], ref["avg_metrics"], rtol=0.1)
    assert got["avg_metrics"][0] < got["avg_metrics"][1]  # RMSE: the weaker penalty wins
    np.testing.assert_allclose(got["best_coef"], ref["best_coef"], atol=1e-7)


def test_a_failed_task_under_the_remote_client_recovers_exactly(remote):
    got = _case(remote, "fault")
    assert got["struck"] and got["recoveries"] == 1  # the fault happened, and one relaunch recovered it
    assert got["error"] < 1e-9  # read-modify-write rotations: no step applied twice or lost
    assert got["steps"] == [1, 2, 3, 4, 5]


def test_progress_reaches_the_remote_client_every_10_s(remote):
    got = _case(remote, "progress")
    assert got["error"] < 1e-9
    assert got["end"] - got["start"] >= 55, got["end"] - got["start"]  # a fit of about 60 s
    during = [t for t in got["times"] if t <= got["end"]]
    assert len(during) >= 6, got["lines"]
    marks = [got["start"]] + during + [got["end"]]
    gaps = np.diff(marks)
    assert gaps.max() <= 10.0, (gaps.tolist(), got["lines"])
    assert any("iterations 200/200" in line for line in got["lines"]), got["lines"]


def test_interrupt_all_ends_the_fit_and_its_shards(remote):
    got = _case(remote, "interrupt")
    assert not got["alive"]  # the fit returned
    assert got["ended"] != "no error" and "StepFailedError" in got["ended"], got["ended"]
    assert got["returned"] - got["interrupted"] < 30, got
    assert remote["shards_left"] == 0 and remote["shards_gone_after"] <= 35, remote["shards_gone_after"]
