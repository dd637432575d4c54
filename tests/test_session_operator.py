"""An operator's handle (the `pyshmlock` command's: it owns no process slot)
ends update sessions, and its death halfway cannot leave the pause pinned:
its ending names its liveness byte (an OFD lock the kernel drops with it),
and an attached process that finds that byte free takes the ending over and
finishes it (session.c, session_adopt; DESIGN §2 "Update sessions").  The
window between the operator's claim and its unpin is held open with gdb
(tests/debugger.py)."""
import os
import shutil
import signal
import struct
import textwrap

import pytest
from debugger import Gdb, kill, spawn
from helpers import run_python, wait_for

import pyshmlock

pytestmark = pytest.mark.timeout(120)

needs_gdb = pytest.mark.skipif(shutil.which("gdb") is None, reason="needs gdb")

HDR_SIZE, SLOT_SIZE = 768, 128
OFF_STATE, OFF_TOKEN = 64, 704
ST_PINNED = 0x20000
TOKEN_ENDING, TOKEN_OPERATOR = 1 << 63, 1 << 61


def raw(name):
    """(state, session_token), read from the segment file."""
    with open(f"/dev/shm/pyshmlock.{name}", "rb") as f:
        d = f.read(HDR_SIZE)
    assert struct.unpack_from("<II", d, 8) == (HDR_SIZE, SLOT_SIZE), "layout moved"
    return struct.unpack_from("<I", d, OFF_STATE)[0], struct.unpack_from("<Q", d, OFF_TOKEN)[0]


def session_of_a_dead_process(name, ttl=600.0):
    """A session begun by a process that was then SIGKILLed: its token."""
    code = textwrap.dedent("""
        import os, signal, sys, pyshmlock
        lk = pyshmlock.RWLock(sys.argv[1])
        print(lk.begin_session(ttl=float(sys.argv[2])), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    p = run_python("-c", code, name, str(ttl), timeout=60)
    assert p.returncode == -signal.SIGKILL, p.stderr
    return int(p.stdout.split()[0])


# An operator's process: ends the session as lost through an operator's
# handle (no slot), when told.
OPERATOR = textwrap.dedent('''
    import sys, pyshmlock
    op = pyshmlock.RWLock._operator(sys.argv[1])
    print("ready", flush=True)
    sys.stdin.readline()
    op.end_session(int(sys.argv[2]), lost=True)
    print("ended", flush=True)
''')


def test_an_operators_handle_ends_a_session(lock_name):
    token = session_of_a_dead_process(lock_name)
    op = pyshmlock.RWLock._operator(lock_name)
    try:
        op.end_session(token, lost=True)
        assert not raw(lock_name)[0] & ST_PINNED
        with pytest.raises(pyshmlock.DataSuspectError):
            op.resume(timeout=1)
        assert op.resume(timeout=1, force=True)
        assert [r.lost for r in op.info().recoveries] == [("update session",)]
    finally:
        op.close()


def test_an_operators_resume_ends_an_expired_session_with_nobody_attached(lock_name):
    """Nobody attached, so no watchdog: the command's own resume ends it."""
    session_of_a_dead_process(lock_name, ttl=0.2)
    wait_for(lambda: pyshmlock.inspect(lock_name).session.expires_in <= 0, 30,
             "the session's deadline")
    op = pyshmlock.RWLock._operator(lock_name)
    try:
        with pytest.raises(pyshmlock.DataSuspectError):
            op.resume(timeout=10)            # ends it at once, then refuses
        assert pyshmlock.inspect(lock_name).session is None
        assert op.resume(timeout=1, force=True)
    finally:
        op.close()


@needs_gdb
def test_an_operator_that_dies_while_ending_a_session_is_taken_over(lock_name):
    token = session_of_a_dead_process(lock_name)
    p = spawn(OPERATOR, lock_name, str(token))
    g = None
    lk = None
    try:
        assert p.stdout.readline().strip() == "ready"
        g = Gdb(p.pid)
        STOP = "mark_counted"           # end_lost: after the claim, before the unpin
        g.send(f"break {STOP}")
        g.expect("Breakpoint 1 at", 60)
        g.send("continue -a &")
        g.expect("Continuing", 30)
        p.stdin.write("go\n")
        p.stdin.flush()
        g.expect(f"{STOP} (h=", 30)
        state, word = raw(lock_name)
        assert state & ST_PINNED, hex(state)
        assert word & TOKEN_ENDING and word & TOKEN_OPERATOR, hex(word)
        # While the operator lives (stopped, its byte held), nobody takes
        # its ending over: an attached process's resume keeps waiting.
        lk = pyshmlock.RWLock(lock_name, stale="keep")
        assert lk.resume(timeout=0.5) is False
        now_state, now_word = raw(lock_name)
        assert now_word == word and now_state & ST_PINNED, (hex(now_state), hex(now_word))
        # It dies halfway: the next look of an attached process finishes it.
        os.kill(p.pid, signal.SIGKILL)
        kill(p)
        with pytest.raises(pyshmlock.DataSuspectError):
            lk.resume(timeout=10)
        state, word = raw(lock_name)
        assert not state & ST_PINNED and not word & TOKEN_OPERATOR, (hex(state), hex(word))
        assert lk.resume(timeout=1, force=True)
    finally:
        if g is not None:
            g.close()
        kill(p)
        if lk is not None:
            lk.close()


@needs_gdb
def test_the_lease_watchdog_takes_over_an_operator_that_died(lock_name):
    """No waiter: an attached process's watchdog finishes the ending, and
    wakes a resume that slept through the operator's death."""
    token = session_of_a_dead_process(lock_name)
    holder = spawn(textwrap.dedent('''
        import sys, pyshmlock
        lk = pyshmlock.RWLock(sys.argv[1], stale="keep")
        print("attached", flush=True)
        sys.stdin.readline()
    '''), lock_name)
    p = spawn(OPERATOR, lock_name, str(token))
    g = None
    try:
        assert holder.stdout.readline().strip() == "attached"
        assert p.stdout.readline().strip() == "ready"
        g = Gdb(p.pid)
        STOP = "unpin"                  # the claim is made and the mark counted
        g.send(f"break {STOP}")
        g.expect("Breakpoint 1 at", 60)
        g.send("continue -a &")
        g.expect("Continuing", 30)
        p.stdin.write("go\n")
        p.stdin.flush()
        g.expect(f"{STOP} (h=", 30)
        os.kill(p.pid, signal.SIGKILL)
        kill(p)
        wait_for(lambda: not raw(lock_name)[0] & ST_PINNED, 30,
                 "the attached process's watchdog to finish the dead operator's ending")
        assert pyshmlock.inspect(lock_name).data_suspect
    finally:
        if g is not None:
            g.close()
        kill(p)
        kill(holder)


DAYS_400 = 400 * 86400


@pytest.mark.parametrize("ttl", [float("inf"), DAYS_400 + 1, 1e300])
def test_a_ttl_beyond_400_days_is_refused(lock, ttl):
    with pytest.raises(ValueError, match="400 days"):
        lock.begin_session(ttl=ttl)
    assert not lock.paused, "a refused session paused the lock"


def test_a_ttl_of_400_days_is_a_session(lock):
    assert pyshmlock.MAX_SESSION_TTL == DAYS_400
    token = lock.begin_session(ttl=DAYS_400)
    assert lock.session.expires_in > 399 * 86400
    lock.end_session(token)
    assert lock.resume(timeout=1)


def test_an_async_ttl_beyond_400_days_is_refused(lock_name):
    import asyncio

    async def go():
        alk = pyshmlock.AsyncRWLock(lock_name)
        try:
            with pytest.raises(ValueError, match="400 days"):
                await alk.begin_session(ttl=float("inf"))
        finally:
            alk.close()
    asyncio.run(go())
