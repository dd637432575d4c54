"""An asyncio attempt made before fork() and still registered (an owed
reader, an exclusive claim) belongs to the parent's slot.  In a forked child
that has taken a slot of its own, withdrawing or retrying that attempt must
not count the parent's registration off the child's slot (which would wrap
its owed-reader count and shut every writer out while the child lives), nor
mistake the parent's claim for its own.  The holder is a third process."""
import asyncio
import os

import pytest
from conftest import FORK
from holders import hold_until_told

import pyshmlock

pytestmark = pytest.mark.timeout(60)


def _child_withdraws(q, name, aw, cmd):
    alock = aw.lock
    assert alock.acquire_read(0) is False      # the child takes a slot of its own
    aw.close()                                 # the parent's registration
    me = [p for p in alock.info().processes if p.is_self]
    q.put(("queued", me[0].queued_readers))
    cmd.get(timeout=20)


def _child_retries(q, name, aw):
    async def main():
        try:
            return await asyncio.wait_for(aw, 0.3)
        except asyncio.TimeoutError:
            return "timed out"
    aw.lock.acquire_read(0)                    # the child takes a slot of its own
    q.put(asyncio.run(main()))


def test_a_read_attempt_from_before_a_fork_withdrawn_in_the_child_leaves_its_slot_whole(
        lock_name, children):
    cmd, child_cmd = FORK.Queue(), FORK.Queue()
    writer = children(hold_until_told, lock_name, cmd, "write")
    writer.expect("writing")
    alock = pyshmlock.AsyncRWLock(lock_name)
    aw = alock.reader_lock.__aenter__()        # not granted: an owed reader queued
    assert alock.info().queued_readers == {os.getpid(): 1}
    child = children(_child_withdraws, lock_name, aw, child_cmd)
    assert child.get() == ("queued", 0)
    aw.close()
    cmd.put("go")
    writer.expect("released")
    # Nothing is owed any more, the child alive or not: a writer gets in.
    assert alock._lock.acquire_write(5)
    alock.release_write()
    child_cmd.put("exit")
    assert child.join() == 0
    alock.close()


def test_a_write_attempt_from_before_a_fork_retried_in_the_child_is_its_own(
        lock_name, children):
    cmd = FORK.Queue()
    reader = children(hold_until_told, lock_name, cmd, "read")
    reader.expect("reading")
    alock = pyshmlock.AsyncRWLock(lock_name)
    aw = alock.writer_lock.__aenter__()        # not granted: the claim is ours
    child = children(_child_retries, lock_name, aw)
    assert child.get() == "timed out"           # not a "corrupt segment" error
    assert child.join() == 0
    aw.close()
    cmd.put("go")
    reader.expect("released")
    assert alock._lock.acquire_write(5)
    alock.release_write()
    alock.close()
