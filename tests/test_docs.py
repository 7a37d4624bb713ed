"""The documentation's examples run, its links resolve and its generated pages are current.

* Every ```python block of README.md and docs/*.md runs on the test session's ``local[2]``:
  a page's blocks in order, in one namespace (like a notebook's cells), with ``spark`` already
  defined. A block that cannot run here (it needs a cluster, a Connect server, ...) is marked
  by an HTML comment on the line before its fence, ``<!-- no-run: why -->``, and there are
  few. :data:`CHECKS` then tests what each page's examples print or compute.
* The examples in the package's docstrings run as doctests, with ``spark`` and a tiny
  ``df`` (label, features) defined.
* Every relative link (and ``#anchor``) in README.md and docs/*.md points at a file or
  heading that exists.
* docs/configuration.md is the build of conf/pystrads-defaults.conf
  (``python docs/build_configuration.py`` rewrites it), and every table of
  docs/benchmarks.md is a marked block built from the benchmark JSON in docs/bench-data/
  (``python docs/build_benchmarks.py``), naming its command, machine and date.
* The code map in docs/architecture.md lists every module of ``pystrads/``, and no other.
* README.md, docs/, ``pystrads/`` and conf/ carry no development history: no numbered work
  items ("issue 17", "session 22", "#12"), no names that encode one, no removed runtime.
"""

import contextlib
import doctest
import glob
import importlib
import importlib.util
import io
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
NO_RUN = re.compile(r"^<!--\s*no-run:\s*\S.*-->\s*$")
#: the no-run blocks stay the exception: raise this only with a reason
MAX_NO_RUN = 4


def code_blocks(text):
    """``[(line number of the first code line, code, runnable)]`` for every ```python block."""
    lines = text.split("\n")
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            prev = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            end = lines.index("```", i + 1)
            blocks.append((i + 2, "\n".join(lines[i + 1:end]) + "\n", not NO_RUN.match(prev.strip())))
            i = end
        elif lines[i].lstrip().startswith("```python"):
            raise AssertionError(f"line {i + 1}: write python blocks as a bare ```python fence at the line start "
                                 "(mark blocks that cannot run with <!-- no-run: why --> on the line before)")
        i += 1
    return blocks


def page_blocks(page):
    with open(os.path.join(ROOT, page), encoding="utf-8") as fh:
        return code_blocks(fh.read())


RUNNABLE = [p for p in PAGES if any(run for _, _, run in page_blocks(p))]


def run_page(page, spark):
    """Runs the page's runnable blocks in order; returns (namespace, stdout of each block)."""
    ns = {"__name__": "docs_example", "spark": spark}
    outputs = []
    for first_line, code, runnable in page_blocks(page):
        if not runnable:
            continue
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            # padded so a traceback names the line of the page itself
            exec(compile("\n" * (first_line - 1) + code, os.path.join(ROOT, page), "exec"), ns)
        outputs.append(out.getvalue())
    return ns, outputs


def _check_readme(ns, outputs):
    lda, mf, lasso = outputs
    assert len(re.findall(r"^topic \d+: \w+ \w+ \w+ \w+ \w+$", lda, re.M)) == 8, lda
    assert "prediction" in mf and "recommendations" in mf, mf
    nnz, r2 = re.search(r"^(\d+) non-zeros; r2 ([-\d.]+)$", lasso, re.M).groups()
    assert 0 < int(nnz) < 2000 and float(r2) > 0.5, lasso
    assert "probability" in lasso and ns["clf"].numClasses == 2


def _check_lda(ns, outputs):
    out, learned, sharp = outputs
    assert out.rstrip().splitlines()[-1] == "True", out
    lda = ns["lda"]
    assert lda.summary.totalIterations == 15 and lda.getK() == 10
    assert lda.topicsMatrix().toArray().sum() == lda.summary.numTokens
    low, high = map(float, re.search(r"^learned alpha ([\d.]+) \.\. ([\d.]+), sum", learned, re.M).groups())
    assert low < high < 5.0, learned  # no longer the symmetric start (5.0 each)
    updates = ns["learned"].summary.iterations.dropna(subset=["alpha_sum"])
    assert updates["iteration"].tolist() == [5, 10, 15], learned
    beta = float(re.search(r"^learned beta ([\d.]+) \(start: 0.1\)$", sharp, re.M).group(1))
    assert 0 < beta < 0.1 and beta == pytest.approx(ns["sharp"].estimatedTopicConcentration(), abs=1e-4), sharp
    assert ns["sharp"].summary.iterations.dropna(subset=["beta"])["iteration"].tolist() == [5, 10, 15, 20]


def _check_mf(ns, outputs):
    out, implicit_out = outputs
    rmse = float(out.splitlines()[0])
    assert 0 < rmse < 1.0, out  # ratings on 0.5-5 from a rank-4 model with noise 0.25
    assert ns["model"].rank == 10 and ns["model"].itemFactors.count() > 0
    history = ns["history"]  # implicit feedback: 10 iterations, the objective never increases
    assert len(history) == 10 and history[-1] < history[0] and "recommendations" in implicit_out


def _check_lasso(ns, outputs):
    (out,) = outputs
    assert float(out.splitlines()[0]) > 0.5, out
    assert 0 < sum(1 for c in ns["model"].coefficients if c) < 2000
    assert "probability" in out
    multi = ns["multi"]  # the multinomial example: five classes, MLlib's shapes and centred intercepts
    assert multi.isMultinomial and multi.numClasses == multi.coefficientMatrix.numRows == 5
    assert abs(sum(multi.interceptVector)) < 1e-9 and out.splitlines()[-1].startswith("5 ")


def _check_programs(ns, outputs):
    engine_rdd, _, serial, engine_df = outputs  # (the third block: serial mode)
    assert serial.splitlines()[0] == "True", serial
    assert engine_rdd.splitlines()[0] == "[100. 100. 100. 100. 100.]", engine_rdd
    assert engine_df.splitlines()[0] == "[100. 100. 100. 100. 100.]", engine_df


def _check_user_guide(ns, outputs):
    stopping, out = outputs
    total, best, stopped = stopping.splitlines()[0].split()
    assert stopped == "True" and int(total) == int(best) + 2 < 30, stopping  # the rule ended the fit
    assert "validation_rmse" in stopping
    assert out.splitlines()[0] == "2", out
    assert "(3,[0,2],[0.5,2.0])" in out, out


#: what each page's examples must print or compute (a page not listed only has to run)
CHECKS = {
    "README.md": _check_readme,
    "docs/lda.md": _check_lda,
    "docs/mf.md": _check_mf,
    "docs/lasso.md": _check_lasso,
    "docs/programs.md": _check_programs,
    "docs/user-guide.md": _check_user_guide,
}


#: the pages whose examples fit models for tens of seconds: they run with the slow scenarios
SLOW_PAGES = ("README.md", "docs/lda.md", "docs/lasso.md", "docs/mf.md")


@pytest.mark.parametrize("page", [pytest.param(p, marks=pytest.mark.slow) if p in SLOW_PAGES else p
                                  for p in RUNNABLE])
def test_page_examples_run(spark, page):
    ns, outputs = run_page(page, spark)
    if page in CHECKS:
        CHECKS[page](ns, outputs)


def test_every_checked_page_has_examples_and_no_run_blocks_are_few():
    assert set(CHECKS) <= set(RUNNABLE), set(CHECKS) - set(RUNNABLE)
    skipped = [(p, line) for p in PAGES for line, _, run in page_blocks(p) if not run]
    assert len(skipped) <= MAX_NO_RUN, skipped


def test_block_extraction_honours_no_run_markers():
    text = ("x\n```python\na = 1\n```\n\n<!-- no-run: needs YARN -->\n```python\nb = 2\n```\n"
            "<!-- no-run -->\n```python\nc = 3\n```\n```bash\nls\n```\n")
    # a bare <!-- no-run --> (no reason) does not count: the block runs
    assert code_blocks(text) == [(3, "a = 1\n", True), (8, "b = 2\n", False), (12, "c = 3\n", True)]


def test_a_broken_example_fails_naming_its_page_and_line(spark, tmp_path):
    page = tmp_path / "broken.md"
    page.write_text("# broken\n\n```python\nx = 1\ny = x / 0\n```\n")
    with pytest.raises(ZeroDivisionError) as info:
        run_page(str(page), spark)
    frames = [(f.filename, f.lineno) for f in __import__("traceback").extract_tb(info.tb)]
    assert (str(page), 5) in frames


# -- docstrings -------------------------------------------------------------------------------

def _modules_with_examples():
    found = []
    for path in sorted(glob.glob(os.path.join(ROOT, "pystrads", "**", "*.py"), recursive=True)):
        if ">>>" in open(path, encoding="utf-8").read():
            rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
            found.append(rel[: -len(".__init__")] if rel.endswith(".__init__") else rel)
    return found


#: the modules whose examples fit estimators for over ten seconds: they run with the slow scenarios
SLOW_MODULES = ("pystrads.ml.lda", "pystrads.ml.regression")


@pytest.mark.parametrize("module", [pytest.param(m, marks=pytest.mark.slow) if m in SLOW_MODULES else m
                                    for m in _modules_with_examples()])
def test_docstring_examples_run(spark, module):
    from pyspark.ml.linalg import Vectors

    df = spark.createDataFrame([(1.0, Vectors.sparse(3, [0], [1.0])), (0.0, Vectors.sparse(3, [1], [1.0])),
                                (2.0, Vectors.sparse(3, [0, 2], [2.0, 1.0])), (0.5, Vectors.sparse(3, [2], [0.5]))],
                               ["label", "features"])
    mod = importlib.import_module(module)
    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    tests = [t for t in finder.find(mod, module, globs={"spark": spark, "df": df}) if t.examples]
    assert tests, f"{module} has '>>>' but no doctest was found"
    out = io.StringIO()
    for t in tests:
        runner.run(t, out=out.write)
    assert runner.failures == 0, out.getvalue()


# -- links and generated pages ----------------------------------------------------------------
def _load_script(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "docs", name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module



def _anchors(path):
    """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens."""
    ids = set()
    with open(path, encoding="utf-8") as fh:
        in_code = False
        for line in fh:
            if line.startswith("```"):
                in_code = not in_code
            m = None if in_code else re.match(r"^#{1,6}\s+(.*?)\s*$", line)
            if m:
                ids.add(re.sub(r"\s", "-", re.sub(r"[^\w\- ]", "", m.group(1).lower())))
    return ids


def test_relative_links_and_anchors_resolve():
    broken = []
    for page in PAGES:
        text = open(os.path.join(ROOT, page), encoding="utf-8").read()
        text = re.sub(r"```.*?```", "", text, flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue
            file_part, _, anchor = target.partition("#")
            path = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), file_part)) if file_part \
                else os.path.join(ROOT, page)
            if not os.path.exists(path):
                broken.append(f"{page}: {target} (no such file)")
            elif anchor and path.endswith(".md") and anchor not in _anchors(path):
                broken.append(f"{page}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


#: what names a document outside the repository: the sibling folder the development machine has
OUTSIDE_WORDS = re.compile(r"\.\./shared\b|\bdesign\.md\b|\bshared/(papers|data|design)\b|the design document")


def outside_references(page_path, text):
    """The references of a page to documents outside the repository: relative links that leave
    it, and names of the development machine's documents."""
    found = [m.group(0) for m in OUTSIDE_WORDS.finditer(text)]
    for target in re.findall(r"\]\(([^)\s#]+)", text):
        if re.match(r"^[a-z]+:", target):
            continue  # a URL
        path = os.path.normpath(os.path.join(os.path.dirname(page_path), target))
        if not path.startswith(ROOT + os.sep):
            found.append(target)
    return found


def test_the_architecture_page_stays_a_read_of_at_most_400_lines():
    lines = open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8").read().splitlines()
    assert len(lines) <= 400, f"docs/architecture.md has {len(lines)} lines: keep its records short"


def test_docs_name_no_document_outside_the_repository():
    found = {page: outside_references(os.path.join(ROOT, page), open(os.path.join(ROOT, page), encoding="utf-8").read())
             for page in PAGES}
    assert not any(found.values()), {page: refs for page, refs in found.items() if refs}
    page = os.path.join(ROOT, "docs", "x.md")
    assert outside_references(page, "see [the design](../../shared/design.md) and ../shared/data") == \
        ["../shared", "design.md", "../shared", "../../shared/design.md"]
    assert outside_references(page, "[ok](lda.md#priors) [ok](../README.md) [url](https://x.org/a.md)") == []


def test_configuration_reference_is_the_build_of_the_conf_file():
    build = _load_script("build_configuration")
    assert build.main(["--check"]) == 0, "docs/configuration.md is stale: run python docs/build_configuration.py"
    page = open(os.path.join(ROOT, "docs", "configuration.md"), encoding="utf-8").read()
    from pystrads.config import DEFAULTS, PREFIX

    for key in DEFAULTS:
        assert f"`{PREFIX}{key}`" in page, key



def test_differences_from_mllib_are_the_build_of_the_estimators_declarations():
    build = _load_script("build_differences")
    assert build.main(["--check"]) == 0, "docs/user-guide.md is stale: run python docs/build_differences.py"
    table = build.table()
    for name, counterpart, param, kind, _ in build.rows():
        assert f"| `{name}` | `{counterpart}.{param}` | {kind} |" in table
    assert ("StradsLasso", "LinearRegression", "loss", "refused") in [r[:4] for r in build.rows()]
    with pytest.raises(ValueError, match="no <!-- differences-table -->"):
        build.build("# a page without the block\n")


def test_configuration_build_refuses_a_conf_file_that_misses_a_key(tmp_path, monkeypatch):
    build = _load_script("build_configuration")
    text = open(build.CONF, encoding="utf-8").read()
    conf = tmp_path / "pystrads-defaults.conf"
    conf.write_text(re.sub(r"(?m)^spark\.pystrads\.step\.maxRounds .*$", "", text))
    monkeypatch.setattr(build, "CONF", str(conf))
    with pytest.raises(ValueError, match=r"only in the registry \['step\.maxRounds'\]"):
        build.build()


def tables_outside_generated_blocks(text):
    """Line numbers of the markdown table rows (lines starting with ``|``) that no
    ``<!-- bench-table: NAME -->`` ... ``<!-- /bench-table -->`` block holds."""
    outside, inside = [], False
    for number, line in enumerate(text.split("\n"), 1):
        if re.match(r"^<!-- bench-table: \S+ -->$", line):
            inside = True
        elif line.startswith("<!-- /bench-table -->"):
            inside = False
        elif line.startswith("|") and not inside:
            outside.append(number)
    return outside


def test_every_benchmark_table_is_generated():
    build = _load_script("build_benchmarks")
    page = open(build.PAGE, encoding="utf-8").read()
    assert not tables_outside_generated_blocks(page), (
        f"docs/benchmarks.md lines {tables_outside_generated_blocks(page)}: a table outside a generated block; "
        "write the job's JSON to docs/bench-data/ and mark the table (docs/build_benchmarks.py)")
    assert build.main(["--check"]) == 0, "docs/benchmarks.md is stale: run python docs/build_benchmarks.py"
    # a hand-copied table is caught, inside a block or not
    assert tables_outside_generated_blocks("text\n\n| a | b |\n|---|---|\n| 1 | 2 |\n") == [3, 4, 5]
    assert tables_outside_generated_blocks("<!-- bench-table: x -->\n| a |\n<!-- /bench-table -->\n| b |\n") == [4]


def test_benchmark_tables_are_the_build_of_their_json():
    build = _load_script("build_benchmarks")
    page = open(build.PAGE, encoding="utf-8").read()
    marked = build.MARKED.findall(page)
    assert {name for _, name, _, _ in marked} == set(build.TABLES)
    for _, name, block, _ in marked:
        caption, _, table = block.partition("\n\n")
        # each table names the command, the machine and the date of its run, and its JSON
        assert re.match(r"^Command: `python3? jobs/\w+\.py[^`]*` · machine: [^·]+ · run of \d{4}-\d{2}-\d{2} · "
                        r"data: \[`bench-data/\w+\.json`\]", caption), (name, caption)
        assert table.count("\n") >= 3, name  # header, rule, at least one row
    # an edited figure is caught
    first = marked[0][2].rstrip("\n").split("\n")[-1]
    edited = re.sub(r"\d(?=[^\d]*$)", lambda m: str((int(m.group()) + 1) % 10), first)
    assert edited != first and build.build(page.replace(first, edited)) == page


# -- the code map ------------------------------------------------------------------------------

def code_map():
    """``{entry: text}`` of the code map in docs/architecture.md: an entry is a line of the
    block under "Where the code is" that starts with a folder or module of ``pystrads/``,
    with the lines indented below it."""
    text = open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8").read()
    block = text.split("## Where the code is", 1)[1].split("```", 2)[1]
    entries, key = {}, None
    for line in block.split("\n"):
        if re.match(r"^  \S", line):
            key = line.split()[0]
            entries[key] = line
        elif key and line.startswith("   "):
            entries[key] += " " + line.strip()
        else:
            key = None  # pystrads/ itself, and what lies outside it (jobs/)
    return entries


def test_the_code_map_lists_every_module_and_no_other():
    entries = code_map()
    package = os.path.join(ROOT, "pystrads")
    unlisted = []
    for path in sorted(glob.glob(os.path.join(package, "**", "*.py"), recursive=True)):
        parts = os.path.relpath(path, package).split(os.sep)
        if parts[-1] == "__init__.py":
            continue
        listed = parts[0] in entries if len(parts) == 1 else \
            re.search(rf"(?<![\w/]){re.escape(parts[-1])}", entries.get(parts[0] + "/", ""))
        if not listed:
            unlisted.append("/".join(parts))
    assert not unlisted, f"docs/architecture.md's code map misses {unlisted}: say what each holds"
    gone = [f"{key} {name}" for key, text in entries.items() if key.endswith("/")
            for name in re.findall(r"\b\w+\.py\b", text)
            if not glob.glob(os.path.join(package, key, "**", name), recursive=True)]
    assert not gone, f"docs/architecture.md's code map names modules that do not exist: {gone}"


# -- the docs describe the product as it is -----------------------------------------------------

#: numbered work items ("issue 17", "session 22", "work item 3", "#12") and names that encode
#: one ("lasso_strads_s22", "s21"): the history lives in git, not in the docs or the code
WORK_ITEM = re.compile(r"\b(?:issue|session|work[ -]?item|ticket|sprint)s?\s*#?\d+|(?<![\w&#/])#\d{1,3}\b"
                       r"|\b\w+_s\d{1,3}\b|\bs\d{2}\b", re.I)
#: the narrative of how the docs' subject changed, and the runtime that was removed
HISTORY = re.compile(r"runtime\.mode|\b(?:first|resident|step) runtime\b|\bkept (?:one|a) release\b"
                     r"|\bkept\b.{0,40}\bfor comparison\b|\bwe (?:first )?tried\b|\blater changed\b", re.I)


def _product_files():
    """(path, text, patterns) of what users read: the README, docs/, the package and conf/."""
    def files(pattern):
        return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern), recursive=True)
                      if os.path.isfile(p))

    pages = ["README.md"] + files("docs/**/*.md")
    code, conf = files("pystrads/**/*.py"), files("conf/*")
    for paths, patterns in ((pages, (WORK_ITEM, HISTORY)), (code + conf, (WORK_ITEM,))):
        for path in paths:
            yield path, open(os.path.join(ROOT, path), encoding="utf-8").read(), patterns


def history_lines(text, patterns):
    return [(n, m.group()) for n, line in enumerate(text.split("\n"), 1) for pattern in patterns
            for m in pattern.finditer(line)]


def test_docs_and_code_carry_no_development_history():
    found = [f"{path}:{n}: {hit!r}" for path, text, patterns in _product_files()
             for n, hit in history_lines(text, patterns)]
    assert not found, ("development history (work-item numbers, a removed runtime) in what users read; "
                       "say what the product does now, git keeps the rest:\n" + "\n".join(found))


def test_history_check_catches_work_items_and_spares_plain_text():
    caught = ["as issue 12 asks", "Session 22 re-measured", "see #17", "(issue #6)", "work item 3",
              "table lasso_strads_s19", "the s22 run", "runtime.mode=steps", "the first runtime",
              "kept one release for comparison"]
    for line in caught:
        assert history_lines(line, (WORK_ITEM, HISTORY)), line
    plain = ["the schedule's work items", "an issue with the input", "the session's `spark`",
             "## 10⁹ parameters", "[link](#lasso-layout)", "color &#123;", "x[0]  # 3 rounds",
             "the same fit with α fixed, for comparison", "2 cores, 24 GiB", "s2 = 0.5"]
    for line in plain:
        assert not history_lines(line, (WORK_ITEM, HISTORY)), line
