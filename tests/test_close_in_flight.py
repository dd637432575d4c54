"""close() while calls of the same process are in flight: another thread
waiting in acquire_write, or an asyncio task parked, makes close() refuse
with LockInUseError (never a crash, never a freed handle under a waiter),
and a refused close() leaves the lock fully usable by the calls of the
other threads.  Every wait is bounded."""
import os
import threading
import time

import pytest
from conftest import FORK
from helpers import reap
from holders import hold_until_told

import pyshmlock

pytestmark = pytest.mark.timeout(90)


def _close_under_a_blocked_writer(name, result_fd):
    """In a forked child: a thread blocks in acquire_write (its claim is in
    the state word) while the main thread closes the lock."""
    lk = pyshmlock.RWLock(name)
    out = []
    t = threading.Thread(target=lambda: out.append(lk.acquire_write(3)))
    t.start()
    t0 = time.monotonic()
    while lk.info().writer_pid != os.getpid() and time.monotonic() - t0 < 30:
        time.sleep(0.005)
    try:
        lk.close()
        verdict = b"closed"
    except pyshmlock.LockInUseError as e:
        verdict = b"refused:" + str(e).encode()
    t.join(10)
    os.write(result_fd, verdict + b"|" + repr(out).encode())
    if verdict.startswith(b"refused"):
        lk.close()
    os._exit(0)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_close_while_another_thread_waits_is_refused_not_a_crash(lock_name, children):
    cmd = FORK.Queue()
    c = children(hold_until_told, lock_name, cmd)        # reads until the end
    c.expect("reading")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            _close_under_a_blocked_writer(lock_name, w)
        finally:
            os._exit(3)
    os.close(w)
    status = reap(pid, 60.0)
    got = os.read(r, 4096).decode(errors="replace")
    os.close(r)
    cmd.put("go")
    assert status is not None, "the child hung"
    assert os.WIFEXITED(status), f"the child died of signal {os.WTERMSIG(status)} ({got!r})"
    assert got.startswith("refused:"), got
    assert "in flight" in got or "waiting" in got, got
    assert got.endswith("[False]"), got          # the writer timed out normally


def test_close_with_an_asyncio_task_parked_is_refused(lock_name, children):
    import asyncio
    cmd = FORK.Queue()
    c = children(hold_until_told, lock_name, cmd)        # reads until the end
    c.expect("reading")

    async def main():
        alk = pyshmlock.AsyncRWLock(lock_name)
        task = asyncio.ensure_future(alk.acquire_write(60))
        while alk.info().writer_pid != os.getpid():      # parked, its claim made
            await asyncio.sleep(0.005)
        with pytest.raises(pyshmlock.LockInUseError, match="waiting|in flight"):
            alk.close()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        alk.close()          # nothing in flight any more
        return alk

    alk = asyncio.run(asyncio.wait_for(main(), 30))
    with pytest.raises(ValueError, match="closed"):
        alk.pause()
    cmd.put("go")
    c.expect("released")


def test_a_refused_close_never_disturbs_calls_of_other_threads(lock):
    """close() refused (a hold, or calls in flight) must leave the lock fully
    usable: concurrent calls neither fail as "closed" nor lose their count."""
    assert lock.acquire_read(1)
    stop = threading.Event()
    errors = []

    def churn():
        try:
            while not stop.is_set():
                assert lock.acquire_read(2)
                lock.release_read()
                lock.is_locked()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=churn) for _ in range(2)]
    for t in threads:
        t.start()
    refused = 0
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < 1.0:
            with pytest.raises(pyshmlock.LockInUseError):
                lock.close()
            refused += 1
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert not errors, errors
    assert refused > 10
    lock.release_read()
    lock.close()                  # nothing in flight and nothing held: closes
    with pytest.raises(ValueError, match="closed"):
        lock.acquire_read(0)
