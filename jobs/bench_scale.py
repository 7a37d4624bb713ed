"""Scale benchmark: models far larger than a 1 GiB driver, through the Estimators.

    python jobs/bench_scale.py                   # both cases at full size (~10-30 min, ~10 GB of RAM, disk)
    python jobs/bench_scale.py --case lda        # or --case mf
    python jobs/bench_scale.py --quick           # tiny sizes: checks the job itself in a minute

Each case runs in a fresh ``local[2]`` driver with ``spark.driver.memory=1g``:

* **lda** -- StradsLDA with V = 1,000,000 and K = 1,000 (a 4 GB int32 word-topic
  table) on a synthetic Zipf(0.8) corpus of 10 M tokens made on the executors:
  2 iterations, then ``describeTopics(10)``, ``transform`` and ``logPerplexity`` of
  2,000 documents, save, load and ``transform`` with the loaded model;
* **lda-peer** -- StradsLDA (2 workers, fixed priors α = 0.1, β = 0.01) against
  tomotopy (2 threads) on one Zipf(0.8) corpus, V = 1,000,000, K = 1,000, 3 M tokens
  in 15,000 documents (``--peer-*`` to change it, e.g. ``--peer-vocab 100000
  --peer-k 10000``): a short and a long fit of each (3 and 9 iterations; time per
  iteration = their difference / 6), each after a warm-up fit of a tiny model;
  tomotopy in a process of its own, after StradsLDA.  Reported beside the phases:
  both systems' whole long fit (tomotopy: ``add_doc`` + ``train``) and time per
  iteration, the word-topic table's non-zeros and how the shards stored them, the
  shard's peak against 500 MiB + 3 x 8 bytes x (non-zeros + V);
* **lda-k** -- the lda-peer corpus over V = 100,000 words (``--k-vocab``), fitted
  with K = 1,000 and 10,000 (``--k-list``) by StradsLDA (``sampler="auto"``) and
  tomotopy, a short and a long fit of each at each K: time per token at each K
  and its growth from the first K to the last (target for StradsLDA:
  ``--k-growth-target``, 1.5x), each pystrads role's largest process at each K
  (target: ``--k-process-limit-mib``, 4 GiB); tomotopy is left out at a K where
  its dense table of the corpus's distinct words x K counts would not fit in
  the memory available (said in the report), e.g. ``--k-vocab 1000000 --k-list
  1000 100000 --k-growth-target 2``;
* **lda-samplers** -- the lda-k corpus, each of ``--samplers`` (fplus, alias) at
  each K of ``--k-list``, one fit of ``--sampler-iters`` iterations logging the
  log-likelihood every iteration: the time each sampler needs to reach the
  first one's log-likelihood at its 4th iteration (``auto``'s crossover);
* **mf** -- StradsMF with 2,000,000 users, 20,000 items and rank 100 on 10 ratings
  per user made on the executors: 2 iterations, then ``recommendForUserSubset(10)``
  for 10,000 users, save, load and the same recommendations from the loaded model;
  the shard's peak in the fit against 3 x its tables as stored (``item_factors`` and
  the users' factors the workers leave on it, float64) + 500 MiB, beside what the
  shards' own stats say they held (``summary.shards``: blobs now and at most, VmHWM).

Reported per phase: its time and the peak resident memory of the Python
driver (``VmHWM``, reset after a warm-up fit of a tiny model so that one-off
imports and JIT compilation are not counted), the JVM driver, each shard and
each Python worker (sampled every 0.2 s from /proc: every process that carries
this run's environment marker). The job fails unless the Python driver's peak
grew by less than 5 % of the model's size (LDA: V·K·4 bytes; MF: (users +
items)·rank·4 bytes, ALS's float32 factors) and, for mf, unless the shard's peak
met its bound. Writes ``out/bench_scale.json``.
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
#: lda-samplers: the iteration of the first sampler whose log-likelihood the others race to
TARGET_ITERATION = 4
MIB = 2 ** 20


class Sampler(threading.Thread):
    """Peak RSS of every process carrying ``MARKER=<value>`` in its environment or descending from
    this one, by role and pid (a shard forked by the executor's forker names itself a shard in its
    command line and overwrites the environment block /proc shows, so only its ancestry finds it)."""

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

    @staticmethod
    def descendants(root: int) -> set:
        children = {}
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    children.setdefault(int(fh.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
        out, todo = set(), [root]
        while todo:
            for child in children.get(todo.pop(), []):
                if child not in out:
                    out.add(child)
                    todo.append(child)
        return out

    def run(self):
        while not self.stopped.wait(0.2):
            mine = self.descendants(os.getpid())
            for entry in os.listdir("/proc"):
                if not entry.isdigit():
                    continue
                try:
                    if int(entry) not in mine and int(entry) != os.getpid():
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


def status_mem(key: str) -> int:
    """A line of /proc/meminfo, in bytes."""
    with open("/proc/meminfo") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith(key))


def tomotopy_table_bytes(vocab: int, k: int, num_docs: int, doc_len: int) -> int:
    """The dense word-topic table tomotopy would allocate for the Zipf corpus: its distinct words x K
    int32 counts (tomotopy's vocabulary is the words it was given)."""
    import numpy as np

    cdf = zipf_cdf(vocab)
    seen = np.zeros(vocab, dtype=bool)
    for d in range(num_docs):
        seen[zipf_doc(cdf, d, doc_len)[0]] = True
    return int(seen.sum()) * k * 4


def zipf_cdf(vocab: int):
    import numpy as np

    cdf = np.cumsum(np.arange(1, vocab + 1, dtype=np.float64) ** -0.8)
    return cdf / cdf[-1]


def zipf_doc(cdf, d: int, doc_len: int):
    """Document ``d``: ``(word ids, counts)`` of ``doc_len`` Zipf(0.8) draws (the same wherever made)."""
    import numpy as np

    words = np.searchsorted(cdf, np.random.default_rng(int(d)).random(doc_len))
    return np.unique(np.minimum(words, len(cdf) - 1), return_counts=True)


def zipf_docs(spark, num_docs: int, vocab: int, doc_len: int):
    """DataFrame(id, features): documents of ``doc_len`` Zipf(0.8) words, made on the executors."""
    import pyarrow as pa
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import to_arrow_type

    def make(batches):
        cdf = zipf_cdf(vocab)
        vector_type = to_arrow_type(VectorUDT().sqlType())
        for batch in batches:
            ids = batch.column(0).to_numpy()
            rows = []
            for d in ids:
                w, c = zipf_doc(cdf, d, doc_len)
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


def lda_peer_phases(spark, df, k: int, phase, short: int, long: int, repeats: int = 1, sampler: str = "auto",
                    prefix: str = "", workers: int = 2, budget_s: float = 0.0):
    """StradsLDA's short and long fits with fixed priors (the peer comparison's settings),
    ``repeats`` times, after a warm-up fit of a tiny model with the sampler they will use (its
    kernels compiled or loaded from numba's cache there, not in the short fit); the last long
    fit's summary.  ``workers``: numWorkers (0: unset, the estimator's default shape).
    ``budget_s`` > 0: then a fit of as many iterations as the medians say fit in 90 % of that wall time
    (the peer's whole fit), its log-likelihood computed at its last iteration (that time
    included), for the log-likelihood per token each system reaches in the same time."""
    import numpy as np

    from pystrads.kernels.lda import choose_sampler
    from pystrads.ml import StradsLDA

    shape = {"numWorkers": workers} if workers else {}
    warm = choose_sampler(k, 200) if sampler == "auto" else sampler
    StradsLDA(k=2, maxIter=2, seed=1, sampler=warm, **shape).fit(zipf_docs(spark, 40, 200, 50)).close()

    def fit(iters):
        return StradsLDA(k=k, maxIter=iters, seed=1, **shape, docConcentration=[0.1], topicConcentration=0.01,
                         optimizeDocConcentration=False, logLikelihoodEvery=0, sampler=sampler).fit(df)

    times = {short: [], long: []}
    for run in range(1, repeats + 1):
        suffix = f" (run {run})" if repeats > 1 else ""
        t0 = time.perf_counter()
        phase(f"{prefix}fit {short} iterations{suffix}", lambda: fit(short).close())
        t1 = time.perf_counter()
        model = phase(f"{prefix}fit {long} iterations{suffix}", lambda: fit(long))
        times[short].append(t1 - t0)
        times[long].append(time.perf_counter() - t1)
        out = {"shards": model.summary.shards, "timings": model.summary.timings, "sampler": model.summary.sampler,
               "steps": model.summary.steps.to_dict(orient="list")}
        model.close()
    if budget_s > 0:
        per_it = float(np.median(np.subtract(times[long], times[short]))) / (long - short)
        fixed = float(np.median(times[long])) - long * per_it
        # planned on 90 % of the budget: the log-likelihood's own read and the runs' spread (the fit's
        # measured time is what the report shows)
        iters = max(1, min(20 * long, int((0.9 * budget_s - fixed) / per_it) if per_it > 0 else 20 * long))
        t0 = time.perf_counter()
        model = StradsLDA(k=k, maxIter=iters, seed=1, **shape, docConcentration=[0.1], topicConcentration=0.01,
                          optimizeDocConcentration=False, logLikelihoodEvery=iters, sampler=sampler).fit(df)
        out["budget"] = {"budget_s": budget_s, "iterations": iters, "fit_s": time.perf_counter() - t0,
                         "log_likelihood_per_token": model.summary.logLikelihoodHistory[-1] / model.summary.numTokens}
        model.close()
    return out


def lda_sampler_phases(spark, df, ks, samplers, iterations: int, phase, workers: int = 2) -> dict:
    """Each sampler at each K (after a warm-up fit of a tiny model with the same sampler): a fit of
    ``iterations`` with the log-likelihood logged every iteration, for its log-likelihood at each
    iteration, and the same fit without it, for the cumulative time of its steps at each iteration
    (the log-likelihood's own cost, a read of the whole table, would favour the sampler that needs
    fewer iterations); for ``auto``'s crossovers.  ``workers``: numWorkers (0: the default shape)."""
    import numpy as np

    from pystrads.ml import StradsLDA

    shape = {"numWorkers": workers} if workers else {}
    out = {}
    for k in ks:
        for sampler in samplers:
            StradsLDA(k=2, maxIter=2, seed=1, sampler=sampler, **shape).fit(zipf_docs(spark, 40, 200, 50)).close()

            def fit(every):
                return StradsLDA(k=k, maxIter=iterations, seed=1, docConcentration=[0.1], topicConcentration=0.01,
                                 optimizeDocConcentration=False, logLikelihoodEvery=every, sampler=sampler,
                                 **shape).fit(df)

            model = phase(f"K={k} {sampler} {iterations} iterations, log-likelihood every iteration", lambda: fit(1))
            log_likelihood = [float(x) for x in model.summary.logLikelihoodHistory]
            model.close()
            model = phase(f"K={k} {sampler} {iterations} iterations", lambda: fit(0))
            steps, seconds = model.summary.steps, []  # each step's time spread over its iterations
            for rounds, step_s in zip(steps["rounds"], steps["step_s"]):
                per = max(1, int(rounds) // model.summary.numWorkers)
                seconds += [float(step_s) / per] * per
            out[f"{k}/{sampler}"] = {"k": k, "sampler": sampler, "workers": model.summary.numWorkers,
                                     "threads": model.summary.timings.get("threads"),
                                     "log_likelihood": log_likelihood,
                                     "cumulative_s": list(np.cumsum(seconds)[:iterations].round(3))}
            model.close()
    return out


def tomotopy_log_likelihood_per_token(model, k: int, vocab: int, alpha: float, beta: float) -> float:
    """log p(w, z) per token of a tomotopy model's topic assignments, by pystrads' own formula
    (:mod:`pystrads.kernels.lda.likelihood`, with StradsLDA's V: the features' size, where
    tomotopy's V is the words it was given), so both systems' states are scored alike."""
    import numpy as np

    from pystrads.kernels import lda as K

    words, topics, lengths = [], [], []
    for doc in model.docs:
        words.append(np.asarray(doc.words, dtype=np.int64))
        topics.append(np.asarray(doc.topics, dtype=np.int64))
        lengths.append(len(doc.words))
    lengths = np.asarray(lengths, dtype=np.int64)
    w, t = np.concatenate(words), np.concatenate(topics)
    doc_topic = np.zeros((len(lengths), k), dtype=np.int32)
    np.add.at(doc_topic, (np.repeat(np.arange(len(lengths)), lengths), t), 1)
    ll = K.doc_log_likelihood(doc_topic, lengths, K.alpha_vector(alpha, k))
    pairs, counts = np.unique(w * k + t, return_counts=True)
    rows = pairs // k
    for lo in range(0, int(rows.max()) + 1, 10_000):  # the word rows in dense chunks
        part = (rows >= lo) & (rows < lo + 10_000)
        block = np.zeros((10_000, k), dtype=np.int32)
        block[rows[part] - lo, pairs[part] % k] = counts[part]
        ll += K.word_log_likelihood_rows(block, beta)
    ll += K.topic_totals_log_likelihood(np.bincount(t, minlength=k).astype(np.int64), beta, vocab)
    return float(ll / len(w))


def tomotopy_peer(args) -> dict:
    """tomotopy on the same corpus in this process (its own): warm-up, then ``add_doc`` + ``train``
    of a short and a long fit, 2 threads, the same priors and seed."""
    import tomotopy as tp

    def fit(num_docs, vocab, k, iters, timed, score=False):
        cdf = zipf_cdf(vocab)
        t0 = time.perf_counter()
        model = tp.LDAModel(k=k, alpha=0.1, eta=0.01, seed=1)
        for d in range(num_docs):
            w, c = zipf_doc(cdf, d, args.doc_len)
            model.add_doc([str(x) for x in __import__("numpy").repeat(w, c)])
        t1 = time.perf_counter()
        model.train(iters, workers=2)
        t2 = time.perf_counter()
        out = {"add_doc_s": t1 - t0, "train_s": t2 - t1, "fit_s": t2 - t0}
        if score:  # after the clock stopped
            out["log_likelihood_per_token"] = tomotopy_log_likelihood_per_token(model, k, vocab, 0.1, 0.01)
        return out

    fit(40, 200, 2, 2, False)  # warm-up, as StradsLDA's
    num_docs = args.peer_tokens // args.doc_len
    if args.case == "tomotopy-k":  # the K-growth case: each K of --k-list at --k-vocab
        out = {"by_k": {}, "skipped": {}}
        for k in args.k_list:
            need, have = tomotopy_table_bytes(args.k_vocab, k, num_docs, args.doc_len), status_mem("MemAvailable:")
            if need > 0.8 * have:  # its dense table alone would not fit: say so instead of swapping or dying
                out["skipped"][str(k)] = (f"tomotopy keeps a dense words x topics table of int32 counts: "
                                          f"{need / 2**30:,.0f} GiB at K = {k:,} for this corpus's distinct words, "
                                          f"against {have / 2**30:,.0f} GiB available")
                print(f"tomotopy K={k}: skipped ({out['skipped'][str(k)]})", flush=True)
                continue
            out["by_k"][str(k)] = [{"short": fit(num_docs, args.k_vocab, k, args.peer_short, True),
                                    "long": fit(num_docs, args.k_vocab, k, args.peer_long, True)}
                                   for _ in range(args.repeats)]
        out["peak_rss"] = status("VmHWM:")
        return out
    out = {"runs": [{"short": fit(num_docs, args.peer_vocab, args.peer_k, args.peer_short, True),
                     "long": fit(num_docs, args.peer_vocab, args.peer_k, args.peer_long, True,
                                 score=run == args.repeats - 1)}
                    for run in range(args.repeats)]}
    out["peak_rss"] = status("VmHWM:")
    return out


def mf_phases(spark, df, rank: int, path: str, phase, sample_users: int):
    from pystrads.ml import StradsMF, StradsMFModel

    model = phase("fit", lambda: StradsMF(rank=rank, maxIter=2, seed=1, numWorkers=2).fit(df))
    steps = model.summary.steps
    shard_memory = {"shards": model.summary.shards,
                    "snapshot_bytes": [float(x) for x in steps.get("snapshot_bytes", [])]}
    users = spark.range(0, sample_users).selectExpr("cast(id * 37 as int) as user").cache()
    users.count()
    phase("recommendForUserSubset(10)", lambda: model.recommendForUserSubset(users, 10).count())
    phase("save", lambda: model.write().overwrite().save(path))
    loaded = phase("load", lambda: StradsMFModel.load(path))
    phase("recommend (loaded)", lambda: loaded.recommendForUserSubset(users, 10).count())
    return {"shard_memory": shard_memory}


def print_mf_shard(r: dict) -> bool:
    """MF's shard peak against 3 x its tables as stored + 500 MiB, where the tables as stored are
    the ``item_factors`` table and the users' factors the workers leave on the shards (float64,
    users x rank x 8 bytes), with what the shards' own accounts say they held; stores the
    figures in ``r["mf_shard"]``."""
    m = r.get("shard_memory") or {}
    shards = m.get("shards") or []
    users, rank = r["size"]["users"], r["size"]["rank"]
    tables = sum(s.get("table_bytes", 0) for s in shards)
    stored = tables + users * rank * 8
    bound = 3 * stored + 500 * MIB
    peak = r["phases"]["fit"]["peaks"].get("shard", {}).get("max_mib", 0) * MIB
    snaps = m.get("snapshot_bytes") or [0]
    out = {"tables_bytes": tables, "users_factors_bytes": users * rank * 8, "stored_bytes": stored,
           "bound_bytes": bound, "peak_bytes": peak, "snapshot_generation_bytes": max(snaps),
           "blob_bytes_at_end": sum(s.get("blob_bytes", 0) for s in shards),
           "peak_blob_bytes": sum(s.get("peak_blob_bytes", 0) for s in shards),
           "peak_rss_bytes": sum(s.get("peak_rss_bytes", 0) for s in shards)}
    r["mf_shard"] = out
    print(f"MF shard: tables {tables / MIB:,.0f} MiB + users' factors {users * rank * 8 / MIB:,.0f} MiB = "
          f"{stored / MIB:,.0f} MiB as stored; the workers' state snapshots {out['snapshot_generation_bytes'] / MIB:,.0f}"
          f" MiB a step; blobs held at most {out['peak_blob_bytes'] / MIB:,.0f} MiB, at the fit's end "
          f"{out['blob_bytes_at_end'] / MIB:,.0f} MiB")
    ok = 0 < peak <= bound
    print(f"MF shard peak {peak / MIB:,.0f} MiB (its own VmHWM {out['peak_rss_bytes'] / MIB:,.0f} MiB) against "
          f"3 x stored + 500 MiB = {bound / MIB:,.0f} MiB: {'met' if ok else 'NOT met'}")
    return ok


def child(args) -> dict:
    import tempfile
    import tracemalloc

    from pystrads.session import spark_session

    sampler = Sampler(os.environ[MARKER])
    sampler.start()
    spark = spark_session("local[2]", f"pystrads-scale-{args.case}", dict({
        "spark.ui.enabled": "false", "spark.driver.memory": "1g", "spark.sql.shuffle.partitions": "8"},
        **dict(kv.split("=", 1) for kv in args.conf)))
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
    elif args.case == "lda-k":
        lda_peer_phases(spark, zipf_docs(spark, 40, 200, 50), 2, quiet, 1, 2)
        df = zipf_docs(spark, args.peer_tokens // args.doc_len, args.k_vocab, args.doc_len).cache()
        report["model_bytes"] = args.k_vocab * max(args.k_list) * 4
        report["size"] = {"vocab": args.k_vocab, "k": list(args.k_list), "tokens": args.peer_tokens}
    elif args.case == "lda-samplers":
        df = zipf_docs(spark, args.peer_tokens // args.doc_len, args.k_vocab, args.doc_len).cache()
        report["model_bytes"] = args.k_vocab * max(args.k_list) * 4
        report["size"] = {"vocab": args.k_vocab, "k": list(args.k_list), "tokens": args.peer_tokens}
    elif args.case == "lda-peer":
        lda_peer_phases(spark, zipf_docs(spark, 40, 200, 50), 2, quiet, 1, 2)
        df = zipf_docs(spark, args.peer_tokens // args.doc_len, args.peer_vocab, args.doc_len).cache()
        report["model_bytes"] = args.peer_vocab * args.peer_k * 4
        report["size"] = {"vocab": args.peer_vocab, "k": args.peer_k, "tokens": args.peer_tokens}
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
    elif args.case == "lda-samplers":
        report["fits"] = lda_sampler_phases(spark, df, args.k_list, args.samplers, args.sampler_iters, phase,
                                            args.peer_workers)
    elif args.case == "lda-k":
        report["by_k"] = {}
        for k in args.k_list:
            got = lda_peer_phases(spark, df, k, phase, args.peer_short, args.peer_long, args.repeats,
                                  args.peer_sampler, prefix=f"K={k} ", workers=args.peer_workers)
            report["by_k"][str(k)] = {"sampler": got["sampler"], "timings": got["timings"]}
    elif args.case == "lda-peer":
        report.update(lda_peer_phases(spark, df, args.peer_k, phase, args.peer_short, args.peer_long, args.repeats,
                                      args.peer_sampler, workers=args.peer_workers, budget_s=args.budget_s))
    else:
        report.update(mf_phases(spark, df, args.mf_rank, tmp + "/model", phase, args.sample_users))
    report["driver_traced_peak"] = tracemalloc.get_traced_memory()[1]
    report["driver_rss_before"] = rss0
    report["driver_peak_rss_growth"] = status("VmHWM:") - rss0
    sampler.stopped.set()
    spark.stop()
    return report


def run_case(args, case: str) -> dict:
    if case == "lda-peer" and "tomotopy" not in args.skip:
        # tomotopy first: its whole fit's median time is StradsLDA's budget for the equal-time fit
        tt = _run_child(args, "tomotopy")
        budget = [] if "error" in tt else sorted(run["long"]["fit_s"] for run in tt["runs"])
        r = _run_child(args, case, [f"--budget-s={budget[len(budget) // 2]}"] if budget else [])
        if "error" not in r:
            r["tomotopy"] = tt
        return r
    if case == "lda-k" and "tomotopy" not in args.skip:
        r = _run_child(args, case)
        if "error" not in r:
            r["tomotopy"] = _run_child(args, "tomotopy" if case == "lda-peer" else "tomotopy-k")
        return r
    return _run_child(args, case)


def _run_child(args, case: str, extra=()) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", case] + args.passthrough + list(extra)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, **{MARKER: f"{os.getpid()}-{case}"})
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not line:
        err = proc.stderr or proc.stdout
        at = err.rfind("Traceback (most recent call last)")  # the Python side first, then the end
        return {"case": case, "error": (err[at:at + 3000] + "\n...\n" if at >= 0 else "") + err[-1500:]}
    return json.loads(line[0][len("RESULT "):])


def print_report(r: dict, args=None) -> bool:
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
    if r["case"] in ("lda-peer", "lda-k"):  # a model of a few million non-zeros: a fixed budget
        driver_ok = growth <= 100 * MIB
        target = "target <= 100 MiB"
    else:
        driver_ok = growth < 0.05 * r["model_bytes"]
        target = "target < 5 %"
    print(f"Python driver: peak RSS grew {growth / MIB:,.0f} MiB = {growth / r['model_bytes']:.1%} of the model "
          f"({target}: {'met' if driver_ok else 'NOT met'}); traced peak {r['driver_traced_peak'] / MIB:,.1f} MiB")
    if r["case"] == "lda-peer":
        return print_peer(r) and driver_ok
    if r["case"] == "lda-k":
        return (print_k_growth(r, args.k_growth_target, args.k_process_limit_mib) if args else print_k_growth(r)) \
            and driver_ok
    if r["case"] == "lda-samplers":
        print_sampler_race(r)
    if r["case"] == "mf":
        return print_mf_shard(r) and driver_ok
    return driver_ok


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def print_peer(r: dict) -> bool:
    """The peer comparison's figures, medians over the runs (and whether the shard's memory met
    its bound); stores them in ``r["peer"]``."""
    fits = {}  # iterations -> seconds of each run
    for name, p in r["phases"].items():
        fits.setdefault(int(name.split()[1]), []).append(p["seconds"])
    n_short, n_long = sorted(fits)
    per_runs = [(b - a) / (n_long - n_short) for a, b in zip(fits[n_short], fits[n_long])]
    per_it, long_s = _median(per_runs), _median(fits[n_long])
    tables = [s["tables"] for s in r["shards"]]
    word = [t[name] for t in tables for name in t if name.endswith("/word_topic")]
    nnz = sum(w.get("nonzeros", 0) for w in word)
    shard_peak = max(p["peaks"].get("shard", {}).get("max_mib", 0) for p in r["phases"].values()) * MIB
    bound = 500 * MIB + 3 * 8 * (nnz + r["size"]["vocab"])
    steps = r.get("steps") or {}
    # a step holds several rounds (iterations x workers): the split is per iteration, over the whole fit
    iterations = max(1.0, sum(steps.get("rounds", [])) / max(1, int(r["timings"].get("workers", 2))))
    r["peer"] = {"iterations": [n_short, n_long], "runs": len(per_runs), "strads_fit_s": long_s,
                 "strads_per_iteration_s": round(per_it, 3), "strads_per_iteration_runs": per_runs,
                 "nonzeros": nnz, "word_topic_storage": word, "shard_peak_bytes": shard_peak,
                 "shard_bound_bytes": bound, "strads_one_off": {k: v for k, v in r["timings"].items()
                                                                 if isinstance(v, (int, float))},
                 "strads_iteration_split": {key: sum(steps[key]) / iterations for key in ("seconds", "compute_s",
                                                                                          "sample_s", "sync_s")
                                            if key in steps}, "split_per_iteration": True}
    print(f"StradsLDA's long fit, per iteration (its steps' sums over its iterations): " + ", ".join(
        f"{k} {v:.2f} s" for k, v in r["peer"]["strads_iteration_split"].items()))
    print("StradsLDA's long fit, one-off: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(r["timings"].items())
                                                        if isinstance(v, (int, float)) and v >= 0.05))
    print(f"StradsLDA: {n_long}-iteration fit {long_s:.1f} s, {per_it:.2f} s per iteration (medians of "
          f"{len(per_runs)}); word_topic {nnz:,} non-zeros, stored "
          f"{[{k: w[k] for k in ('bytes', 'pair_entries', 'dense_rows') if k in w} for w in word]}")
    ok = shard_peak <= bound
    print(f"shard peak {shard_peak / MIB:,.0f} MiB against 500 MiB + 3 x 8 B x (non-zeros + V) = "
          f"{bound / MIB:,.0f} MiB: {'met' if ok else 'NOT met'}")
    tt = r.get("tomotopy")
    if tt and "error" not in tt:
        t_per_runs = [(run["long"]["train_s"] - run["short"]["train_s"]) / (n_long - n_short) for run in tt["runs"]]
        t_per_it, t_fit = _median(t_per_runs), _median([run["long"]["fit_s"] for run in tt["runs"]])
        r["peer"].update(tomotopy_fit_s=round(t_fit, 2), tomotopy_per_iteration_s=round(t_per_it, 3),
                         tomotopy_add_doc_s=round(_median([run["long"]["add_doc_s"] for run in tt["runs"]]), 2),
                         tomotopy_peak_rss=tt["peak_rss"],
                         per_iteration_ratio=round(t_per_it / per_it, 3) if per_it > 0 else None,
                         fit_ratio=round(t_fit / long_s, 3))
        print(f"tomotopy: {n_long}-iteration add_doc + train {t_fit:.1f} s (add_doc "
              f"{r['peer']['tomotopy_add_doc_s']:.1f} s), {t_per_it:.2f} s per iteration; peak RSS "
              f"{tt['peak_rss'] / MIB:,.0f} MiB")
        print(f"tomotopy / StradsLDA: per iteration {r['peer']['per_iteration_ratio']} (target >= 3), whole fit "
              f"{r['peer']['fit_ratio']} (target >= 2)")
        budget, t_ll = r.get("budget"), tt["runs"][-1]["long"].get("log_likelihood_per_token")
        if budget and t_ll is not None:
            r["peer"]["equal_time"] = dict(budget, tomotopy_log_likelihood_per_token=t_ll,
                                           tomotopy_iterations=n_long)
            print(f"log-likelihood per token in tomotopy's whole-fit time ({budget['budget_s']:.1f} s): StradsLDA "
                  f"{budget['log_likelihood_per_token']:.4f} after {budget['iterations']} iterations "
                  f"({budget['fit_s']:.1f} s), tomotopy {t_ll:.4f} after {n_long} (target: StradsLDA's >= tomotopy's: "
                  f"{'met' if budget['log_likelihood_per_token'] >= t_ll else 'NOT met'})")
    elif tt:
        print(f"tomotopy FAILED: {tt['error'][-800:]}")
    return ok


def _per_iteration(short_s, long_s, n_short: int, n_long: int):
    """Median time per iteration over the runs: (long - short) / (n_long - n_short)."""
    return _median([(b - a) / (n_long - n_short) for a, b in zip(short_s, long_s)])


def print_sampler_race(r: dict) -> None:
    """Per K: each sampler's time to reach the first sampler's log-likelihood at its
    ``TARGET_ITERATION``-th iteration, and its ratio to the first's; stores them in ``r["race"]``."""
    race = []
    for k in r["size"]["k"]:
        fits = [f for f in r["fits"].values() if f["k"] == k]
        ref = fits[0]
        target = ref["log_likelihood"][TARGET_ITERATION - 1]
        ref_s = ref["cumulative_s"][TARGET_ITERATION - 1]
        for f in fits:
            hit = next((i for i, ll in enumerate(f["log_likelihood"]) if ll >= target), None)
            per_it = (f["cumulative_s"][-1] - f["cumulative_s"][0]) / max(1, len(f["cumulative_s"]) - 1)
            race.append({"k": k, "sampler": f["sampler"], "seconds_per_iteration": round(per_it, 3),
                         "iterations_to_target": None if hit is None else hit + 1,
                         "seconds_to_target": None if hit is None else f["cumulative_s"][hit],
                         "time_ratio": None if hit is None else round(f["cumulative_s"][hit] / ref_s, 3)})
    r["race"] = race
    print(f"time to {race[0]['sampler'] if race else ''}'s log-likelihood at its iteration {TARGET_ITERATION} "
          "(steps' time in fits without the log-likelihood; the log-likelihood from the same fits with it):")
    print("| K | sampler | s/iteration | iterations to target | seconds to target | × the first |")
    print("|---:|---|---:|---:|---:|---:|")
    for x in race:
        print(f"| {x['k']:,} | {x['sampler']} | {x['seconds_per_iteration']:.2f} | {x['iterations_to_target'] or '—'} | "
              f"{x['seconds_to_target'] or '—'} | {x['time_ratio'] or '—'} |")


def print_k_growth(r: dict, target_growth: float = 1.5, limit_mib: int = 4096) -> bool:
    """The K-growth case: time per token at each K for StradsLDA and tomotopy (where its dense table
    fits in memory), its growth from the smallest K to the largest (StradsLDA's target:
    ``target_growth``) and each pystrads role's largest process at each K (target: ``limit_mib``);
    stores them in ``r["growth"]``."""
    ks = [int(k) for k in r["by_k"]]
    tokens = r["size"]["tokens"]
    fits: dict = {}
    for name, p in r["phases"].items():  # "K=1000 fit 2 iterations"
        k, n = int(name.split()[0][2:]), int(name.split()[2])
        fits.setdefault(k, {}).setdefault(n, []).append(p["seconds"])
    rows, tt = [], r.get("tomotopy")
    for k in ks:
        n_short, n_long = sorted(fits[k])
        row = {"k": k, "sampler": r["by_k"][str(k)]["sampler"],
               "strads_per_iteration_s": round(_per_iteration(fits[k][n_short], fits[k][n_long], n_short, n_long), 3)}
        row["strads_ns_per_token"] = round(row["strads_per_iteration_s"] / tokens * 1e9, 1)
        peaks: dict = {}  # role -> the largest peak of one process of it over this K's fits, MiB
        for name, p in r["phases"].items():
            if int(name.split()[0][2:]) == k:
                for role, got in p["peaks"].items():
                    peaks[role] = max(peaks.get(role, 0), round(got["max_mib"]))
        row["peak_mib"] = peaks
        if tt and "error" not in tt and str(k) in tt.get("skipped", {}):
            row["tomotopy_skipped"] = tt["skipped"][str(k)]
        elif tt and "error" not in tt:
            runs = tt["by_k"][str(k)]
            row["tomotopy_per_iteration_s"] = round(_per_iteration([x["short"]["train_s"] for x in runs],
                                                                   [x["long"]["train_s"] for x in runs],
                                                                   n_short, n_long), 3)
            row["tomotopy_ns_per_token"] = round(row["tomotopy_per_iteration_s"] / tokens * 1e9, 1)
        rows.append(row)
    lo, hi = rows[0], rows[-1]
    growth = {"rows": rows, "strads_growth": round(hi["strads_per_iteration_s"] / lo["strads_per_iteration_s"], 3),
              "target": target_growth, "process_limit_mib": limit_mib}
    if "tomotopy_per_iteration_s" in lo and "tomotopy_per_iteration_s" in hi:
        growth["tomotopy_growth"] = round(hi["tomotopy_per_iteration_s"] / lo["tomotopy_per_iteration_s"], 3)
    r["growth"] = growth
    print(f"time per token, V = {r['size']['vocab']:,}, {tokens:,} tokens (per iteration = (long - short fit) / "
          f"iterations, medians):")
    roles = ["python driver", "JVM driver", "shard", "python worker"]
    print("| K | StradsLDA sampler | StradsLDA s/iteration | ns/token | tomotopy s/iteration | ns/token | "
          + " | ".join(f"{x} peak MiB" for x in roles) + " |")
    print("|---:|---|---:|---:|---:|---:|" + "---:|" * len(roles))
    for row in rows:
        print(f"| {row['k']:,} | {row['sampler']} | {row['strads_per_iteration_s']:.2f} | {row['strads_ns_per_token']} | "
              f"{row.get('tomotopy_per_iteration_s', '—')} | {row.get('tomotopy_ns_per_token', '—')} | "
              + " | ".join(f"{row['peak_mib'].get(x, '—'):,}" for x in roles) + " |")
        if "tomotopy_skipped" in row:
            print(f"  tomotopy at K = {row['k']:,}: not run: {row['tomotopy_skipped']}")
    grew_ok = growth["strads_growth"] <= target_growth
    biggest = max(max(row["peak_mib"].values(), default=0) for row in rows)
    memory_ok = biggest <= limit_mib
    growth["largest_process_mib"] = biggest
    print(f"K {lo['k']:,} -> {hi['k']:,}: StradsLDA's time per token grew {growth['strads_growth']}x (target <= "
          f"{target_growth}x: {'met' if grew_ok else 'NOT met'})"
          + (f", tomotopy's {growth['tomotopy_growth']}x" if "tomotopy_growth" in growth else ""))
    print(f"largest pystrads process: {biggest:,} MiB (target <= {limit_mib:,} MiB: {'met' if memory_ok else 'NOT met'})")
    ok = grew_ok and memory_ok
    if tt and "error" in tt:
        print(f"tomotopy FAILED: {tt['error'][-800:]}")
    return ok


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--case", choices=["lda", "lda-peer", "lda-k", "lda-samplers", "mf", "both", "all"],
                   default="both",
                   help="both = lda and mf; all = lda, lda-peer, lda-k and mf")
    p.add_argument("--quick", action="store_true", help="tiny sizes (checks the job, not the claim)")
    p.add_argument("--lda-vocab", type=int, default=1_000_000)
    p.add_argument("--lda-k", type=int, default=1000)
    p.add_argument("--lda-tokens", type=int, default=10_000_000)
    p.add_argument("--doc-len", type=int, default=200)
    p.add_argument("--peer-vocab", type=int, default=1_000_000)
    p.add_argument("--peer-k", type=int, default=1000)
    p.add_argument("--peer-tokens", type=int, default=3_000_000)
    p.add_argument("--peer-short", type=int, default=3)
    p.add_argument("--peer-long", type=int, default=9)
    p.add_argument("--k-vocab", type=int, default=100_000, help="lda-k: V")
    p.add_argument("--k-list", type=int, nargs="+", default=[1000, 10_000], help="lda-k: the values of K")
    p.add_argument("--k-growth-target", type=float, default=1.5,
                   help="lda-k: the most StradsLDA's time per token may grow from the first K to the last")
    p.add_argument("--k-process-limit-mib", type=int, default=4096,
                   help="lda-k: the most any pystrads process (driver, shard, worker) may peak at, MiB")
    p.add_argument("--samplers", nargs="+", default=["fplus", "alias"], help="lda-samplers: the samplers raced")
    p.add_argument("--sampler-iters", type=int, default=10, help="lda-samplers: iterations of each fit")
    p.add_argument("--peer-sampler", default="auto", help="StradsLDA's sampler in lda-peer (default: auto)")
    p.add_argument("--peer-workers", type=int, default=2,
                   help="StradsLDA's numWorkers in lda-peer, lda-k and lda-samplers (0: unset, the default shape: one worker "
                        "an executor computing with its cores)")
    p.add_argument("--skip", nargs="*", default=[], help="peers to leave out (tomotopy)")
    p.add_argument("--budget-s", type=float, default=0.0, help=argparse.SUPPRESS)  # lda-peer: tomotopy's fit time
    p.add_argument("--repeats", type=int, default=1, help="lda-peer: short and long fits of each system (medians)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark setting for the measured session (e.g. spark.pystrads.shard.mallocRetainBytes=0)")
    p.add_argument("--mf-users", type=int, default=2_000_000)
    p.add_argument("--mf-items", type=int, default=20_000)
    p.add_argument("--mf-rank", type=int, default=100)
    p.add_argument("--mf-per-user", type=int, default=10)
    p.add_argument("--sample-users", type=int, default=10_000)
    p.add_argument("--out", default="out/bench_scale.json")
    p.add_argument("--child", choices=["lda", "lda-peer", "lda-k", "lda-samplers", "tomotopy", "tomotopy-k", "mf"], default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.lda_vocab, args.lda_k, args.lda_tokens = 20_000, 50, 200_000
        args.mf_users, args.mf_items, args.mf_rank, args.sample_users = 20_000, 500, 10, 500
        args.peer_vocab, args.peer_k, args.peer_tokens = 20_000, 100, 200_000
        args.k_vocab, args.k_list = 20_000, [50, 500]
    if args.child:
        args.case = args.child
        result = tomotopy_peer(args) if args.child.startswith("tomotopy") else child(args)
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    args.passthrough = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
                        if k in ("lda_vocab", "lda_k", "lda_tokens", "doc_len", "mf_users", "mf_items", "mf_rank",
                                 "mf_per_user", "sample_users", "peer_vocab", "peer_k", "peer_tokens", "peer_short",
                                 "peer_long", "peer_sampler", "peer_workers", "repeats", "k_vocab", "sampler_iters")] \
        + [f"--conf={kv}" for kv in args.conf] + ["--k-list", *map(str, args.k_list), "--samplers", *args.samplers]
    results, ok = [], True
    cases = {"both": ["lda", "mf"], "all": ["lda", "lda-peer", "lda-k", "mf"]}.get(args.case, [args.case])
    for case in cases:
        r = run_case(args, case)
        ok = print_report(r, args) and ok
        results.append(r)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        given = list(argv if argv is not None else sys.argv[1:])
        shown = [a for i, a in enumerate(given) if not a.startswith("--out") and (i == 0 or given[i - 1] != "--out")]
        json.dump({"quick": args.quick, "command": "python3 jobs/bench_scale.py " + " ".join(shown),
            "date": time.strftime("%Y-%m-%d"), "results": results}, fh, indent=2)
    print(f"\nwrote {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
