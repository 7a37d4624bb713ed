"""A driver that starts a long fit and prints its shards, for the lifecycle test
(which SIGKILLs this process mid-fit).  Usage: python tests/lifecycle_driver.py LEASE_SECONDS START,
START ``forked`` (a Python job first starts pystrads.daemon, whose forker then forks the shards)
or ``spawned`` (spark.pystrads.shard.fork=false: new interpreters)."""

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
    lease, start = sys.argv[1], sys.argv[2]
    spark = spark_session("local[2]", "pystrads-lifecycle", {
        "spark.ui.enabled": "false", "spark.pystrads.shard.leaseSeconds": lease,
        "spark.pystrads.shard.perExecutor": "2", "spark.pystrads.shard.fork": str(start == "forked").lower()})
    spark.sparkContext.setLogLevel("ERROR")
    if start == "forked":
        assert spark.sparkContext.parallelize(range(4), 2).map(lambda x: x + 1).sum() == 10
    Engine(Announcing(10 ** 9, rounds_per_step=200), spark.sparkContext.parallelize(range(4), 2)).fit()
