"""Driver script for the multi-executor tests: run the four program shapes
against a Spark master given on the command line and print one JSON line.

    python tests/cluster_driver.py spark://127.0.0.1:7077 2
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

from pystrads.session import spark_session  # noqa: E402
from shapes import run_block_lstsq, run_priority_lasso, run_rotation, run_sgd  # noqa: E402


def main(master, executors):
    spark = spark_session(master, "pystrads-cluster-test", {
        "spark.executor.cores": "1", "spark.cores.max": str(executors), "spark.executor.memory": "1g",
        "spark.ui.enabled": "false", "spark.pystrads.executor.waitSeconds": "120",
    })
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    deadline = time.time() + 120
    while sc._jsc.sc().getExecutorMemoryStatus().size() - 1 < executors and time.time() < deadline:
        time.sleep(0.5)
    out = {"executors": sc._jsc.sc().getExecutorMemoryStatus().size() - 1}
    for name, runner in [("rotation", run_rotation), ("block_lstsq", run_block_lstsq),
                         ("priority_lasso", run_priority_lasso), ("sgd", run_sgd)]:
        got, expected, summary = runner(sc)[:3]
        out[name] = {"result": np.asarray(got).tolist(), "expected": np.asarray(expected).tolist(),
                     "rounds": summary.total_rounds}
    from pystrads.ps import launcher

    manager = next(iter(launcher._MANAGERS.values()))
    out["shards"] = [{"executor": s.executor, "host": s.host, "port": s.port, "pid": s.pid}
                     for s in manager.group.shards]
    print("RESULT " + json.dumps(out), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
