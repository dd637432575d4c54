"""asyncio parking and the garbage collector: a task left parked when its
loop is closed forms a reference cycle, and the collector runs its
coroutine's `finally` at any allocation, in any thread, also while that
thread is inside the parking code.  Nothing there may wait for a lock the
parking code holds; the abandoned attempts withdraw; later waiters get
their answers in time.

Each collector case runs in a child interpreter with a deadline: a
deadlock there is a failed test, not a hung suite.  The last two cases run
here: a closed loop's parked task gives its place in the queue back once the
loop and the task are dropped, or when the lock is closed."""
import asyncio
import gc
import os
import subprocess
import sys
import textwrap
import weakref

import pytest
from holders import hold_until_told, timed_acquire

import pyshmlock

pytestmark = pytest.mark.timeout(120)

# GC at (nearly) every allocation, in the thread that allocates.
ROUNDS = textwrap.dedent('''
    import asyncio, gc, sys, threading, time
    import pyshmlock
    lock = pyshmlock.AsyncRWLock(sys.argv[1])
    gc.set_threshold(1, 1, 1)

    def rounds():
        for i in range(100):
            loop = asyncio.new_event_loop()
            async def parked():
                await lock.acquire_read()
            t = loop.create_task(parked())
            loop.run_until_complete(asyncio.sleep(0.002))
            loop.close()          # the task stays parked: a cycle for the GC
            del t, loop

    th = threading.Thread(target=rounds, daemon=True)
    th.start()
    th.join(60)
    if th.is_alive():
        print("deadlocked", flush=True)
        sys.exit(3)
    gc.set_threshold(700, 10, 10)
    gc.collect()
    print("queued", sum(lock.info().queued_readers.values()), flush=True)

    async def later():             # another loop's waiter, with a timeout
        t0 = time.monotonic()
        got = await lock.acquire_read(timeout=0.5)
        return got, time.monotonic() - t0
    got, took = asyncio.run(later())
    print("later", got, round(took, 2), flush=True)
''')


def run_child(code, *args, timeout=90):
    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                       text=True, timeout=timeout)
    return p.returncode, p.stdout


def test_closed_loops_with_parked_readers_never_deadlock_the_collector(lock_name, children):
    from conftest import FORK
    cmd = FORK.Queue()
    writer = children(hold_until_truly_told_write, lock_name, cmd)
    writer.expect("writing")               # readers queue as owed behind it
    rc, out = run_child(ROUNDS, lock_name)
    assert rc == 0, out
    assert "queued 0" in out, f"abandoned attempts did not withdraw: {out}"
    assert "later False" in out, out       # still written: a timely False
    took = float(out.split("later False")[1].split()[0])
    assert took < 5, out
    cmd.put("go")
    writer.expect("released")
    lk = pyshmlock.RWLock(lock_name)
    try:
        # no owed reader of a dead loop holds the next writer back
        assert lk.acquire_write(5)
        lk.release_write()
    finally:
        lk.close()


def hold_until_truly_told_write(q, name, cmd):
    hold_until_told(q, name, cmd, "write")


# The collector runs a parked task's `finally` while this thread holds the
# helper's lock, exactly as an allocation inside park() can make it do.
UNDER_MU = textwrap.dedent('''
    import asyncio, gc, sys
    import pyshmlock
    from pyshmlock import _park
    lock = pyshmlock.AsyncRWLock(sys.argv[1])
    loop = asyncio.new_event_loop()
    async def parked():
        await lock.acquire_read()
    t = loop.create_task(parked())
    loop.run_until_complete(asyncio.sleep(0.01))
    loop.close()
    helper = _park._helpers[lock._lock._att.key]
    del t, loop
    with helper.mu:
        gc.collect()               # runs the coroutine's finally: unpark
    print("collected", flush=True)
    gc.collect()
    print("queued", sum(lock.info().queued_readers.values()), flush=True)
''')


def test_the_collector_never_waits_for_the_parking_lock(lock_name, children):
    from conftest import FORK
    cmd = FORK.Queue()
    writer = children(hold_until_truly_told_write, lock_name, cmd)
    writer.expect("writing")
    rc, out = run_child(UNDER_MU, lock_name, timeout=30)
    assert rc == 0 and "collected" in out and "queued 0" in out, out
    cmd.put("go")
    writer.expect("released")


# ------------------------------------- a loop closed with a task parked

@pytest.mark.timeout(60)
def test_a_loop_closed_with_a_parked_reader_releases_its_place(lock_name, children):
    """A loop closed while a task is parked (run_until_complete, then close)
    can never run that task again: once the loop and the task are dropped,
    the queued reader must go, so writers in other processes get in, and the
    lock can be closed."""
    alock = pyshmlock.AsyncRWLock(lock_name)
    alock._lock.acquire_write()
    loop = asyncio.new_event_loop()
    task = loop.create_task(alock.acquire_read())
    loop.run_until_complete(asyncio.sleep(0.05))        # parked: a queued reader
    assert alock.info().queued_readers.get(os.getpid()) == 1
    loop.close()
    loop_ref = weakref.ref(loop)
    del loop, task
    gc.collect()
    assert loop_ref() is None, "the closed loop is kept alive by the asyncio helper"
    alock._lock.release_write()
    assert not alock.info().queued_readers
    c = children(timed_acquire, lock_name, "write", 5)
    ok, waited = c.get(timeout=20)
    assert ok and waited < 2.0
    alock.close()


@pytest.mark.timeout(60)
def test_closing_a_lock_abandons_the_tasks_of_a_closed_loop(lock_name):
    """Even while the closed loop and its task are still referenced, the
    lock's close() takes their place back instead of refusing forever."""
    alock = pyshmlock.AsyncRWLock(lock_name)
    alock._lock.acquire_write()
    loop = asyncio.new_event_loop()
    task = loop.create_task(alock.acquire_read())
    loop.run_until_complete(asyncio.sleep(0.05))
    loop.close()
    alock._lock.release_write()
    alock.close()                      # not LockInUseError: nothing can run that task
    assert not task.done()
    probe = pyshmlock.RWLock(lock_name)
    try:
        assert not probe.info().queued_readers
        assert probe.acquire_write(2)
        probe.release_write()
    finally:
        probe.close()
