"""CPython's own tests of threading.Lock, run against the write side of the
blocking API: ``RWLock(name).writer_lock`` is threading.Lock-shaped
(acquire(blocking, timeout) / release() / locked(), ``with``).

The tests are not copied here: they are imported from the standard library
of the interpreter running the suite (``test.lock_tests``, the module that
CPython's own test_threading uses), so they are exactly that CPython
version's ``LockTests``.  Some distributions strip the ``test`` package;
the module is then skipped with the reason.

Each lock is a fresh segment whose name is removed at once.  Only the
documented differences (README, "Ownership") are overridden below, each
with what we check instead.
"""
import os
import threading
import time
import uuid
import weakref
from _thread import TIMEOUT_MAX

import pytest

import pyshmlock

lock_tests = pytest.importorskip(
    "test.lock_tests",
    reason="this Python has no test.lock_tests (its distribution strips the "
           "standard library's test package, e.g. Debian without "
           "libpython3-testsuite); CPython's LockTests cannot be run")

pytestmark = [
    pytest.mark.timeout(120),
    # CPython's tests drop their locks without close(), as they would a
    # threading.Lock: RWLock's finaliser then warns, as designed
    pytest.mark.filterwarnings("ignore:unclosed lock 'test-locktests-:ResourceWarning"),
]


# Every lock write_hold made, by weak reference: one still alive when its
# test ends is closed then (close_made); one the test dropped went through
# RWLock's own finaliser, which takes no lock (it warns, ResourceWarning,
# and queues its reference).  No finaliser of the test's own: one runs
# inside whatever call the collection interrupts, close() takes the
# registry lock, and a collection inside a close() (which holds it) then
# waits for good (tests/test_finalisers_take_no_lock.py).  Held weakly
# because CPython's test_weakref_deleted checks that a dropped lock dies.
_made = []


def write_hold():
    """A threading.Lock-shaped hold on a lock of its own."""
    name = f"test-locktests-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    lk = pyshmlock.RWLock(name)
    pyshmlock.unlink(name)                 # nothing left in /dev/shm, ever
    _made.append(weakref.ref(lk))
    return lk.writer_lock


@pytest.fixture(autouse=True)
def close_made():
    yield
    while _made:
        lk = _made.pop()()
        if lk is None:
            continue
        try:
            lk.close()
        except pyshmlock.LockInUseError:
            pass   # a thread of the test still holds it: its own finaliser
            #        gives the reference back once it is dropped


def _in_thread(fn):
    """Run fn in a thread; return (thread, list that gets fn's result or error)."""
    out = []

    def run():
        try:
            out.append(fn())
        except BaseException as e:     # handed to the test thread
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


class TestWriteHoldIsALock(lock_tests.LockTests):
    locktype = staticmethod(write_hold)

    # Difference 1 (README, "Ownership", re-entry row): a thread that asks,
    # without a timeout, for a write hold it already has gets
    # WouldDeadlockError; threading.Lock would block until another thread
    # releases it.  A timed attempt does wait for that release, as
    # threading.Lock's does.
    def test_reacquire(self):
        lock = self.locktype()
        second = threading.Event()

        def same_thread_twice():
            assert lock.acquire()
            with pytest.raises(pyshmlock.WouldDeadlockError):
                lock.acquire()
            assert lock.acquire(blocking=False) is False
            second.set()
            return lock.acquire(timeout=30)     # until the main thread releases

        t, out = _in_thread(same_thread_twice)
        assert second.wait(30), out
        assert t.is_alive()                     # its timed attempt waits
        lock.release()                          # from another thread: allowed
        t.join(30)
        assert out == [True]
        assert lock.locked()
        lock.release()
        assert not lock.locked()

    # Difference 2: threading.Lock refuses a timeout above TIMEOUT_MAX with
    # OverflowError; here any finite timeout, however large, and inf mean
    # "wait that long".  Bad timeouts are refused as threading.Lock's are.
    def test_timeout(self):
        lock = self.locktype()
        with pytest.raises(ValueError):
            lock.acquire(False, 1)              # a timeout on a try
        for bad in (-100, -1e-3, float("nan")):
            with pytest.raises(ValueError):
                lock.acquire(timeout=bad)
        huge = (TIMEOUT_MAX, TIMEOUT_MAX + 1, 1e100, float("inf"))
        for forever in huge:                    # free: at once
            assert lock.acquire(timeout=forever) is True
            lock.release()
        # contended: a huge timeout waits until the hold is given back
        for forever in huge:
            assert lock.acquire()
            t, out = _in_thread(lambda: lock.acquire(timeout=forever))
            time.sleep(0.05)
            assert out == []                    # still waiting
            lock.release()
            t.join(30)
            assert out == [True]
            lock.release()
        # a short timeout on a hold another thread has: False after it
        assert lock.acquire()
        started = time.monotonic()
        t, out = _in_thread(lambda: lock.acquire(timeout=0.5))
        t.join(30)
        waited = time.monotonic() - started
        assert out == [False]
        self.assertTimeout(waited, 0.5)
        lock.release()

    # Difference 3: there is no _at_fork_reinit.  threading.Lock needs it
    # because a forked child keeps a copy of a lock whose holding thread is
    # gone; here holds belong to processes in shared memory, so a forked
    # child holds nothing and sees the parent's hold as the parent's (tested
    # across real processes in test_semantics.py,
    # test_forked_child_holds_nothing_and_cannot_release_parents_hold).
    def test_at_fork_reinit(self):
        assert not hasattr(self.locktype(), "_at_fork_reinit")
