"""A driver that starts a long fit and prints its shards, for the lifecycle test
(which SIGKILLs this process mid-fit).  Usage: python tests/lifecycle_driver.py LEASE_SECONDS"""

import json
import sys

from pystrads.engine import Engine
from pystrads.programs.examples import EmptyProgram
from pystrads.ps import launcher
from pystrads.session import spark_session


class Announcing(EmptyProgram):
    def schedule(self, ctx):
        if ctx.step == 1:
            manager = next(iter(launcher._MANAGERS.values()))
            shards = [{"pid": s.pid, "host": s.host, "port": s.port} for s in manager.group.shards]
            print("SHARDS " + json.dumps({"shards": shards, "token": manager.token}), flush=True)
        return super().schedule(ctx)


if __name__ == "__main__":
    lease = sys.argv[1]
    spark = spark_session("local[2]", "pystrads-lifecycle", {
        "spark.ui.enabled": "false", "spark.pystrads.shard.leaseSeconds": lease,
        "spark.pystrads.shard.perExecutor": "2"})
    spark.sparkContext.setLogLevel("ERROR")
    Engine(Announcing(10 ** 9, rounds_per_step=200), spark.sparkContext.parallelize(range(4), 2)).fit()
