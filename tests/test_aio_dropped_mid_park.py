"""An attempt driven by hand (send) until it parks, then dropped with the
future it yielded, is a coroutine nobody will resume.  A coroutine dropped
so is finalised and cleans up at once; so is the attempt: its parking
record (which the loop's reader callback keeps) refers to it only weakly,
so its owed-reader registration, which would shut other processes' writers
out, goes with it.  (It used to stay until the next wake-up of its word and
a garbage collection after it: indefinitely in an idle process.)  The
writer is another process."""
import asyncio
import gc
import os

import pytest
from conftest import FORK
from holders import hold_until_told

import pyshmlock

pytestmark = pytest.mark.timeout(60)


def test_a_parked_attempt_dropped_by_its_driver_withdraws_its_registration(
        lock_name, children):
    cmd = FORK.Queue()
    writer = children(hold_until_told, lock_name, cmd, "write")
    writer.expect("writing")
    alock = pyshmlock.AsyncRWLock(lock_name)

    async def main():
        aw = alock.acquire_read()
        fut = aw.send(None)                 # parked: an owed reader queued
        assert not fut.done()
        del aw, fut              # (no collection: dropping it is enough)
        return alock.info().queued_readers.get(os.getpid(), 0)

    loop = asyncio.new_event_loop()
    try:
        left = loop.run_until_complete(main())
    finally:
        cmd.put("go")
        writer.expect("released")
        loop.close()
        gc.collect()
        alock.close()
    assert left == 0
