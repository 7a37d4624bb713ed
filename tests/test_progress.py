"""Progress reports (log lines, the text bar) and the summaries' pandas history and plots."""

import logging

import numpy as np
import pytest

from pystrads.engine.scheduler.progress import ProgressReporter


def test_progress_lines_have_position_values_elapsed_and_eta(caplog):
    caplog.set_level(logging.INFO, logger="pystrads.progress")
    rep = ProgressReporter("LDAProgram fit-1", "log")
    rep._t0 -= 30.0  # 30 s into the fit
    line = rep.update(3, 10, "iteration", objective=1.5, tokens_per_s=12345.678)
    assert line.startswith("LDAProgram fit-1: iteration 3/10 (30%) objective=1.5 tokens_per_s=12345.7")
    assert "30 s elapsed" in line and "ETA 1 min 10 s" in line  # 30 s for 30 % -> 70 s to go
    rep.finish("converged")
    assert [r.getMessage() for r in caplog.records] == [line, rep.lines[-1]]
    assert rep.lines[-1].startswith("LDAProgram fit-1: converged after")


def test_progress_modes(capsys, caplog):
    caplog.set_level(logging.INFO, logger="pystrads.progress")
    off = ProgressReporter("p", "off")
    off.update(1, 2)
    bar = ProgressReporter("p", "bar")  # not a notebook here: a text bar on stderr
    bar.update(1, 4, "iteration")
    bar.finish("done")
    err = capsys.readouterr().err
    assert "\r[########......................] p: iteration 1/4 (25%)" in err and err.endswith("\n")
    assert not caplog.records  # neither off nor bar logs
    with pytest.raises(ValueError, match="progress mode 'loud'"):
        ProgressReporter("p", "loud")
    unknown_total = ProgressReporter("p", "log").update(7, None, "step")
    assert unknown_total.startswith("p: step 7 |") and "ETA" not in unknown_total


def test_a_fit_reports_progress_and_its_history(spark, caplog):
    from pystrads.ml import StradsMF

    caplog.set_level(logging.INFO, logger="pystrads.progress")
    rng = np.random.default_rng(0)
    rows = [(u, i, float(rng.random() * 4 + 1)) for u in range(30) for i in range(20) if rng.random() < 0.5]
    df = spark.createDataFrame(rows, ["user", "item", "rating"])
    model = StradsMF(rank=2, maxIter=3, regParam=0.1, seed=1).fit(df)
    lines = [r.getMessage() for r in caplog.records if r.name == "pystrads.progress"]
    assert any("iteration 3/3 (100%)" in l and "train_rmse=" in l for l in lines), lines
    assert lines[-1].split(": ", 1)[1].startswith("done after")
    hist = model.summary.to_pandas()
    assert list(hist["iteration"]) == [1, 2, 3] and (np.diff(hist["train_rmse"]) <= 1e-9).all()
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    ax = model.summary.plot()
    assert list(ax.lines[0].get_ydata()) == list(hist["train_rmse"])


def test_notebook_bar_is_one_display_updated_in_place(monkeypatch):
    """In a notebook the bar is one HTML display (display_id) updated after every step."""
    import sys
    import types

    from pystrads.engine.scheduler import progress

    shown = []

    class Handle:
        def update(self, obj):
            shown.append(("update", obj.data))

    def display(obj, display_id=False):
        assert display_id is True
        shown.append(("display", obj.data))
        return Handle()

    fake = types.ModuleType("IPython.display")
    fake.HTML = type("HTML", (), {"__init__": lambda self, data: setattr(self, "data", data)})
    fake.display = display
    monkeypatch.setitem(sys.modules, "IPython.display", fake)
    monkeypatch.setattr(progress, "in_notebook", lambda: True)
    rep = progress.ProgressReporter("LDAProgram fit-9", "auto")
    assert rep.to_bar and rep.to_log
    rep.update(1, 4, "iteration", log_likelihood=-1.5e6)
    rep.update(2, 4, "iteration", log_likelihood=-1.2e6)
    rep.finish("done")
    assert [kind for kind, _ in shown] == ["display", "update", "update"]
    assert 'value="0.2500"' in shown[0][1] and "iteration 1/4 (25%) log_likelihood=-1.5e+06" in shown[0][1]
    assert 'value="1.0000"' in shown[-1][1] and "done after" in shown[-1][1]
    monkeypatch.undo()
    assert not progress.in_notebook()  # pytest is no notebook
    monkeypatch.setenv("DATABRICKS_RUNTIME_VERSION", "15.4")
    assert progress.in_notebook()


def test_notebook_detection_reads_a_loaded_ipython_and_never_imports_one(monkeypatch):
    """A notebook's kernel has IPython imported already: in_notebook asks that module and never
    imports IPython itself (~1 s of a process's first fit, where none is loaded)."""
    import sys
    import types

    from pystrads.engine.scheduler import progress

    tried = []

    class Watch:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "IPython":
                tried.append(name)
            return None

    monkeypatch.delenv("DATABRICKS_RUNTIME_VERSION", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Watch()] + sys.meta_path)
    for name in [m for m in sys.modules if m.split(".")[0] == "IPython"]:
        monkeypatch.delitem(sys.modules, name)
    assert not progress.in_notebook() and tried == []
    kernel = types.ModuleType("IPython")
    kernel.get_ipython = lambda: type("ZMQInteractiveShell", (), {})()
    monkeypatch.setitem(sys.modules, "IPython", kernel)
    assert progress.in_notebook()
    kernel.get_ipython = lambda: None  # IPython loaded, but no shell (a script that imported it)
    assert not progress.in_notebook() and tried == []
