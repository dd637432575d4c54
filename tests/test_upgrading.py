"""Upgrading across a segment layout change: with every process of the old
release stopped, the new release's first opener replaces the old segment
with no manual step; while one still runs, the error names its pid and the
command to run.  `pyshmlock rm` follows the same rule.

An old release's segment is made here from a real lock of this release
whose layout number is set back (every layout shares the prefix and the
slot's leading mutex and pid: csrc/core/layouts.c); its "old process" is a
real process attached to it."""
import os
import signal
import struct
import subprocess
import sys
import time

import pytest

import pyshmlock

pytestmark = pytest.mark.timeout(60)


def attach_and_stay(q, name):
    lk = pyshmlock.RWLock(name)
    q.put("attached")
    time.sleep(600)
    lk.close()


def age(name, layout=2):
    with open(f"/dev/shm/pyshmlock.{name}", "r+b") as f:
        f.seek(4)
        f.write(struct.pack("<I", layout))


def rm(name, *flags):
    return subprocess.run([sys.executable, "-m", "pyshmlock", "rm", name, *flags],
                          capture_output=True, text=True, timeout=30)


@pytest.mark.needs_robust_futex
def test_an_old_layout_nobody_uses_is_replaced_at_the_first_open(lock_name, children):
    old = children(attach_and_stay, lock_name)
    old.expect("attached")
    age(lock_name)                       # as if written by pyshmlock 0.2.x
    with pytest.raises(pyshmlock.LayoutVersionError) as e:
        pyshmlock.RWLock(lock_name)      # an old process still uses it
    msg = str(e.value)
    assert f"pid {old.pid}" in msg and "0.2.x" in msg and "rm --force" in msg, msg
    p = rm(lock_name)
    assert p.returncode == 1 and "1 other live process" in p.stderr, p.stderr
    os.kill(old.pid, signal.SIGKILL)     # the old release is stopped
    old.kill()
    lk = pyshmlock.RWLock(lock_name)     # no manual step
    try:
        assert not lk.paused and lk.acquire_read(0)
        lk.release_read()
    finally:
        lk.close()


@pytest.mark.needs_robust_futex
def test_rm_removes_an_old_layout_nobody_uses(lock_name):
    subprocess.run([sys.executable, "-c",
                    "import pyshmlock, sys; pyshmlock.RWLock(sys.argv[1])", lock_name],
                   check=True, timeout=30)
    age(lock_name)
    p = rm(lock_name)
    assert p.returncode == 0, p.stderr
    assert not os.path.exists(f"/dev/shm/pyshmlock.{lock_name}")
