"""A fit whose shard is frozen (SIGSTOP) mid-fit, in a driver process of its own (the shards'
lease and the shard count are the application's): prints a JSON line with the result.

    python tests/freeze_driver.py OUT.json
"""

import json
import os
import signal
import sys
import threading
import time

import numpy as np

LEASE, ROUND_TIMEOUT, ITERATIONS = 6.0, 15.0, 60


def main():
    out = sys.argv[1]
    from pyspark import cloudpickle

    from pystrads.engine import Engine
    from pystrads.programs import examples as ex
    from pystrads.session import spark_session
    from pystrads.testing import around_steps

    class SlowRotation(ex.RotationSum):
        def push(self, ctx, data, state, block):
            time.sleep(0.01)
            return super().push(ctx, data, state, block)

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark = spark_session("local[2]", "pystrads-freeze", {
        "spark.ui.enabled": "false", "spark.pystrads.shard.perExecutor": "2",
        "spark.pystrads.shard.leaseSeconds": str(LEASE), "spark.pystrads.round.timeoutSeconds": str(ROUND_TIMEOUT),
        "spark.pystrads.step.targetSeconds": "0.3"})
    spark.sparkContext.setLogLevel("OFF")
    rng = np.random.default_rng(5)
    keys, vals = rng.integers(0, 100, 2000), rng.random(2000)
    rdd = spark.sparkContext.parallelize(list(zip(keys.tolist(), vals.tolist())), 2)
    frozen, state = {}, {}

    def freeze(job, step, run):
        if step == 3 and not frozen:
            shard = job.group.shards[1]
            other = job.group.shards[0]

            def stop_later():
                time.sleep(0.2)
                os.kill(shard.pid, signal.SIGSTOP)
                frozen.update(pid=shard.pid, other=other.pid, t=time.monotonic())
                time.sleep(LEASE * 1.5)  # past the lease: the shard left running must still live
                try:
                    os.kill(other.pid, 0)
                    state["other_alive_after_lease"] = True
                except OSError:
                    state["other_alive_after_lease"] = False

            threading.Thread(target=stop_later, daemon=True).start()
        return run()

    result = {}
    try:
        with around_steps(freeze):
            engine = Engine(SlowRotation(100, ITERATIONS), rdd, num_workers=2, seed=1)
            with engine.fit() as res:
                sums = res.read_table("sums")[:, 0]
                result.update(ok=True, exact=bool(np.allclose(sums, ITERATIONS * np.bincount(keys, vals, 100),
                                                              atol=1e-9)),
                              recoveries=res.summary.fixed.get("recoveries", 0))
    except Exception as exc:  # noqa: BLE001 -- a clear error is an allowed outcome
        result.update(ok=False, error=f"{type(exc).__name__}: {exc}")
    result["seconds_after_freeze"] = time.monotonic() - frozen["t"] if frozen else None
    time.sleep(max(0.0, LEASE * 1.5 + 0.5 - (result["seconds_after_freeze"] or 0)))
    result.update(state)
    if frozen:
        os.kill(frozen["pid"], signal.SIGCONT)  # it finds its lease lapsed and exits
    with open(out, "w") as fh:
        json.dump(result, fh)
    spark.stop()


if __name__ == "__main__":
    main()
