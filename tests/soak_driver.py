"""Soak test: >= 2000 steps of a small Lasso fit with resident memory and open
file descriptors of the driver, the Python workers and the shards sampled along the way.

    python tests/soak_driver.py [--steps 2000] [--warmup 300] [--tolerance 0.10] [--out soak.json]

Runs the runtime's STRADS-Lasso program (dynamic, prioritised, dependency-checked; one
round per step, so every step is one Spark job) on ``local[2]`` and records, after
warm-up and then at regular intervals: the driver's Python process, the Python worker
processes (pyspark daemon and its forked workers) and every shard.  Exits 1 when any
figure leaves [1 - tolerance, 1 + tolerance] times its value at the end of warm-up, and
prints a table either way.  The JVM is reported but not judged (its heap grows until
garbage collection decides otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pystrads.engine import Engine  # noqa: E402
from pystrads.programs import examples as ex  # noqa: E402
from pystrads.ps import launcher  # noqa: E402
from pystrads.session import spark_session  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return 0


def _fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def _children():
    """pid -> parent pid for every process."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    out[int(entry)] = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _descendants(root: int, parents):
    found, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        kids = [c for c, pp in parents.items() if pp == pid]
        found += kids
        frontier += kids
    return found


def sample(shard_pids):
    """Figures of this driver's own processes only (other Spark applications may run beside it)."""
    mine = _descendants(os.getpid(), _children())
    workers = [p for p in mine if any(d in _cmdline(p) for d in ("pyspark.daemon", "pystrads.daemon"))]
    jvm = [p for p in mine if "java" in _cmdline(p).split(" ")[0]]
    return {
        "driver_rss": _rss(os.getpid()), "driver_fds": _fds(os.getpid()),
        "workers_rss": sum(_rss(p) for p in workers), "workers_fds": sum(_fds(p) for p in workers),
        "workers": len(workers),
        "shards_rss": sum(_rss(p) for p in shard_pids), "shards_fds": sum(_fds(p) for p in shard_pids),
        "jvm_rss": sum(_rss(p) for p in jvm),
    }


class SoakLasso(ex.PriorityLasso):
    """The runtime's Lasso, never stopping early, sampling resources after chosen steps."""

    def __init__(self, *args, checkpoints=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.checkpoints = set(checkpoints)
        self.samples = []

    def after_step(self, ctx, metrics):
        super().after_step(ctx, metrics)
        ctx._stop_reason = None  # keep stepping: the soak needs its steps, not convergence
        if ctx.step in self.checkpoints:
            manager = next(iter(launcher._MANAGERS.values()))
            row = sample([s.pid for s in manager.group.shards])
            row.update(step=ctx.step, time=time.time())
            self.samples.append(row)
            print(f"step {ctx.step}: " + ", ".join(f"{k}={v}" for k, v in row.items() if k != "time"), flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=300)
    p.add_argument("--tolerance", type=float, default=0.10)
    p.add_argument("--out", default="out/soak.json")
    args = p.parse_args(argv)
    rng = np.random.default_rng(11)
    a = rng.standard_normal((400, 40))
    b = a @ np.r_[rng.standard_normal(8), np.zeros(32)] + 0.1 * rng.standard_normal(400)
    lam = 0.05 * np.abs(a.T @ b).max()
    every = max(1, (args.steps - args.warmup) // 8)
    checkpoints = [args.warmup] + list(range(args.warmup + every, args.steps + 1, every))
    if checkpoints[-1] != args.steps:
        checkpoints.append(args.steps)
    program = SoakLasso(40, lam, np.corrcoef(a.T), coords_per_round=4, candidates=12, rho=0.5,
                        pipeline_depth=1, max_rounds=args.steps, tol=-1.0, checkpoints=checkpoints)
    spark = spark_session("local[2]", "pystrads-soak", {"spark.ui.enabled": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    t0 = time.time()
    rdd = spark.sparkContext.parallelize(ex.as_records(a, b), 2)
    with Engine(program, rdd, seed=5, config={"progress": "off"}).fit() as res:
        steps = len(res.summary.rows)
        x = res.read_table("x")[:, 0]
    seconds = time.time() - t0
    spark.stop()
    ref = program.samples[0]
    judged = ["driver_rss", "driver_fds", "workers_rss", "workers_fds", "shards_rss", "shards_fds"]
    worst = {k: max(abs(s[k] / ref[k] - 1.0) if ref[k] else 0.0 for s in program.samples) for k in judged}
    ok = steps >= args.steps and all(v <= args.tolerance for v in worst.values())
    print(f"\n{steps} steps in {seconds:.0f} s ({steps / seconds:.1f} steps/s); objective reached with "
          f"{int(np.count_nonzero(x))} non-zeros")
    print("| figure | after warm-up (step %d) | at the end (step %d) | largest deviation |" %
          (ref["step"], program.samples[-1]["step"]))
    print("|---|---:|---:|---:|")
    for k in judged + ["jvm_rss"]:
        scale = 2 ** 20 if k.endswith("rss") else 1
        unit = " MiB" if scale > 1 else ""
        dev = f"{100 * worst[k]:.1f} %" if k in worst else "(not judged)"
        print(f"| {k} | {ref[k] / scale:.1f}{unit} | {program.samples[-1][k] / scale:.1f}{unit} | {dev} |")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"steps": steps, "seconds": seconds, "samples": program.samples, "worst": worst,
                   "tolerance": args.tolerance, "ok": ok}, fh, indent=2)
    print(("PASS" if ok else "FAIL") + f": every judged figure within ±{100 * args.tolerance:.0f} % of its "
          "post-warm-up value" + ("" if ok else f" (worst {max(worst.values()):.1%})"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
