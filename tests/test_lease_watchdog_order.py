"""The lease watchdog never pauses a gate its agent has just renewed and
reopened.

The agent renews the host lease (a seq_cst store of the new deadline) and
then resumes the gate.  Each attached process's watchdog reads the state
word first (acquire), then the deadline: a watchdog that sees the reopened
gate also sees the renewed deadline.  (Read the other way round, it could
pair the passed deadline from before the renewal with the reopened gate,
and pause a healthy host.)  The window is held open with a gdb read
watchpoint on the deadline, in one process's watchdog thread."""
import re
import shutil
import textwrap

import pytest
from debugger import Gdb, kill, spawn

import pyshmlock
from pyshmlock.cluster._lease import lease_arm, lease_info

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("gdb") is None, reason="needs gdb"),
]

# The header's lease_deadline_ns (layout 4, x86-64 and aarch64): the first
# field of the cache line after the recovery log.
LEASE_DEADLINE_OFF = 640

WATCHER = textwrap.dedent('''
    import sys, pyshmlock
    lk = pyshmlock.RWLock(sys.argv[1])
    print("open", flush=True)
    sys.stdin.readline()
''')


def _mapping(pid, name):
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            if line.rstrip().endswith(f"/dev/shm/pyshmlock.{name}"):
                return int(re.match(r"([0-9a-f]+)-", line).group(1), 16)
    raise AssertionError("segment not mapped")


def test_a_watchdog_that_sees_the_reopened_gate_sees_the_renewed_lease(lock_name):
    lk = pyshmlock.RWLock(lock_name)
    watcher = spawn(WATCHER, lock_name)
    g = None
    try:
        lease_arm(lk, -1.0)                    # passed: the watchdogs pause the gate
        assert watcher.stdout.readline().strip() == "open"
        assert lk.paused or lk.wait_resumed(0) is False
        expiries = lease_info(lk)["expiries"]
        addr = _mapping(watcher.pid, lock_name) + LEASE_DEADLINE_OFF
        g = Gdb(watcher.pid)
        g.expect("(gdb)", 20)
        # The watcher's watchdog stops right after it reads the deadline.
        g.send(f"rwatch *(long *){addr:#x}")
        g.send("continue -a &")
        g.expect("hit Hardware read watchpoint", 20)
        # The agent renews the lease, then reopens the gate.
        lease_arm(lk, 60.0)
        assert lk._resume_as_manager(5)
        # The watchdog goes on with its pass; its next pass begins at
        # lease_check again: by then it has decided.
        g.send("delete")
        g.send("break lease_check")
        g.send("continue -a &")
        g.expect("hit Breakpoint", 20)
        assert not lk.paused, "the watchdog paused a renewed, reopened lease"
        assert lease_info(lk)["expiries"] == expiries
    finally:
        if g is not None:
            g.close()
        kill(watcher)
        lk.close()
