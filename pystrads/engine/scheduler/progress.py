"""Progress of a fit: a log line per step and, in notebooks, a live progress bar.

Programs report where they stand with ``ctx.progress(done, total, unit, **shown)``
(e.g. iteration 12 of 100, the objective); the engine hands that to a
:class:`ProgressReporter` after every step together with its elapsed time.
The reporter knows nothing of any algorithm: it formats what it is given.

``spark.pystrads.progress``: ``auto`` (log lines; a bar too when running in a
Jupyter / Databricks notebook), ``log``, ``bar`` (bar in notebooks, a
carriage-return line on stderr elsewhere), ``both`` or ``off``.
"""

from __future__ import annotations

import html
import logging
import os
import sys
import time
from typing import Any, Dict, Optional

log = logging.getLogger("pystrads.progress")

MODES = ("auto", "log", "bar", "both", "off")


def in_notebook() -> bool:
    """True inside a Jupyter kernel or a Databricks notebook."""
    if os.environ.get("DATABRICKS_RUNTIME_VERSION"):
        return True
    ipython = sys.modules.get("IPython")  # a notebook's kernel imported it; importing it here costs ~1 s
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
    except Exception:  # noqa: BLE001 -- a partial or odd IPython: not a notebook
        return False
    return shell is not None and type(shell).__name__ in ("ZMQInteractiveShell", "DatabricksShell")


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


class ProgressReporter:
    """Formats progress reports; writes them to the log, a notebook bar or stderr."""

    def __init__(self, name: str, mode: str = "auto"):
        if mode not in MODES:
            raise ValueError(f"progress mode {mode!r} is not one of {MODES}")
        notebook = in_notebook()
        self.name = name
        self.to_log = mode in ("auto", "log", "both")
        self.to_bar = mode in ("bar", "both") or (mode == "auto" and notebook)
        self.notebook = notebook
        self._handle = None
        self._t0 = time.perf_counter()
        self.last: Optional[Dict[str, Any]] = None
        self.lines = []  # every formatted line (the tests read them)

    def update(self, done: float, total: Optional[float], unit: str = "iterations", **shown: Any) -> str:
        elapsed = time.perf_counter() - self._t0
        parts = [f"{self.name}: {unit} {_value(done)}"]
        frac = None
        if total:
            frac = min(1.0, max(0.0, done / total))
            parts[0] += f"/{_value(total)} ({100 * frac:.0f}%)"
        parts += [f"{k}={_value(v)}" for k, v in shown.items()]
        timing = f"{_duration(elapsed)} elapsed"
        if frac and 0 < frac < 1:
            timing += f", ETA {_duration(elapsed * (1 - frac) / frac)}"
        line = " ".join(parts) + " | " + timing
        self.last = {"done": done, "total": total, "unit": unit, "elapsed": elapsed, **shown}
        self.lines.append(line)
        if self.to_log:
            log.info("%s", line)
        if self.to_bar:
            self._bar(frac, line)
        return line

    def finish(self, reason: str = "done") -> None:
        if self.last is None:
            return
        line = f"{self.name}: {reason} after {_duration(time.perf_counter() - self._t0)}"
        self.lines.append(line)
        if self.to_log:
            log.info("%s", line)
        if self.to_bar:
            self._bar(1.0 if reason in ("done", "converged", "maxIter") else None, line, final=True)

    # -- outputs
    def _bar(self, frac: Optional[float], line: str, final: bool = False) -> None:
        if self.notebook:
            try:
                from IPython.display import HTML, display  # type: ignore

                value = "" if frac is None else f' value="{frac:.4f}" max="1"'
                body = HTML(f'<div style="font-family:monospace"><progress style="width:40%"{value}></progress> '
                            f"{html.escape(line)}</div>")
                if self._handle is None:
                    self._handle = display(body, display_id=True)
                else:
                    self._handle.update(body)
                return
            except Exception:  # noqa: BLE001 -- fall back to the text bar
                self.notebook = False
        width = 30
        filled = int(round(width * (frac or 0.0)))
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {line[:150]}" + ("\n" if final else ""))
        sys.stderr.flush()
