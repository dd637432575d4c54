"""Closing a lock races with the process's own lease watchdog and with
fork(): the watchdog may be ending an update session in the name of this
process's slot while another thread closes the lock (the slot must stay
this process's until the watchdog is done, or a death later leaves a pin
that nobody can end, or a stale end unpins the next session); a fork that
lands during another thread's close leaves the child able to open the lock
again.  Each window is held open with gdb (tests/debugger.py)."""
import os
import platform
import shutil
import signal
import struct
import textwrap
import time

import pytest
from debugger import Gdb, kill, spawn
from helpers import wait_for

import pyshmlock

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("gdb") is None, reason="needs gdb"),
]

# Offsets in the segment (layout 3), checked against the header's own
# header_size/slot_size fields before use.  A slot's pid follows its glibc
# mutex: 40 bytes on x86-64, 48 on aarch64 (verify/glibc_layout.c prints it).
HDR_SIZE, SLOT_SIZE = 768, 128
OFF_STATE, OFF_TOKEN = 64, 704
OFF_SLOT_PID = {"x86_64": 40, "aarch64": 48}.get(platform.machine(), 40)
ST_PINNED = 0x20000
TOKEN_ENDING = 1 << 63


def raw(name):
    """(state, session_token, slot-0 pid), read from the segment file."""
    with open(f"/dev/shm/pyshmlock.{name}", "rb") as f:
        d = f.read(HDR_SIZE + SLOT_SIZE)
    assert struct.unpack_from("<II", d, 8) == (HDR_SIZE, SLOT_SIZE), "layout moved"
    return (struct.unpack_from("<I", d, OFF_STATE)[0],
            struct.unpack_from("<Q", d, OFF_TOKEN)[0],
            struct.unpack_from("<I", d, HDR_SIZE + OFF_SLOT_PID)[0])


# P1: opens the lock, begins a session with a short ttl, then on "close"
# closes the lock from a thread (close blocks in handle_retire while the
# watchdog is stopped inside the sweep: that is the window).
P1 = textwrap.dedent('''
    import sys, threading, pyshmlock
    lk = pyshmlock.RWLock(sys.argv[1])
    lk.begin_session(ttl=float(sys.argv[2]))
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "close":
            def c():
                lk.close()
                print("closed", flush=True)
            threading.Thread(target=c, daemon=True).start()
            print("closing", flush=True)
''')

def stall_watchdog_in_expiry(name):
    """P1 with its lease watchdog stopped between the session expiry's
    claim_ending (token = ENDING(slot 0)) and its unpin."""
    p1 = spawn(P1, name, "0.3")
    assert p1.stdout.readline().strip() == "ready"
    g = Gdb(p1.pid)
    g.send("break mark_counted")   # session_expire: after claim_ending, before unpin
    g.send("continue -a &")
    g.expect("hit Breakpoint", 10)
    state, token, pid0 = raw(name)
    assert state & ST_PINNED and token & TOKEN_ENDING and token & 0xFFFF == 0
    assert pid0 == p1.pid
    return p1, g


@pytest.fixture
def name(lock_name):
    """conftest's lock_name (unique, removed afterwards) under a short name."""
    return lock_name


def test_a_death_while_the_watchdog_ends_a_session_is_recovered(name):
    """Control: P1 dies while its watchdog owns the ending; its slot is
    still held by its keeper, so the next opener reclaims it (EOWNERDEAD ->
    session_recover) and the gate can be opened."""
    p1, g = stall_watchdog_in_expiry(name)
    try:
        os.kill(p1.pid, signal.SIGKILL)
        kill(p1)
    finally:
        g.close()
        kill(p1)
    lk = pyshmlock.RWLock(name, create=False)
    try:
        assert not raw(name)[0] & ST_PINNED
        assert lk.resume(timeout=1.0, force=True) is True
    finally:
        lk.close()


def test_a_close_waits_for_the_watchdog_before_it_gives_the_slot_back(name):
    """close() runs while the watchdog is inside session_expire, which has
    taken the session's ending in the name of slot 0: close must not give
    slot 0 back before the watchdog's unpin is done (a death then would
    leave an ending of a slot nobody owns: a pin no one can end; a new
    owner of slot 0 could see a later session unpinned by the late unpin).
    Then a later process opens, and its own session is untouched."""
    p1, g = stall_watchdog_in_expiry(name)
    lk = None
    try:
        p1.stdin.write("close\n")
        p1.stdin.flush()
        assert p1.stdout.readline().strip() == "closing"
        time.sleep(0.5)                     # close waits: the slot stays P1's
        state, token, pid0 = raw(name)
        assert pid0 == p1.pid, "close gave the slot back under the watchdog's ending"
        assert state & ST_PINNED and token & TOKEN_ENDING
        g.send("continue -a")               # the watchdog finishes its expiry
        assert p1.stdout.readline().strip() == "closed"
        wait_for(lambda: raw(name)[2] == 0, 5, "slot 0 released by close()")
        assert not raw(name)[0] & ST_PINNED
        os.kill(p1.pid, signal.SIGKILL)
        kill(p1)
        lk = pyshmlock.RWLock(name, create=False)
        tok2 = lk.begin_session(ttl=60, timeout=2)
        assert lk.resume(timeout=0.2, force=True) is False     # S2 pins the pause
        lk.end_session(tok2)
        assert lk.resume(timeout=1.0, force=True) is True
    finally:
        g.close()
        kill(p1)
        if lk is not None:
            lk.close()


# The child of a fork() made while another thread is inside close(), past
# H_CLOSED (stopped at the keeper call that frees the slot).  The core says
# the handle is closed (handles_after_fork keeps H_CLOSED), but the Python
# registry (_attachment._registry) still has the attachment: _detach had not
# reached `del _registry[att.key]`.  Every later RWLock(name) in the child
# shares that dead attachment (shl_attach -> SHL_ECLOSED): the child can never
# open the lock again.  Pre-existing (not from e79dd7c), found on the way.
FORK_IN_CLOSE = textwrap.dedent('''
    import os, sys, threading, pyshmlock
    lk = pyshmlock.RWLock(sys.argv[1])
    print("ready", flush=True)
    sys.stdin.readline()
    threading.Thread(target=lk.close, daemon=True).start()
    sys.stdin.readline()
    pid = os.fork()
    if pid == 0:
        try:
            pyshmlock.RWLock(sys.argv[1]).close()
            print("child reopened", flush=True)
        except Exception as e:
            print("child cannot reopen:", type(e).__name__, e, flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
''')


def test_a_fork_during_another_threads_close_leaves_the_child_able_to_reopen(name):
    p = spawn(FORK_IN_CLOSE, name)
    g = None
    try:
        assert p.stdout.readline().strip() == "ready"
        g = Gdb(p.pid)
        g.send("break keeper_call")      # shl_close: after H_CLOSED, before the unlock
        g.send("continue -a &")
        g.expect("Continuing.", 10)
        p.stdin.write("close\n")
        p.stdin.flush()
        g.expect("hit Breakpoint", 10)
        p.stdin.write("fork\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "child reopened"
    finally:
        if g is not None:
            g.close()
        kill(p)
