"""The virtual environment the SGLang processes run in.

Built once per pinned requirement set (the key is a hash of
requirements.txt and the interpreter's version) under
~/.cache/pyshmlock-tests/, with `pip install --no-deps -r requirements.txt`:
no resolver runs, so nothing can pull a CUDA build of torch.  The pyshmlock
under test is installed into it from this checkout (`pip install --no-deps
<repo root>`), again whenever the checkout's sources change."""

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import List

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
REQUIREMENTS = HERE / "requirements.txt"
CACHE = Path(os.environ.get("PYSHMLOCK_TEST_CACHE",
                            Path.home() / ".cache" / "pyshmlock-tests"))
SOURCES = ("pyshmlock", "csrc", "setup.py", "pyproject.toml", "MANIFEST.in")


def requirements_key() -> str:
    digest = hashlib.sha256(REQUIREMENTS.read_bytes())
    digest.update(sys.version.split()[0].encode())
    return digest.hexdigest()[:16]


def sources_key() -> str:
    digest = hashlib.sha256()
    for top in SOURCES:
        path = REPO / top
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for f in files:
            if "__pycache__" in f.parts or f.suffix in (".so", ".o", ".pyc"):
                continue
            digest.update(str(f.relative_to(REPO)).encode())
            digest.update(f.read_bytes())
    return digest.hexdigest()[:16]


def _run(cmd: List[str], log: Path) -> None:
    with open(log, "a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=900)
    if done.returncode != 0:
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({done.returncode}):\n{tail}")


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def ensure() -> Path:
    """The venv's directory, built or updated if needed (under a file lock,
    so two test runs do not build it at once)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    venv = CACHE / f"sglang-venv-{requirements_key()}"
    with open(CACHE / "sglang-venv.lock", "w") as lockfile:
        fcntl.flock(lockfile, fcntl.LOCK_EX)
        log = CACHE / "sglang-venv.log"
        if not (venv / ".complete").exists():
            started = time.monotonic()
            building = venv.with_name(venv.name + ".building")
            shutil.rmtree(building, ignore_errors=True)
            shutil.rmtree(venv, ignore_errors=True)
            log.write_text("")
            _run([sys.executable, "-m", "venv", str(building)], log)
            # --find-links: the SGLang wheel cached by the compatibility tests, if there.
            _run([str(python_of(building)), "-m", "pip", "install", "-q", "--no-deps",
                  "--find-links", str(CACHE), "-r", str(REQUIREMENTS)], log)
            building.rename(venv)  # python -m ... only: scripts keep the old path
            (venv / ".complete").write_text(f"{time.monotonic() - started:.1f}\n")
        marker = venv / ".pyshmlock-sources"
        key = sources_key()
        if not marker.exists() or marker.read_text() != key:
            _run([str(python_of(venv)), "-m", "pip", "install", "-q", "--no-deps",
                  "--force-reinstall", str(REPO)], log)
            marker.write_text(key)
    return venv


def build_seconds(venv: Path) -> float:
    """How long building the venv from scratch took (recorded at build)."""
    try:
        return float((venv / ".complete").read_text())
    except (OSError, ValueError):
        return float("nan")


if __name__ == "__main__":
    print(ensure())
