"""begin_session(): unpinned, then an update hold, then the pin, which
releases the hold.  A signal handler that raises (KeyboardInterrupt is one)
and runs just after the update is granted must not leave the update hold
behind: the caller never saw it and cannot release it (the pin is made in C
straight after the grant, blocking and asyncio).  The signal is taken by
another thread, so the waiting thread gets no EINTR and the handler runs
only once the grant has returned.  The reader that keeps the update waiting is another process."""
import asyncio
import os
import signal
import threading
import time

import pytest
from conftest import FORK
from helpers import wait_until_waiting
from holders import hold_until_told

import pyshmlock

pytestmark = pytest.mark.timeout(60)


class _Interrupted(Exception):
    pass


def test_an_interrupt_landing_right_after_the_update_is_granted_leaks_no_hold(
        lock_name, children):
    cmd = FORK.Queue()
    reader = children(hold_until_told, lock_name, cmd, "read")
    reader.expect("reading")
    lock = pyshmlock.RWLock(lock_name)

    def handler(signum, frame):
        raise _Interrupted()

    previous = signal.signal(signal.SIGUSR1, handler)
    started, stop = threading.Event(), threading.Event()

    def sleeper():
        started.set()
        stop.wait(30)

    taker = threading.Thread(target=sleeper)
    taker.start()
    started.wait(5)

    def later():
        wait_until_waiting(lock, os.getpid())   # begin_session waits for the reader
        signal.pthread_kill(taker.ident, signal.SIGUSR1)   # trips the handler only
        time.sleep(0.2)
        cmd.put("go")                                       # the update is granted

    t = threading.Thread(target=later)
    t.start()
    leaked = False
    try:
        with pytest.raises(_Interrupted):
            lock.begin_session(timeout=10)
        try:
            lock.release_update()
            leaked = True
        except RuntimeError:
            pass
    finally:
        stop.set()
        t.join(10)
        taker.join(10)
        signal.signal(signal.SIGUSR1, previous)
    reader.expect("released")
    lock.close()
    assert not leaked, "begin_session left the update hold behind"


def test_an_asyncio_session_parked_behind_a_reader_begins_times_out_or_is_cancelled_cleanly(
        lock_name, children):
    cmd = FORK.Queue()
    reader = children(hold_until_told, lock_name, cmd, "read")
    reader.expect("reading")
    alock = pyshmlock.AsyncRWLock(lock_name)

    async def main():
        with pytest.raises(TimeoutError):
            await alock.begin_session(ttl=30, timeout=0.2)
        task = asyncio.create_task(alock.begin_session(ttl=30))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert alock.info().updater_pid is None
        assert alock._lock.acquire_read(0)  # no claim left to shut readers out
        alock.release_read()
        task = asyncio.create_task(alock.begin_session(ttl=30, timeout=10))
        await asyncio.sleep(0.2)
        cmd.put("go")                       # the reader leaves: the update is had
        token = await task
        assert isinstance(token, int) and not isinstance(token, bool) and token != 0
        return token

    token = asyncio.run(main())
    reader.expect("released")
    info = alock.info()
    assert info.updater_pid is None and info.session is not None and info.paused
    alock.end_session(token)
    assert alock._lock.resume(5)
    alock.close()
