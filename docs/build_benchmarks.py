"""Writes the benchmark tables of docs/benchmarks.md from the benchmark jobs' JSON output.

Every table of the page is generated. It sits between two markers::

    <!-- bench-table: lda_reuters -->
    Command: `python3 jobs/bench_lda.py ...` · machine: ... · run of 2026-11-25 · data: ...

    | system | ... |
    <!-- /bench-table -->

and is rendered, with the caption line above it, from ``docs/bench-data/<json>.json``: a copy
of the JSON file the named command wrote (its ``--out``).  :data:`TABLES` maps each marker to
its renderer and to what the caption needs that the JSON may not hold: the command, the date
of the run and the machine.  What the JSON holds wins (``command``, ``date``, ``machine``), so
a job that records them needs nothing here.  To refresh a table: run its command, copy its
JSON over the one in docs/bench-data/, set the run's date (and command) in :data:`TABLES` if
the JSON lacks them, then

    python docs/build_benchmarks.py            # rewrite the tables in docs/benchmarks.md
    python docs/build_benchmarks.py --check    # exit 1 if a table differs from its JSON

``tests/test_docs.py`` runs the check, and fails on a table outside the markers.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Callable, NamedTuple, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "benchmarks.md")
DATA = os.path.join(ROOT, "docs", "bench-data")
MARKED = re.compile(r"(<!-- bench-table: (\S+) -->\n)(.*?)(<!-- /bench-table -->)", re.S)
#: the machine of a run whose JSON does not describe it
DEVELOPMENT_MACHINE = "2 cores / 24 GiB development machine"


def _f(x, digits=1):
    return f"{x:.{digits}f}"


def _sig(x, digits=3):
    """``digits`` significant digits, trailing zeros kept (61.0, 0.152, 7.59)."""
    if x == 0:
        return "0"
    from math import floor, log10

    decimals = max(0, digits - 1 - floor(log10(abs(x))))
    return f"{x:.{decimals}f}"


def _exp(x):
    """Two significant digits, short exponent: 2.2e-8."""
    if not x:
        return "0"
    mantissa, exponent = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _mtok(x):
    return f"{x / 1e6:.1f} M" if x >= 1e6 else f"{x / 1e6:.2f} M"


# -- LDA (jobs/bench_lda.py) -------------------------------------------------------------------

LDA_NAMES = {
    "pystrads default": "pystrads, a default session (`local[2]`, no settings)",
    "pystrads 1 worker x 2 threads": "pystrads, 1 worker × 2 threads",
    "pystrads 2 workers": "pystrads, 2 workers × 1 thread",
    "pystrads 1 worker": "pystrads, 1 worker × 1 thread",
    "tomotopy 2 threads": "tomotopy 0.14 (C++), 2 threads",
    "pystrads 2 workers, learned alpha": "pystrads, 2 workers, learned α",
    "tomotopy 2 threads, learned alpha": "tomotopy, 2 threads, learned α",
}


def lda_table(data, systems=None):
    """``systems``: the rows to show (the job's names), else every row."""
    rows = [r for r in data["table"] if systems is None or (r["system"] in systems and not r.get("ladder"))]
    out = ["| system | iterations | runs | prep s | train s | wall s | tokens/s (wall) | held-out perplexity |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    ladder = [r for r in rows if r.get("ladder")]
    for i, r in enumerate(r for r in rows if not r.get("ladder")):
        name = LDA_NAMES.get(r["system"], r["system"])
        prep = "inside fit" if r["prep_s"] is None else _f(r["prep_s"])
        perplexity = _f(r["heldout_perplexity"])
        if r.get("heldout_perplexity_raw_counts") is not None:
            perplexity += f" (raw counts: {_f(r['heldout_perplexity_raw_counts'])})"
        bold = i == 0 and r["system"].startswith("pystrads")
        out.append(f"| {'**' + name + '**' if bold else name} | {r['iterations']} | {r['runs']} | {prep} | "
                   f"{_f(r['train_s'])} | {_f(r['wall_s'])} | {_mtok(r['tokens_per_s'])} | {perplexity} |")
        if i == 1 and ladder:  # the ladder of the first system, after its two full fits (as the job prints)
            def join(key, fmt=_f):
                return " / ".join(fmt(x[key]) for x in ladder)
            out.append(f"| {LDA_NAMES.get(ladder[0]['system'], ladder[0]['system'])} (ladder) | "
                       f"{' / '.join(str(x['iterations']) for x in ladder)} | {ladder[0]['runs']} | "
                       f"{join('prep_s')} | {join('train_s')} | {join('wall_s')} | | {join('heldout_perplexity')} |")
    return out


def lda_shapes_table(data):
    """A default session's StradsLDA against the explicit shapes and tomotopy, one run."""
    out = lda_table(data, {"pystrads default", "pystrads 1 worker x 2 threads", "pystrads 2 workers",
                           "pystrads 1 worker", "tomotopy 2 threads"})
    s, default = data.get("summary", {}), next((r for r in data["table"] if r["system"] == "pystrads default"), None)
    if default is not None and s.get("default_vs_best_shape_wall") is not None:
        out += ["", f"The default session ran {default['workers']} worker × {default['threads']} threads: "
                f"{s['default_vs_best_shape_wall']:.3f}× the wall time of the fastest explicit shape "
                f"({LDA_NAMES.get(s['best_explicit_shape'], s['best_explicit_shape'])}); "
                f"{s['default_throughput_vs_tomotopy']:.2f}× tomotopy's speed, held-out perplexity "
                f"{100 * s['default_perplexity_vs_tomotopy']:+.2f} % against tomotopy's."]
    return out


def lda_mllib_table(data):
    """MLlib's two LDA optimizers, with tomotopy from the same run as the yardstick."""
    return lda_table(data, {"tomotopy 2 threads", "MLlib online", "MLlib EM"})


def lda_learned_alpha_table(data):
    """Fixed against learned α, 2 workers / 2 threads, from one run."""
    return lda_table(data, {"pystrads 2 workers", "tomotopy 2 threads", "pystrads 2 workers, learned alpha",
                            "tomotopy 2 threads, learned alpha"})


# -- Lasso (jobs/bench_lasso.py) -----------------------------------------------------------------

def lasso_table(data):
    (problem,) = data["problems"].values()
    runs = problem["runs"]

    def name(system, run):
        width = f"; L = {run['width']}" if run.get("width") and "(L = " not in system else ""
        if system == "pystrads StradsLasso (defaults)":
            return f"**pystrads `StradsLasso` (defaults{width})**"
        if system.startswith("pystrads StradsLogisticRegression"):
            return f"**pystrads `StradsLogisticRegression` (defaults, `tol=1e-9`{width})**"
        if system.startswith("pystrads") and "rounds only" in system:
            return system + (f" (`workingSetLimit=0`{width})" if "dynamic" in system
                             else f" ({run['iterations']} it.{width})")
        if system.startswith("MLlib"):
            return (f"MLlib `LinearRegression` (OWL-QN; `maxIter` {run['rung_to_1e-3']} / "
                    f"{run['rung_to_1e-6']})")
        peer, what = system.split(" ")[:2]
        return f"{peer} `{what}` (1 core, in memory{', liblinear' if 'liblinear' in system else ''})"

    order = sorted(runs, key=lambda s: (not s.startswith("pystrads"), not s.startswith("MLlib")))
    waits = any(r.get("schedule_s") is not None for r in runs.values())
    mllib = any(s.startswith("MLlib") for s in runs)
    skglm = any(r.get("ratio_to_skglm_1e-6") is not None for r in runs.values())
    fixed = problem.get("fixed_s")
    out = ["| system | s to 1e-3 | s to 1e-6 |" + (" × MLlib (1e-3) | × MLlib (1e-6) |" if mllib else "")
           + (" × skglm (1e-6) |" if skglm else "") + " final gap | non-zeros |"
           + (" schedule s (waited) |" if waits else ""),
           "|---|---:|---:|" + ("---:|---:|" if mllib else "") + ("---:|" if skglm else "") + "---:|---:|"
           + ("---:|" if waits else "")]
    for system in order:
        r = runs[system]
        cells = [name(system, r)]
        for gap in ("1e-3", "1e-6"):
            cells.append("not reached" if r[f"s_to_{gap}"] is None else _sig(r[f"s_to_{gap}"]))
        for key in ((["ratio_to_mllib_1e-3", "ratio_to_mllib_1e-6"] if mllib else [])
                    + (["ratio_to_skglm_1e-6"] if skglm else [])):
            ratio = r.get(key)
            cells.append("—" if ratio is None else ("1" if ratio == 1 else _sig(ratio, 2)))
        cells += [_exp(r["final_gap"]), str(r["nonzeros"])]
        if waits:
            cells.append("—" if r.get("schedule_s") is None else
                         f"{_f(r['schedule_s'], 2)} ({_f(r['schedule_wait_s'], 2)})")
        out.append("| " + " | ".join(cells) + " |")
    if fixed is not None:
        out += ["", f"pystrads' fixed cost, the default fit with `maxIter=0` (the input scan, the shards, the "
                f"workers' launch and load, the init step, reading the model back): **{_sig(fixed)} s**."]
    return out


# -- runtime (jobs/bench_runtime.py) ------------------------------------------------------------

def runtime_every_round_table(data):
    """``every_round``: ms per one-round step and where they go; ``rounds``: an empty program."""
    # pystrads' one runtime; a "steps" row (a job per step) is a removed runtime's, kept in older JSON
    rows = [r for r in data["every_round"] if r.get("runtime") != "steps"]
    short, long = rows[0]["differenced_rounds"]
    out = [f"| data per worker | rounds/s, whole fits ({long} − {short} rounds) | ms per round | cost vs 1 MiB "
           "| rounds/s in the steps | ms per step | schedule ms | push ms | clock waits ms | snapshot ms "
           "| RPCs and the rest ms |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        b = r["breakdown_ms"]
        rest = r["round_ms"] - b["schedule"] - b["compute"] - b["sync"] - b["snapshot"]
        out.append(f"| {r['block_mib']} MiB | **{_f(r['rounds_per_s_differenced'])}** | {_f(r['round_ms_differenced'], 2)} | "
                   f"{_f(r['round_ms_differenced'] / rows[0]['round_ms_differenced'], 2)}× | {_f(r['rounds_per_s'])} | "
                   f"{_f(r['round_ms'], 2)} | {_f(b['schedule'], 2)} | {_f(b['compute'], 2)} | "
                   f"{_f(b['sync'], 2)} | {_f(b['snapshot'], 2)} | {_f(rest, 2)} |")
    e = data.get("rounds")
    if e:
        out += ["", f"An empty program, U = {e['workers']}, {e['rounds']:,} rounds in steps of "
                f"{e['rounds_per_step']}: **{e['rounds_per_s']:,.0f} rounds/s** over the whole fit (from the driver's "
                f"`fit()` call to its result), {e['rounds_per_s_in_jobs']:,.0f} over the steps, "
                f"{e['rounds_per_s_inside_steps']:,.0f} inside the workers' rounds."]
    return out


def runtime_throughput_table(data):
    """The shard client against raw ``pyarrow.flight``, GB/s."""
    out = ["| block | raw get | client `copy=False` | ratio | client `out=` | ratio | client new array | ratio "
           "| raw put, dropped | raw put, stored | client put | ratio to dropped | ratio to stored |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in data["throughput"]:
        cells = [f"{r['mib']} MiB", _f(r["raw_get_gbps"], 2), _f(r["client_get_view_gbps"], 2),
                 f"**{_f(r['get_view_ratio'], 2)}**", _f(r["client_get_out_gbps"], 2), _f(r["get_out_ratio"], 2),
                 _f(r["client_get_gbps"], 2), _f(r["get_ratio"], 2), _f(r["raw_put_gbps"], 2),
                 _f(r["raw_put_store_gbps"], 2), _f(r["client_put_gbps"], 2), f"**{_f(r['put_ratio'], 2)}**",
                 _f(r["put_store_ratio"], 2)]
        out.append("| " + " | ".join(cells) + " |")
    return out


# -- MF on MovieLens (jobs/bench_mf.py) ----------------------------------------------------------

MF_NAMES = {"pystrads": "**pystrads StradsMF (defaults: 1 worker × 2 threads)**",
            "pystrads numWorkers=2": "pystrads StradsMF, `numWorkers=2` (2 workers × 1 thread)",
            "pystrads sgd": "pystrads StradsMF, `algorithm=\"sgd\"`", "ALS": "MLlib ALS"}


def mf_table(data):
    out = ["| system | rank | fit time | × ALS | test RMSE | vs ALS |", "|---|---:|---:|---:|---:|---:|"]
    summary = data["summary"]
    for rank in sorted({r["rank"] for r in data["results"]}):
        als = summary[f"ALS_rank{rank}"]
        for key, row in summary.items():
            system, _, at = key.rpartition("_rank")
            if int(at) != rank:
                continue
            ours = system != "ALS"
            label = MF_NAMES.get(system, system)
            out.append(f"| {label} | {rank} | {_f(row['fit_s'], 2)} s | "
                       + (f"**{_f(row['fit_s'] / als['fit_s'], 2)}×** | " if ours else "| ")
                       + f"{row['test_rmse']:.4f} | "
                       + (f"{row['test_rmse'] - als['test_rmse']:+.4f} |".replace("-", "−") if ours else "|"))
    threads = data.get("threads_vs_workers")
    if threads:
        out += ["", f"The default shape (1 worker × 2 threads) against `numWorkers={data['workers']}` "
                f"({data['workers']} workers × 1 thread): "
                + "; ".join(f"rank {rank}: **{_f(t['time_ratio'], 2)}×** the time, test RMSE "
                            f"{t['rmse_difference']:+.4f}".replace("-", "−") for rank, t in threads.items()) + "."]
    rec = data.get("recommend")
    if rec:
        out += ["", f"recommendForAllUsers(10) at rank {rec['rank']}: pystrads {_f(rec['median_s']['pystrads'], 2)} s, "
                f"ALS {_f(rec['median_s']['ALS'], 2)} s (medians of {rec['repeats']}), **{_f(rec['ratio'], 2)}×**."]
    return out


MF_IMPLICIT_NAMES = {"pystrads": "**pystrads `StradsMF(implicitPrefs=True)`**", "ALS": "MLlib `ALS(implicitPrefs=True)`",
                     "implicit": "`implicit` 0.7 (CG, 2 threads)"}


def mf_implicit_table(data):
    out = ["| system | rank | α | fit time | × ALS | precision@10 | vs ALS | NDCG@10 | vs ALS |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    summary = data["summary"]
    configs = sorted({(r["rank"], r["alpha"]) for r in data["results"]})
    for rank, alpha in configs:
        als = summary[f"ALS_rank{rank}_alpha{alpha:g}"]
        for system, label in MF_IMPLICIT_NAMES.items():
            row = summary.get(f"{system}_rank{rank}_alpha{alpha:g}")
            if row is None:
                continue
            ours = system != "ALS"
            out.append(f"| {label} | {rank} | {alpha:g} | {_f(row['fit_s'], 2)} s | "
                       + (f"{_f(row['fit_s'] / als['fit_s'], 2)}× | " if ours else "| ")
                       + f"{row['precision@10']:.4f} | "
                       + (f"{row['precision@10'] - als['precision@10']:+.4f} | " if ours else "| ")
                       + f"{row['ndcg@10']:.4f} | "
                       + (f"{row['ndcg@10'] - als['ndcg@10']:+.4f} |" if ours else "|"))
    return out


def mf_implicit_iteration_table(data):
    """bench_mf.py --implicit --per-iteration: s per iteration from two fit lengths, against implicit."""
    out = ["| data | interactions (train) | system | s / iteration | × implicit | in the steps | "
           "fit of n₂ iterations | precision@10 | vs implicit |", "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    rows = data["results"]
    for r in rows:
        peer = next(p for p in rows if p["system"] == "implicit" and (p["dataset"], p["rank"]) == (r["dataset"], r["rank"]))
        ours = r["system"] == "pystrads"
        out.append(f"| {r['label']}, rank {r['rank']} | {r['train']:,} | "
                   + ("**pystrads `StradsMF`**" if ours else "`implicit` 0.7 (CG, 2 threads)")
                   + f" | {_f(r['per_iteration_s'], 3)} s | "
                   + (f"**{r['per_iteration_s'] / peer['per_iteration_s']:.2f}×** | " if ours else "1 | ")
                   + (f"{_f(r['steps_per_iteration_s'], 3)} s | " if r.get("steps_per_iteration_s") else "— | ")
                   + f"{_f(r['fit_s'], 2)} s | {r['precision@10']:.4f} | "
                   + (f"{r['precision@10'] - peer['precision@10']:+.4f} |" if ours else "|"))
    return out


# -- models of 10^9 parameters (jobs/bench_scale.py) ---------------------------------------------

def scale_table(data):
    roles = ["python driver", "JVM driver", "shard", "python worker"]
    out = ["| case | phase | seconds | Python driver peak MiB | JVM driver peak MiB | shard peak MiB | "
           "largest Python worker MiB |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in data["results"]:
        for phase, p in r["phases"].items():
            cells = [f"{p['peaks'][role]['max_mib']:,.0f}" if p["peaks"].get(role) else "—" for role in roles]
            out.append(f"| {r['case']} | {phase} | {p['seconds']} | " + " | ".join(cells) + " |")
    out += ["", "| case | model (int32 / float32) | Python driver before | peak growth | of the model |",
            "|---|---:|---:|---:|---:|"]
    for r in data["results"]:
        size = ", ".join(f"{k} {v:,}" for k, v in r["size"].items())
        out.append(f"| {r['case']} ({size}) | {r['model_bytes'] / 2**20:,.0f} MiB | "
                   f"{r['driver_rss_before'] / 2**20:,.0f} MiB | {r['driver_peak_rss_growth'] / 2**20:,.0f} MiB | "
                   f"**{r['driver_peak_rss_growth'] / r['model_bytes']:.1%}** |")
    for r in data["results"]:
        m = r.get("mf_shard")
        if not m:
            continue
        mib = 2 ** 20
        out += ["", "| MF shard in the fit | MiB |", "|---|---:|",
                f"| `item_factors` table (float64) | {m['tables_bytes'] / mib:,.0f} |",
                f"| users' factors the workers leave on it at the end (float64) | {m['users_factors_bytes'] / mib:,.0f} |",
                f"| **tables as stored** | **{m['stored_bytes'] / mib:,.0f}** |",
                f"| the workers' state snapshots of one step (two kept: the step before and the newest) | "
                f"{m['snapshot_generation_bytes'] / mib:,.0f} |",
                f"| blobs held at most (the shard's own account) | {m['peak_blob_bytes'] / mib:,.0f} |",
                f"| blobs held when the fit ended (the last snapshots and the users' factors) | "
                f"{m['blob_bytes_at_end'] / mib:,.0f} |",
                f"| **shard peak** (sampled; its own VmHWM {m['peak_rss_bytes'] / mib:,.0f}) | "
                f"**{m['peak_bytes'] / mib:,.0f}** |",
                f"| bound: 3 × tables as stored + 500 MiB | {m['bound_bytes'] / mib:,.0f} |"]
    return out


def _shape(timings) -> str:
    """A fit's shape from its one-off timings' ``workers`` and ``threads`` (2 workers where older
    JSON does not say)."""
    workers, threads = int(timings.get("workers", 2)), int(timings.get("threads", 1))
    return f"{workers} workers" if threads == 1 else f"{workers} worker{'s' if workers > 1 else ''} × {threads} threads"


def lda_peer_table(data):
    """jobs/bench_scale.py --case lda-peer: StradsLDA against tomotopy on one large sparse model."""
    r = data["results"][0]
    peer, size = r["peer"], r["size"]
    n_short, n_long = peer["iterations"]
    split = peer["strads_iteration_split"]
    out = [f"Corpus: Zipf(0.8), V = {size['vocab']:,}, K = {size['k']:,}, {size['tokens']:,} tokens; medians of "
           f"{peer['runs']} runs, each a {n_short}- and a {n_long}-iteration fit of each system "
           "(per iteration = their difference).", "",
           "| system | per iteration | whole fit | peak memory |", "|---|---:|---:|---:|",
           f"| StradsLDA, {_shape(r.get('timings', {}))} | {_f(peer['strads_per_iteration_s'], 2)} s | {_f(peer['strads_fit_s'])} s | shard "
           f"{peer['shard_peak_bytes'] / 2**20:,.0f} MiB |"]
    if "tomotopy_fit_s" in peer:
        out.append(f"| tomotopy, 2 threads | {_f(peer['tomotopy_per_iteration_s'], 2)} s | {_f(peer['tomotopy_fit_s'])} s "
                   f"(add_doc {_f(peer['tomotopy_add_doc_s'])} s) | {peer['tomotopy_peak_rss'] / 2**20:,.0f} MiB |")
        out.append(f"| **tomotopy ÷ StradsLDA** | **{peer['per_iteration_ratio']:.2f}** | **{peer['fit_ratio']:.2f}** | |")
    if "equal_time" in peer:
        e = peer["equal_time"]
        out += ["", f"In tomotopy's whole-fit time ({_f(e['budget_s'])} s), log p(w, z) per token of each system's "
                "state, both scored by pystrads' formula (V = the features' size):", "",
                "| system | iterations | time | log-likelihood per token |", "|---|---:|---:|---:|",
                f"| StradsLDA (log-likelihood computed in the fit, its time included) | {e['iterations']} | "
                f"{_f(e['fit_s'])} s | **{e['log_likelihood_per_token']:.4f}** |",
                f"| tomotopy | {e['tomotopy_iterations']} | {_f(e['budget_s'])} s | "
                f"{e['tomotopy_log_likelihood_per_token']:.4f} |"]
    stored = peer["word_topic_storage"]
    pairs = sum(w.get("pair_entries", 0) for w in stored)
    dense = sum(w.get("dense_rows", 0) for w in stored)
    held = sum(w.get("bytes", 0) for w in stored)
    one_off = peer["strads_one_off"]
    out += ["", f"The word-topic table held {peer['nonzeros']:,} non-zero counts in {held / 2**20:,.0f} MiB "
            f"({pairs:,} pair slots, {dense:,} dense rows; dense it is {r['model_bytes'] / 2**20:,.0f} MiB); the "
            f"shard's peak {peer['shard_peak_bytes'] / 2**20:,.0f} MiB against 500 MiB + 24 B × (non-zeros + V) = "
            f"{peer['shard_bound_bytes'] / 2**20:,.0f} MiB; the Python driver grew "
            f"{r['driver_peak_rss_growth'] / 2**20:,.0f} MiB. The long fit's time per iteration ("
            + ("its steps' sums over its iterations" if peer.get("split_per_iteration") else "medians of its steps")
            + "): "
            + ", ".join(f"{k} {_f(v, 2)} s" for k, v in split.items()) + " (compute and sync: mean per worker, "
            "sample: summed over the workers). One-off costs of the long fit: "
            + ", ".join(f"{k} {_f(v)} s" for k, v in sorted(one_off.items())
                        if k.endswith("_s") and k != "total_s" and v >= 0.5) + "."]
    return out


def lda_k_table(data):
    """jobs/bench_scale.py --case lda-k: time per token at two K, StradsLDA and tomotopy (and, where
    the run sampled them, each pystrads role's largest process at each K)."""
    r = data["results"][0]
    g, size = r["growth"], r["size"]
    roles = ["python driver", "JVM driver", "shard", "python worker"]
    peaks = all("peak_mib" in row for row in g["rows"])
    out = [f"Corpus: Zipf(0.8), V = {size['vocab']:,}, {size['tokens']:,} tokens; per iteration = the difference of a "
           "short and a long fit, divided by their difference in iterations"
           + ("; peaks: the largest process of each role over that K's fits (MiB)." if peaks else "."), "",
           "| K | StradsLDA's sampler (auto) | StradsLDA per iteration | ns per token | tomotopy per iteration "
           "| ns per token |" + ("".join(f" {x} peak |" for x in roles) if peaks else ""),
           "|---:|---|---:|---:|---:|---:|" + ("---:|" * len(roles) if peaks else "")]
    skipped = []
    for row in g["rows"]:
        tt = row.get("tomotopy_per_iteration_s")
        out.append(f"| {row['k']:,} | {row['sampler']} | {_f(row['strads_per_iteration_s'], 2)} s | "
                   f"{row['strads_ns_per_token']:,.0f} | " + (f"{_f(tt, 2)} s | {row['tomotopy_ns_per_token']:,.0f} |"
                                                            if tt is not None else "— | — |")
                   + ("".join(f" {row['peak_mib'].get(x, 0):,} |" for x in roles) if peaks else ""))
        if "tomotopy_skipped" in row:
            skipped.append(f"tomotopy at K = {row['k']:,} not run: {row['tomotopy_skipped']}.")
    lo, hi = g["rows"][0]["k"], g["rows"][-1]["k"]
    out.append(f"| **growth, K = {lo:,} → {hi:,}** | | **{g['strads_growth']:.2f}×** | | "
               + (f"**{g['tomotopy_growth']:.2f}×** | |" if "tomotopy_growth" in g else "— | |")
               + (" |" * len(roles) if peaks else ""))
    if skipped:
        out += [""] + skipped
    return out


def lda_samplers_table(data):
    """jobs/bench_scale.py --case lda-samplers: time to a log-likelihood level per sampler and K."""
    race = data["results"][0]["race"]
    out = ["| K | sampler | per iteration | iterations to the target | time to the target | × F+LDA's time |",
           "|---:|---|---:|---:|---:|---:|"]
    for x in race:
        hit = x["iterations_to_target"] is not None
        out.append(f"| {x['k']:,} | {x['sampler']} | {_f(x['seconds_per_iteration'], 2)} s | "
                   + (f"{x['iterations_to_target']} | {_f(x['seconds_to_target'])} s | " if hit else "not reached | — | ")
                   + (f"**{x['time_ratio']:.2f}**" if hit and x["sampler"] != race[0]["sampler"] else
                      ("1" if hit else "—")) + " |")
    return out


def lda_scaleout_table(data):
    """jobs/bench_lda_scaleout.py: throughput at U = 1, 2, 4."""
    out = ["| master | workers | runs | wall s | tokens/s (wall) | speed-up vs U = 1 | per worker | per core "
           "| sampler tokens/s per worker | sampling share of rounds |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in data["table"]:
        out.append(f"| `{r['master']}` | {r['workers']} | {r['runs']} | {_f(r['wall_s'])} | {_mtok(r['tokens_per_s'])} "
                   f"| {r['speedup']:.2f}× | {r['efficiency_per_worker']:.0%} | {r['efficiency_per_core']:.0%} "
                   f"| {_mtok(r['sampler_tokens_per_s_per_worker'] or 0)} | {r['sampling_share_of_rounds']:.0%} |")
    return out


def lda_priors_table(data):
    """jobs/bench_lda_priors.py: StradsLDA with a fixed and a learned topicConcentration."""
    out = ["| corpus | K | iterations | β | held-out perplexity | × fixed | fit time |", "|---|---:|---:|---|---:|---:|---:|"]
    for r in data["results"]:
        for variant in ("fixed", "learned"):
            m = r[variant]
            beta = f"{data['beta']} (fixed)" if variant == "fixed" else f"learned: {m['beta']:.4f}"
            ratio = f"**{r['perplexity_ratio']:.3f}×**" if variant == "learned" else ""
            out.append(f"| {r['corpus']} | {r['k']} | {r['iterations']} | {beta} | {m['heldout_perplexity']:.1f} | "
                       f"{ratio} | {_f(m['wall_s'])} s |")
    return out


SCORING_NAMES = {"linear": "StradsLassoModel", "logistic": "StradsLogisticRegressionModel", "mf": "StradsMFModel",
                 "lda": "StradsLDAModel"}


def scoring_table(data):
    """jobs/bench_scoring.py: transform of pystrads' models against MLlib's on the same rows."""
    out = ["| model | MLlib peer | rows | pystrads | MLlib | × MLlib |", "|---|---|---:|---:|---:|---:|"]
    for r in data["results"]:
        m = r["median_s"]
        out.append(f"| {SCORING_NAMES[r['case']]} | {r['peer']} | {r['rows']:,} | {_f(m['pystrads'], 2)} s | "
                   f"{_f(m['MLlib'], 2)} s | **{_f(r['ratio']['pystrads'], 2)}×** |")
    arrow = [r for r in data["results"] if r.get("arrow")]
    if arrow:
        out += ["", "The Arrow path (what scores where no JVM model can be made, under Spark Connect): "
                + "; ".join(f"{SCORING_NAMES[r['case']]} on {r['arrow']['rows']:,} rows "
                            f"{_f(r['arrow']['median_s']['pystrads (Arrow)'], 2)} s against MLlib's "
                            f"{_f(r['arrow']['median_s']['MLlib'], 2)} s (**{_f(r['arrow']['ratio'], 1)}×**)"
                            for r in arrow) + "."]
    return out


# -- the tables of the page -----------------------------------------------------------------------

class Table(NamedTuple):
    """One generated table: how to render its JSON, and the caption's facts the JSON may lack."""

    render: Callable[[dict], list]
    #: the command that wrote the JSON (used when the JSON has no ``command``)
    command: Optional[str] = None
    #: the day of the run, ISO (used when the JSON has no ``date``)
    date: Optional[str] = None
    #: ``docs/bench-data/<json>.json``; default: the marker's name
    json: Optional[str] = None


_LDA = 'python3 jobs/bench_lda.py {corpus}--repeats {repeats} --skip-em --skip-online --skip-learned --ladder ""'
_RUNTIME = "python3 jobs/bench_runtime.py --repeats 3"

def cv_table(data):
    """jobs/bench_cv.py: CrossValidator over StradsMF, parallelism 2 (one worker per fit) against 1."""
    med, runs = data["median_s"], data["seconds"]
    shape = data.get("default_shape") or "2: every slot"
    rows = [("sequential", "1", f"default ({shape})"), ("parallel", "2", "1")]
    out = ["| CrossValidator | parallelism | numWorkers per fit | median | runs | avgMetrics (RMSE) |",
           "|---|---:|---|---:|---|---|"]
    for name, parallelism, workers in rows:
        metrics = ", ".join(f"{m:.4f}" for m in data["avg_metrics"][name])
        out.append(f"| {name} | {parallelism} | {workers} | {_f(med[name], 2)} s | "
                   + ", ".join(f"{x:.2f}" for x in runs[name]) + f" s | {metrics} |")
    out.append(f"| **parallel ÷ sequential** | | | **{data['ratio']:.2f}** | | metrics equal to sequential fits "
               f"of the parallel settings: {'yes' if data['metrics_equal'] else 'no'} |")
    return out


def multinomial_table(data):
    """jobs/bench_multinomial.py: time to MLlib's converged multinomial objective."""
    prob, med, runs = data["problem"], data["median_s"], data["seconds"]
    conv, ours = data["mllib_converged"], data["pystrads"]
    out = ["| system | reaches MLlib's converged objective at | median time | runs | final objective |",
           "|---|---|---:|---|---:|",
           f"| MLlib `LogisticRegression` | iteration {data['mllib_iterations_to_target']} (converged after "
           f"{conv['iterations']}) | {_f(med['mllib'])} s | " + ", ".join(_f(x) for x in runs["mllib"])
           + f" s | {conv['objective']:.10f} |",
           f"| StradsLogisticRegression | iteration {ours['iteration']} ({ours['iterations']} run, stop: "
           f"{ours['stop']}) | {_f(med['pystrads'])} s | " + ", ".join(_f(x) for x in runs["pystrads"])
           + f" s | {ours['final_objective']:.10f} |",
           f"| **StradsLogisticRegression ÷ MLlib** | | **{data['ratio']:.2f}** | | |"]
    out.append("")
    out.append(f"Problem: {prob['rows']:,} rows × {prob['features']:,} features, {prob['nonzeros']:,} non-zeros, "
               f"{prob['classes']} classes; `regParam` {data['params']['regParam']}, `elasticNetParam` "
               f"{data['params']['elasticNetParam']}; target: MLlib's converged objective × (1 + 1e-6) = "
               f"{data['target']:.10f}; pystrads' model has {ours['nonzeros']:,} non-zero coefficients.")
    return out


def first_fit_table(data):
    """jobs/bench_first_fit.py: the first StradsLDA fit of a fresh process against a warm one."""
    med, phases, cold = data["median"], data["phases"], data["empty_kernel_cache"]
    names = {"scan_s": "scan (the input's Spark job)", "shard_start_s": "shards' start",
             "init_s": "init step (workers' start, imports, load, kernels)",
             "init_compute_s": "  of which init compute",
             "load_s": "  of which the workers' load", "read_model_s": "model read"}
    out = ["| | first fit | warm fit |", "|---|---:|---:|",
           f"| **whole fit** (median of {len(data['runs'])} processes) | **{_f(med['first_s'], 2)} s** | "
           f"**{_f(med['warm_s'], 2)} s** |"]
    for key, label in names.items():
        out.append(f"| {label} | {_f(phases['first_phases'][key], 2)} s | {_f(phases['warm_phases'][key], 2)} s |")
    cpu = data.get("cpu_s")
    if cpu:
        labels = {"jvm": "the Spark JVM", "python_workers": "the Python daemon and workers",
                  "shards": "the shards", "driver": "the driver (Python)"}
        first, warm = cpu["first_cpu_s"], cpu["warm_cpu_s"]
        out.append(f"| CPU seconds (all cores) | **{_f(sum(first.values()), 2)} s** | "
                   f"**{_f(sum(warm.values()), 2)} s** |")
        for key, label in labels.items():
            out.append(f"|   {label} | {_f(first[key], 2)} s | {_f(warm[key], 2)} s |")
    out.append(f"| first ÷ warm (target ≤ 1.5) | **{med['ratio']:.2f}** | |")
    n = data['problem']['iterations']
    out.append(f"| a warm fit's one-off cost, 2·t({n}) − t({2 * n}) (target ≤ 1 s) | | **{_f(med['one_off_s'], 2)} s** |")
    if "iteration_ms" in med:
        out.append(f"| an iteration of a warm fit, (t({2 * n}) − t({n})) / {n} (target ≤ 5 ms) | | "
                   f"**{_f(med['iteration_ms'], 2)} ms** |")
    alt = data.get("compared")
    if alt:
        setting = ", ".join(f"`{k}={v}`" for k, v in alt["conf"].items())
        m, ph = alt["median"], alt["phases"]
        out.append("")
        out.append(f"The same run, processes alternating with {setting} (medians of {len(alt['runs'])}): "
                   f"first fit {_f(m['first_s'], 2)} s (shards' start {_f(ph['first_phases']['shard_start_s'], 2)} s, "
                   f"init step {_f(ph['first_phases']['init_s'], 2)} s), warm fit {_f(m['warm_s'], 2)} s, "
                   f"first ÷ warm {m['ratio']:.2f}.")
    out.append("")
    out.append(f"A fresh clone's first run (empty numba cache, kernels compiling): first fit "
               f"{_f(cold['first_s'], 2)} s, warm fit {_f(cold['warm_s'], 2)} s. Problem: "
               f"{data['problem']['corpus']}, {data['problem']['docs']:,} documents, K = {data['problem']['k']}, "
               f"{data['problem']['iterations']} iterations, fixed α"
               + (f"; {data['problem']['case']}." if data['problem'].get('case') else "."))
    return out


#: every table of docs/benchmarks.md, by the name in its marker
TABLES = {
    "lda_reuters": Table(lda_shapes_table, _LDA.format(corpus="", repeats=3), "2026-11-29"),
    "lda_reuters_mllib": Table(lda_mllib_table, "python3 jobs/bench_lda.py --repeats 1 --em-repeats 1 --ladder 25,50",
                               "2026-11-24"),
    "lda_reuters_learned_alpha": Table(lda_learned_alpha_table,
                                       'python3 jobs/bench_lda.py --repeats 2 --skip-em --skip-online --ladder ""',
                                       "2026-11-24"),
    "lda_scaleout": Table(lda_scaleout_table, "python3 jobs/bench_lda_scaleout.py", "2026-11-25"),
    "lda_debian": Table(lda_table, _LDA.format(corpus="--corpus debian ", repeats=3), "2026-11-26"),
    "lda_debian_k1000": Table(lda_table, _LDA.format(corpus="--corpus debian -k 1000 --iters 50 ", repeats=1),
                              "2026-12-01"),
    "mf_movielens": Table(mf_table, "python3 jobs/bench_mf.py --repeats 3 --high-rank 0", "2026-12-01"),
    "mf_implicit": Table(mf_implicit_table, date="2026-11-24"),
    "mf_implicit_iteration": Table(mf_implicit_iteration_table),
    "lasso_strads": Table(lasso_table, "python3 jobs/bench_lasso.py --quick --repeats 3", "2026-11-30"),
    "lasso_reuters": Table(lasso_table, "python3 jobs/bench_lasso.py --problems reuters-earn --repeats 3",
                           "2026-11-30"),
    "lasso_dense": Table(lasso_table, "python3 jobs/bench_lasso.py --problems strads:20000x20000x200 --widths 128,2048 "
                         "--quick --repeats 1 --skip-mllib --skip-sklearn --skip-celer --skip-skglm", "2026-11-30"),
    "runtime_every_round": Table(runtime_every_round_table, _RUNTIME, "2026-11-24",
                                 json="runtime"),
    "runtime_throughput": Table(runtime_throughput_table, _RUNTIME, "2026-11-24",
                                json="runtime"),
    "scale": Table(scale_table, date="2026-11-24"),
    "lda_peer": Table(lda_peer_table),
    "lda_peer_default": Table(lda_peer_table),
    "lda_k": Table(lda_k_table),
    "lda_k_v1m": Table(lda_k_table),
    "lda_samplers": Table(lda_samplers_table),
    "lda_samplers_v1m": Table(lda_samplers_table),
    "scoring": Table(scoring_table),
    "lda_priors": Table(lda_priors_table),
    "cv": Table(cv_table),
    "multinomial": Table(multinomial_table),
    "first_fit": Table(first_fit_table),
    "first_fit_notebook": Table(first_fit_table),
}


def _machine(data) -> str:
    m = data.get("machine")
    if isinstance(m, dict) and (m.get("cpus") or m.get("cpu_count")):
        python = f", Python {m['python']}" if m.get("python") else ""
        return f"{m.get('cpus') or m.get('cpu_count')} CPUs{python}"
    if isinstance(m, str):
        return m
    if data.get("cores"):
        return f"{data['cores']} cores"
    return DEVELOPMENT_MACHINE


def caption(name: str) -> str:
    """The line above a table: the command, the machine and the date of its run, and its JSON."""
    table = TABLES[name]
    json_name = table.json or name
    data = _load(json_name)
    command = data.get("command") or table.command
    date = data.get("date") or table.date
    if not command or not date:
        raise ValueError(f"table {name!r}: neither docs/bench-data/{json_name}.json nor TABLES in {__file__} gives "
                         f"its {'command' if not command else 'date'}")
    return (f"Command: `{command}` · machine: {_machine(data)} · run of {date} · "
            f"data: [`bench-data/{json_name}.json`](bench-data/{json_name}.json)")


def _load(json_name: str) -> dict:
    with open(os.path.join(DATA, json_name + ".json"), encoding="utf-8") as fh:
        return json.load(fh)


def render(name: str) -> str:
    if name not in TABLES:
        raise ValueError(f"docs/benchmarks.md marks a table {name!r} that {__file__} cannot render")
    table = TABLES[name]
    return caption(name) + "\n\n" + "\n".join(table.render(_load(table.json or name))) + "\n"


def build(text: str) -> str:
    return MARKED.sub(lambda m: m.group(1) + render(m.group(2)) + m.group(4), text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if a table in docs/benchmarks.md is stale")
    args = parser.parse_args(argv)
    with open(PAGE, encoding="utf-8") as fh:
        current = fh.read()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _page import write_or_check

    return write_or_check(PAGE, build(current), args.check, "python docs/build_benchmarks.py (its tables differ "
                                                            "from docs/bench-data/)")


if __name__ == "__main__":
    sys.exit(main())
