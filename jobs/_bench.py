"""What the benchmark jobs share: the command a result records, and writing the result's JSON."""

from __future__ import annotations

import json
import os
import platform
import shlex
import time
from typing import Any, Dict, Optional, Sequence


def record(script: str, argv: Sequence[str], out: str, fields: Dict[str, Any]) -> Dict[str, Any]:
    """Write ``fields`` to ``out`` as JSON with the run's ``command`` (``python3 <script> <argv>``,
    without ``--out``: where the JSON goes is not part of the experiment), ``date`` and ``machine``;
    returns the written dict."""
    given = list(argv)
    shown = [a for i, a in enumerate(given) if a != "--out" and (i == 0 or given[i - 1] != "--out")
             and not a.startswith("--out=")]
    result = {"command": "python3 " + shlex.join([script] + shown), "date": time.strftime("%Y-%m-%d"), **fields,
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}}
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as fh:
        json.dump(result, fh, indent=2)
    print(f"wrote {out}")
    return result


def argv_of(argv: Optional[Sequence[str]]) -> Sequence[str]:
    import sys

    return list(argv if argv is not None else sys.argv[1:])
