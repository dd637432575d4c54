"""The README's documentation command works as written: in a fresh clone of
the repository, from its root, in a fresh virtual environment (the command
installs into the active one), `pip install '.[docs]' && python -m sphinx -b
html docs docs/_build/html` builds the site from the installed package.  And
there, where the unbuilt checkout shadows that installed copy, importing
pyshmlock says to run from another directory.

The clone is of the committed tree (HEAD), as a user's would be.  It needs
git and a package index; without either it skips, saying which."""
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = [
    # One pip install (the C core built once, Sphinx from pip's cache) and
    # one site build: about a minute on 2 shared CPUs.
    pytest.mark.timeout(300),
    pytest.mark.skipif(shutil.which("git") is None, reason="needs git, to clone the tree"),
    pytest.mark.skipif(not os.path.isdir(os.path.join(ROOT, ".git"))
                       and not os.path.isfile(os.path.join(ROOT, ".git")),
                       reason="not a git checkout (an sdist): nothing to clone"),
    pytest.mark.skipif(os.environ.get("PYSHMLOCK_SANITIZED_RUN") == "1",
                       reason="not under the sanitizer run"),
]


def readme_docs_command():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    m = re.search(r"`(pip install '\.\[docs\]' &&\s+python -m sphinx [^`]+)`", readme)
    assert m, "the README's documentation command moved: update this test"
    return " ".join(m.group(1).split())


def _environ(venv):
    """The environment a user's shell has with `venv` activated: nothing of
    the suite's (PYTHONSAFEPATH would hide the very problem)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONSAFEPATH", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = f"{venv}/bin:{env.get('PATH', '/usr/bin:/bin')}"
    return env


def _index_reachable(env):
    try:
        p = subprocess.run(["python", "-m", "pip", "install", "--dry-run", "--no-deps", "-q",
                            "sphinx"], env=env, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return False
    return p.returncode == 0


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """(clone dir, venv, environment, the command's result)."""
    top = tmp_path_factory.mktemp("docs-command")
    src = top / "pyshmlock"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", ROOT, str(src)], check=True,
                   capture_output=True, timeout=120)
    venv = top / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True,
                   capture_output=True, timeout=120)
    env = _environ(venv)
    if not _index_reachable(env):
        pytest.skip("no package index reachable: the command installs from one")
    done = subprocess.run(["bash", "-c", readme_docs_command()], cwd=str(src), env=env,
                          capture_output=True, text=True, timeout=270)
    return src, venv, env, done


def test_readme_docs_command_builds_the_site_from_a_fresh_clone(clone):
    src, venv, env, done = clone
    assert done.returncode == 0, f"{readme_docs_command()} exited {done.returncode}:\n" \
                                 f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    site = src / "docs" / "_build" / "html"
    assert (site / "index.html").is_file()
    # autodoc imported the installed package: the reference has its classes
    assert "pyshmlock.RWLock.acquire_read" in (site / "api.html").read_text()


def test_an_unbuilt_checkout_shadowing_the_installed_package_says_where_to_run(clone):
    src, venv, env, done = clone
    assert done.returncode == 0, done.stderr[-3000:]
    p = subprocess.run(["python", "-c", "import pyshmlock"], cwd=str(src), env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "Run from another directory" in p.stderr, p.stderr[-3000:]
    assert str(venv) in p.stderr, p.stderr[-3000:]       # names the installed copy
    elsewhere = subprocess.run(["python", "-c", "import pyshmlock; print(pyshmlock.__file__)"],
                               cwd=str(src / "docs"), env=env, capture_output=True,
                               text=True, timeout=60)
    assert elsewhere.returncode == 0 and str(venv) in elsewhere.stdout, elsewhere.stderr
