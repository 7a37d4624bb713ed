"""The README's Program API example runs and prints what it says."""

import contextlib
import io
import re


def test_readme_program_example_runs(spark):
    text = open("README.md").read()
    code = re.search(r"### Your own algorithm: write a Program\n\n```python\n(.*?)```", text, re.S).group(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {"__name__": "readme_example"})
    first = out.getvalue().splitlines()[0]
    assert first == "[100. 100. 100. 100. 100.]"
