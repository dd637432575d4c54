"""The multi-process tests again, against a core built with AddressSanitizer
and UndefinedBehaviorSanitizer.

The instrumented core is built into a scratch directory (the installed one
is never touched) and a child pytest runs the multi-process suites against
it, with gcc's ASan runtime preloaded into the child Python.  Any
out-of-bounds access, use after free or undefined behaviour in the C core
aborts that child, and this test fails with the sanitizer's report.

`make sanitize` runs the whole suite this way; this test runs the parts
that exercise the core across processes, so that CI checks them too.
"""
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.dirname(os.path.abspath(__file__))

# Every test of these files runs the core in several processes (or feeds it
# corrupted segments); together they take about a minute under ASan.
SUITES = ("test_semantics.py", "test_crash.py", "test_stress.py", "test_bad_input.py",
          "test_fuzz.py", "test_trust.py", "test_limits.py", "test_fastpath.py",
          "test_aio.py", "test_close_in_flight.py", "test_raw_segment_state.py",
          "test_process_exit.py")

# The child run must not recurse into this file.
INNER = "PYSHMLOCK_SANITIZED_RUN"


def _libasan():
    """Path of gcc's ASan runtime, or None if it is not installed."""
    cc = shutil.which("gcc")
    if cc is None:
        return None
    path = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True,
                          text=True, timeout=30).stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else None


@pytest.mark.timeout(420)
@pytest.mark.skipif(os.environ.get(INNER) == "1", reason="already the sanitized run")
@pytest.mark.skipif(_libasan() is None, reason="gcc's libasan is not installed")
def test_multiprocess_suites_under_asan_and_ubsan(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    build = subprocess.run([sys.executable, os.path.join(ROOT, "csrc", "build_extensions.py"),
                            str(tmp_path)], env={**env, "PYSHMLOCK_SANITIZE": "1"},
                           capture_output=True, text=True, timeout=180)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    # The Python package next to the instrumented extension.
    for entry in os.listdir(os.path.join(ROOT, "pyshmlock")):
        src = os.path.join(ROOT, "pyshmlock", entry)
        dst = os.path.join(tmp_path, "pyshmlock", entry)
        if entry.startswith("_shmlock") or entry == "__pycache__" or os.path.exists(dst):
            continue
        (shutil.copytree if os.path.isdir(src) else shutil.copy)(src, dst)
    built = [f for f in os.listdir(tmp_path / "pyshmlock") if f.startswith("_shmlock")
             and f.endswith(".so")]
    assert len(built) == 1, built
    with open(tmp_path / "pyshmlock" / built[0], "rb") as f:
        assert b"__asan_report" in f.read(), "the core was built without AddressSanitizer"
    # The fast-path extension (calls into that core) is instrumented too.
    fast = [f for f in os.listdir(tmp_path / "pyshmlock") if f.startswith("_fast")
            and f.endswith(".so")]
    assert len(fast) == 1, fast
    with open(tmp_path / "pyshmlock" / fast[0], "rb") as f:
        assert b"__asan_report" in f.read(), "_fast was built without AddressSanitizer"

    run_env = {**env, INNER: "1", "PYTHONPATH": str(tmp_path),
               "LD_PRELOAD": _libasan(),
               "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
               "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}
    # The child must import the instrumented package, not the installed one.
    where = subprocess.run([sys.executable, "-c",
                            "import pyshmlock._shmlock as m; print(m.__file__)"],
                           cwd=tmp_path, env=run_env, capture_output=True, text=True,
                           timeout=60)
    assert where.returncode == 0, where.stderr[-3000:]
    assert where.stdout.strip().startswith(str(tmp_path)), where.stdout

    # No faulthandler watchdog: it is a thread started at every test, and
    # this build's AddressSanitizer keeps no lock of its own across fork(),
    # so a child forked while that thread starts can wait for good on the
    # sanitizer's thread registry (its first thread: a queue's feeder).
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "-o", "faulthandler_timeout=0",
                        "-x", *[os.path.join(TESTS, s) for s in SUITES]],
                       cwd=tmp_path, env=run_env, capture_output=True, text=True,
                       timeout=400)
    report = p.stdout[-6000:] + p.stderr[-6000:]
    assert p.returncode == 0, report
    assert "ERROR: AddressSanitizer" not in report and "runtime error:" not in report, report
    passed = re.search(r"(\d+) passed", p.stdout)
    assert passed and int(passed.group(1)) >= 40, report
