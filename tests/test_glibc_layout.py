"""glibc's robust-mutex fields are where the core reads them, on this
machine's architecture, glibc and kernel: verify/glibc_layout.c is compiled
with the core and run (x86-64 here; aarch64 in .ci/arm64's root).  The
kernel's part of it (its robust list, a dead owner's mark) runs wherever the
probe finds robust futexes and must then not skip.  A core that reads the
wrong word of the mutex fails the check (the second test)."""
import glob
import os
import shutil
import subprocess

import pytest
from kernel_features import robust_futexes_missing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = os.path.join(ROOT, "verify", "glibc_layout.c")

# Compiling the core under emulation (qemu-user) takes a minute or more.
pytestmark = pytest.mark.timeout(900)


def _build_and_run(csrc, out_dir):
    exe = os.path.join(out_dir, "glibc_layout")
    subprocess.run(["gcc", "-std=gnu11", "-O1", "-Wall", "-Wextra", "-Werror",
                    f"-I{csrc}", f"-I{os.path.join(csrc, 'core')}",
                    *sorted(glob.glob(os.path.join(csrc, "core", "*.c"))), PROGRAM,
                    "-o", exe, "-lpthread"], check=True, timeout=800)
    return subprocess.run([exe], capture_output=True, text=True, timeout=120)


def test_glibc_mutex_fields_are_where_the_core_reads_them(tmp_path):
    run = _build_and_run(os.path.join(ROOT, "csrc"), str(tmp_path))
    print(run.stdout)
    assert run.returncode == 0 and "FAIL" not in run.stdout, run.stdout + run.stderr
    skipped = [line for line in run.stdout.splitlines() if line.startswith("skip")]
    if robust_futexes_missing() is None:
        assert not skipped, f"the kernel has robust futexes, yet {skipped}"
    else:
        assert len(skipped) == 2, run.stdout


def test_the_check_fails_for_a_core_that_reads_the_wrong_word(tmp_path):
    """A scratch core whose mutex_word points at glibc's owner field (which
    also holds the TID while locked) instead of the lock word."""
    csrc = tmp_path / "csrc"
    shutil.copytree(os.path.join(ROOT, "csrc"), csrc)
    slots = csrc / "core" / "slots.c"
    text = slots.read_text()
    right = "return (uint32_t *)&m->__data.__lock;"
    assert right in text
    slots.write_text(text.replace(right, "return (uint32_t *)&m->__data.__owner;"))
    run = _build_and_run(str(csrc), str(tmp_path))
    assert run.returncode == 1, run.stdout + run.stderr
    assert "FAIL free: the word at offset" not in run.stdout      # 0 either way
    assert "FAIL contended: it is the word at offset 0" not in run.stdout
    assert "FAIL contended: it is the word at offset" in run.stdout, run.stdout
