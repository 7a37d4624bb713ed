"""The fault matrix on the step loop without Spark (tests/loopkit.py): every phase -- load, init,
rounds, a worker's done, after_step, checkpoint, commit -- x every shipped program -- LDA, MF, Lasso with the
working-set solver and with rounds only, L1 logistic likewise, and a program whose schedule and after_step
write tables -- x both scheduler locations.  Each faulted fit must end with the tables, the
program's driver-side state and the summary's steps of the fault-free fit, exactly: no step
applied twice or in part.  A journal that records the state before after_step's effects (the
order the coordinator used to have) fails the check."""

from __future__ import annotations

import tempfile

import numpy as np
import pytest

import loopkit
from pystrads.datasets.synthetic import strads_lasso_problem
from pystrads.programs import examples as ex
from pystrads.programs.lasso import LassoProgram
from pystrads.programs.lda import LDAProgram
from pystrads.programs.logistic import L1LogisticProgram
from pystrads.programs.mf import MFProgram
from pystrads.ps.partition import range_bounds

pytestmark = pytest.mark.timeout(300)


class SideEffects(ex.RotationSum):
    """RotationSum whose schedule and after_step write a table and count in attributes."""

    def __init__(self):
        super().__init__(60, iterations=6)
        self.schedules = self.after_steps = 0

    def tables(self):
        return super().tables() + [ex.Table("counts", 2, 1, "float64")]

    def schedule(self, ctx):
        U = ctx.num_workers
        n = min(ctx.rounds_this_step(self.iterations * U, U), U)  # an iteration a step
        if not n:
            return None
        self.schedules += 1
        ctx.table("counts").add([1], [[1.0]])
        return ex.Schedule.per_worker([[(p + r) % U for p in range(U)] for r in range(n)])

    def after_step(self, ctx, metrics):
        ctx.table("counts").add([0], [[1.0]])
        self.after_steps += 1
        super().after_step(ctx, metrics)


def _rotation():
    rng = np.random.default_rng(2)
    pairs = list(zip(rng.integers(0, 60, 400).tolist(), rng.random(400).tolist()))
    return SideEffects(), [pairs[:200], pairs[200:]]


def _mf():
    rng = np.random.default_rng(3)
    users, items = np.nonzero(rng.random((30, 20)) < 0.4)
    ratings = (rng.random((30, 2)) @ rng.random((2, 20)))[users, items]
    triples = list(zip(users.tolist(), items.tolist(), ratings.tolist()))
    program = MFProgram(30, 20, 2, 0.05, np.bincount(items, minlength=20), 4, 1, seed=5)
    return program, [[t for t in triples if t[0] % 2 == p] for p in range(2)]


def _linear(cls, gram_limit, binary=False):
    p = strads_lasso_problem(200, 150, nnz_per_col=8, seed=6)
    y = (p.y > np.median(p.y)).astype(float) if binary else p.y
    lam_max = float(np.max(np.abs(p.dense().T @ (y - (0.5 if binary else 0.0))))) / len(y)
    rows = [(float(t), 1.0, i, v) for t, (_, i, v) in zip(y, p.rows())]
    program = cls(150, 0.05 * lam_max, fit_intercept=False, standardization=False, max_iter=10, tol=1e-14,
                  gram_limit=gram_limit, coords_per_round=16, candidates_per_round=32)
    return program, [rows[0::2], rows[1::2]]


def _lda():
    rng = np.random.default_rng(4)
    docs = []
    for d in range(60):
        words, counts = np.unique(rng.integers(0, 80, 25), return_counts=True)
        docs.append((d, words, counts))
    weights = np.zeros(80)
    for _, w, c in docs:
        np.add.at(weights, w, c)
    program = LDAProgram(num_topics=4, vocab_size=80, num_workers=2, block_bounds=range_bounds(80, 2, weights),
                         alpha=0.5, beta=0.1, max_iter=5, sampler="fplus", seed=3, word_weights=weights)
    return program, [docs[0::2], docs[1::2]]


PROGRAMS = {
    "side_effects": _rotation,
    "mf": _mf,
    "lasso": lambda: _linear(LassoProgram, 4096),
    "lasso_rounds": lambda: _linear(LassoProgram, 0),
    "logistic": lambda: _linear(L1LogisticProgram, 4096, binary=True),
    "logistic_rounds": lambda: _linear(L1LogisticProgram, 0, binary=True),
    "lda": _lda,
}
PHASES = ["load", "init", "rounds", "done", "after_step", "checkpoint", "commit", "commit_partly"]

_REFERENCE = {}


def _fit(name, phase=None, location="driver", at_step=2):
    program, records = PROGRAMS[name]()
    struck = loopkit.struck_program(type(program))
    program.__class__ = struck
    faults = loopkit.Faults(phase, at_step=at_step)
    if phase != "checkpoint":  # (checkpoints change no result: the reference fit keeps none)
        return loopkit.run_fit(program, records, faults=faults, location=location), faults
    with tempfile.TemporaryDirectory(prefix="pystrads-loopkit-") as checkpoints:
        got = loopkit.run_fit(program, records, faults=faults, location=location, checkpoint_dir=checkpoints)
    assert got.summary.fixed.get("checkpoints", 0) >= 1
    return got, faults


def reference(name):
    if name not in _REFERENCE:
        _REFERENCE[name] = _fit(name)[0]
    return _REFERENCE[name]


def _state(program):
    from pystrads.engine.scheduler.checkpoints import program_state

    return {k: v for k, v in program_state(program).items() if k not in ("t_origin",)}


def _assert_counts(got, want):
    """LDA: the counts are exact -- each token counted once in its word's row and in the totals
    -- though the chain after a replay may differ from the fault-free one."""
    word_topic, totals = got.tables["word_topic"], got.tables["topic_totals"][0]
    np.testing.assert_array_equal(word_topic.sum(axis=1), want.tables["word_topic"].sum(axis=1))
    np.testing.assert_array_equal(totals, word_topic.sum(axis=0))
    assert [r["step"] for r in got.summary.rows] == [r["step"] for r in want.summary.rows]
    assert got.stopped == want.stopped


def _assert_same(got, want):
    assert sorted(got.tables) == sorted(want.tables)
    for name in want.tables:
        np.testing.assert_array_equal(got.tables[name], want.tables[name], err_msg=f"table {name}")
    assert [r["step"] for r in got.summary.rows] == [r["step"] for r in want.summary.rows]
    assert got.stopped == want.stopped
    a, b = _state(got.program), _state(want.program)
    assert sorted(a) == sorted(b)
    for key in b:
        _assert_equal_values(a[key], b[key], key)


def _assert_equal_values(a, b, where):
    if isinstance(b, dict):
        assert isinstance(a, dict) and sorted(a) == sorted(b), where
        for k in b:
            if k in ("elapsed_s",):
                continue
            _assert_equal_values(a[k], b[k], f"{where}.{k}")
    elif isinstance(b, (list, tuple)) and not (b and isinstance(b[0], (int, float, np.number))):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_equal_values(x, y, f"{where}[{i}]")
    elif isinstance(b, (np.ndarray, list, tuple, int, float, np.number)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=where)


#: every program x phase x where the scheduler runs; with the scheduler in the job, for a
#: commit that reached one shard and for a task lost after its done, the loop's own side effects
#: run in the README's command and the other programs in the slow step (L1 logistic's parallel
#: rounds, which its working sets leave to larger supports, in the slow step only)
FAULT_CASES = [pytest.param(name, phase, location, marks=pytest.mark.slow)
               if ((location == "job" or phase in ("commit_partly", "done")) and name != "side_effects")
               or name == "logistic_rounds" else (name, phase, location)
               for name in sorted(PROGRAMS) for phase in PHASES for location in ("driver", "job")]


@pytest.mark.parametrize("name,phase,location", FAULT_CASES)
def test_a_fault_in_any_phase_ends_as_the_fault_free_fit(name, phase, location):
    got, faults = _fit(name, phase, location)
    assert faults.struck.is_set(), f"the {phase} fault was never struck"
    (_assert_counts if name == "lda" else _assert_same)(got, reference(name))
    if name == "side_effects":  # the loop's own writes, each once a step
        steps = len(got.summary.rows)
        assert got.tables["counts"][:, 0].tolist() == [steps, steps]
        assert got.program.after_steps == steps == got.program.schedules


def test_the_check_fails_when_the_journal_records_the_state_before_after_steps_effects(monkeypatch):
    """A journal double with the order the coordinator used to have: a step's entry records the
    program's state as of before ``after_step`` ran.  A coordinator that dies once ``after_step``
    wrote its table then counts that write once but the state's step twice: the matrix's check
    fails."""
    from pystrads.engine.scheduler.journal import Journal
    from pystrads.engine.scheduler.loop import StepLoop

    class EarlyJournal(Journal):
        early: set = set()

        def write(self, entry, open_step):
            if entry.step not in self.early:  # the step's entry was recorded before after_step
                super().write(entry, open_step)

    account = StepLoop._account

    def account_after_recording(self, ctx, schedule, program_rounds, t_sched, answer, t_step):
        step = self.position.step
        early = self._journal_entry(step)
        early.position = dict(early.position, step=step + 1,
                              rounds_done=early.position["rounds_done"] + len(schedule))
        Journal.write(self.journal, early, step)
        self.journal.early = self.journal.early | {step}
        return account(self, ctx, schedule, program_rounds, t_sched, answer, t_step)

    monkeypatch.setattr(loopkit, "Journal", EarlyJournal)
    monkeypatch.setattr(StepLoop, "_account", account_after_recording)
    got, faults = _fit("side_effects", "after_step", "job")
    assert faults.struck.is_set()
    with pytest.raises(AssertionError):
        _assert_same(got, reference("side_effects"))
    # step 2's after_step: its table write kept, its state's count lost with the replayed entry
    assert got.tables["counts"][0, 0] == got.program.after_steps + 1


@pytest.mark.parametrize("name", ["mf", pytest.param("lasso", marks=pytest.mark.slow), "lda"])
def test_a_checkpoint_directory_resumes_exactly_under_another_shard_layout(name):
    """One checkpoint directory, three fits of one program on 3, then 1, then 2 shards (each
    table's rows cut otherwise, its files per shard otherwise, the older layout's files still in
    the directory): each resumes from the one before, and the last ends as the fit that ran
    through on two shards -- exactly."""
    want = reference(name)
    fits = []
    with tempfile.TemporaryDirectory(prefix="pystrads-loopkit-") as directory:
        for shards, max_steps in ((3, 1), (1, 1), (2, None)):
            program, records = PROGRAMS[name]()
            program.__class__ = loopkit.struck_program(type(program))
            fits.append(loopkit.run_fit(program, records, checkpoint_dir=directory, shards=shards,
                                        max_steps=max_steps))
    assert "resumed_from_step" not in fits[0].summary.fixed
    assert [f.summary.fixed.get("resumed_from_step") for f in fits[1:]] == [1, 2]
    assert len(want.summary.rows) > 2  # the last fit had steps of its own to run
    (_assert_counts if name == "lda" else _assert_same)(fits[-1], want)
