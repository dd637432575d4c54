"""A resume never opens the gate on data marked suspect after it looked.

resume() decides on one load of the state word (paused, no update, no
session, data not suspect) and opens the gate with a CAS from that word.
Anything that marks the data suspect in between changes the word: the mark
is a bit of it.  (Before layout 4 the mark lived in another word; a resume
stopped between its look and its CAS while an update session began and
expired and the epoch wrapped back, 2^14 claims later, opened the gate on
the expired session's data.)  The window is held open with gdb."""
import shutil
import textwrap

import pytest
from debugger import Gdb, kill, spawn
from helpers import wait_for

import pyshmlock

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(shutil.which("gdb") is None, reason="needs gdb"),
]

STATE_OFF = 64
SLEEPER_BITS = 0x8000 | 0x10000      # SLEEPERS, DRAINERS: no decision depends on them

RESUMER = textwrap.dedent('''
    import sys, pyshmlock
    lk = pyshmlock.RWLock(sys.argv[1])
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        print("resumed" if lk.resume(30) else "timed out", flush=True)
    except Exception as e:
        print(type(e).__name__, flush=True)
''')

READER = textwrap.dedent('''
    import sys, pyshmlock
    lk = pyshmlock.RWLock(sys.argv[1])
    assert lk.acquire_read(5)
    print("reading", flush=True)
    sys.stdin.readline()
    lk.release_read()
    print("released", flush=True)
    sys.stdin.readline()
''')


def _state(name):
    with open(f"/dev/shm/pyshmlock.{name}", "rb") as f:
        f.seek(STATE_OFF)
        return int.from_bytes(f.read(4), "little")


def test_a_resume_stopped_before_its_cas_does_not_open_on_an_expired_session(lock_name):
    lk = pyshmlock.RWLock(lock_name)
    reader = spawn(READER, lock_name)
    resumer = spawn(RESUMER, lock_name)
    g = None
    try:
        assert reader.stdout.readline().strip() == "reading"   # a read hold: claims wait
        assert resumer.stdout.readline().strip() == "ready"
        lk.pause()
        looked = _state(lock_name)
        # The resumer looks at the word and decides to open; stop it right
        # after its decision (resume_allowed), before the CAS.
        g = Gdb(resumer.pid)
        g.expect("(gdb)", 20)
        g.send("break resume_allowed")
        g.send("continue -a &")
        resumer.stdin.write("go\n")
        resumer.stdin.flush()
        g.expect("hit Breakpoint", 30)
        g.send("finish")
        g.expect("Run till exit", 10)
        g.expect("(gdb)", 10)            # back in try_resume, before its CAS: stopped there
        g.send("delete")
        # Meanwhile: an update session begins and expires (its data is
        # marked suspect), then write claims that give up (a reader holds)
        # bring the epoch back round to the word the resumer looked at.
        lk.begin_session(ttl=0.05)
        wait_for(lambda: lk.info().session is None, 10, "the session to expire")
        assert lk.info().data_suspect
        claims = 0
        while (_state(lock_name) ^ looked) & ~SLEEPER_BITS and claims < 2 ** 14 + 2:
            assert lk.acquire_write(0) is False
            claims += 1
        # The reader leaves, which clears the drainer bit the claims set:
        # the word is the one the resumer looked at, but for the mark.
        reader.stdin.write("release\n")
        reader.stdin.flush()
        assert reader.stdout.readline().strip() == "released"
        # The resumer goes on: its CAS must fail, and the decision made
        # again must see the mark.
        g.send("continue -a &")
        assert resumer.stdout.readline().strip() == "DataSuspectError"
        assert lk.info().paused
    finally:
        if g is not None:
            g.close()
        kill(resumer)
        kill(reader)
        lk.resume(force=True)
        lk.close()
