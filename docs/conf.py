"""Sphinx configuration of pystrads' documentation site: the guides (Markdown, through
myst-parser) and the API reference (autodoc + autosummary + numpydoc, what pyspark and
scikit-learn use), one page per public class with its params, their defaults and its methods.

    python -m sphinx -W --keep-going -b html docs docs/_build/html

Warnings are errors; members a class inherits from pyspark are not documented here (their
docstrings are pyspark's), only pystrads' own.  No network is needed.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the checkout's pystrads, installed or not
sys.path.insert(0, os.path.join(HERE, "_ext"))

project = "pystrads"
author = "the pystrads authors"
from pystrads import __version__ as release  # noqa: E402

version = release
root_doc = "site"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.autosummary", "numpydoc", "myst_parser", "pystrads_api"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "bench-data", "api/generated/*.md"]
templates_path = ["_templates"]

autosummary_generate = True
autosummary_imported_members = False
autodoc_default_options = {"members": True, "undoc-members": False, "inherited-members": False,
                           "show-inheritance": True, "member-order": "groupwise"}
autodoc_typehints = "none"  # the signatures show the defaults; the types read as the docstrings say
autodoc_mock_imports = []
numpydoc_show_class_members = False  # autodoc lists the members once, with their docs
numpydoc_validation_checks = set()
numpydoc_xref_param_type = False

myst_heading_anchors = 3  # the guides link to each other's sections by their GitHub anchors
# the guides also link to files outside the site (the README, jobs/, conf/): GitHub renders those
suppress_warnings = ["myst.xref_missing"]

html_theme = "alabaster"
html_title = f"pystrads {release}"
html_static_path = []
