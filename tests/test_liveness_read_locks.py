"""A user who may only read a segment can hold OFD read locks on its slots'
bytes (docs/DESIGN.md §5a, "Readers and the liveness locks"): that denies
those slots to new processes, and nothing worse.  Here another user (nobody,
through a 0644 segment) read-locks every byte it can: a new opener is
refused at once (no wait), every process that runs is still seen alive, and
a holder that dies is still reclaimed."""
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from debugger import kill, spawn
from helpers import run_python

import pyshmlock

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become nobody"),
]

NOBODY = 65534
MAX = 3

# As nobody: read-lock the byte of each slot asked for, say which it got.
READER = textwrap.dedent(r'''
    import fcntl, os, struct, sys
    F_OFD_SETLK = 37
    fd = os.open(sys.argv[1], os.O_RDONLY)
    print("ready", flush=True)
    for line in sys.stdin:
        slot = int(line)
        try:
            fcntl.fcntl(fd, F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_RDLCK, 0, slot, 1, 0))
            print("locked", flush=True)
        except OSError:
            print("refused", flush=True)
''')

HOLDER = textwrap.dedent('''
    import sys, time, pyshmlock
    lk = pyshmlock.RWLock(sys.argv[1], mode=0o644)
    assert lk.acquire_write(5)
    print("holding", flush=True)
    time.sleep(600)
''')

OPENER = textwrap.dedent('''
    import sys, pyshmlock
    try:
        pyshmlock.RWLock(sys.argv[1], mode=0o644)
        print("opened")
    except pyshmlock.TooManyProcessesError:
        print("full")
''')


def test_read_locks_on_slots_deny_slots_and_nothing_more(lock_name):
    with pyshmlock.RWLock(lock_name, mode=0o644, max_processes=MAX).attached() as lk:
        reader = subprocess.Popen(
            ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
             sys.executable, "-c", READER, f"/dev/shm/pyshmlock.{lock_name}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/")
        holder = spawn(HOLDER, lock_name)
        try:
            assert reader.stdout.readline().strip() == "ready"
            assert holder.stdout.readline().strip() == "holding"

            def read_lock(slot):
                reader.stdin.write(f"{slot}\n")
                reader.stdin.flush()
                return reader.stdout.readline().strip()

            slots = {p.pid: p.slot for p in lk.info().processes}
            # The slots of live processes cannot be read-locked; the free one can.
            assert [read_lock(i) for i in range(MAX)] == [
                "refused" if i in slots.values() else "locked" for i in range(MAX)]
            r = run_python("-c", OPENER, lock_name, timeout=30)   # refused, never waits
            assert r.stdout.strip() == "full", r.stdout + r.stderr
            seen = pyshmlock.inspect(lock_name)
            assert sorted(seen.attached_pids) == sorted(slots) and seen.dead_pids == []
            # The holder dies: it is reclaimed; its slot may then be read-locked too.
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait(10)
            assert lk.acquire_write(10)
            lk.release_write()
            assert [r.pid for r in lk.info().recoveries] == [holder.pid]
            assert read_lock(slots[holder.pid]) == "locked"
            assert lk.info().attached_pids == [os.getpid()]
        finally:
            kill(holder)
            reader.kill()
            reader.wait(10)
