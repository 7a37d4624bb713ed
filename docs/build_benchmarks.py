"""Writes the benchmark tables of docs/benchmarks.md from the benchmark jobs' JSON output.

A generated table sits between two markers in the page::

    <!-- bench-table: lda_reuters_resident -->
    | system | ... |
    <!-- /bench-table -->

and is rendered from ``docs/bench-data/<name>.json``, a copy of the JSON file the job
named above the table wrote (its ``--out``).  To refresh a table: run that command, copy
its JSON over the one in docs/bench-data/, then

    python docs/build_benchmarks.py            # rewrite the tables in docs/benchmarks.md
    python docs/build_benchmarks.py --check    # exit 1 if a table differs from its JSON

``tests/test_docs.py`` runs the check.  Tables whose run left no JSON behind are written
by hand in the page (it says which).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "benchmarks.md")
DATA = os.path.join(ROOT, "docs", "bench-data")
MARKED = re.compile(r"(<!-- bench-table: (\S+) -->\n)(.*?)(<!-- /bench-table -->)", re.S)


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
    "pystrads 2 workers": "pystrads, 2 workers",
    "pystrads 1 worker": "pystrads, 1 worker",
    "tomotopy 2 threads": "tomotopy 0.14 (C++), 2 threads",
    "pystrads 2 workers, learned alpha": "pystrads, 2 workers, learned α",
    "tomotopy 2 threads, learned alpha": "tomotopy, 2 threads, learned α",
}


def lda_table(data):
    rows = data["table"]
    out = ["| system | iterations | runs | prep s | train s | wall s | tokens/s (wall) | held-out perplexity |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    ladder = [r for r in rows if r.get("ladder")]
    for i, r in enumerate(r for r in rows if not r.get("ladder")):
        name = LDA_NAMES.get(r["system"], r["system"])
        prep = "inside fit" if r["prep_s"] is None else _f(r["prep_s"])
        perplexity = _f(r["heldout_perplexity"])
        if r.get("heldout_perplexity_raw_counts") is not None:
            perplexity += f" (raw counts: {_f(r['heldout_perplexity_raw_counts'])})"
        out.append(f"| {'**' + name + '**' if i == 0 else name} | {r['iterations']} | {r['runs']} | {prep} | "
                   f"{_f(r['train_s'])} | {_f(r['wall_s'])} | {_mtok(r['tokens_per_s'])} | {perplexity} |")
        if i == 1 and ladder:  # the ladder of the first system, after its two full fits (as the job prints)
            def join(key, fmt=_f):
                return " / ".join(fmt(x[key]) for x in ladder)
            out.append(f"| {LDA_NAMES.get(ladder[0]['system'], ladder[0]['system'])} (ladder) | "
                       f"{' / '.join(str(x['iterations']) for x in ladder)} | {ladder[0]['runs']} | "
                       f"{join('prep_s')} | {join('train_s')} | {join('wall_s')} | | {join('heldout_perplexity')} |")
    return out


# -- Lasso (jobs/bench_lasso.py) -----------------------------------------------------------------

def lasso_table(data):
    (problem,) = data["problems"].values()
    runs = problem["runs"]

    def name(system, run):
        if system == "pystrads StradsLasso (defaults)":
            return "**pystrads `StradsLasso` (defaults)**"
        if system.startswith("pystrads") and "rounds only" in system:
            return system + (" (`workingSetLimit=0`)" if "dynamic" in system else f" ({run['iterations']} it.)")
        if system.startswith("MLlib"):
            return (f"MLlib `LinearRegression` (OWL-QN; `maxIter` {run['rung_to_1e-3']} / "
                    f"{run['rung_to_1e-6']})")
        peer = system.split(" ")[0]
        return f"{peer} `Lasso` (1 core, in memory)"

    order = sorted(runs, key=lambda s: (not s.startswith("pystrads"), not s.startswith("MLlib")))
    out = ["| system | s to 1e-3 | s to 1e-6 | × MLlib (1e-3) | × MLlib (1e-6) | final gap | non-zeros |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for system in order:
        r = runs[system]
        cells = [name(system, r)]
        for gap in ("1e-3", "1e-6"):
            cells.append("not reached" if r[f"s_to_{gap}"] is None else _sig(r[f"s_to_{gap}"]))
        for gap in ("1e-3", "1e-6"):
            ratio = r.get(f"ratio_to_mllib_{gap}")
            cells.append("—" if ratio is None else ("1" if ratio == 1 else _sig(ratio, 2)))
        cells += [_exp(r["final_gap"]), str(r["nonzeros"])]
        out.append("| " + " | ".join(cells) + " |")
    return out


# -- runtime (jobs/bench_runtime.py) ------------------------------------------------------------

def runtime_every_round_table(data):
    labels = {"resident": "resident (default)", "steps": "job per step (`runtime.mode=steps`)"}
    out = ["| runtime | data per worker | rounds/s | ms per round | cost vs 1 MiB |",
           "|---|---:|---:|---:|---:|"]
    base = {}
    for r in data["every_round"]:
        base.setdefault(r["runtime"], r["round_ms"])
        ms = _f(r["round_ms"], 2 if r["round_ms"] < 10 else 1)
        out.append(f"| {labels.get(r['runtime'], r['runtime'])} | {r['block_mib']} MiB | {_f(r['rounds_per_s'])} | "
                   f"{ms} | {_f(r['round_ms'] / base[r['runtime']], 2)}× |")
    return out


# -- implicit MF (jobs/bench_mf.py --implicit) ---------------------------------------------------

# -- MF on MovieLens (jobs/bench_mf.py) ----------------------------------------------------------

MF_NAMES = {"pystrads": "**pystrads StradsMF (defaults)**", "pystrads sgd": "pystrads StradsMF, `algorithm=\"sgd\"`",
            "ALS": "MLlib ALS"}


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


RENDERERS = {
    "scale": scale_table,
    "mf_implicit": mf_implicit_table,
    "mf_movielens": mf_table,
    "lda_reuters": lda_table,
    "lda_reuters_resident": lda_table,
    "lda_reuters_current": lda_table,
    "lda_reuters_kernels": lda_table,
    "lda_debian_current": lda_table,
    "lda_debian_k1000": lda_table,
    "lda_reuters_lone_worker": lda_table,
    "lda_reuters_hold": lda_table,
    "lda_debian_hold": lda_table,
    "lda_debian_k1000_hold": lda_table,
    "lda_scaleout": lda_scaleout_table,
    "lasso_strads_resident": lasso_table,
    "lasso_strads_current": lasso_table,
    "lasso_strads_exchange": lasso_table,
    "lasso_strads_input": lasso_table,
    "lasso_strads_s19": lasso_table,
    "lasso_strads_s20": lasso_table,
    "lasso_strads_s21": lasso_table,
    "lasso_strads_s22": lasso_table,
    "runtime_every_round": runtime_every_round_table,
}


def render(name: str) -> str:
    if name not in RENDERERS:
        raise ValueError(f"docs/benchmarks.md marks a table {name!r} that {__file__} cannot render")
    with open(os.path.join(DATA, name + ".json"), encoding="utf-8") as fh:
        return "\n".join(RENDERERS[name](json.load(fh))) + "\n"


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
