"""The README stays a document a person can read, and its set-up commands are
the ones CI and the package really use."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(path):
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def test_readme_is_sane():
    text = read("README.md")
    assert len(text) < 64 * 1024, "README.md grew past 64 KiB: a broken edit?"
    headings = re.findall(r"^## .+$", text, re.M)
    assert len(headings) == len(set(headings)) >= 6, headings


def test_readme_commands_are_the_real_ones():
    readme = read("README.md")
    ci = read(".ci/run").splitlines()
    test_cmd = ci[ci.index("# --- the README's test command, verbatim ---") + 1]
    assert test_cmd in readme
    assert "pip install '.[demo]' && pyshmlock demo" in readme
    assert 'pyshmlock = "pyshmlock.cli:main"' in read("pyproject.toml")


def test_operations_page_exists_and_is_linked():
    ops = read("docs/OPERATIONS.md")
    for topic in ("Choosing timeouts", "Data suspect", "A pause left on", "exits 3",
                  "A stale segment after a restart", "What to alert on"):
        assert topic.lower() in ops.lower(), topic
    assert "docs/OPERATIONS.md" in read("README.md")


def test_readme_sglang_snippet_names_its_stale_policy():
    readme = read("README.md")
    line = next(ln for ln in readme.splitlines() if 'AsyncRWLock(f"sglang-' in ln)
    assert 'stale="reset"' in line
