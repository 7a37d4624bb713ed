"""Loaders for the bundled sample and for common corpus formats.

* :func:`load_debian_sample` -- the small corpus shipped in the package
  (2,500 Debian package descriptions; see ``data/README.md``);
* :func:`read_text_corpus` -- documents from text (one per line), JSON lines,
  CSV or Parquet with a text column;
* :func:`read_reuters21578` -- the Reuters-21578 SGML files (not shipped:
  research use only), as ``(newid, lewis_split, text)`` tuples;
* :func:`read_uci_bow`, :func:`read_count_vectors`, :func:`read_movielens`,
  :func:`read_libsvm` -- see :mod:`pystrads.datasets.readers`.
"""

from __future__ import annotations

import gzip
import html
import os
import re
from typing import List, Optional, Tuple

from ..errors import InputError
from .readers import read_count_vectors, read_libsvm, read_movielens, read_uci_bow  # noqa: F401

DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
DEBIAN_SAMPLE = os.path.join(DATA_DIR, "debian_sample.jsonl.gz")


def load_debian_sample(spark):
    """The bundled sample as a DataFrame ``(package string, text string)``."""
    import json
    import pkgutil

    # through the package loader: works from a zip on --py-files too, where the path does not exist
    raw = pkgutil.get_data(__name__, "data/debian_sample.jsonl.gz")
    rows = [json.loads(line) for line in gzip.decompress(raw).decode("utf-8").splitlines() if line.strip()]
    return spark.createDataFrame([(r["package"], r["text"]) for r in rows], "package string, text string")


def read_text_corpus(spark, path: str, fmt: Optional[str] = None, text_col: str = "text"):
    """Documents as a DataFrame with a string column ``text``.

    ``fmt``: ``"text"`` (one document per line), ``"jsonl"``, ``"csv"`` (with a
    header) or ``"parquet"``; guessed from the file name when omitted.
    """
    if fmt is None:
        name = path.lower().rstrip("/")
        for ending, guess in ((".parquet", "parquet"), (".csv", "csv"), (".csv.gz", "csv"),
                              (".jsonl", "jsonl"), (".jsonl.gz", "jsonl"), (".json", "jsonl")):
            if name.endswith(ending):
                fmt = guess
        fmt = fmt or "text"
    if fmt == "text":
        df = spark.read.text(path).withColumnRenamed("value", "text")
        return df.where("length(trim(text)) > 0")
    if fmt == "jsonl":
        df = spark.read.json(path)
    elif fmt == "csv":
        df = spark.read.option("header", True).option("multiLine", True).option("escape", '"').csv(path)
    elif fmt == "parquet":
        df = spark.read.parquet(path)
    else:
        raise InputError(f"format {fmt!r} is not one of text, jsonl, csv, parquet")
    if text_col not in df.columns:
        raise InputError(f"text column {text_col!r} is not in {path} (columns: {df.columns}); pass the right "
                         "column name (--text-col)")
    return df.withColumnRenamed(text_col, "text") if text_col != "text" else df


_REUTERS = re.compile(r"<REUTERS([^>]*)>(.*?)</REUTERS>", re.S)
_ATTR = re.compile(r'(\w+)="([^"]*)"')


def _tag(body: str, name: str) -> str:
    m = re.search(rf"<{name}>(.*?)</{name}>", body, re.S)
    return m.group(1) if m else ""


def read_reuters21578(directory: str) -> List[Tuple[int, str, str]]:
    """``(newid, lewissplit, title + body)`` for every Reuters-21578 document with text.

    Reads ``reut2-*.sgm`` or ``reut2-*.sgm.gz`` as Latin-1 and unescapes SGML
    entities. The collection is for research use: it is not shipped here.
    """
    names = sorted(n for n in os.listdir(directory) if re.match(r"reut2-\d+\.sgm(\.gz)?$", n))
    if not names:
        raise InputError(f"no reut2-*.sgm files in {directory}")
    docs = []
    for name in names:
        opener = gzip.open if name.endswith(".gz") else open
        with opener(os.path.join(directory, name), "rt", encoding="latin-1") as fh:
            raw = fh.read()
        for attrs, body in _REUTERS.findall(raw):
            a = dict(_ATTR.findall(attrs))
            text = (_tag(body, "TITLE") + "\n" + _tag(body, "BODY")).strip()
            text = html.unescape(re.sub(r"&#\d+;", " ", text))
            if text:
                docs.append((int(a.get("NEWID", -1)), a.get("LEWISSPLIT", ""), text))
    return docs
