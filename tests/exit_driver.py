"""A driver process that exits while its heartbeat thread is stopping the shards, one of them
frozen, for the lifecycle test.

    python tests/exit_driver.py LEASE_SECONDS

Fits a small program on two shards, freezes one (SIGSTOP), calls ``spark.stop()`` and returns as
soon as the heartbeat thread has begun stopping the shards (it saw the application stop). Prints
``RESULT {json}`` (the shards' pids, the frozen one first), then, as the very last of the
interpreter's exit handlers, ``EXIT {json}``: the heartbeat threads still alive and the seconds
the exit handlers took.
"""

import atexit
import json
import os
import signal
import sys
import threading
import time

_RETURNED = [0.0]


def _last_exit_handler():  # registered before pystrads is imported: runs after its handlers
    alive = sorted(t.name for t in threading.enumerate() if t.name.startswith("pystrads-heartbeat") and t.is_alive())
    print("EXIT " + json.dumps({"heartbeats": alive, "exit_s": time.monotonic() - _RETURNED[0]}), flush=True)


atexit.register(_last_exit_handler)


def main(lease):
    from pystrads.engine import Engine
    from pystrads.programs.examples import EmptyProgram
    from pystrads.ps import launcher
    from pystrads.session import spark_session

    spark = spark_session("local[2]", "pystrads-exit", {"spark.ui.enabled": "false",
                                                        "spark.pystrads.shard.leaseSeconds": str(lease),
                                                        "spark.pystrads.shard.perExecutor": "2"})
    spark.sparkContext.setLogLevel("ERROR")
    Engine(EmptyProgram(4, rounds_per_step=4), spark.sparkContext.parallelize(range(4), 2)).fit()
    manager = next(iter(launcher._MANAGERS.values()))
    pids = sorted(s.pid for s in manager.group.shards)
    os.kill(pids[0], signal.SIGSTOP)  # answers nothing: a call to it lasts its whole deadline
    spark.stop()
    deadline = time.monotonic() + 4 * manager.config["shard.heartbeatSeconds"] + 10
    while not manager._stop.is_set() and time.monotonic() < deadline:
        time.sleep(0.01)
    print("RESULT " + json.dumps({"pids": pids, "stopping": manager._stop.is_set(),
                                  "heartbeat_s": manager.config["shard.heartbeatSeconds"]}), flush=True)
    _RETURNED[0] = time.monotonic()


if __name__ == "__main__":
    main(float(sys.argv[1]))
