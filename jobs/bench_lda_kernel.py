"""Measure the LDA sampling kernels: tokens/s/core per sampler, K and doc length.

A single-core kernel benchmark (no Spark): one worker's word-major token
array, swept in ``--blocks`` word blocks of equal token mass as in a STRADS
word rotation.  For each document-length regime (short ~50 tokens, long
~1000) and each K it

1. draws a synthetic corpus from an LDA model whose word marginal is Zipf,
2. initialises topics at random and runs ``--burn-in`` F+LDA sweeps so that
   documents have realistic (fewer) non-zero topics,
3. times one full sweep of every sampler from that same state, ``--runs``
   times, and reports the median (tokens per second on one core),
4. optionally (``--convergence-sweeps``) runs every sampler from the same
   random start and records log p(w, z) per sweep and the time taken.

Compile time is measured apart from sampling time: by default the kernels
are compiled into a fresh, empty numba cache directory (the first call is
then a real compile), and a child process then loads them from that cache
(what each new Spark Python worker pays).

Usage::

    python jobs/bench_lda_kernel.py --quick            # < 1 minute
    python jobs/bench_lda_kernel.py --out bench_lda_kernel.json
    python jobs/bench_lda_kernel.py --corpus reuters --topics 20 50 100 1000 --blocks 1
"""

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

REGIMES = {"short": 50, "long": 1000}

_CACHE_LOAD_SNIPPET = """
import sys, time, json
t0 = time.perf_counter()
import numpy as np
from pystrads.kernels import lda
from pystrads.kernels.random import new_state
t_import = time.perf_counter() - t0
out = {"import_s": t_import}
for name in sys.argv[1:]:
    args = {args}
    t0 = time.perf_counter()
    lda.SAMPLERS[name](*args)
    out[name] = time.perf_counter() - t0
print(json.dumps(out))
"""


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench_lda_kernel.json", help="JSON result path")
    parser.add_argument("--quick", action="store_true",
                        help="small corpus, 1 burn-in sweep, no convergence runs (< 1 min)")
    parser.add_argument("--tokens", type=int, default=None,
                        help="tokens per regime (default 200000; quick 40000)")
    parser.add_argument("--vocab", type=int, default=None,
                        help="vocabulary size V (default 20000; quick 5000)")
    parser.add_argument("--topics", type=int, nargs="+", default=[20, 100, 1000], help="values of K")
    parser.add_argument("--regimes", nargs="+", default=list(REGIMES),
                        help="document-length regimes: 'short' (~50), 'long' (~1000) or "
                             "'L<n>' for a mean length of n tokens")
    parser.add_argument("--corpus", choices=["synthetic", "reuters", "debian"], default="synthetic",
                        help="'reuters' / 'debian': the training documents of ../shared/data tokenised as "
                             "jobs/bench_lda.py does (one regime, named after the corpus; --tokens, --vocab "
                             "and --regimes do not apply; beta defaults to bench_lda.py's 0.1)")
    parser.add_argument("--samplers", nargs="+", default=None, help="default: all")
    parser.add_argument("--blocks", type=int, default=2, help="word blocks per sweep (U)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per cell (median)")
    parser.add_argument("--burn-in", type=int, default=None,
                        help="F+LDA sweeps before timing (default 10; quick 1)")
    parser.add_argument("--convergence-sweeps", type=int, default=None,
                        help="sweeps per sampler from a random start (default 15; quick 0 = skip)")
    parser.add_argument("--alpha", type=float, default=None, help="default 50 / K")
    parser.add_argument("--alpha-spread", type=float, default=0.0,
                        help="an asymmetric prior: alpha_t = alpha * exp(spread * N(0, 1)), rescaled to the "
                             "symmetric prior's sum (0 = symmetric)")
    parser.add_argument("--beta", type=float, default=None, help="default 0.01 (synthetic), 0.1 (a real corpus)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warm-cache", action="store_true",
                        help="use the normal numba cache instead of a fresh one "
                             "(compile column then shows cache-load time)")
    args = parser.parse_args(argv)
    if args.tokens is None:
        args.tokens = 40_000 if args.quick else 200_000
    if args.vocab is None:
        args.vocab = 5_000 if args.quick else 20_000
    if args.burn_in is None:
        args.burn_in = 1 if args.quick else 10
    if args.convergence_sweeps is None:
        args.convergence_sweeps = 0 if args.quick else 15
    if args.quick:
        args.runs = min(args.runs, 3)
    if args.beta is None:
        args.beta = 0.01 if args.corpus == "synthetic" else 0.1
    if args.corpus != "synthetic":
        args.regimes = [args.corpus]
    return args


def real_corpus(name):
    """The training documents of ``name`` ("reuters" or "debian") as bench_lda.py tokenises them:
    (token_word sorted, token_doc, n_docs, V).  Spark's English stop words need a JVM: a local
    session is started for them and stopped."""
    sys.path.insert(0, os.path.join(REPO_ROOT, "jobs"))
    from bench_lda import tokenize_corpus
    from pyspark.ml.feature import StopWordsRemover
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.master("local[1]").appName("stop-words").getOrCreate()
    stop = set(StopWordsRemover.loadDefaultStopWords("english"))
    spark.stop()
    vocab, train_ids, _ = tokenize_corpus(name, stop, False)
    token_word = np.concatenate([np.asarray(d, dtype=np.int64) for d in train_ids])
    token_doc = np.repeat(np.arange(len(train_ids)), [len(d) for d in train_ids])
    order = np.argsort(token_word, kind="stable")
    return token_word[order].astype(np.int32), token_doc[order].astype(np.int32), len(train_ids), len(vocab)


def make_corpus(n_tokens, mean_doc_len, vocab_size, seed, n_true_topics=50, zipf_exponent=1.07):
    """Tokens from an LDA model whose word marginal follows Zipf's law.

    Topic t is ``φ_t ∝ zipf ⊙ Gamma(0.3)`` noise (so the marginal stays
    Zipf), documents have ``θ_d ~ Dir(0.1)`` over 50 true topics and
    Poisson(mean_doc_len) lengths (at least 1).
    """
    rng = np.random.default_rng(seed)
    zipf = 1.0 / np.arange(1, vocab_size + 1) ** zipf_exponent
    phi = zipf * rng.gamma(0.3, size=(n_true_topics, vocab_size))
    phi /= phi.sum(axis=1, keepdims=True)
    lengths = []
    total = 0
    while total < n_tokens:
        length = max(1, int(rng.poisson(mean_doc_len)))
        length = min(length, n_tokens - total)
        lengths.append(length)
        total += length
    lengths = np.array(lengths)
    n_docs = lengths.size
    theta = rng.dirichlet(np.full(n_true_topics, 0.1), n_docs)
    token_doc = np.repeat(np.arange(n_docs), lengths)
    # Topic of each token: inverse-CDF per document.
    cdf = np.cumsum(theta, axis=1)
    u = rng.random(n_tokens)
    true_topic = np.minimum((u[:, None] > cdf[token_doc]).sum(axis=1), n_true_topics - 1)
    token_word = np.empty(n_tokens, dtype=np.int64)
    for t in range(n_true_topics):
        idx = np.flatnonzero(true_topic == t)
        token_word[idx] = rng.choice(vocab_size, size=idx.size, p=phi[t])
    order = np.argsort(token_word, kind="stable")
    return token_word[order].astype(np.int32), token_doc[order].astype(np.int32), n_docs


class WorkerState:
    """All arrays one worker holds, and a sweep over its word blocks."""

    def __init__(self, lda, token_word, token_doc, token_topic, n_docs, n_topics, vocab_size,
                 n_blocks):
        self.lda = lda
        self.token_word, self.token_doc, self.token_topic = token_word, token_doc, token_topic
        self.n_topics, self.vocab_size = n_topics, vocab_size
        self.word_topic = lda.count_word_topic(token_word, token_topic, 0, vocab_size, n_topics)
        self.topic_totals = lda.count_topic_totals(token_topic, n_topics)
        self.doc_ptr, self.doc_tokens = lda.build_doc_tokens(token_doc, n_docs)
        self.doc_counts = lda.DocCounts.from_tokens(token_topic, self.doc_ptr, self.doc_tokens, n_topics)
        # Word blocks of about equal token mass (the runtime's partitioning).
        cuts = np.arange(1, n_blocks) * token_word.size // n_blocks
        word_cuts = [0] + [int(token_word[c]) for c in cuts] + [vocab_size]
        self.word_bounds = sorted(set(word_cuts))
        self.tok_bounds = np.searchsorted(token_word, self.word_bounds)

    def copy(self, sampler=None):
        """A copy; for ``sampler`` the document counts in the layout the LDA program gives it
        (``lda.doc_counts_layout``)."""
        other = object.__new__(WorkerState)
        other.__dict__.update(self.__dict__)
        for name in ("token_topic", "word_topic", "topic_totals", "doc_counts"):
            setattr(other, name, getattr(self, name).copy())
        if sampler is not None:
            layout = self.lda.doc_counts_layout(sampler, self.doc_ptr.size - 1, self.n_topics)
            other.doc_counts = self.lda.DocCounts.from_tokens(other.token_topic, self.doc_ptr, self.doc_tokens,
                                                              self.n_topics, layout=layout)
        return other

    def sweep(self, kernel, alpha, beta, rng_state):
        for b in range(len(self.word_bounds) - 1):
            lo, hi = self.word_bounds[b], self.word_bounds[b + 1]
            kernel(self.token_word, self.token_doc, self.token_topic,
                   self.tok_bounds[b], self.tok_bounds[b + 1], lo, self.word_topic[lo:hi],
                   self.topic_totals, *self.doc_counts, self.doc_ptr, self.doc_tokens, alpha, beta, self.vocab_size,
                   rng_state)

    def mean_doc_nonzero(self):
        """Token-weighted mean number of non-zero topics of a token's document (K_d)."""
        nonzero = np.count_nonzero(self.doc_counts.to_dense(self.n_topics), axis=1)
        return float(nonzero[self.token_doc].mean())

    def log_likelihood(self, alpha, beta):
        return self.lda.joint_log_likelihood(self.word_topic, self.topic_totals, self.doc_counts,
                                             np.diff(self.doc_ptr), alpha, beta, self.vocab_size)


def time_to(run, target):
    """Seconds a convergence run needed to reach log-likelihood ``target`` (linear between sweeps)."""
    lls, secs = run["log_likelihood"], run["seconds"]
    for i in range(1, len(lls)):
        if lls[i] >= target:
            step = lls[i] - lls[i - 1]
            frac = 1.0 if step <= 0 else (target - lls[i - 1]) / step
            return secs[i - 1] + frac * (secs[i] - secs[i - 1])
    return float("inf")


def prior(alpha, n_topics, spread, seed):
    """The samplers' alpha vector: constant, or log-normally spread around ``alpha`` with the same sum."""
    if not spread:
        return np.full(n_topics, float(alpha))
    values = np.exp(spread * np.random.default_rng(seed).standard_normal(n_topics))
    return values * (alpha * n_topics / values.sum())


def tiny_args(lda, new_state):
    """A tiny problem for compile-time measurement."""
    token_word = np.array([0, 0, 1, 2], np.int32)
    token_doc = np.array([0, 1, 0, 1], np.int32)
    token_topic = np.array([0, 1, 2, 1], np.int32)
    word_topic = lda.count_word_topic(token_word, token_topic, 0, 3, 3)
    doc_ptr, doc_tokens = lda.build_doc_tokens(token_doc, 2)
    doc_counts = lda.DocCounts.from_tokens(token_topic, doc_ptr, doc_tokens, 3)
    return (token_word, token_doc, token_topic, 0, 4, 0, word_topic,
            lda.count_topic_totals(token_topic, 3), *doc_counts, doc_ptr, doc_tokens, np.full(3, 0.1), 0.01, 3,
            new_state(0))


def measure_compile(lda, new_state, samplers):
    """Seconds of the first call (compile, or cache load) minus a warm call."""
    result = {}
    t0 = time.perf_counter()
    tiny_args(lda, new_state)
    lda.joint_log_likelihood(np.zeros((1, 3), np.int32), np.zeros(3, np.int64),
                             np.zeros((1, 3), np.int32), np.zeros(1, np.int64), 0.1, 0.1, 3)
    result["helpers"] = time.perf_counter() - t0
    for name in samplers:
        kernel = lda.SAMPLERS[name]
        t0 = time.perf_counter()
        kernel(*tiny_args(lda, new_state))
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        kernel(*tiny_args(lda, new_state))
        result[name] = first - (time.perf_counter() - t0)
    return result


def measure_cache_load(samplers):
    """Per-sampler first-call time in a fresh process that finds the cache filled."""
    snippet = _CACHE_LOAD_SNIPPET.replace(
        "{args}", "(np.array([0,0,1,2],np.int32), np.array([0,1,0,1],np.int32), "
        "np.array([0,1,2,1],np.int32), 0, 4, 0, np.array([[1,1,0],[0,0,1],[0,1,0]],np.int32), "
        "np.array([1,2,1],np.int64), np.array([0,7,14],np.int64), "
        "np.array([3,1,0,1,2,0,2,3,0,2,0,1,1,0],np.int32), "
        "np.array([0,2,4],np.int64), np.array([0,2,1,3],np.int32), "
        "np.full(3, 0.1), 0.01, 3, new_state(0))")
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", snippet, *samplers], env=env,
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1:]}
    return json.loads(proc.stdout)


def main(argv=None):
    args = parse_args(argv)
    cache_dir = None
    if not args.warm_cache:
        cache_dir = tempfile.mkdtemp(prefix="pystrads-numba-")
        os.environ["NUMBA_CACHE_DIR"] = cache_dir  # before numba is imported
    if os.path.isdir(os.path.join(REPO_ROOT, "pystrads")):
        sys.path.insert(0, REPO_ROOT)  # measure this checkout, not an installed copy
    from pystrads.kernels import lda
    from pystrads.kernels.random import new_state

    samplers = args.samplers or list(lda.SAMPLERS)
    started = time.perf_counter()
    load_before = os.getloadavg()
    compile_s = measure_compile(lda, new_state, samplers)
    cache_load_s = measure_cache_load(samplers) if cache_dir else {}

    rows, convergence = [], []
    for regime in args.regimes:
        if args.corpus == "synthetic":
            mean_len = REGIMES[regime] if regime in REGIMES else int(regime.lstrip("L"))
            token_word, token_doc, n_docs = make_corpus(args.tokens, mean_len, args.vocab,
                                                        args.seed + mean_len)
            vocab_size = args.vocab
        else:
            token_word, token_doc, n_docs, vocab_size = real_corpus(args.corpus)
        n = token_word.size
        for n_topics in args.topics:
            alpha = prior(args.alpha if args.alpha is not None else 50.0 / n_topics, n_topics, args.alpha_spread,
                          args.seed)
            beta = args.beta
            rng_state = new_state(args.seed, stream=n_topics)
            init_topic = lda.random_topics(n, n_topics, rng_state)
            start = WorkerState(lda, token_word, token_doc, init_topic.copy(), n_docs, n_topics,
                                vocab_size, args.blocks)
            burned = start.copy()
            for _ in range(args.burn_in):
                burned.sweep(lda.sample_block_fplus, alpha, beta, rng_state)
            kd = burned.mean_doc_nonzero()
            dense_rate = None
            for name in samplers:
                kernel = lda.SAMPLERS[name]
                times = []
                for run in range(args.runs):
                    state = burned.copy(name)
                    run_rng = new_state(args.seed + run, stream=1)
                    t0 = time.perf_counter()
                    state.sweep(kernel, alpha, beta, run_rng)
                    times.append(time.perf_counter() - t0)
                sweep_s = float(np.median(times))
                rate = n / sweep_s
                if name == "dense":
                    dense_rate = rate
                rows.append({
                    "regime": regime, "mean_doc_len": float(n / n_docs), "K": n_topics,
                    "sampler": name, "tokens": n, "sweep_s": sweep_s, "sweep_s_runs": times,
                    "tokens_per_s": rate, "mean_doc_nonzero_topics": kd,
                    "speedup_vs_dense": None if dense_rate is None else rate / dense_rate,
                })
                print(f"{regime:5s} K={n_topics:5d} {name:6s} {rate / 1e6:8.3f} M tok/s "
                      f"(sweep {sweep_s:.3f} s, K_d {kd:.1f})", flush=True)
            for name in samplers if args.convergence_sweeps else []:
                state = start.copy(name)
                conv_rng = new_state(args.seed, stream=99)
                lls, elapsed = [state.log_likelihood(alpha, beta)], [0.0]
                for _ in range(args.convergence_sweeps):
                    t0 = time.perf_counter()
                    state.sweep(lda.SAMPLERS[name], alpha, beta, conv_rng)
                    elapsed.append(elapsed[-1] + time.perf_counter() - t0)
                    lls.append(state.log_likelihood(alpha, beta))
                convergence.append({"regime": regime, "K": n_topics, "sampler": name,
                                    "log_likelihood": lls, "seconds": elapsed})

    print()
    corpus = (f"V={args.vocab}, {args.tokens} tokens/regime" if args.corpus == "synthetic"
              else f"{args.corpus}: V={vocab_size}, {n} tokens")
    print(f"LDA kernel throughput, one core, median of {args.runs} sweeps after "
          f"{args.burn_in} F+LDA burn-in sweeps; {corpus}, "
          f"alpha=50/K{f' spread {args.alpha_spread}' if args.alpha_spread else ''}, beta={args.beta}, "
          f"U={args.blocks} blocks")
    header = f"{'regime':6s} {'K':>5s} {'K_d':>6s} " + " ".join(f"{s:>9s}" for s in samplers)
    print(header + "   (M tokens/s/core)")
    for regime in args.regimes:
        for n_topics in args.topics:
            cells = {r["sampler"]: r for r in rows if r["regime"] == regime and r["K"] == n_topics}
            kd = next(iter(cells.values()))["mean_doc_nonzero_topics"]
            print(f"{regime:6s} {n_topics:5d} {kd:6.1f} " + " ".join(
                f"{cells[s]['tokens_per_s'] / 1e6:9.3f}" for s in samplers))
    print()
    label = "compile" if cache_dir else "first call (warm cache)"
    print(f"{label} s: " + ", ".join(f"{k} {v:.2f}" for k, v in compile_s.items()))
    if cache_load_s:
        print("cache load in a new process s: " + ", ".join(
            f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in cache_load_s.items()))
    if convergence:
        print()
        print(f"log p(w,z) per token after {args.convergence_sweeps} sweeps from a random start "
              "(seconds)")
        for regime in args.regimes:
            for n_topics in args.topics:
                cells = [c for c in convergence if c["regime"] == regime and c["K"] == n_topics]
                n = args.tokens if args.corpus == "synthetic" else n
                print(f"{regime:6s} {n_topics:5d} " + " ".join(
                    f"{c['sampler']} {c['log_likelihood'][-1] / n:.3f} ({c['seconds'][-1]:.1f})"
                    for c in cells))
        print()
        print("seconds to the log-likelihood every sampler reached (the lowest final one)")
        for regime in args.regimes:
            for n_topics in args.topics:
                cells = [c for c in convergence if c["regime"] == regime and c["K"] == n_topics]
                target = min(c["log_likelihood"][-1] for c in cells)
                for c in cells:
                    c["seconds_to_common"] = time_to(c, target)
                    c["common_log_likelihood"] = target
                print(f"{regime:6s} {n_topics:5d} " + " ".join(
                    f"{c['sampler']} {c['seconds_to_common']:.2f}" for c in cells))

    result = {
        "benchmark": "lda_kernel",
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpu_count": os.cpu_count(), "python": platform.python_version(),
                    "numpy": np.__version__, "numba": __import__("numba").__version__},
        "params": {k: v for k, v in vars(args).items() if k != "out"},
        "load_average": {"start": load_before, "end": os.getloadavg()},
        "compile_s": compile_s, "compile_is_cold": cache_dir is not None,
        "cache_load_s": cache_load_s,
        "throughput": rows, "convergence": convergence,
        "wall_s": time.perf_counter() - started,
    }
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)
    print(f"\nwrote {args.out} ({result['wall_s']:.1f} s)")
    if cache_dir:
        shutil.rmtree(cache_dir, ignore_errors=True)
    return result


if __name__ == "__main__":
    main()
