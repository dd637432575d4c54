"""The kernel-feature probes (kernel_features.py) that decide which tests
skip: they answer from the system calls themselves, so under qemu-user,
which has neither robust futexes nor futex_waitv, both say so with ENOSYS,
and the tests that need them skip naming it."""
import os
import platform
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
QEMU = shutil.which(f"qemu-{platform.machine()}-static")


@pytest.mark.skipif(QEMU is None, reason=f"needs qemu-{platform.machine()}-static "
                    "(qemu-user-static) to run this interpreter emulated")
@pytest.mark.timeout(120)
def test_the_probes_see_what_qemu_user_lacks():
    """The same interpreter and probe, run under qemu-user on this machine.
    The probe must answer from the system call, so the switch that turns
    futex_waitv off (the suite's second run, .ci/run) is cleared for it."""
    env = {k: v for k, v in os.environ.items() if k != "PYSHMLOCK_NO_FUTEX_WAITV"}
    out = subprocess.run([QEMU, sys.executable, os.path.join(HERE, "kernel_features.py")],
                         capture_output=True, text=True, timeout=100, check=True,
                         env=env).stdout
    assert "robust futexes: no robust futexes here: get_robust_list returned ENOSYS" in out, out
    assert "futex_waitv: no futex_waitv here: it returned ENOSYS" in out, out

