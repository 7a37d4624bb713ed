"""Builds the "Differences from MLlib" table of docs/user-guide.md from the estimators themselves.

Each drop-in declares the MLlib params it takes without honouring them in its ``_mllib_only``
(:class:`pystrads.ml._params.MLlibOnly`: a warning saying what runs instead, or a refusal
naming the alternative); the conformance checks (``pystrads.testing``) fail on an MLlib param a
drop-in lacks.  The pyspark doctests that differ are ``pystrads.testing.DOCTEST_GAPS``.  The table between ``<!-- differences-table -->`` and
``<!-- /differences-table -->`` is this script's output, and ``tests/test_docs.py`` fails when
it is stale:

    python docs/build_differences.py            # rewrite the table in docs/user-guide.md
    python docs/build_differences.py --check    # exit 1 if it is stale
"""

from __future__ import annotations

import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "user-guide.md")
MARKED = re.compile(r"(<!-- differences-table -->\n)(.*?)(<!-- /differences-table -->)", re.S)

#: drop-in -> the MLlib class it stands in for
COUNTERPARTS = {"StradsLDA": "LDA", "StradsMF": "ALS", "StradsLasso": "LinearRegression",
                "StradsLogisticRegression": "LogisticRegression"}


def rows():
    """``[(drop-in, MLlib class, param, "warning" | "refused", what pystrads does)]``."""
    import pystrads.ml as ml

    out = []
    for name, counterpart in COUNTERPARTS.items():
        cls = getattr(ml, name)
        for param, gap in sorted(cls._merged("_mllib_only", {}).items()):
            out.append((name, counterpart, param, "refused" if gap.refused else "warning", gap.instead))
    return out


def table() -> str:
    from pystrads.testing import DOCTEST_GAPS

    lines = ["| drop-in | MLlib's param | when set | what pystrads does |", "|---|---|---|---|"]
    for name, counterpart, param, kind, instead in rows():
        lines.append(f"| `{name}` | `{counterpart}.{param}` | {kind} | {instead.replace('|', '/')} |")
    lines += ["", "pyspark.ml's own doctests of the four classes run on the drop-ins "
              "(`tests/test_pyspark_doctests.py`); these examples differ:", "",
              "| MLlib class | example | why |", "|---|---|---|"]
    for (counterpart, source), why in sorted(DOCTEST_GAPS.items()):
        lines.append(f"| `{counterpart}` | `{source}` | {why.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def build(text: str) -> str:
    if not MARKED.search(text):
        raise ValueError("docs/user-guide.md has no <!-- differences-table --> ... <!-- /differences-table --> block")
    return MARKED.sub(lambda m: m.group(1) + table() + m.group(3), text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if the table in docs/user-guide.md is stale")
    args = parser.parse_args(argv)
    sys.path.insert(0, ROOT)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _page import write_or_check

    with open(PAGE, encoding="utf-8") as fh:
        text = fh.read()
    return write_or_check(PAGE, build(text), args.check, "python docs/build_differences.py")


if __name__ == "__main__":
    sys.exit(main())
