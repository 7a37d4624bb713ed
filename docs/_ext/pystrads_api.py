"""Sphinx extension of pystrads' API reference: a "Params" table on every page of a pyspark.ml
``Params`` class -- each param's name, default and meaning, read from a fresh instance, as
pyspark.ml users look them up (``explainParams``).  The params themselves are class attributes
autodoc would list as ``Param(parent='undefined', ...)`` reprs: they are left out of the member
list and shown here instead."""

from __future__ import annotations

import re

#: characters with a meaning in reStructuredText inline markup, escaped in the params' docs
_MARKUP = re.compile(r"([\\`*_|\[\]<>])")


def _escaped(text: str) -> str:
    return _MARKUP.sub(r"\\\1", " ".join(str(text).split()))


def _literal(text: str) -> str:
    """``text`` as an inline literal (a value's repr), its backquotes kept out of the markup."""
    return "``" + str(text).replace("``", "` `") + "``" if text else "(empty)"


#: defaults that are not one value: pyspark's HasSeed hashes the class name (per process)
SHOWN_DEFAULTS = {"seed": "a hash of the class name (as in pyspark.ml)"}


def shown_default(instance, param) -> str:
    """A param's default as the table shows it (reST)."""
    if param.name in SHOWN_DEFAULTS:
        return SHOWN_DEFAULTS[param.name]
    return _literal(repr(instance.getOrDefault(param))) if instance.hasDefault(param) else "(none)"


def params_table(cls) -> list:
    """The reST lines of ``cls``'s params table (empty for a class that is not a pyspark Params)."""
    from pyspark.ml.param import Params

    if not (isinstance(cls, type) and issubclass(cls, Params)):
        return []
    instance = cls()
    lines = ["", ".. rubric:: Params", "", ".. list-table::", "   :header-rows: 1", "   :widths: 22 18 60",
             "   :class: pystrads-params", "", "   * - param", "     - default", "     - meaning"]
    for param in sorted(instance.params, key=lambda p: p.name):
        lines += [f"   * - ``{param.name}``", f"     - {shown_default(instance, param)}",
                  f"     - {_escaped(param.doc)}"]
    return lines + [""]


def _add_params(app, what, name, obj, options, lines):
    if what == "class":
        lines.extend(params_table(obj))


def _skip_params(app, what, name, obj, skip, options):
    from pyspark.ml.param import Param

    if isinstance(obj, Param):
        return True  # shown in the params table
    return None


def setup(app):
    app.connect("autodoc-process-docstring", _add_params, priority=900)  # after numpydoc's rewrite
    app.connect("autodoc-skip-member", _skip_params)
    return {"version": "1", "parallel_read_safe": True}
