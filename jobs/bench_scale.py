"""Scale benchmark: models far larger than a 1 GiB driver, through the Estimators.

    python jobs/bench_scale.py                   # both cases at full size (~10-30 min, ~10 GB of RAM, disk)
    python jobs/bench_scale.py --case lda        # or --case mf
    python jobs/bench_scale.py --quick           # tiny sizes: checks the job itself in a minute

Each case runs in a fresh ``local[2]`` driver with ``spark.driver.memory=1g``:

* **lda** -- StradsLDA with V = 1,000,000 and K = 1,000 (a 4 GB int32 word-topic
  table) on a synthetic Zipf(0.8) corpus of 10 M tokens made on the executors:
  2 iterations, then ``describeTopics(10)``, ``transform`` and ``logPerplexity`` of
  2,000 documents, save, load and ``transform`` with the loaded model;
* **mf** -- StradsMF with 2,000,000 users, 20,000 items and rank 100 on 10 ratings
  per user made on the executors: 2 iterations, then ``recommendForUserSubset(10)``
  for 10,000 users, save, load and the same recommendations from the loaded model.

Reported per phase: its time and the peak resident memory of the Python
driver (``VmHWM``, reset after a warm-up fit of a tiny model so that one-off
imports and JIT compilation are not counted), the JVM driver, each shard and
each Python worker (sampled every 0.2 s from /proc: every process that carries
this run's environment marker). The job fails unless the Python driver's peak
grew by less than 5 % of the model's size (LDA: V·K·4 bytes; MF: (users +
items)·rank·4 bytes, ALS's float32 factors). Writes ``out/bench_scale.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

MARKER = "PYSTRADS_BENCH_SCALE"
MIB = 2 ** 20


class Sampler(threading.Thread):
    """Peak RSS of every process carrying ``MARKER=<value>`` in its environment, by role and pid."""

    def __init__(self, value: str):
        super().__init__(daemon=True)
        self.tag, self.peaks, self.stopped = f"{MARKER}={value}".encode(), {}, threading.Event()

    @staticmethod
    def role(cmd: str, pid: int) -> str:
        if pid == os.getpid():
            return "python driver"
        if "pystrads.ps.server" in cmd:
            return "shard"
        if cmd.startswith("java") or "/java" in cmd.split(" ")[0]:
            return "JVM driver"
        return "python worker" if "pyspark" in cmd or "python" in cmd else "other"

    def run(self):
        while not self.stopped.wait(0.2):
            for entry in os.listdir("/proc"):
                if not entry.isdigit():
                    continue
                try:
                    with open(f"/proc/{entry}/environ", "rb") as fh:
                        if self.tag not in fh.read().split(b"\0"):
                            continue
                    with open(f"/proc/{entry}/cmdline", "rb") as fh:
                        cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
                    with open(f"/proc/{entry}/status") as fh:
                        rss = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmRSS:"))
                except (OSError, StopIteration):
                    continue
                key = (self.role(cmd, int(entry)), int(entry))
                self.peaks[key] = max(self.peaks.get(key, 0), rss)

    def take(self) -> dict:
        """Peaks since the last call, by role: the largest process's and their sum."""
        peaks, self.peaks = self.peaks, {}
        out = {}
        for (role, _), rss in peaks.items():
            r = out.setdefault(role, {"processes": 0, "max_mib": 0.0, "sum_mib": 0.0})
            r["processes"] += 1
            r["max_mib"] = round(max(r["max_mib"], rss / MIB), 1)
            r["sum_mib"] = round(r["sum_mib"] + rss / MIB, 1)
        return out


def status(key: str) -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith(key))


def zipf_docs(spark, num_docs: int, vocab: int, doc_len: int):
    """DataFrame(id, features): documents of ``doc_len`` Zipf(0.8) words, made on the executors."""
    import numpy as np
    import pyarrow as pa
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import to_arrow_type

    def make(batches):
        cdf = np.cumsum(np.arange(1, vocab + 1, dtype=np.float64) ** -0.8)
        cdf /= cdf[-1]
        vector_type = to_arrow_type(VectorUDT().sqlType())
        for batch in batches:
            ids = batch.column(0).to_numpy()
            rows = []
            for d in ids:
                words = np.searchsorted(cdf, np.random.default_rng(int(d)).random(doc_len))
                w, c = np.unique(np.minimum(words, vocab - 1), return_counts=True)
                rows.append({"type": 0, "size": vocab, "indices": w.tolist(), "values": c.astype(float).tolist()})
            yield pa.RecordBatch.from_arrays([pa.array(ids), pa.array(rows, type=vector_type)], ["id", "features"])

    schema = T.StructType([T.StructField("id", T.LongType()), T.StructField("features", VectorUDT())])
    return spark.range(0, num_docs, 1, 4).mapInArrow(make, schema)


def ratings(spark, users: int, items: int, per_user: int):
    """DataFrame(user, item, rating): ``per_user`` distinct Zipf-popular items per user, ratings 1-5."""
    import numpy as np
    import pyarrow as pa
    from pyspark.sql import types as T

    def make(batches):
        cdf = np.cumsum(np.arange(1, items + 1, dtype=np.float64) ** -0.8)
        cdf /= cdf[-1]
        for batch in batches:
            us = batch.column(0).to_numpy()
            rng = np.random.default_rng(int(us[0]) if len(us) else 0)
            it = np.minimum(np.searchsorted(cdf, rng.random((len(us), per_user))), items - 1)
            u = np.repeat(us, per_user).astype(np.int32)
            r = rng.integers(1, 6, len(u)).astype(np.float64)
            yield pa.RecordBatch.from_arrays([pa.array(u), pa.array(it.ravel().astype(np.int32)), pa.array(r)],
                                             ["user", "item", "rating"])

    schema = T.StructType([T.StructField("user", T.IntegerType()), T.StructField("item", T.IntegerType()),
                           T.StructField("rating", T.DoubleType())])
    return spark.range(0, users, 1, 8).mapInArrow(make, schema).dropDuplicates(["user", "item"])


def lda_phases(spark, df, k: int, path: str, phase):
    from pystrads.ml import StradsLDA, StradsLDAModel

    model = phase("fit", lambda: StradsLDA(k=k, maxIter=2, seed=1, numWorkers=2).fit(df))
    phase("describeTopics", lambda: model.describeTopics(10).collect())
    sample = df.limit(2000).cache()
    sample.count()
    phase("transform", lambda: model.transform(sample).select("id", "topicDistribution").count())
    phase("logPerplexity", lambda: model.logPerplexity(sample))
    phase("save", lambda: model.write().overwrite().save(path))
    loaded = phase("load", lambda: StradsLDAModel.load(path))
    phase("transform (loaded)", lambda: loaded.transform(sample).select("id", "topicDistribution").count())
    return {"tokens": model.summary.numTokens}


def mf_phases(spark, df, rank: int, path: str, phase, sample_users: int):
    from pystrads.ml import StradsMF, StradsMFModel

    model = phase("fit", lambda: StradsMF(rank=rank, maxIter=2, seed=1, numWorkers=2).fit(df))
    users = spark.range(0, sample_users).selectExpr("cast(id * 37 as int) as user").cache()
    users.count()
    phase("recommendForUserSubset(10)", lambda: model.recommendForUserSubset(users, 10).count())
    phase("save", lambda: model.write().overwrite().save(path))
    loaded = phase("load", lambda: StradsMFModel.load(path))
    phase("recommend (loaded)", lambda: loaded.recommendForUserSubset(users, 10).count())
    return {}


def child(args) -> dict:
    import tempfile
    import tracemalloc

    from pystrads.session import spark_session

    sampler = Sampler(os.environ[MARKER])
    sampler.start()
    spark = spark_session("local[2]", f"pystrads-scale-{args.case}", {
        "spark.ui.enabled": "false", "spark.driver.memory": "1g", "spark.sql.shuffle.partitions": "8"})
    spark.sparkContext.setLogLevel("ERROR")
    tmp = tempfile.mkdtemp(prefix="pystrads-scale-")
    report = {"case": args.case, "phases": {}}

    def quiet(name, fn):
        return fn()

    if args.case == "lda":  # warm-up: imports, JIT, first Arrow jobs; then the data, cached on the executors
        lda_phases(spark, zipf_docs(spark, 40, 200, 50), 2, tmp + "/warm", quiet)
        df = zipf_docs(spark, args.lda_tokens // args.doc_len, args.lda_vocab, args.doc_len).cache()
        report["model_bytes"] = args.lda_vocab * args.lda_k * 4
        report["size"] = {"vocab": args.lda_vocab, "k": args.lda_k, "tokens": args.lda_tokens}
    else:
        mf_phases(spark, ratings(spark, 200, 50, 5), 4, tmp + "/warm", quiet, 20)
        df = ratings(spark, args.mf_users, args.mf_items, args.mf_per_user).cache()
        report["model_bytes"] = (args.mf_users + args.mf_items) * args.mf_rank * 4
        report["size"] = {"users": args.mf_users, "items": args.mf_items, "rank": args.mf_rank,
                          "ratings_per_user": args.mf_per_user}
    t0 = time.perf_counter()
    report["input_rows"] = df.count()
    report["input_s"] = round(time.perf_counter() - t0, 1)
    sampler.take()
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # VmHWM := the current RSS
    rss0 = status("VmRSS:")
    tracemalloc.start()

    def phase(name, fn):
        t = time.perf_counter()
        out = fn()
        report["phases"][name] = {"seconds": round(time.perf_counter() - t, 1), "peaks": sampler.take()}
        return out

    if args.case == "lda":
        report.update(lda_phases(spark, df, args.lda_k, tmp + "/model", phase))
    else:
        report.update(mf_phases(spark, df, args.mf_rank, tmp + "/model", phase, args.sample_users))
    report["driver_traced_peak"] = tracemalloc.get_traced_memory()[1]
    report["driver_rss_before"] = rss0
    report["driver_peak_rss_growth"] = status("VmHWM:") - rss0
    sampler.stopped.set()
    spark.stop()
    return report


def run_case(args, case: str) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", case] + args.passthrough
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, **{MARKER: f"{os.getpid()}-{case}"})
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not line:
        err = proc.stderr or proc.stdout
        at = err.rfind("Traceback (most recent call last)")  # the Python side first, then the end
        return {"case": case, "error": (err[at:at + 3000] + "\n...\n" if at >= 0 else "") + err[-1500:]}
    return json.loads(line[0][len("RESULT "):])


def print_report(r: dict) -> bool:
    if "error" in r:
        print(f"\n== {r['case']}: FAILED\n{r['error']}")
        return False
    print(f"\n== {r['case']}: {r['size']}, model {r['model_bytes'] / MIB:,.0f} MiB, input {r['input_rows']:,} rows "
          f"({r['input_s']} s to make and cache)")
    roles = ["python driver", "JVM driver", "shard", "python worker"]
    print("| phase | seconds | " + " | ".join(f"{x} peak MiB" for x in roles) + " |")
    print("|---|---:|" + "---:|" * len(roles))
    for name, p in r["phases"].items():
        cells = []
        for role in roles:
            got = p["peaks"].get(role)
            cells.append("—" if not got else f"{got['max_mib']:,.0f}" + (f" (×{got['processes']})"
                                                                        if got["processes"] > 1 else ""))
        print(f"| {name} | {p['seconds']} | " + " | ".join(cells) + " |")
    growth = r["driver_peak_rss_growth"]
    ok = growth < 0.05 * r["model_bytes"]
    print(f"Python driver: peak RSS grew {growth / MIB:,.0f} MiB = {growth / r['model_bytes']:.1%} of the model "
          f"(target < 5 %: {'met' if ok else 'NOT met'}); traced peak {r['driver_traced_peak'] / MIB:,.1f} MiB")
    return ok


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--case", choices=["lda", "mf", "both"], default="both")
    p.add_argument("--quick", action="store_true", help="tiny sizes (checks the job, not the claim)")
    p.add_argument("--lda-vocab", type=int, default=1_000_000)
    p.add_argument("--lda-k", type=int, default=1000)
    p.add_argument("--lda-tokens", type=int, default=10_000_000)
    p.add_argument("--doc-len", type=int, default=200)
    p.add_argument("--mf-users", type=int, default=2_000_000)
    p.add_argument("--mf-items", type=int, default=20_000)
    p.add_argument("--mf-rank", type=int, default=100)
    p.add_argument("--mf-per-user", type=int, default=10)
    p.add_argument("--sample-users", type=int, default=10_000)
    p.add_argument("--out", default="out/bench_scale.json")
    p.add_argument("--child", choices=["lda", "mf"], default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.lda_vocab, args.lda_k, args.lda_tokens = 20_000, 50, 200_000
        args.mf_users, args.mf_items, args.mf_rank, args.sample_users = 20_000, 500, 10, 500
    if args.child:
        args.case = args.child
        print("RESULT " + json.dumps(child(args)), flush=True)
        return 0
    args.passthrough = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
                        if k in ("lda_vocab", "lda_k", "lda_tokens", "doc_len", "mf_users", "mf_items", "mf_rank",
                                 "mf_per_user", "sample_users")]
    results, ok = [], True
    for case in (["lda", "mf"] if args.case == "both" else [args.case]):
        r = run_case(args, case)
        ok = print_report(r) and ok
        results.append(r)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"quick": args.quick, "results": results}, fh, indent=2)
    print(f"\nwrote {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
