"""An attempt awaited a second time while it is parked (two tasks awaiting
one awaitable, or a second `await` from another loop) is refused with
RuntimeError, as a coroutine awaited twice is: the first awaiter keeps its
place and is woken as usual, and nothing is left held.  The other side is
another process."""
import asyncio
import os

import pytest
from conftest import FORK
from helpers import wait_for
from holders import hold_until_told

import pyshmlock

pytestmark = pytest.mark.timeout(60)


def test_a_parked_attempt_awaited_by_a_second_task_is_refused(lock_name, children):
    alock = pyshmlock.AsyncRWLock(lock_name)
    cmd = FORK.Queue()
    blocker = children(hold_until_told, lock_name, cmd)
    blocker.expect("reading")

    async def main():
        aw = alock.acquire_write(10)
        first = asyncio.ensure_future(aw)
        await asyncio.sleep(0.1)          # first is parked on the writer claim
        assert not first.done()
        second = asyncio.ensure_future(aw)
        with pytest.raises(RuntimeError, match="being awaited already"):
            await asyncio.wait_for(second, 5)
        assert not first.done()           # still waiting, still in its place
        cmd.put("go")                     # the reader leaves: the first is woken
        assert await asyncio.wait_for(first, 5) is True
        alock.release_write()

    asyncio.run(main())
    blocker.expect("released")
    # The helper thread may still be in its last sleep (woken by the
    # release, not yet out): it holds nothing; wait for it to leave.
    wait_for(lambda: os.getpid() not in alock.info().waiters, 30,
             what="the helper's last sleep")
    info = alock.info()
    assert info.writer_pid != os.getpid() and os.getpid() not in info.waiters
    alock.close()


def test_sending_a_parked_attempt_before_its_wake_up_is_refused(lock_name, children):
    alock = pyshmlock.AsyncRWLock(lock_name)
    cmd = FORK.Queue()
    blocker = children(hold_until_told, lock_name, cmd)
    blocker.expect("reading")

    async def main():
        aw = alock.acquire_write(10)
        fut = aw.send(None)               # parked: the future to wait on
        assert not fut.done()
        with pytest.raises(RuntimeError, match="being awaited already"):
            aw.send(None)
        with pytest.raises(KeyError):     # throw still withdraws it
            aw.throw(KeyError("x"))
        cmd.put("go")

    asyncio.run(main())
    blocker.expect("released")
    # The helper thread may still be in its last sleep (woken by the
    # release, not yet out): it holds nothing; wait for it to leave.
    wait_for(lambda: os.getpid() not in alock.info().waiters, 30,
             what="the helper's last sleep")
    info = alock.info()
    assert info.writer_pid != os.getpid() and os.getpid() not in info.waiters
    alock.close()
