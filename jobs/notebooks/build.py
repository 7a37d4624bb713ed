"""Build the example notebook from its Databricks source, and run it headlessly.

    python jobs/notebooks/build.py                      # pystrads_tour.py -> pystrads_tour.ipynb
    python jobs/notebooks/build.py --execute out.ipynb  # run every cell, write the notebook with outputs

The Databricks source (``# Databricks notebook source``, cells separated by
``# COMMAND ----------``, markdown as ``# MAGIC %md`` lines) is the one file
edited by hand; the ``.ipynb`` is generated from it (a test checks they
agree).  ``--execute`` needs no Jupyter: code cells run in order in one
namespace (like one kernel), printed output and matplotlib figures
(``plt.show()``) become the cells' outputs, and the first failing cell stops
the run with its traceback.  ``--master`` sets the Spark master of the
session the notebook creates when no ``spark`` exists (default ``local[2]``).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import os
import sys
import time
import traceback
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "pystrads_tour.py")
NOTEBOOK = os.path.join(HERE, "pystrads_tour.ipynb")
HEADER = "# Databricks notebook source"
SEPARATOR = "# COMMAND ----------"


def parse_databricks(text: str) -> List[Dict[str, str]]:
    """Cells ``{"type": "code" | "markdown", "source": str}`` of a Databricks source file."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != HEADER:
        raise ValueError(f"not a Databricks notebook source: the first line must be {HEADER!r}")
    cells, current = [], []
    for line in lines[1:] + [SEPARATOR]:
        if line.strip() == SEPARATOR:
            body = "\n".join(current).strip("\n")
            current = []
            if not body:
                continue
            magic = [ln for ln in body.splitlines()]
            if all(ln.startswith("# MAGIC") for ln in magic):
                stripped = [ln[len("# MAGIC"):][1:] if ln.startswith("# MAGIC ") else "" for ln in magic]
                if stripped and stripped[0].strip() == "%md":
                    cells.append({"type": "markdown", "source": "\n".join(stripped[1:])})
                    continue
            cells.append({"type": "code", "source": body})
        else:
            current.append(line)
    return cells


def to_ipynb(cells: List[Dict[str, str]]) -> Dict:
    def lines(src: str) -> List[str]:
        parts = src.split("\n")
        return [p + "\n" for p in parts[:-1]] + [parts[-1]]

    out = []
    for c in cells:
        if c["type"] == "markdown":
            out.append({"cell_type": "markdown", "metadata": {}, "source": lines(c["source"])})
        else:
            out.append({"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                        "source": lines(c["source"])})
    return {"cells": out, "nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                         "language_info": {"name": "python"}}}


def execute(nb: Dict, master: str = "local[2]") -> Dict:
    """Run the code cells of ``nb`` in order (in this process); returns ``nb`` with outputs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outputs: List[Dict] = []

    def show(*_args, **_kwargs):
        for num in plt.get_fignums():
            buf = io.BytesIO()
            plt.figure(num).savefig(buf, format="png", dpi=80)
            outputs.append({"output_type": "display_data", "metadata": {},
                            "data": {"image/png": base64.b64encode(buf.getvalue()).decode(),
                                     "text/plain": ["<Figure>"]}})
        plt.close("all")

    original_show, plt.show = plt.show, show
    namespace: Dict = {"__name__": "__main__"}
    try:
        return _run_cells(nb, namespace, master, lambda: outputs)
    finally:
        plt.show = original_show


def _run_cells(nb: Dict, namespace: Dict, master: str, figures) -> Dict:
    if master:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        from pystrads.session import spark_session

        namespace["spark"] = spark_session(master, "pystrads-notebook", {"spark.ui.enabled": "false"})
    count = 0
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        count += 1
        figures().clear()
        stdout = io.StringIO()
        t0 = time.perf_counter()
        try:
            with contextlib.redirect_stdout(stdout):
                exec(compile("".join(cell["source"]), f"<cell {count}>", "exec"), namespace)
        except Exception as exc:
            cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": stdout.getvalue()},
                               {"output_type": "error", "ename": type(exc).__name__, "evalue": str(exc),
                                "traceback": traceback.format_exc().splitlines()}]
            raise RuntimeError(f"cell {count} failed: {type(exc).__name__}: {exc}\n{stdout.getvalue()[-2000:]}") \
                from exc
        text = stdout.getvalue()
        cell["outputs"] = ([{"output_type": "stream", "name": "stdout", "text": text}] if text else []) + list(figures())
        cell["execution_count"] = count
        cell["metadata"]["seconds"] = round(time.perf_counter() - t0, 1)
    return nb


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--execute", metavar="OUT", help="run the notebook and write it with outputs to OUT")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--figures", metavar="DIR", help="with --execute: also write the figures as PNG files")
    parser.add_argument("--check", action="store_true", help="fail if the .ipynb is not the build of the source")
    args = parser.parse_args(argv)
    with open(SOURCE) as fh:
        nb = to_ipynb(parse_databricks(fh.read()))
    text = json.dumps(nb, indent=1) + "\n"
    if args.check:
        with open(NOTEBOOK) as fh:
            if fh.read() != text:
                print(f"{NOTEBOOK} is stale: run python {os.path.relpath(__file__)}", file=sys.stderr)
                return 1
        return 0
    if args.execute:
        executed = execute(nb, args.master)
        with open(args.execute, "w") as fh:
            json.dump(executed, fh, indent=1)
        if args.figures:
            os.makedirs(args.figures, exist_ok=True)
            n = 0
            for cell in executed["cells"]:
                for out in cell.get("outputs", []):
                    if "image/png" in out.get("data", {}):
                        n += 1
                        with open(os.path.join(args.figures, f"figure{n}.png"), "wb") as fh:
                            fh.write(base64.b64decode(out["data"]["image/png"]))
        print(f"executed {sum(c['cell_type'] == 'code' for c in executed['cells'])} cells -> {args.execute}")
        return 0
    with open(NOTEBOOK, "w") as fh:
        fh.write(text)
    print(f"wrote {NOTEBOOK}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
