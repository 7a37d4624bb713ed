"""Benchmark: what the first StradsLDA fit of an application costs beyond a warm one.

    python3 jobs/bench_first_fit.py --repeats 3      # the bundled sample, K = 20, 100 iterations
    python3 jobs/bench_first_fit.py --notebook       # the notebook case: the fit is the first Python work

Each repeat is a fresh Python process, as a second run of the quick start is: it starts a Spark
session (local[2]), turns the bundled Debian sample into term counts (its rows come from Python:
Spark's Python daemon starts there) and caches them, then fits StradsLDA (``k``, ``maxIter``, ``seed`` 1,
fixed α) with no warm-up call -- the *first* fit -- and then, in the same process, ``--pairs``
fits of ``maxIter`` iterations (*warm*) interleaved with as many of twice as many. Reported
per process: the first fit, the median warm fit, their ratio (target <= 1.5), a warm fit's
one-off cost ``2 t(n) - t(2n)`` from the medians (target <= 1 s) and the first fit's phases next to the warm fit's (the
summary's ``timings``: the scan, the shards' start, the init step -- the workers' start, their
imports and load, the kernels' loading -- and the model's read), and the CPU seconds each fit
cost the Spark JVM, the Python daemon and workers, the shards and the driver (from /proc: on
2 cores a first fit is bound by CPU, so this says where its extra time goes). One more process
runs with an empty numba cache (``NUMBA_CACHE_DIR``), as a fresh clone's first run does, kernels compiling.
``--notebook``: the corpus is read by the JVM (``spark.read.json`` of the bundled file) and
turned into term counts by MLlib's JVM stages, as a notebook does it, so the first fit is the
session's first Python work (Spark's Python daemon and workers start inside it); the JSON records
the Python workers' CPU before the first fit (0 in that case).
Medians over the repeats; the table and JSON (``--out``; ``docs/bench-data/first_fit.json``
feeds docs/benchmarks.md).  ``--compare KEY=VALUE`` (repeatable) runs, after each process, one
more with those Spark settings (e.g. ``spark.pystrads.shard.fork=false``), and reports its
medians beside the default's: an A/B in the same run, through the same slow and fast spells.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
from _bench import argv_of, record  # noqa: E402

PHASES = ("scan_s", "shard_start_s", "init_s", "init_compute_s", "load_s", "read_model_s")
#: the processes whose CPU time a fit is charged, by what their command line runs
PROCESSES = ("jvm", "python_workers", "shards", "driver")


def _kind(pid: int, cmdline: str):
    if pid == os.getpid():
        return "driver"
    program = cmdline.split(" ", 1)[0]
    if os.path.basename(program).startswith("java"):
        return "jvm"
    if "pystrads.ps.server" in cmdline:
        return "shards"
    if "pyspark.worker" in cmdline or ".daemon" in cmdline or cmdline.startswith("pystrads-forker"):
        # Spark's daemon, the workers it forks, and the forker of the shards
        return "python_workers"
    return None


def cpu_seconds() -> dict:
    """CPU seconds (user + system) so far of this process and its descendants -- the Spark JVM,
    its Python daemon and workers, the shards -- by :data:`PROCESSES` (zeros without /proc).
    A process that exited between two readings takes its CPU time with it."""
    parent, info = {}, {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # exited meanwhile
            continue
        pid = int(entry)
        parent[pid] = int(fields[1])
        info[pid] = (cmdline, (int(fields[11]) + int(fields[12])) / tick)
    out = {kind: 0.0 for kind in PROCESSES}
    for pid, (cmdline, seconds) in info.items():
        p = pid
        while p not in (0, 1, os.getpid()) and p in parent:
            p = parent[p]
        kind = _kind(pid, cmdline)
        if p == os.getpid() and kind is not None:
            out[kind] += seconds
    return out


def _spent(before: dict, after: dict) -> dict:
    return {kind: after.get(kind, 0.0) - before.get(kind, 0.0) for kind in PROCESSES}


def child(k: int, iterations: int, pairs: int, conf=None, notebook: bool = False) -> dict:
    """One fresh process's measurements (printed as JSON by ``--child``), its session with the
    Spark settings ``conf`` besides the defaults; ``notebook``: the corpus comes from the JVM."""
    t0 = time.perf_counter()
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import CountVectorizer, RegexTokenizer, StopWordsRemover

    from pystrads.datasets import load_debian_sample
    from pystrads.ml import StradsLDA
    from pystrads.session import spark_session

    imports = time.perf_counter() - t0
    spark = spark_session("local[2]", "pystrads-bench-first-fit", {"spark.ui.enabled": "false", **(conf or {})})
    spark.sparkContext.setLogLevel("ERROR")
    if notebook:
        import pystrads.datasets

        path = os.path.join(os.path.dirname(pystrads.datasets.__file__), "data", "debian_sample.jsonl.gz")
        df = spark.read.json(path)
    else:
        df = load_debian_sample(spark)
    stages = [RegexTokenizer(inputCol="text", outputCol="tokens", pattern="[^a-z0-9+]+", toLowercase=True),
              StopWordsRemover(inputCol="tokens", outputCol="words"),
              CountVectorizer(inputCol="words", outputCol="features", vocabSize=50000, minDF=2.0)]
    features = Pipeline(stages=stages).fit(df).transform(df).select("features").cache()
    docs = features.count()
    python_before = cpu_seconds()["python_workers"]  # 0: the first fit starts Spark's Python workers

    def fit(n):
        cpu = cpu_seconds()
        start = time.perf_counter()
        model = StradsLDA(k=k, maxIter=n, seed=1, optimizeDocConcentration=False).fit(features)
        return time.perf_counter() - start, dict(model.summary.timings), _spent(cpu, cpu_seconds())

    first, first_phases, first_cpu = fit(iterations)
    warm, double = [], []
    for _ in range(pairs):  # interleaved, so that a slow spell of the machine hits both
        warm.append(fit(iterations))
        double.append(fit(2 * iterations)[0])
    mid = sorted(warm, key=lambda w: w[0])[len(warm) // 2]  # the median warm fit
    spark.stop()
    return {"docs": docs, "imports_s": imports, "python_before_first_fit_s": python_before, "first_s": first, "warm_s": mid[0],
            "double_s": float(np.median(double)), "warm_runs_s": [w[0] for w in warm], "double_runs_s": double,
            "first_phases": {p: first_phases.get(p, 0.0) for p in PHASES},
            "warm_phases": {p: mid[1].get(p, 0.0) for p in PHASES},
            "first_cpu_s": first_cpu, "warm_cpu_s": mid[2]}


def run_child(k: int, iterations: int, pairs: int, env=None, conf=None, notebook: bool = False) -> dict:
    settings = [a for key, value in (conf or {}).items() for a in ("--conf", f"{key}={value}")]
    settings += ["--notebook"] if notebook else []
    # the executors run this interpreter, as the quick start's do: a PYSPARK_PYTHON naming another
    # path to it (a pyenv shim, say) would start every Python daemon through that wrapper and the
    # shards through a Spark job instead of from the driver
    env = dict(env or os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "-k", str(k), "--iterations",
                          str(iterations), "--pairs", str(pairs)] + settings, capture_output=True, text=True,
                         env=env, check=False)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"the measuring process failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(lines[-1])


def phase_medians(runs) -> dict:
    """The first and warm fits' phases, medians over ``runs``."""
    return {when: {p: float(np.median([r[when][p] for r in runs])) for p in PHASES}
            for when in ("first_phases", "warm_phases")}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-k", type=int, default=20)
    p.add_argument("--iterations", type=int, default=100)
    p.add_argument("--repeats", type=int, default=3, help="fresh processes with the numba cache in place")
    p.add_argument("--pairs", type=int, default=3,
                   help="warm fits of --iterations and of twice as many per process, interleaved (medians)")
    p.add_argument("--compare", action="append", default=[], metavar="KEY=VALUE",
                   help="also run each process with these Spark settings, alternating (repeatable)")
    p.add_argument("--notebook", action="store_true",
                   help="the notebook case: the corpus read and counted by the JVM, the fit the first Python work")
    p.add_argument("--conf", action="append", default=[], help=argparse.SUPPRESS)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help="default out/bench_first_fit[_notebook].json")
    args = p.parse_args(argv)
    for setting in args.compare + args.conf:
        if "=" not in setting:
            p.error(f"--compare / --conf take KEY=VALUE, not {setting!r} (e.g. spark.pystrads.shard.fork=false)")
    if args.child:
        print(json.dumps(child(args.k, args.iterations, args.pairs, dict(a.split("=", 1) for a in args.conf),
                               args.notebook)))
        return None

    args.out = args.out or f"out/bench_first_fit{'_notebook' if args.notebook else ''}.json"
    compare = dict(a.split("=", 1) for a in args.compare)
    runs, alternate = [], []
    for rep in range(args.repeats):
        for conf, into, label in [({}, runs, "")] + ([(compare, alternate, " (compared)")] if compare else []):
            r = run_child(args.k, args.iterations, args.pairs, conf=conf, notebook=args.notebook)
            r["ratio"] = r["first_s"] / r["warm_s"]
            r["one_off_s"] = 2 * r["warm_s"] - r["double_s"]
            r["iteration_ms"] = 1e3 * (r["double_s"] - r["warm_s"]) / args.iterations  # what an iteration adds
            into.append(r)
            print(f"  process {rep + 1}{label}: first fit {r['first_s']:.2f} s, warm {r['warm_s']:.2f} s "
                  f"(x{r['ratio']:.2f}), one-off {r['one_off_s']:.2f} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="pystrads-numba-") as cache:
        cold = run_child(args.k, args.iterations, 1, dict(os.environ, NUMBA_CACHE_DIR=cache), notebook=args.notebook)
    cold["ratio"] = cold["first_s"] / cold["warm_s"]
    print(f"  kernels compiling (empty numba cache): first fit {cold['first_s']:.2f} s, warm {cold['warm_s']:.2f} s")

    def med(key, of=runs):
        return float(np.median([r[key] for r in of]))

    phases = phase_medians(runs)
    cpu = {when: {kind: float(np.median([r[when][kind] for r in runs])) for kind in PROCESSES}
           for when in ("first_cpu_s", "warm_cpu_s")}
    summary = {"first_s": med("first_s"), "warm_s": med("warm_s"), "ratio": med("ratio"),
               "one_off_s": med("one_off_s"), "iteration_ms": med("iteration_ms")}
    print(f"\nmedians: first fit {summary['first_s']:.2f} s, warm fit {summary['warm_s']:.2f} s, ratio "
          f"{summary['ratio']:.2f} (target <= 1.5), one-off {summary['one_off_s']:.2f} s (target <= 1), "
          f"{summary['iteration_ms']:.2f} ms an iteration (target <= 5)")
    for p_name in PHASES:
        first, warm = phases["first_phases"][p_name], phases["warm_phases"][p_name]
        print(f"  {p_name:16s} first {first:.2f} s   warm {warm:.2f} s")
    for kind in PROCESSES:
        first, warm = cpu["first_cpu_s"][kind], cpu["warm_cpu_s"][kind]
        print(f"  CPU {kind:14s} first {first:.2f} s   warm {warm:.2f} s")
    compared = None
    if compare:
        compared = {"conf": compare, "runs": alternate,
                    "median": {key: med(key, alternate) for key in ("first_s", "warm_s", "ratio", "one_off_s")},
                    "phases": phase_medians(alternate)}
        m = compared["median"]
        print(f"with {' '.join(f'{k}={v}' for k, v in compare.items())}: first fit {m['first_s']:.2f} s, "
              f"warm fit {m['warm_s']:.2f} s, ratio {m['ratio']:.2f}, one-off {m['one_off_s']:.2f} s")
    return record("jobs/bench_first_fit.py", argv_of(argv), args.out, {
        "problem": {"corpus": "bundled Debian sample", "docs": runs[0]["docs"], "k": args.k,
                    "iterations": args.iterations,
                    "case": "notebook: read and counted by the JVM" if args.notebook else "rows from Python"},
        "runs": runs, "median": summary, "phases": phases, "cpu_s": cpu, "empty_kernel_cache": cold,
        **({"compared": compared} if compared else {})})


if __name__ == "__main__":
    main()
