"""An exclusive release clears only its own claim.

The release loads the state word, checks that it names this process's
granted claim, and clears the claim with a CAS from the word it loaded; a
failed CAS reloads and tries again.  The owner is checked on every value the
CAS compares against: if the word meanwhile names another claimant (only a
corrupt segment, or a recovery that took a live process for dead, can do
that), the release refuses (CorruptSegmentError) and leaves that claim
alone.  The window between the check and the CAS is held open with gdb
(tests/debugger.py), and the word rewritten there through a raw mapping."""
import mmap
import os
import shutil
import textwrap

import pytest
from debugger import Gdb, kill, spawn

import pyshmlock

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("gdb") is None, reason="needs gdb"),
]

STATE_OFF = 64        # the state word: first field of the header's second cache line
OWNER_MASK, GRANTED = 0xFFF, 0x2000

HOLDER = textwrap.dedent('''
    import sys, pyshmlock
    lk = pyshmlock.RWLock(sys.argv[1])
    assert lk.acquire_write(5)
    print("holding", flush=True)
    sys.stdin.readline()
    try:
        lk.release_write()
        print("released", flush=True)
    except Exception as e:
        print(type(e).__name__, flush=True)
''')


def _state(name):
    with open(f"/dev/shm/pyshmlock.{name}", "rb") as f:
        f.seek(STATE_OFF)
        return int.from_bytes(f.read(4), "little")


def _set_state(name, value):
    fd = os.open(f"/dev/shm/pyshmlock.{name}", os.O_RDWR)
    try:
        m = mmap.mmap(fd, 0)
    finally:
        os.close(fd)
    try:
        m[STATE_OFF:STATE_OFF + 4] = value.to_bytes(4, "little")
    finally:
        m.close()


def test_a_release_whose_word_changed_owner_clears_nothing(lock_name):
    holder = spawn(HOLDER, lock_name)
    g = None
    try:
        assert holder.stdout.readline().strip() == "holding"
        mine = _state(lock_name)
        assert mine & OWNER_MASK and mine & GRANTED
        g = Gdb(holder.pid)
        g.expect("(gdb)", 20)
        # Between the release's owner check and its CAS: the count of
        # suspect marks is read there (suspect_after; before layout 4,
        # unmark_suspect just ahead of the CAS loop).
        g.send("break suspect_after")
        g.send("break unmark_suspect")
        g.send("continue -a &")
        holder.stdin.write("release\n")
        holder.stdin.flush()
        g.expect("hit Breakpoint", 20)
        # Another claimant's granted claim now (slot 5), as a recovery that
        # took this process for dead and a new writer would leave it.
        other = (mine & ~(OWNER_MASK | 0x1000)) | 6 | GRANTED
        _set_state(lock_name, other)
        g.send("delete")
        g.send("continue -a &")
        assert holder.stdout.readline().strip() == "CorruptSegmentError"
        assert _state(lock_name) & OWNER_MASK == 6, "the release cleared another's claim"
    finally:
        if g is not None:
            g.close()
        kill(holder)
        pyshmlock.unlink(lock_name, force=True)
