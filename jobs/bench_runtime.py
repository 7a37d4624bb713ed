"""Runtime benchmark: a scheduler deciding every round, empty rounds per second, and
shard-client throughput vs raw Arrow Flight.

    python jobs/bench_runtime.py [--repeats 5] [--out out/bench_runtime.json]

0. Rounds/s when ``schedule`` returns one round at a time and reads a table first
   (:class:`~pystrads.programs.examples.EveryRoundProgram`), with 1 MiB and 128 MiB
   of data per worker: from whole fits of 100 and 300 rounds, (t(300) - t(100)) / 200
   (everything a round costs), and from the steps' own times (posted to the commit point).
1. Rounds/s of :class:`~pystrads.programs.examples.EmptyProgram` at U = 2 on
   ``local[2]`` (steps of 500 rounds, the job's launch included), median of
   ``--repeats`` fits.
2. Get / put throughput of a row block of 1-64 MiB through the pystrads
   shard client (``TableHandle.read`` / ``write`` against a shard
   process) and through raw ``pyarrow.flight`` (a minimal server process that
   streams a prebuilt table / discards or stores what it receives),
   interleaved in the same run; each sample moves at least 256 MiB (a loop of
   calls for small blocks); median of ``--repeats`` samples.  Gets are timed
   three ways: ``copy=False`` (read-only, like the raw client's Arrow table),
   into a reused ``out=`` buffer, and into a new writable array.

Prints a table, writes JSON (and a PNG plot when matplotlib is installed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _bench import argv_of, record  # noqa: E402

WIDTH = 16  # float64 values per row: 128-byte rows


def raw_server() -> None:
    """A minimal Arrow Flight server: the baseline the shard client is held against."""
    import pyarrow as pa
    import pyarrow.flight as flight

    class Raw(flight.FlightServerBase):
        def __init__(self):
            super().__init__("grpc://127.0.0.1:0")
            self.tables = {}

        def do_get(self, context, ticket):
            rows = int(ticket.ticket.decode())
            if rows not in self.tables:
                flat = pa.array(np.random.default_rng(0).random(rows * WIDTH))
                self.tables[rows] = pa.table({"value": pa.FixedSizeListArray.from_arrays(flat, WIDTH)})
            return flight.RecordBatchStream(self.tables[rows])

        def do_put(self, context, descriptor, reader, writer):
            if descriptor.command != b"store":
                for _ in reader:  # the pure transport baseline: received and dropped
                    pass
                return
            # the minimal work of a parameter server: land the rows in a preallocated array
            pos = 0
            for chunk in reader:
                flat = chunk.data.column(0).flatten().to_numpy()
                key = ("buf", len(flat) * 8)
                buf = self.tables.get(key)
                if buf is None or len(buf) < pos + len(flat):
                    buf = self.tables[key] = np.empty(max(pos + len(flat), len(flat)))
                buf[pos:pos + len(flat)] = flat
                pos += len(flat)

    server = Raw()
    print(server.port, flush=True)
    server.serve()


def _start(cmd, env=None, info_file=None):
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
    if info_file:
        while not os.path.exists(info_file):
            if proc.poll() is not None:
                raise RuntimeError(f"{cmd} exited with {proc.returncode}")
            time.sleep(0.02)
        with open(info_file) as fh:
            return proc, json.load(fh)["port"]
    return proc, int(proc.stdout.readline())


def throughput(sizes_mib, repeats):
    import pyarrow as pa
    import pyarrow.flight as flight

    from pystrads.config import DEFAULTS
    from pystrads.ps.client import ShardGroup, ShardInfo
    from pystrads.ps.partition import TableLayout

    token = "bench-" + os.urandom(8).hex()
    info_file = f"/tmp/pystrads-bench-{os.getpid()}.json"
    env = dict(os.environ, PYSTRADS_SHARD_TOKEN=token)
    shard, shard_port = _start([sys.executable, "-m", "pystrads.ps.server", "--lease", "600",
                                "--info-file", info_file, "--malloc-retain", str(DEFAULTS["shard.mallocRetainBytes"])],
                               env, info_file)
    raw, raw_port = _start([sys.executable, os.path.abspath(__file__), "--raw-server"])
    os.remove(info_file)
    rows_out = []
    try:
        group = ShardGroup([ShardInfo("127.0.0.1", shard_port, shard.pid, "bench", "0")], token)
        raw_client = flight.FlightClient(f"grpc://127.0.0.1:{raw_port}")
        for mib in sizes_mib:
            rows = mib * 2 ** 20 // (WIDTH * 8)
            layout = TableLayout(f"bench/t{mib}", rows, WIDTH, "float64", (0, rows), (0,), WIDTH)
            group.client(0).action("create_table", name=layout.name, row_start=0, row_stop=rows, width=WIDTH)
            table = group.table(layout)
            block = np.random.default_rng(1).random((rows, WIDTH))
            flat = pa.array(block.reshape(-1))
            raw_table = pa.table({"value": pa.FixedSizeListArray.from_arrays(flat, WIDTH)})
            times = {k: [] for k in ("client_get", "client_get_view", "client_get_out", "raw_get",
                                     "client_put", "raw_put", "raw_put_store")}
            buffer = np.empty_like(block)
            table.write(range(0, len(block)), block)  # warm up both paths
            raw_client.do_get(flight.Ticket(str(rows).encode())).read_all()
            calls = max(1, 256 // mib)  # each sample moves >= 256 MiB, so small blocks are not all noise

            def timed(fn):
                t0 = time.perf_counter()
                for _ in range(calls):
                    out = fn()
                return (time.perf_counter() - t0) / calls, out

            def raw_get():
                return raw_client.do_get(flight.Ticket(str(rows).encode())).read_all()

            def raw_put(command=b"put"):
                writer, _ = raw_client.do_put(flight.FlightDescriptor.for_command(command), raw_table.schema)
                writer.write_table(raw_table)
                writer.close()

            for _ in range(repeats):  # interleaved, so drifting load hits every path alike
                seconds, got = timed(lambda: table.read(range(0, rows)))
                times["client_get"].append(seconds)
                seconds, view = timed(lambda: table.read(range(0, rows), copy=False))
                times["client_get_view"].append(seconds)
                times["client_get_out"].append(timed(lambda: table.read(range(0, rows), out=buffer))[0])
                times["raw_get"].append(timed(raw_get)[0])
                times["client_put"].append(timed(lambda: table.write(range(0, len(block)), block))[0])
                times["raw_put"].append(timed(raw_put)[0])
                times["raw_put_store"].append(timed(lambda: raw_put(b"store"))[0])
            assert np.array_equal(got, block) and np.array_equal(buffer, block) and np.array_equal(view, block)
            med = {k: float(np.median(v)) for k, v in times.items()}
            gbps = {k: block.nbytes / v / 1e9 for k, v in med.items()}
            rows_out.append({"mib": mib, **{f"{k}_gbps": round(v, 3) for k, v in gbps.items()},
                             "get_ratio": round(gbps["client_get"] / gbps["raw_get"], 3),
                             "get_view_ratio": round(gbps["client_get_view"] / gbps["raw_get"], 3),
                             "get_out_ratio": round(gbps["client_get_out"] / gbps["raw_get"], 3),
                             "put_ratio": round(gbps["client_put"] / gbps["raw_put"], 3),
                             "put_store_ratio": round(gbps["client_put"] / gbps["raw_put_store"], 3)})
            group.client(0).action("drop_tables", prefix=layout.name)
    finally:
        shard.kill()
        raw.kill()
    return rows_out


def empty_rounds(repeats, rounds=2000, per_step=500):
    """Rounds per second of a program that does nothing (U = 2, ``per_step`` rounds per step),
    counted three ways: ``rounds_per_s`` over the whole fit -- from the driver's call to the
    returned result, with shard set-up, the init step, the stats and metrics calls and the
    program's driver hooks; ``rounds_per_s_in_jobs`` over the steps' time only (posting each to
    the workers until its commit); and
    ``rounds_per_s_inside_steps`` over the workers' time in rounds."""
    from pystrads.engine import Engine
    from pystrads.programs.examples import EmptyProgram
    from pystrads.session import spark_session

    spark = spark_session("local[2]", "pystrads-bench-runtime", {"spark.ui.enabled": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    sc = spark.sparkContext
    whole, in_jobs, in_rounds = [], [], []
    with Engine(EmptyProgram(per_step, per_step), sc.parallelize(range(2), 2)).fit():
        pass  # warm-up: shard start, Python workers
    for _ in range(repeats):
        data = sc.parallelize(range(2), 2)
        t0 = time.perf_counter()
        res = Engine(EmptyProgram(rounds, per_step), data).fit()
        elapsed = time.perf_counter() - t0
        with res:
            steps = res.summary.rows
            done = sum(r["rounds"] for r in steps)
            whole.append(done / elapsed)
            in_jobs.append(done / sum(r["step_s"] for r in steps))
            in_rounds.append(done / sum(r["round_s"] for r in steps))
    spark.stop()
    return {"workers": 2, "rounds": rounds, "rounds_per_step": per_step,
            "rounds_per_s": float(np.median(whole)), "rounds_per_s_all": [round(r, 1) for r in whole],
            "rounds_per_s_in_jobs": float(np.median(in_jobs)),
            "rounds_per_s_inside_steps": float(np.median(in_rounds))}


def every_round(repeats, sizes_mib=(1, 128), rounds=None):
    """A scheduler deciding every round (:class:`~pystrads.programs.examples.EveryRoundProgram`:
    one round per step, the driver reads a table before each) at U = 2 on ``local[2]``, with a
    data block of each size per worker.  Per-round cost = the steps' wall time (schedule + step,
    from the driver) / rounds; every size gets one warm-up fit and ``repeats`` timed fits,
    median reported."""
    from pystrads.engine import Engine
    from pystrads.programs.examples import EveryRoundProgram
    from pystrads.session import spark_session

    rounds = rounds or 300
    short = rounds // 3
    spark = spark_session("local[2]", "pystrads-bench-every-round", {"spark.ui.enabled": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    sc = spark.sparkContext
    out = []

    def fit(n, mib):
        program = EveryRoundProgram(n, 64, mib << 20)
        t0 = time.perf_counter()
        with Engine(program, sc.parallelize(range(2), 2), config={"progress": "off"}).fit() as res:
            elapsed = time.perf_counter() - t0
            steps = res.summary.rows
            visits = res.read_table("score")[:, 0]
            assert visits.sum() == 2 * len(steps) == 2 * n, (visits.sum(), len(steps))
            return elapsed, steps

    for mib in sizes_mib:
        costs, whole, parts, long_s, short_s = [], [], [], [], []
        for rep in range(repeats + 1):  # the first fits warm up (shards, Python workers, data)
            elapsed, steps = fit(rounds, mib)
            t_short = fit(short, mib)[0]  # interleaved: a slow spell hits both lengths
            if rep:
                costs.append(sum(r["seconds"] for r in steps) / len(steps))
                whole.append(len(steps) / elapsed)
                long_s.append(elapsed)
                short_s.append(t_short)
                parts.append({k: float(np.mean([r.get(k, 0.0) for r in steps]))
                              for k in ("schedule_s", "compute_s", "sync_s", "snapshot_s", "seconds")})
        # everything a round costs -- the commit, the journal, the next step's opening included --
        # from two whole fits' lengths: (t(rounds) - t(rounds / 3)) / the rounds between
        differenced = (float(np.median(long_s)) - float(np.median(short_s))) / (rounds - short)
        out.append({"block_mib": mib, "rounds": rounds,
                    "round_ms": 1e3 * float(np.median(costs)), "rounds_per_s": 1.0 / float(np.median(costs)),
                    "rounds_per_s_whole_fit": float(np.median(whole)),
                    "differenced_rounds": [short, rounds], "round_ms_differenced": 1e3 * differenced,
                    "rounds_per_s_differenced": 1.0 / differenced,
                    "fit_s": {str(short): short_s, str(rounds): long_s},
                    "round_ms_all": [round(1e3 * c, 2) for c in costs],
                    # where a step's time goes (ms, median over fits of the per-step means): the
                    # driver's schedule (a table read), the workers' push, their waits on the round
                    # clocks, their state snapshots, and the rest (posting, next / enter / done
                    # calls, the commit)
                    "breakdown_ms": {k[:-2] if k.endswith("_s") else k:
                                     round(1e3 * float(np.median([p[k] for p in parts])), 3)
                                     for k in parts[0]} if parts else {}})
        print(f"  every-round schedule, {mib} MiB/worker: {out[-1]['rounds_per_s']:.1f} rounds/s "
              f"({out[-1]['round_ms']:.2f} ms/round) in the steps; {out[-1]['rounds_per_s_differenced']:.1f} "
              f"rounds/s ({out[-1]['round_ms_differenced']:.2f} ms/round) from whole fits of {short} and {rounds} "
              "rounds", flush=True)
    spark.stop()
    return out


def plot(result, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot (pip install 'pystrads[plot]')")
        return None
    sizes = [r["mib"] for r in result["throughput"]]
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, style in [("client_get_view", "o-"), ("client_get_out", "o:"), ("client_get", "o-."),
                       ("raw_get", "o--"),
                       ("client_put", "s-"), ("raw_put", "s--")]:
        ax.plot(sizes, [r[f"{key}_gbps"] for r in result["throughput"]], style, label=key.replace("_", " "))
    ax.set_xscale("log", base=2)
    ax.set_xlabel("block size (MiB)")
    ax.set_ylabel("GB/s (median)")
    ax.set_title(f"shard client vs raw pyarrow.flight; empty rounds/s = {result['rounds']['rounds_per_s']:.0f}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(description="pystrads runtime benchmark")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sizes", default="1,4,16,64", help="block sizes in MiB")
    parser.add_argument("--out", default="out/bench_runtime.json")
    parser.add_argument("--raw-server", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.raw_server:
        return raw_server()
    sizes = [int(s) for s in args.sizes.split(",")]
    result = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "platform": platform.platform()},
              "every_round": every_round(args.repeats),
              "throughput": throughput(sizes, args.repeats), "rounds": empty_rounds(args.repeats)}
    print()
    rows = {r["block_mib"]: r for r in result["every_round"]}
    print(f"Scheduler deciding every round (one round per step, a table read before each), U=2, local[2], "
          f"median of {args.repeats}:")
    print("| data per worker | rounds/s, whole fits differenced | ms/round | rounds/s in the steps | ms/round "
          "| cost vs 1 MiB |")
    print("|---:|---:|---:|---:|---:|---:|")
    for mib, r in sorted(rows.items()):
        base = rows.get(1)
        print(f"| {mib} MiB | {r['rounds_per_s_differenced']:.1f} | {r['round_ms_differenced']:.2f} "
              f"| {r['rounds_per_s']:.1f} | {r['round_ms']:.2f} "
              f"| {r['round_ms_differenced'] / base['round_ms_differenced']:.2f}x |" if base else "")
    for mib, r in sorted(rows.items()):
        b = r.get("breakdown_ms") or {}
        if b:
            rest = b["seconds"] - b["schedule"] - b["compute"] - b["sync"] - b["snapshot"]
            print(f"  {mib} MiB, ms per step: schedule {b['schedule']:.2f}, push {b['compute']:.2f}, "
                  f"clock waits {b['sync']:.2f}, snapshot {b['snapshot']:.2f}, other (RPCs, commit) {rest:.2f}")
    if 128 in rows and 1 in rows:
        result["every_round_ratio_128_vs_1"] = rows[128]["round_ms"] / rows[1]["round_ms"]
    print()
    r = result["rounds"]
    print(f"Empty program, U=2, local[2], {r['rounds']} rounds in steps of {r['rounds_per_step']} "
          f"(median of {args.repeats}):")
    print(f"  whole fit, driver's call to result: {r['rounds_per_s']:.0f} rounds/s")
    print(f"  steps only (posted to committed):   {r['rounds_per_s_in_jobs']:.0f} rounds/s")
    print(f"  inside steps (workers in rounds):   {r['rounds_per_s_inside_steps']:.0f} rounds/s")
    print()
    print("| block MiB | get: raw GB/s | client, copy=False | ratio | client, out= buffer | ratio "
          "| client, new array | ratio "
          "| put: raw (dropped) GB/s | raw (stored) GB/s | client | ratio dropped | ratio stored |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in result["throughput"]:
        print(f"| {r['mib']} | {r['raw_get_gbps']:.2f} | {r['client_get_view_gbps']:.2f} "
              f"| {r['get_view_ratio']:.2f} "
              f"| {r['client_get_out_gbps']:.2f} | {r['get_out_ratio']:.2f} "
              f"| {r['client_get_gbps']:.2f} | {r['get_ratio']:.2f} "
              f"| {r['raw_put_gbps']:.2f} | {r['raw_put_store_gbps']:.2f} | {r['client_put_gbps']:.2f} "
              f"| {r['put_ratio']:.2f} | {r['put_store_ratio']:.2f} |")
    machine = result.pop("machine")
    result = record("jobs/bench_runtime.py", argv_of(argv), args.out, result)
    result["machine"] = machine
    with open(args.out, "w") as fh:  # the platform too
        json.dump(result, fh, indent=2)
    png = plot(result, os.path.splitext(args.out)[0] + ".png")
    print(f"\nwrote {args.out}" + (f" and {png}" if png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
