"""Holds belong to the process: threads that take holds and exit one by one
without releasing leave them to the process.  The exclusive fast path now
names the holding thread by its thread pointer (this_thread()); a thread
started later (which may get the same thread pointer, as it may get the
same pthread_t) must not be told it holds what a dead thread took, beyond
what pthread_self() told before: its timed attempt waits and times out, or
succeeds once another thread released."""
import threading

import pytest

pytestmark = pytest.mark.timeout(60)


def _in_thread(fn):
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(30)
    assert not t.is_alive()
    return out[0]


def test_read_holds_of_exited_threads_are_released_by_the_process(lock):
    for _ in range(10):
        assert _in_thread(lambda: lock.acquire_read(5))
    assert lock.info().readers == {__import__("os").getpid(): 10}
    # a writer in another thread cannot get in meanwhile
    assert _in_thread(lambda: lock.acquire_write(0)) is False
    for _ in range(10):
        lock.release_read()
    assert _in_thread(lambda: lock.acquire_write(0)) is True
    lock.release_write()


@pytest.mark.parametrize("kind", ["write", "update"])
def test_an_exclusive_hold_of_an_exited_thread(lock, kind):
    assert _in_thread(lambda: getattr(lock, f"acquire_{kind}")(5))
    for _ in range(5):
        # Threads started one by one after the holder exited (they may reuse
        # its thread pointer): a try once says "not had", a timed one times
        # out, none raises or is granted a second exclusive hold.
        assert _in_thread(lambda: getattr(lock, f"acquire_{kind}")(0)) is False
        assert _in_thread(lambda: lock.acquire_read(0)) is False
        assert _in_thread(lambda: getattr(lock, f"acquire_{kind}")(0.05)) is False
    # The process releases it from another thread.
    _in_thread(lambda: getattr(lock, f"release_{kind}")())
    assert _in_thread(lambda: getattr(lock, f"acquire_{kind}")(0)) is True
    getattr(lock, f"release_{kind}")()
    assert not lock.info().writer_pid and not lock.info().updater_pid
