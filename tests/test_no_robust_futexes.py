"""Where the kernel offers no robust futexes (qemu-user answers
set_robust_list with ENOSYS), a process that dies holding a lock would never
be reclaimed.  The library says so instead of running without crash
recovery unawares: opening raises NoCrashRecoveryError naming the cause and
the opt-in, and with the opt-in (PYSHMLOCK_ALLOW_NO_ROBUST=1, or
allow_no_robust=True) it runs, and info() and `pyshmlock status` show that
crash recovery is off.  Run for real: the installed package under Debian's
qemu-x86_64-static, on this machine's own kernel."""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(shutil.which("qemu-x86_64-static") is None,
                       reason="needs qemu-user-static (Debian) to run without robust futexes"),
    pytest.mark.skipif(os.uname().machine != "x86_64", reason="qemu-x86_64-static runs x86-64"),
]


def under_qemu(code, *args, allow=None):
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_PRELOAD", "PYSHMLOCK_ALLOW_NO_ROBUST")}
    if allow is not None:
        env["PYSHMLOCK_ALLOW_NO_ROBUST"] = allow
    return subprocess.run(["qemu-x86_64-static", sys.executable, "-c", textwrap.dedent(code),
                           *args], capture_output=True, text=True, timeout=200, env=env)


def test_opening_without_robust_futexes_is_refused_with_the_cause(lock_name):
    r = under_qemu('''
        import sys, pyshmlock
        try:
            pyshmlock.RWLock(sys.argv[1])
        except pyshmlock.NoCrashRecoveryError as e:
            print("refused:", e)
    ''', lock_name)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "refused:" in r.stdout
    assert "no robust futexes" in r.stdout and "PYSHMLOCK_ALLOW_NO_ROBUST=1" in r.stdout
    assert "allow_no_robust=True" in r.stdout
    assert not os.path.exists(f"/dev/shm/pyshmlock.{lock_name}")


@pytest.mark.parametrize("how", ["environment", "keyword"])
def test_the_opt_in_runs_without_crash_recovery_and_says_so(lock_name, how):
    r = under_qemu('''
        import sys, subprocess, pyshmlock
        lk = pyshmlock.RWLock(sys.argv[1], allow_no_robust=sys.argv[2] == "keyword")
        with lk.reader_lock:
            pass
        with lk.write(5):
            pass
        print("crash_recovery", lk.info().crash_recovery)
        # (a child of an emulated process runs natively unless emulated too)
        status = subprocess.run(["qemu-x86_64-static", sys.executable, "-m", "pyshmlock",
                                 "status", sys.argv[1]], capture_output=True, text=True)
        print(status.stdout)
        lk.close()
    ''', lock_name, how, allow="1" if how == "environment" else None)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "crash_recovery False" in r.stdout
    assert "CRASH RECOVERY off" in r.stdout
