"""notify_closing() from a signal handler: the handler may run in a thread
that is itself inside the parking code's lock (the main thread closing the
lock while the event loop runs in another thread).  It must not wait for
that lock: the parked tasks still end with LockClosingError.  The writer
that keeps them parked is another process."""
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(60)

CHILD = textwrap.dedent("""
    import asyncio, os, signal, sys, threading, time
    import pyshmlock
    from pyshmlock import _park

    name = sys.argv[1]
    alock = pyshmlock.AsyncRWLock(name)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever)
    thread.start()

    async def waiter():
        try:
            return await alock.acquire_write(20)
        except pyshmlock.LockClosingError:
            return "closing"

    fut = asyncio.run_coroutine_threadsafe(waiter(), loop)
    deadline = time.monotonic() + 10
    while os.getpid() not in alock.info().waiters:     # parked, the claim made
        assert time.monotonic() < deadline
        time.sleep(0.02)
    helper = _park._helpers[alock._lock._att.key]
    signal.signal(signal.SIGUSR1, lambda *a: alock.notify_closing())
    # As inside the close hook: this (the main) thread holds the helper's
    # lock when the signal's handler runs.
    with helper.mu:
        signal.raise_signal(signal.SIGUSR1)
    print(fut.result(10), flush=True)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()
    alock.close()
""")


def test_notify_closing_from_a_handler_inside_the_parking_lock_does_not_deadlock(lock_name):
    import pyshmlock
    other = pyshmlock.RWLock(lock_name)
    assert other.acquire_write(5)
    try:
        r = subprocess.run([sys.executable, "-c", CHILD, lock_name], capture_output=True,
                           text=True, timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail("notify_closing from a signal handler deadlocked on the parking lock")
    finally:
        other.release_write()
        other.close()
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "closing", (r.stdout, r.stderr)
