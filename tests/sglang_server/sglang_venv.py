"""The virtual environment the SGLang processes run in.

One per SGLang release under test (``PYSHMLOCK_SGLANG_VERSION``, default
the newest the integration lists), built once per pinned requirement set
(the key is a hash of requirements.txt, the release and the interpreter's
version) under ~/.cache/pyshmlock-tests/, with `pip install --no-deps -r
requirements.txt sglang==<release>`: no resolver runs, so nothing can pull
a CUDA build of torch.  Every release runs on the same tokenizer-side pins.  The pyshmlock
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
#: The releases the suite knows how to run (the integration lists the ones it passed).
RELEASES = ("0.5.21", "0.5.22", "0.5.23")
#: A release the integration does not support (no begin/end_weight_update):
#: --check must refuse it, naming what differs.  Built only for that check.
UNSUPPORTED = "0.5.20"
#: What a release's tokenizer side imports beyond requirements.txt (0.5.20
#: imports xgrammar at module level; later releases only when used).
EXTRA_PINS = {"0.5.20": ("xgrammar==0.2.1",)}


def release() -> str:
    """The SGLang release under test: $PYSHMLOCK_SGLANG_VERSION, else the newest."""
    version = os.environ.get("PYSHMLOCK_SGLANG_VERSION") or RELEASES[-1]
    if version not in RELEASES:
        raise ValueError(f"PYSHMLOCK_SGLANG_VERSION={version}: the suite runs "
                         f"{', '.join(RELEASES)}")
    return version
CACHE = Path(os.environ.get("PYSHMLOCK_TEST_CACHE",
                            Path.home() / ".cache" / "pyshmlock-tests"))
SOURCES = ("pyshmlock", "csrc", "setup.py", "pyproject.toml", "MANIFEST.in")
#: contrib/sglang/'s upstream change, applied to SGLang in a venv of its own
#: (hook=True) for the scenarios that run through the hook.
HOOK_PATCHES = {"0.5.23": REPO / "contrib" / "sglang" / "model-update-gate-0.5.23.patch"}


def requirements_key(version: str) -> str:
    digest = hashlib.sha256(REQUIREMENTS.read_bytes())
    digest.update(version.encode())
    digest.update(" ".join(EXTRA_PINS.get(version, ())).encode())
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


def ensure(version: str = "", hook: bool = False) -> Path:
    """The venv's directory for `version` (default: release()), built or
    updated if needed (under a file lock, so two test runs do not build it
    at once).  With `hook`, SGLang there carries contrib/sglang/'s patch."""
    version = version or release()
    if version not in RELEASES + (UNSUPPORTED,):
        raise ValueError(f"no pins for SGLang {version}")
    CACHE.mkdir(parents=True, exist_ok=True)
    key = requirements_key(version)
    if hook:
        if version not in HOOK_PATCHES:
            raise ValueError(f"contrib/sglang/ has no patch for SGLang {version}")
        patch = HOOK_PATCHES[version]
        key = hashlib.sha256((key + patch.read_text()).encode()).hexdigest()[:16]
    venv = CACHE / f"sglang-{version}{'-hook' if hook else ''}-venv-{key}"
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
                  "--find-links", str(CACHE), "-r", str(REQUIREMENTS),
                  f"sglang=={version}", *EXTRA_PINS.get(version, ())], log)
            if hook:        # the upstream change, as a maintainer would apply it
                site = next((building / "lib").glob("python3*/site-packages"))
                _run(["patch", "-p2", "--forward", "--batch", "-d", str(site), "-i",
                      str(HOOK_PATCHES[version])], log)
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
    print(ensure(*sys.argv[1:2], hook="--hook" in sys.argv))
