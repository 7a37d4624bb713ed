"""What the docs' page builders share: write a generated page, or check that it is current."""

from __future__ import annotations

import os
import sys


def write_or_check(page: str, text: str, check: bool, how: str) -> int:
    """With ``check``: 0 if ``page`` already holds ``text``, else 1 with a message naming ``how`` to
    rebuild it. Without: write ``text`` to ``page`` and return 0."""
    if check:
        current = open(page, encoding="utf-8").read() if os.path.exists(page) else ""
        if current != text:
            print(f"{os.path.basename(page)} is stale: run {how}", file=sys.stderr)
            return 1
        return 0
    with open(page, "w", encoding="utf-8") as fh:
        fh.write(text)
    return 0
