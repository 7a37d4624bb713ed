"""The LDA corpus scan keeps the driver's memory bounded by the vocabulary, not by partitions x
vocabulary: a 2**22-term vocabulary over 64 input partitions fits in a session whose results may
not exceed 256 MiB (spark.driver.maxResultSize; the value is fixed when the context starts, so the
fit runs in a process of its own).  Dense per-partition counts would send 64 x 32 MiB."""

import json
import os
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

DRIVER = r'''
import json, sys
import numpy as np
from pyspark.ml.linalg import SparseVector
from pystrads.ml import StradsLDA
from pystrads.session import spark_session

V, PARTS = 1 << 22, 64
if len(sys.argv) > 1:  # the counts of each partition too many for the driver: summed on the executors
    from pystrads.ml import _lda_data
    _lda_data.TERMS_BUDGET = int(sys.argv[1])
spark = spark_session("local[2]", "pystrads-scan-memory", {"spark.driver.maxResultSize": "256m",
                                                            "spark.ui.enabled": "false"})
spark.sparkContext.setLogLevel("OFF")
rng = np.random.default_rng(4)
docs = []
for d in range(PARTS * 6):
    terms = np.unique(rng.integers(0, V, 12))
    docs.append((SparseVector(V, terms.tolist(), rng.integers(1, 4, len(terms)).astype(float).tolist()),))
df = spark.createDataFrame(docs, ["features"]).repartition(PARTS)
assert df.rdd.getNumPartitions() == PARTS
model = StradsLDA(k=4, maxIter=3, seed=1, numWorkers=2).fit(df)
print(json.dumps({"vocab": model.vocabSize(), "tokens": int(sum(v.values.sum() for (v,) in docs)),
                  "counted": model.summary.numTokens, "iterations": model.summary.totalIterations}))
spark.stop()
'''


@pytest.mark.slow
def test_a_huge_vocabulary_over_many_partitions_fits_under_a_small_result_limit():
    """The executors sum the counts (a budget of 64 terms: past 1 a partition)."""
    proc = subprocess.run([sys.executable, "-c", DRIVER, "64"], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYSPARK_PYTHON=sys.executable), cwd=tempfile.mkdtemp())
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["vocab"] == 1 << 22 and got["counted"] == got["tokens"] and got["iterations"] == 3


def test_the_scan_counts_the_same_whether_the_driver_or_the_executors_sum_them(spark, monkeypatch):
    import numpy as np
    from pyspark.ml.linalg import SparseVector

    from pystrads.ml import _lda_data

    rng = np.random.default_rng(9)
    rows = []
    for _ in range(120):
        terms = np.unique(rng.integers(0, 500, 9))
        rows.append((SparseVector(500, terms.tolist(), rng.integers(1, 4, len(terms)).astype(float).tolist()),))
    df = spark.createDataFrame(rows, ["features"]).repartition(6)
    _, one_job = _lda_data._doc_records(df, "features")
    monkeypatch.setattr(_lda_data, "TERMS_BUDGET", 6)  # one term a partition: every partition has more
    _, summed = _lda_data._doc_records(df, "features")
    expected = np.zeros(500, np.int64)
    for (v,) in rows:
        expected[v.indices] += v.values.astype(np.int64)
    np.testing.assert_array_equal(one_job["freq"], expected)
    np.testing.assert_array_equal(summed["freq"], expected)
    for key in ("docs", "tokens", "empty", "max_length"):
        assert one_job[key] == summed[key], key
