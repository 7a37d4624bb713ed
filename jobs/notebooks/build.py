"""Build the example notebook from its Databricks source, and run it headlessly.

    python jobs/notebooks/build.py                      # pystrads_tour.py -> pystrads_tour.ipynb
    python jobs/notebooks/build.py --execute out.ipynb  # run every cell, write the notebook with outputs

The Databricks source (``# Databricks notebook source``, cells separated by
``# COMMAND ----------``, markdown as ``# MAGIC %md`` lines) is the one file
edited by hand; the ``.ipynb`` is generated from it (a test checks they
agree).  ``--execute`` runs the code cells in a Jupyter kernel (nbclient) that
has ``spark`` before the first cell, as on Databricks: ``--session classic``
(the default) or ``connect`` on ``--master`` (default ``local[2]``; for
Connect a remote ``sc://host:port`` or a local Connect server), or ``none``
(the notebook creates its own); printed output and figures become the
cells' outputs, and the first failing cell stops the run with its error.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
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
    for n, c in enumerate(cells, 1):  # nbformat 4.5: every cell has an id (stable: its position)
        if c["type"] == "markdown":
            out.append({"cell_type": "markdown", "id": f"cell-{n:02d}", "metadata": {}, "source": lines(c["source"])})
        else:
            out.append({"cell_type": "code", "execution_count": None, "id": f"cell-{n:02d}", "metadata": {},
                        "outputs": [], "source": lines(c["source"])})
    return {"cells": out, "nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                         "language_info": {"name": "python"}}}


#: the code that gives the kernel its ``spark`` before the notebook's first cell, as Databricks does
SESSIONS = {
    "classic": ("import os, sys\n"
                "os.environ.setdefault('PYSPARK_PYTHON', sys.executable)\n"
                "from pystrads.session import spark_session\n"
                "spark = spark_session({master!r}, 'pystrads-notebook', {{'spark.ui.enabled': 'false'}})"),
    "connect": ("import os, sys\n"
                "os.environ.setdefault('PYSPARK_PYTHON', sys.executable)\n"
                "from pyspark.sql import SparkSession\n"
                "spark = SparkSession.builder.remote({master!r}).config('spark.ui.enabled', 'false').getOrCreate()"),
}


def execute(nb: Dict, session: str = "classic", master: str = "local[2]", timeout: float = 600) -> Dict:
    """Run the code cells of ``nb`` in order in a Jupyter kernel (nbclient, ipykernel's
    ``python3``); returns ``nb`` with the kernel's outputs (streams, figures as PNG, errors).
    Before the first cell the kernel gets ``spark`` as Databricks gives it: a classic session
    (``session="classic"``, on ``master``), a Spark Connect session (``"connect"``: ``master`` is
    the remote, ``sc://host:port``, or ``local[N]`` for a local Connect server), or none (``""``:
    the notebook makes its own).  The first failing cell stops the run: ``RuntimeError`` naming
    it (``cell N``, counting code cells) and its error."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    run = nbformat.reads(json.dumps(nb), as_version=4)  # (joins each source's lines)
    setup = [nbformat.v4.new_code_cell(SESSIONS[session].format(master=master))] if session else []
    run.cells = setup + run.cells
    client = NotebookClient(run, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": HERE}})
    failure = None
    try:
        client.execute()
    except CellExecutionError as exc:
        failure = exc
    cells = run.cells[len(setup):]
    if setup and any(o.get("output_type") == "error" for o in run.cells[0].get("outputs", [])):
        raise RuntimeError(f"the kernel's spark session ({session}, {master}) failed: {failure}")
    for cell, done in zip(nb["cells"], cells):
        if cell["cell_type"] == "code":
            cell["outputs"] = [dict(o) for o in done.get("outputs", [])]
            cell["execution_count"] = done.get("execution_count")
    if failure is not None:
        code = [c for c in nb["cells"] if c["cell_type"] == "code"]
        count = next((i + 1 for i, c in enumerate(code) if any(o["output_type"] == "error" for o in c["outputs"])), 0)
        error = next((o for c in code for o in c["outputs"] if o["output_type"] == "error"), {})
        text = "".join(o.get("text", "") for o in (code[count - 1]["outputs"] if count else []))
        raise RuntimeError(f"cell {count} failed: {error.get('ename')}: {error.get('evalue')}\n{text[-2000:]}") \
            from failure
    return nb


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--execute", metavar="OUT", help="run the notebook and write it with outputs to OUT")
    parser.add_argument("--session", choices=["classic", "connect", "none"], default="classic",
                        help="the kernel's spark before the first cell (none: the notebook makes its own)")
    parser.add_argument("--master", default="local[2]", help="its master (connect: sc://host:port or local[N])")
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
        executed = execute(nb, "" if args.session == "none" else args.session, args.master)
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
