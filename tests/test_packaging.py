"""The package as users get it: the wheel and the sdist, each installed into
a fresh virtual environment and used from outside the source tree."""
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IN_SOURCE_TREE = os.path.exists(os.path.join(ROOT, "pyproject.toml"))

pytestmark = [
    pytest.mark.timeout(420),
    pytest.mark.skipif(not IN_SOURCE_TREE, reason="builds the package from a source tree"),
    pytest.mark.skipif(os.environ.get("PYSHMLOCK_SANITIZED_RUN") == "1",
                       reason="not under the sanitizer run"),
]

SMOKE = r"""
import os, sys, uuid
import pyshmlock
assert not pyshmlock.__file__.startswith(sys.argv[1]), pyshmlock.__file__
name = f"wheel-smoke-{os.getpid()}-{uuid.uuid4().hex[:8]}"
lk = pyshmlock.RWLock(name)
try:
    assert lk.acquire_read(timeout=1)
    lk.release_read()
    assert lk.pause() and lk.paused
    assert lk.resume(timeout=1) and not lk.paused
    assert lk.acquire_write(timeout=1)
    lk.release_write()
finally:
    lk.close()
    pyshmlock.unlink(name, force=True)
print("smoke ok", pyshmlock.__version__)
"""


def _run(cmd, cwd, timeout=300):
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{cmd} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p.stdout


def _venv(path):
    _run([sys.executable, "-m", "venv", str(path)], cwd=str(path.parent))
    return str(path / "bin" / "python")


def _project_version():
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        for line in f:
            if line.startswith("version = "):
                return line.split('"')[1]
    raise AssertionError("no version in pyproject.toml")


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """One wheel and one sdist built from this tree (a copy of it, so the
    build leaves nothing in the checkout)."""
    out = tmp_path_factory.mktemp("dist")
    src = out / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*.so", "_shmlock.c"))
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
         cwd=str(out))
    _run([sys.executable, "-m", "build", "--sdist", "--outdir", str(out), str(src)],
         cwd=str(out))
    wheels = [f for f in os.listdir(out) if f.endswith(".whl")]
    sdists = [f for f in os.listdir(out) if f.endswith(".tar.gz")]
    assert len(wheels) == 1 and len(sdists) == 1, os.listdir(out)
    return out, out / wheels[0], out / sdists[0]


def test_wheel_is_abi3_and_works_in_a_fresh_venv(dist, tmp_path):
    out, wheel, _ = dist
    assert "-cp39-abi3-" in wheel.name, wheel.name
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        sos = [n for n in names if n.endswith(".so")]
        assert sos and all(".abi3.so" in n for n in sos), sos
        assert not any(n.endswith("_build.py") for n in names), "build script shipped"
        z.extractall(tmp_path / "unpacked")
    # The installed shared objects export the lock's API and nothing else of ours.
    for so in sos:
        syms = _run(["nm", "-D", "--defined-only", str(tmp_path / "unpacked" / so)],
                    cwd=str(tmp_path))
        assert "floor_" not in syms, f"{so} exports benchmark floors"
    py = _venv(tmp_path / "venv")
    _run([py, "-m", "pip", "install", "-q", str(wheel)], cwd=str(tmp_path))
    got = _run([py, "-c", SMOKE, ROOT], cwd=str(tmp_path))
    assert got.strip() == f"smoke ok {_project_version()}"


def test_sdist_carries_tests_docs_model_and_passes_its_tests(dist, tmp_path):
    out, _, sdist = dist
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
        t.extractall(tmp_path / "unpacked")
    for needed in ("LICENSE", "CHANGELOG.md", "Makefile", "README.md", "csrc/core/protocol.c",
                   "csrc/shmlock.h", "tests/conftest.py", "docs/DESIGN.md",
                   "docs/OPERATIONS.md", "verify/shmlock.pml", "verify/run.py"):
        assert needed in names, f"{needed} missing from {sdist.name}"
    assert not any(n.endswith(".so") for n in names)
    tree = tmp_path / "unpacked" / sdist.name[:-len(".tar.gz")]
    py = _venv(tmp_path / "venv")
    _run([py, "-m", "pip", "install", "-q", f"{sdist}", "pytest", "pytest-timeout",
          "hypothesis"], cwd=str(tmp_path))
    # Its own tests, run from the unpacked sdist against the installed package.
    # The sdist's pyshmlock/ has no compiled core, so the import must come
    # from site-packages: pytest puts only tests/ on the path (for conftest),
    # and the working directory is outside the tree.
    # (The semantics suite, which exercises every call across processes; the
    # whole suite runs from the checkout already.)
    _run([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tree),
          "-o", "addopts=", str(tree / "tests" / "test_semantics.py")],
         cwd=str(tmp_path), timeout=300)
