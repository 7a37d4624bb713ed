"""The README stays a front page: short, with the two quick-start commands CI relies on, and a
link to every page of docs/.  (Its examples run in tests/test_docs.py, with the docs' own.)"""

import glob
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")

#: the Quick start's two commands, byte for byte: .ci/run runs the second (between the
#: test-command markers), .ci/wheel-smoke and tests/test_jobs.py run the first one's job
INSTALL_AND_RUN = 'python3 -m pip install -e ".[plot]" && python3 jobs/lda.py'
TEST_COMMAND = 'python3 -m pip install -e ".[test]" && python3 -m pytest -q tests -m "not slow"'


def test_readme_is_at_most_200_lines():
    assert len(open(README, encoding="utf-8").read().splitlines()) <= 200


def test_quick_start_has_exactly_the_two_commands():
    text = open(README, encoding="utf-8").read()
    quick = text.split("## Quick start\n", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)```", quick, re.S)
    assert commands == [INSTALL_AND_RUN + "\n", TEST_COMMAND + "\n"]
    # .ci/run's own extraction (its awk line) finds the test command
    ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()
    awk = re.search(r"^cmd=\$\((.*)\)$", ci, re.M).group(1)
    out = subprocess.run(["bash", "-c", awk], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == TEST_COMMAND


def test_readme_links_every_docs_page():
    text = open(README, encoding="utf-8").read()
    linked = set(re.findall(r"\]\((docs/[^)#\s]+\.md)", text))
    pages = {os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))}
    assert pages <= linked, sorted(pages - linked)
