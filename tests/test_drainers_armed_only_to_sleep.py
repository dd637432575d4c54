"""A writer arms DRAINERS (the bit that makes every leaving reader wake the
drain sleepers with a system call) only when its scan found a reader to wait
for.  An exclusive hold granted on a lock without readers leaves the bit
clear, so the readers that come after it release without a futex wake: a
write then a read cost no system call.  Checked on the state word itself,
read through a raw mapping, for every way a hold is taken (the blocking
call's straight-line claim, an asyncio attempt's general drain, and a hold
that had to wait for a reader first)."""
import asyncio
import threading

import pytest
from conftest import FORK
from helpers import wait_for
from holders import hold_until_told

import pyshmlock

pytestmark = pytest.mark.timeout(60)

STATE_OFF = 64        # the state word: first field of the header's second cache line
DRAINERS = 0x10000


def _state(name):
    with open(f"/dev/shm/pyshmlock.{name}", "rb") as f:
        f.seek(STATE_OFF)
        return int.from_bytes(f.read(4), "little")


@pytest.mark.parametrize("kind", ["write", "update"])
def test_an_uncontended_blocking_hold_leaves_drainers_clear(lock, kind):
    assert getattr(lock, f"acquire_{kind}")(5)
    assert not _state(lock.name) & DRAINERS
    getattr(lock, f"release_{kind}")()
    assert lock.acquire_read(5)
    lock.release_read()
    assert not _state(lock.name) & DRAINERS


def test_an_uncontended_asyncio_hold_leaves_drainers_clear(lock_name):
    alock = pyshmlock.AsyncRWLock(lock_name)
    try:
        async def main():
            async with alock.writer_lock:
                assert not _state(lock_name) & DRAINERS
            assert await alock.acquire_write(5)
            alock.release_write()

        asyncio.run(main())
        assert not _state(lock_name) & DRAINERS
    finally:
        alock.close()


def test_a_hold_that_waited_for_a_reader_leaves_drainers_clear(lock_name, children):
    lock = pyshmlock.RWLock(lock_name)
    cmd = FORK.Queue()
    try:
        reader = children(hold_until_told, lock_name, cmd)
        reader.expect("reading")
        got = threading.Event()

        def writer():
            assert lock.acquire_write(30)
            got.set()

        t = threading.Thread(target=writer)
        t.start()
        # The writer's claim is up and it waits for the reader: DRAINERS armed.
        wait_for(lambda: _state(lock_name) & DRAINERS, 30, what="the writer to sleep")
        cmd.put("go")
        reader.expect("released")
        t.join(30)
        assert got.is_set()
        lock.release_write()
        # The leaving reader cleared the bit as it woke the writer.
        assert not _state(lock_name) & DRAINERS
    finally:
        lock.close()
