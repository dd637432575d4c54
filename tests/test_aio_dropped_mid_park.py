"""An attempt driven by hand (send) until it parks, then dropped with the
future it yielded, is a coroutine nobody will resume.  A coroutine dropped
so is finalised and cleans up at once; an attempt is kept alive by its
parking record (the loop's reader callback holds it) until the next wake-up
of its word and a garbage collection after it, so its owed-reader
registration shuts other processes' writers out meanwhile (indefinitely in
an idle process).  The writer is another process."""
import asyncio
import gc
import os

import pytest
from conftest import FORK
from holders import hold_until_told

import pyshmlock

pytestmark = pytest.mark.timeout(60)


@pytest.mark.xfail(strict=True, reason=(
    "the parking record (lw.parked -> _Parked -> attempt) holds a parked attempt "
    "strongly; withdrawing a dropped one at once needs the record to hold it weakly"))
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
        del aw, fut
        gc.collect()
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
