"""The documentation site (docs/conf.py): it builds without a warning, has a page for every
public class and function, and every estimator's and model's page shows each of its params
with its default -- in the HTML, and as headless Chromium renders it (where the Debian
package ``chromium`` is installed: .ci/run installs it)."""

import html
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
sys.path.insert(0, os.path.join(DOCS, "_ext"))

pytestmark = pytest.mark.slow  # a build of the whole site: .ci/run's slow step and its docs step


def build(source, out):
    """Build ``source`` into ``out`` as .ci/run does: warnings (and numpydoc's) are errors."""
    return subprocess.run([sys.executable, "-W", "error::UserWarning:numpydoc.docscrape", "-m", "sphinx", "-q", "-W",
                           "--keep-going", "-b", "html", source, out], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("site"))
    done = build(DOCS, out)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def _public():
    """``{qualified name: object}`` of the public API the reference documents."""
    import pystrads.engine as engine
    import pystrads.errors as errors
    import pystrads.ml as ml

    names = {f"pystrads.ml.{n}": getattr(ml, n) for n in ml.__all__}
    names.update({f"pystrads.engine.{n}": getattr(engine, n) for n in engine.__all__})
    names.update({f"pystrads.errors.{n}": v for n, v in vars(errors).items()
                  if isinstance(v, type) and issubclass(v, Exception) and v.__module__ == errors.__name__})
    return names


def _text(page):
    raw = re.sub(r"<(script|style)\b.*?</\1>", " ", page, flags=re.S)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", raw)).split())


def _expected_params(cls):
    """``[(name, default as the table shows it)]`` of a pyspark Params class."""
    from pystrads_api import SHOWN_DEFAULTS, params_table

    instance = cls()
    return [(p.name, SHOWN_DEFAULTS.get(p.name) or (repr(instance.getOrDefault(p)) if instance.hasDefault(p)
                                                    else "(none)"))
            for p in instance.params] if params_table(cls) else []


def test_every_public_class_and_function_has_its_page(site):
    errors_page = open(os.path.join(site, "api", "errors.html"), encoding="utf-8").read()
    missing = []
    for name, obj in _public().items():
        if name.startswith("pystrads.errors."):
            if f'id="{name}"' not in errors_page:
                missing.append(name)
        elif not os.path.exists(os.path.join(site, "api", "generated", f"{name}.html")):
            missing.append(name)
    assert not missing, f"no page for {missing}"


def test_every_params_page_shows_each_param_with_its_default(site):
    from pyspark.ml.param import Params

    checked = 0
    for name, cls in _public().items():
        if not (isinstance(cls, type) and issubclass(cls, Params)):
            continue
        text = _text(open(os.path.join(site, "api", "generated", f"{name}.html"), encoding="utf-8").read())
        table = text[text.index("Params param default meaning"):]
        for param, default in _expected_params(cls):
            assert re.search(rf"(^| ){re.escape(param)} {re.escape(default)} ", table), (name, param, default)
        checked += 1
    assert checked == 8  # the four estimators and their models


def test_a_class_page_as_chromium_renders_it_shows_every_param_and_default(site):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("headless Chromium is not installed (Debian package 'chromium'; .ci/run installs it)")
    page = os.path.join(site, "api", "generated", "pystrads.ml.StradsLDA.html")
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", f"file://{page}"],
                         capture_output=True, text=True, timeout=120).stdout
    text = _text(dom)
    assert "pystrads.ml.StradsLDA" in text
    from pystrads.ml import StradsLDA

    shown = text[text.index("Params param default meaning"):]
    for param, default in _expected_params(StradsLDA):
        assert f" {param} {default} " in f" {shown}", (param, default)


def test_params_table_lists_each_param_and_the_build_fails_on_a_bad_docstring(tmp_path):
    """The table holds every param (an unset default shown as such), and a docstring that is not
    valid reStructuredText fails the build."""
    from pystrads_api import params_table

    from pystrads.ml import StradsLasso

    lines = "\n".join(params_table(StradsLasso))
    assert lines.count("   * - ``") == len(StradsLasso().params)
    assert "   * - ``weightCol``\n     - (none)" in lines and "``'dynamic'``" in lines
    assert params_table(int) == []

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "broken_mod.py").write_text('def f():\n    """A *broken emphasis.\n\n    ``unclosed\n    """\n')
    (tmp_path / "src" / "conf.py").write_text(
        "import sys, os\nsys.path.insert(0, os.path.dirname(__file__))\nextensions = ['sphinx.ext.autodoc']\n")
    (tmp_path / "src" / "index.rst").write_text("T\n=\n\n.. autofunction:: broken_mod.f\n")
    done = build(str(tmp_path / "src"), str(tmp_path / "out"))
    assert done.returncode != 0 and "broken_mod.f" in done.stderr, done.stderr[-2000:]
