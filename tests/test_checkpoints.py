"""Checkpoints and resume at the engine level (local[2]); the fault-injection suite kills
real processes (tests/test_faults.py)."""

import os
import tempfile

import numpy as np
import pytest

from pystrads.engine import Engine
from pystrads.programs.mf import MFProgram
from pystrads.ps import storage


@pytest.fixture(scope="module")
def ratings():
    rng = np.random.default_rng(0)
    users, items = np.nonzero(rng.random((60, 40)) < 0.5)
    values = (rng.random((60, 3)) @ rng.random((3, 40)))[users, items]
    return users, items, values


def fit(sc, ratings, config, max_steps=None, reverse=False):
    users, items, values = ratings
    triples = list(zip(users.tolist(), items.tolist(), values.tolist()))
    if reverse:  # the same records, delivered in another order (as a recomputed shuffle may)
        triples = triples[::-1]
    rdd = sc.parallelize(triples, 2).keyBy(lambda t: t[0]).partitionBy(2).values()
    program = MFProgram(60, 40, 3, 0.05, np.bincount(items, minlength=40), 12, 2, seed=3, block_size=1)
    engine = Engine(program, rdd, seed=3, config=dict({"step.targetSeconds": 0.05, "progress": "off"}, **config))
    with engine.fit(max_steps) as res:
        return program.item_matrix(res.read_table("item_factors")), res.summary


@pytest.mark.slow  # the engine-level resume is tests/test_engine_parts.py's, in the README's command
def test_a_fit_resumes_from_its_latest_checkpoint_with_the_same_result(sc, ratings):
    full, plain = fit(sc, ratings, {})
    assert "checkpoints" not in plain.fixed  # no directory: no checkpoints
    d = tempfile.mkdtemp()
    config = {"checkpoint.dir": d, "checkpoint.interval": 1}
    _, first = fit(sc, ratings, config, max_steps=3)
    assert first.fixed["checkpoints"] == 3
    (fit_dir,) = os.listdir(d)
    names = sorted(os.listdir(os.path.join(d, fit_dir)))  # older ones deleted; the fit's OWNER released
    assert len(names) == 2 and names[0] == "LATEST" and names[1].startswith("step-00000003-"), names
    resumed, second = fit(sc, ratings, config, reverse=True)
    assert second.fixed["resumed_from_step"] == 3
    assert second.rows[:3] == first.rows  # the first 3 steps' rows came back with the checkpoint
    assert [r["step"] for r in second.rows] == list(range(1, len(second.rows) + 1))
    assert [r["iteration"] for r in second.iterations] == list(range(1, 13))
    assert np.allclose(resumed, full, atol=1e-10)


def test_a_checkpoint_of_other_data_is_not_resumed(sc, ratings):
    d = tempfile.mkdtemp()
    config = {"checkpoint.dir": d, "checkpoint.interval": 1}
    fit(sc, ratings, config, max_steps=2)
    users, items, values = ratings
    other = (users, items, values[::-1].copy())  # same users, items and counts: same fingerprint directory
    h, summary = fit(sc, other, config)
    assert "resumed_from_step" not in summary.fixed
    reference, _ = fit(sc, other, {})
    assert np.allclose(h, reference, atol=1e-10)


@pytest.mark.slow
def test_two_identical_fits_at_once_checkpoint_apart_and_both_end_right(sc, ratings):
    """Two fits of the same program, data, workers and seed with one checkpoint directory, started
    at once (two threads, as CrossValidator's parallelism runs them): each holds a root of its own
    while it runs, so neither deletes or resumes the other's checkpoints, and both end equal to
    the fit without checkpoints."""
    import threading

    reference, _ = fit(sc, ratings, {})
    d = tempfile.mkdtemp()
    config = {"checkpoint.dir": d, "checkpoint.interval": 1}
    results, errors = [None, None], []

    def run(i):
        try:
            results[i] = fit(sc, ratings, config)
        except BaseException as exc:  # noqa: BLE001 -- reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not errors, errors
    for h, summary in results:
        assert np.allclose(h, reference, atol=1e-10)
        assert summary.fixed.get("checkpoints", 0) >= 1 or "resumed_from_step" in summary.fixed
    roots = sorted(os.listdir(d))
    # one root each while both ran (a fit that finds the other's ended may resume from it instead)
    assert roots[0] + "-2" in roots or any("resumed_from_step" in s.fixed for _, s in results), roots
    assert not any(os.path.exists(os.path.join(d, r, "OWNER")) for r in roots)  # both released


@pytest.mark.parametrize("kinds", [("dense", "dense"), ("sparse", "sparse"), ("dense", "sparse"),
                                   ("sparse", "dense")])
def test_snapshots_restore_into_a_different_number_of_shards(tmp_path, kinds):
    """Snapshots of 3 shards restore into 2 (other row cuts), whichever kind wrote them and
    whichever reads them (a sparse table writes its entries, ``.npz``; a dense one ``.npy``)."""
    from pystrads.ps.client import ShardGroup, ShardInfo
    from pystrads.ps.server import ShardServer

    token = "t"
    three = [ShardServer("grpc://127.0.0.1:0", token, 1e9, f"a{i}") for i in range(3)]
    two = [ShardServer("grpc://127.0.0.1:0", token, 1e9, f"b{i}") for i in range(2)]
    try:
        def create(servers, bounds, kind):
            group = ShardGroup([ShardInfo("127.0.0.1", s.port, 0, "e", s.shard_id) for s in servers], token)
            for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
                group.client(i).action("create_table", name="fit/x", row_start=lo, row_stop=hi, width=4,
                                       storage=kind, max_fill=0.5)
            return group

        src = create(three, [0, 3, 7, 10], kinds[0])
        values = np.arange(40.0).reshape(10, 4) * (np.arange(40).reshape(10, 4) % 3 == 0)
        values[4] = 0.0  # an empty row
        values[6] = 1.5  # a full row (dense in a sparse table)
        for i, (lo, hi) in enumerate([(0, 3), (3, 7), (7, 10)]):
            src.client(i).write_rows("put", "fit/x", np.arange(lo, hi), values[lo:hi], "float64")
        src.broadcast("snapshot", prefix="fit/", dir=str(tmp_path / "snap"))
        ext = "npz" if kinds[0] == "sparse" else "npy"
        assert storage.list_names(str(tmp_path / "snap")) == [f"x.{a}.{ext}" for a in ("0-3", "3-7", "7-10")]
        dst = create(two, [0, 5, 10], kinds[1])
        dst.client(1).write_rows("put", "fit/x", np.arange(5, 10), np.full((5, 4), 9.0), "float64")  # replaced
        dst.broadcast("restore", prefix="fit/", dir=str(tmp_path / "snap"))
        got = np.vstack([dst.client(i).get_rows("fit/x", 4, "float64", start=lo, stop=hi)
                         for i, (lo, hi) in enumerate([(0, 5), (5, 10)])])
        assert np.array_equal(got, values)
        os.remove(tmp_path / "snap" / f"x.3-7.{ext}")  # an incomplete snapshot is refused, naming the gap
        with pytest.raises(Exception, match="lacks rows of table 'x' from row 3"):
            dst.broadcast("restore", prefix="fit/", dir=str(tmp_path / "snap"))
    finally:
        for s in three + two:
            s.shutdown()


def test_lasso_rows_load_in_an_order_independent_of_their_arrival():
    from pystrads.programs._rows import canonical_order, rows_to_arrays

    rng = np.random.default_rng(2)
    rows = [(float(rng.standard_normal()), 1.0, np.sort(rng.choice(50, 5, replace=False)), rng.random(5))
            for _ in range(40)]
    rows.append(rows[3])  # a duplicate row
    rows.append((rows[5][0], 1.0, rows[5][2], rows[5][3] + 1.0))  # the same but for the values
    rows.append((rows[6][0], 1.0, np.sort((rows[6][2] + 1) % 50), rows[6][3]))  # ... but for the indices
    rows.append((rows[7][0], 2.0, rows[7][2], rows[7][3]))  # ... but for the weight
    a = canonical_order(*rows_to_arrays(rows, 50))
    b = canonical_order(*rows_to_arrays(rows[::-1], 50))
    assert len(a[3]) == len(rows)
    for x, y in zip(a, b):
        assert np.array_equal(x, y)
    assert list(a[3]) != [r[0] for r in rows]  # it really reorders


_ESTIMATOR_DRIVER = r"""
import json, sys
import numpy as np
from pystrads.ml import StradsMF
from pystrads.session import spark_session

spark = spark_session("local[2]", "pystrads-ckpt", {"spark.ui.enabled": "false",
                      "spark.pystrads.step.targetSeconds": "0.05", "spark.pystrads.progress": "off"})
spark.sparkContext.setCheckpointDir(sys.argv[1])  # MLlib's way: the estimators' checkpointInterval applies
rng = np.random.default_rng(0)
rows = [(int(u), int(i), float(rng.random() * 4 + 1)) for u in range(40) for i in range(30) if rng.random() < 0.5]
df = spark.createDataFrame(rows, ["user", "item", "rating"])
est = StradsMF(rank=3, maxIter=int(sys.argv[2]), regParam=0.1, seed=1, checkpointInterval=1)
model = est.fit(df)
print("RESULT " + json.dumps({"fixed": {k: v for k, v in model.summary.fixed.items()},
                              "rmse": model.summary.trainRmseHistory}), flush=True)
"""


@pytest.mark.slow
def test_estimators_checkpoint_to_the_spark_checkpoint_dir_and_resume(tmp_path):
    """StradsMF with sc.setCheckpointDir and checkpointInterval=1: a first fit leaves a
    checkpoint under the directory given (not under the random per-application directory Spark
    adds to it); the same fit submitted again -- another application -- resumes from it."""
    import json
    import subprocess
    import sys

    def run(iters):
        proc = subprocess.run([sys.executable, "-c", _ESTIMATOR_DRIVER, str(tmp_path), str(iters)],
                              capture_output=True, text=True, timeout=300,
                              env=dict(os.environ, PYSPARK_PYTHON=sys.executable))
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        assert proc.returncode == 0 and lines, proc.stderr[-4000:]
        return json.loads(lines[0][len("RESULT "):])

    first = run(4)
    assert first["fixed"]["checkpoints"] >= 1 and "resumed_from_step" not in first["fixed"]
    assert any(d.startswith("pystrads-") for d in os.listdir(tmp_path))
    again = run(4)
    assert again["fixed"]["resumed_from_step"] >= 1
    assert again["rmse"] == pytest.approx(first["rmse"], rel=1e-9)  # the history came back with it


def test_a_bare_checkpoint_path_is_refused_when_the_fit_spans_hosts():
    """A path without a scheme is each host's own disk: fine on one host, refused with the fix
    named on several; URIs and file:/// (a mount shared at the same path) pass."""
    from pystrads.engine.driver.preflight import check_checkpoint_storage
    from pystrads.errors import ConfigurationError

    two = {"10.0.0.2", "10.0.0.3"}
    import socket

    check_checkpoint_storage("/tmp/ckpt/pystrads-1", {"localhost"})  # one host
    # one machine under several names (a standalone cluster on this machine: the driver listed by
    # its host name, the executors by 127.0.0.1)
    check_checkpoint_storage("/tmp/ckpt/pystrads-1", {"127.0.0.1", socket.gethostname(), "localhost"})
    check_checkpoint_storage("/tmp/ckpt/pystrads-1", None)  # hosts unknown (checked again later)
    for ok in ("hdfs://nn:8020/ckpt", "s3://bucket/ckpt", "file:///mnt/shared/ckpt", "file:/mnt/x",
               "/dbfs/ckpt"):
        check_checkpoint_storage(ok, two)
    for bare in ("/tmp/ckpt/pystrads-1", "relative/ckpt"):
        with pytest.raises(ConfigurationError, match=r"checkpoint\.dir='.*' is a path without a scheme.*2 hosts "
                                                     r"\(10\.0\.0\.2, 10\.0\.0\.3\).*hdfs://.*file:///that/path"):
            check_checkpoint_storage(bare, two)

