"""Threads of one process share a handle's private state (its slot, hold
counts, in-flight word), the keeper's and the watchdog's requests, the
handle table and the one-time checks.  A harness drives the C core from
many threads at once (verify/threads_tsan.c); built with ThreadSanitizer,
any data race in that process-private state is a report, and fails here."""
import os
import shutil
import subprocess
import uuid

import pytest

import pyshmlock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.environ.get("PYSHMLOCK_CSRC", os.path.join(ROOT, "csrc"))
HARNESS = os.path.join(os.path.dirname(CSRC), "verify", "threads_tsan.c")


def _tsan_cc():
    """A C compiler with ThreadSanitizer's runtime, or None."""
    for cc in ("gcc", "clang-14", "clang"):
        path = shutil.which(cc)
        if path is None:
            continue
        probe = subprocess.run([path, "-fsanitize=thread", "-x", "c", "-", "-o", os.devnull],
                               input="int main(void){return 0;}", capture_output=True,
                               text=True, timeout=60)
        if probe.returncode == 0:
            return path
    return None


@pytest.mark.timeout(300)
@pytest.mark.skipif(os.environ.get("PYSHMLOCK_SANITIZED_RUN") == "1",
                    reason="already a sanitized run (ASan and TSan do not mix)")
@pytest.mark.skipif(not os.path.exists(HARNESS), reason="no checkout beside the tests")
def test_threads_of_one_process_race_on_nothing(tmp_path):
    cc = _tsan_cc()
    if cc is None:
        pytest.skip("no compiler with ThreadSanitizer's runtime")
    core = os.path.join(CSRC, "core")
    sources = sorted(os.path.join(core, f) for f in os.listdir(core) if f.endswith(".c"))
    exe = tmp_path / "threads_tsan"
    build = subprocess.run([cc, "-std=gnu11", "-g", "-O1", "-fsanitize=thread",
                            f"-I{CSRC}", f"-I{core}", *sources, HARNESS, "-o", str(exe),
                            "-lpthread"], capture_output=True, text=True, timeout=240)
    assert build.returncode == 0, build.stderr[-3000:]
    name = f"test-tsan-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["TSAN_OPTIONS"] = "halt_on_error=0 exitcode=66 report_signal_unsafe=0"
    # Made, and kept open, by another process (this one): the harness's
    # first calls are observers' that look at its slot, in every thread at once.
    other = pyshmlock.RWLock(name)
    try:
        run = subprocess.run([str(exe), name], capture_output=True, text=True, timeout=240,
                             env=env)
    finally:
        other.close()
        try:
            os.unlink(f"/dev/shm/pyshmlock.{name}")
        except FileNotFoundError:
            pass
    assert "ThreadSanitizer" not in run.stderr, run.stderr[-6000:]
    assert run.returncode == 0, run.stderr[-3000:]
