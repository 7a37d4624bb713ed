"""One fit of LDA, MF or Lasso on local[2] with one injected fault, for the fault-injection suite
(tests/test_faults.py).  Usage::

    python tests/fault_driver.py PROGRAM FAULT[,FAULT...] OUT_JSON CHECKPOINT_DIR [MASTER]

PROGRAM: lda | mf | lasso | lasso_rounds (Lasso with ``workingSetLimit=0``: parallel rounds only).  MASTER: local[2] (default) or a standalone master URL (two
one-core executors).  FAULT:

* ``none`` -- fault-free reference (checkpoints on, as in every run);
* ``shard`` -- SIGKILL every shard process once step ``TRIGGER`` runs;
* ``worker`` -- SIGKILL the Python worker processes (the tasks of the step) once step ``TRIGGER`` runs;
* ``driver`` -- SIGKILL this driver once step ``TRIGGER`` runs and a checkpoint exists (writes the
  shard pids to ``OUT_JSON`` first; the test then checks they exit within the lease);
* ``drop`` -- not a fault but a bug: step ``TRIGGER``'s model updates are rolled back on the shards
  after its tasks ran (the workers keep theirs); for ``lasso``, whose model moves on the driver
  between steps, the workers skip that step's coefficient changes instead; the suite checks
  that its exactness test catches it;
* ``resume`` -- a plain run, expected to resume from the checkpoint a killed driver left;
* ``executor`` -- (standalone cluster) SIGKILL one executor's standalone worker JVM, the executor
  JVM it runs and that executor's shard -- a lost machine -- once step ``TRIGGER`` runs.

Several faults (``none,drop,worker,shard``; not ``driver`` or ``resume``) run one after another in
this one driver process -- one Spark application, fresh checkpoints for each fit, the patch of
each fault undone before the next -- and ``OUT_JSON`` maps each fault to its result: the suite
pays a driver's start (Python, the JVM, Spark) once per program instead of once per cell.

Writes ``OUT_JSON``: quality (LDA: final log-likelihood; MF: training RMSE; Lasso:
objective), the parameters (to compare with the fault-free run), ``exact`` -- the program's
invariant between the model on the shards and the workers' states (LDA: word-topic counts equal
the recount from token topics; MF: every residual equals rating - w_u . h_i; Lasso: every
residual equals y - X beta) -- and the recovery figures of the summary.
"""

import contextlib
import json
import os
import signal
import sys
import threading
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

TRIGGER = 4  # the fault hits while this step runs (checkpoints every 2 steps: one exists by then)
LEASE = 6.0
ROUNDS_PER_STEP = 24  # lasso_rounds: every step runs this many rounds (with its closing sweep)


def lda_fit(sc, config):
    from test_lda_program import make_program, recount, synthetic_corpus

    from pystrads.engine import Engine

    # documents of 100 tokens: Gibbs chains from any start reach the same mode within 40
    # iterations (16 of 16 seeds within 0.25 % of each other); with 50 tokens a chain in five
    # ends in a local optimum 5 % lower, and the 1 % quality check would compare modes, not faults
    docs, _ = synthetic_corpus(n_docs=240, vocab=300, topics=5, doc_len=100, seed=4)
    tokens = sum(int(c.sum()) for _, _, c in docs)
    program = make_program(docs, 300, 2, iterations=40)
    with Engine(program, sc.parallelize(docs, 2), seed=1, config=config).fit() as res:
        word_topic = res.read_table("word_topic")
        exact = bool(word_topic.sum() == tokens and np.array_equal(word_topic, recount(res, 300, 5))
                     and np.array_equal(res.read_table("topic_totals")[0], word_topic.sum(axis=0)))
        quality = float(res.summary.iterations[-1]["log_likelihood"])
        return {"quality": quality, "params": word_topic.astype(float).ravel().tolist(), "exact": exact,
                "iterations": int(res.summary.iterations[-1]["iteration"])}, res.summary


def mf_fit(sc, config):
    from pystrads.engine import Engine
    from pystrads.programs.mf import MFProgram

    rng = np.random.default_rng(0)
    nu, ni, rank = 120, 80, 4
    users, items = np.nonzero(rng.random((nu, ni)) < 0.4)
    ratings = (rng.random((nu, rank)) @ rng.random((rank, ni)))[users, items] + 0.05 * rng.standard_normal(len(users))
    rdd = sc.parallelize(list(zip(users.tolist(), items.tolist(), ratings.tolist())), 2) \
        .keyBy(lambda t: t[0]).partitionBy(2).values()
    program = MFProgram(nu, ni, rank, 0.05, np.bincount(items, minlength=ni), 40, 2, seed=3, block_size=1)
    with Engine(program, rdd, seed=3, config=config).fit() as res:
        h = program.item_matrix(res.read_table("item_factors"))

        def user_rows(worker, data, state):
            # each worker's residuals must equal its ratings minus w_u . h_i for the committed H:
            # a lost or doubled update of H (or of a worker's W) breaks this
            predicted = np.einsum("nk,nk->n", state.w[data.rating_user], h[data.items[data.rating_item]])
            drift = float(np.max(np.abs(data.ratings - predicted - state.residual), initial=0.0))
            return data.users, state.w, drift

        parts = res.map_states(user_rows)
    w = np.zeros((nu, rank))
    for ids, rows, _ in parts:
        w[ids] = rows
    drift = max(d for _, _, d in parts)
    return {"quality": float(res.summary.iterations[-1]["train_rmse"]), "params": np.concatenate(
        [h.ravel(), w.ravel()]).tolist(), "exact": bool(drift <= 1e-9), "invariant_error": drift,
        "iterations": int(res.summary.iterations[-1]["iteration"])}, res.summary


def lasso_fit(sc, config, working_set_limit=None, lose_step=None):
    """Lasso on the STRADS generator; ``working_set_limit=0`` switches the driver's working-set
    solver off, so every update is a parallel round over the workers' data (the STRADS
    algorithm proper), and the faults hit those rounds."""
    from pystrads.datasets.synthetic import lambda_max, strads_lasso_problem
    from pystrads.engine import Engine
    from pystrads.programs._rows import ColumnSample
    from pystrads.programs.lasso import LassoProgram

    p = strads_lasso_problem(400, 1500, nnz_per_col=10, corr_prob=0.3, seed=5)
    rdd = sc.parallelize([(y, 1.0, i, v) for y, i, v in p.rows()], 2)
    sample = ColumnSample([(i, v) for _, i, v in p.rows()], 1500)
    if working_set_limit is None:
        extra = dict(coords_per_round=16, candidates_per_round=32, tol=1e-9, max_iter=400)
    else:  # rounds only: a fixed number of steps of parallel rounds
        extra = dict(coords_per_round=64, candidates_per_round=128, tol=1e-12, max_iter=16,
                     gram_limit=working_set_limit)
    cls = LassoProgram
    if lose_step is not None:
        class LosesOneStep(LassoProgram):  # defined here so that it travels to the workers by value
            def apply(self, ctx, data, state, work):
                if ctx.step == lose_step:  # this step's coefficient changes never reach the residuals
                    return state
                return super().apply(ctx, data, state, work)
        cls = LosesOneStep
    program = cls(1500, 0.05 * lambda_max(p), fit_intercept=False, standardization=False, sample=sample,
                  min_rounds_per_step=8, **extra)
    with Engine(program, rdd, num_workers=2, seed=1, config=config).fit() as res:
        beta, _ = program.result(res.read_table("coef"))

        def residual_drift(worker, data, state):
            # r must equal y - X beta for the committed beta (no intercept here): a lost or
            # doubled coefficient update, or a residual update applied twice, breaks this
            fitted = np.zeros(len(data["y"]))
            cols = np.repeat(np.arange(len(data["col_ptr"]) - 1), np.diff(data["col_ptr"]))
            np.add.at(fitted, data["row_idx"], data["vals"] * beta[cols])
            return float(np.max(np.abs(data["y"] - fitted - state["r"]), initial=0.0))

        drift = max(res.map_states(residual_drift))
        return {"quality": float(program.driver_state["objective"]), "params": beta.tolist(),
                "exact": bool(drift <= 1e-9), "invariant_error": drift, "rounds": res.summary.total_rounds,
                "round_updates": int(program.driver_state["round_updates"]),
                "iterations": len(res.summary.rows)}, res.summary


#: what the command line of Spark's Python daemon and of the workers it forks holds: pyspark's
#: own, or the one spark_session sets (spark.python.daemon.module)
DAEMONS = ("pyspark.daemon", "pyspark/daemon", "pystrads.daemon")


def _pyspark_workers():
    """Pids of this driver's forked Python workers: processes running Spark's daemon code
    whose parent does too (the daemon itself is a child of the JVM; shards, children of a
    worker, are not pyspark processes), and that descend from this process -- never another
    application's workers on the same machine (a benchmark or a second test run)."""
    daemons, procs, parents = set(), {}, {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        parents[int(pid)] = ppid
        if any(daemon in cmd for daemon in DAEMONS):
            daemons.add(int(pid))
            procs[int(pid)] = ppid

    def mine(pid):
        while pid > 1:
            if pid == os.getpid():
                return True
            pid = parents.get(pid, 0)
        return False

    return [pid for pid, ppid in procs.items() if ppid in daemons and mine(pid)]


def inject(fault, out, checkpoint_dir, manager, step):
    """Strike once: kill the shards, this driver's Python workers, an executor (with its worker
    JVM and shard) or this driver itself."""
    from pystrads.ps import storage

    if fault == "shard":
        for s in manager.group.shards:
            os.kill(s.pid, signal.SIGKILL)
    elif fault == "worker":
        victims = _pyspark_workers()
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if not victims:
            return False
    elif fault == "executor":
        shard = manager.group.shards[-1]
        executor_pid = int(shard.executor.rsplit(":", 1)[1])
        with open(f"/proc/{executor_pid}/stat") as fh:
            worker_pid = int(fh.read().rsplit(")", 1)[1].split()[1])
        for pid in (worker_pid, executor_pid, shard.pid):
            os.kill(pid, signal.SIGKILL)
    elif fault == "driver":
        fit_dirs = [d for d in storage.list_names(checkpoint_dir) if d.startswith("pystrads-")]
        if not any(storage.exists(os.path.join(checkpoint_dir, d, "LATEST")) for d in fit_dirs):
            return False
        with open(out, "w") as fh:
            json.dump({"shard_pids": [s.pid for s in manager.group.shards], "killed_at_step": step}, fh)
        os.kill(os.getpid(), signal.SIGKILL)
    print(f"FAULT {fault} injected during step {step}", flush=True)
    return True


def strike_during_step(fault, out, checkpoint_dir, struck):
    """A step hook that injects ``fault`` once step ``TRIGGER`` has begun: a thread strikes as
    soon as the step's command is posted while it runs (the workers' tasks live for the whole
    fit, and some programs' steps last milliseconds, too short to be caught by polling alone).
    ``struck`` (an Event) is set once the fault was injected: a fit it never hit is reported
    as such, and the suite fails it."""
    from pystrads.ps import launcher

    def hook(job, step, run):
        if step < TRIGGER or struck.is_set():
            return run()
        manager = next(iter(launcher._MANAGERS.values()))

        def strike():
            time.sleep(0.005)  # the step's command is posted and its rounds start
            if inject(fault, out, checkpoint_dir, manager, step):
                struck.set()

        striker = threading.Thread(target=strike, daemon=True)
        striker.start()
        try:
            return run()
        finally:
            striker.join()

    return hook


def drop_one_step(struck):
    """The broken variant the suite must catch (a step hook): step ``TRIGGER`` runs on the
    workers, but the shards roll its model updates back instead of committing them, while the
    workers keep theirs -- a lost update that no error reports.  ``struck`` is set once it did."""
    def hook(job, step, run):
        if step != TRIGGER:
            return run()
        broadcast = job.group.broadcast

        def rolled_back(action, **kw):
            if action == "commit_step":
                struck.set()
                return broadcast("abort_step", **kw)
            return broadcast(action, **kw)
        job.group.broadcast = rolled_back
        try:
            return run()
        finally:
            del job.group.broadcast
            print(f"FAULT drop: step {step}'s model updates rolled back after its tasks ran", flush=True)
    return hook


def run_one(spark, program, fault, out, checkpoint_dir):
    """One fit of ``program`` with ``fault`` injected: its result (with the summary's recovery figures)."""
    from pystrads.testing import around_steps

    config = {"checkpoint.dir": checkpoint_dir, "checkpoint.interval": 2, "step.targetSeconds": 0.15,
              "progress": "off"}
    if program == "lasso_rounds":
        # steps sized by the round cap alone (not by time), so its dynamic schedule -- planned
        # per step -- is the same in every run and the coefficients can be compared exactly
        config.update({"step.targetSeconds": 3600.0, "step.maxRounds": ROUNDS_PER_STEP})
    hook = None
    struck = threading.Event()  # set once the fault was injected (a fault-free cell never sets it)
    if fault in ("shard", "worker", "driver", "executor"):
        hook = strike_during_step(fault, out, checkpoint_dir, struck)
    fits = {"lda": lda_fit, "mf": mf_fit, "lasso": lasso_fit,
            "lda_threads": lambda sc, cfg: lda_fit(sc, dict(cfg, **{"worker.threads": 2})),
            "lasso_rounds": lambda sc, cfg: lasso_fit(sc, cfg, working_set_limit=0)}
    if fault == "drop" and program == "lasso":
        # the default Lasso's model moves on the driver between steps (its working-set solutions)
        # and its steps carry them to the workers: lose that instead
        fits["lasso"] = lambda sc, cfg: lasso_fit(sc, cfg, lose_step=TRIGGER)

        def lost_step_ran(job, step, run):  # the workers lose step TRIGGER's changes: it must run
            done = run()
            if step == TRIGGER:
                struck.set()
            return done
        hook = lost_step_ran
    elif fault == "drop":
        hook = drop_one_step(struck)
    t0 = time.perf_counter()
    with around_steps(hook) if hook is not None else contextlib.nullcontext():
        result, summary = fits[program](spark.sparkContext, config)
    result.update(seconds=time.perf_counter() - t0, steps=len(summary.rows), injected=struck.is_set(),
                  recoveries=summary.fixed.get("recoveries", 0),
                  resumed_from_step=summary.fixed.get("resumed_from_step"),
                  checkpoints=summary.fixed.get("checkpoints", 0),
                  checkpoint_s=summary.fixed.get("checkpoint_s", 0.0),
                  recovery_s=summary.fixed.get("recovery_s", 0.0))
    return result


def main():
    program, faults, out, checkpoint_dir = sys.argv[1:5]
    master = sys.argv[5] if len(sys.argv) > 5 else "local[2]"
    faults = faults.split(",")
    if len(faults) > 1 and {"driver", "resume"} & set(faults):
        sys.exit("fault_driver: 'driver' and 'resume' each need a driver process of their own")
    from pystrads.session import spark_session

    conf = {"spark.ui.enabled": "false", "spark.pystrads.shard.leaseSeconds": str(LEASE)}
    if not master.startswith("local"):
        conf.update({"spark.executor.cores": "1", "spark.cores.max": "2", "spark.executor.memory": "1g",
                     "spark.pystrads.executor.waitSeconds": "120"})
    spark = spark_session(master, f"pystrads-fault-{program}-{'-'.join(faults)}", conf)
    spark.sparkContext.setLogLevel("OFF")
    if not master.startswith("local"):
        deadline = time.time() + 120
        while spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1 < 2 and time.time() < deadline:
            time.sleep(0.5)
    if len(faults) == 1:
        result = run_one(spark, program, faults[0], out, checkpoint_dir)
    else:
        result = {}
        for fault in faults:  # a fit that fails is reported as its cell's error; the others still run
            try:
                result[fault] = run_one(spark, program, fault, out, os.path.join(checkpoint_dir, fault))
            except Exception:
                result[fault] = {"error": traceback.format_exc()}
    with open(out, "w") as fh:
        json.dump(result, fh)
    spark.stop()


if __name__ == "__main__":
    main()
