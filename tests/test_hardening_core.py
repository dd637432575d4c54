"""Regression tests for the C-core defects of the outside review (issue 11):
epoch wrap-around, close() under a call in flight, fork() during re-attach,
read-hold count overflow, and the handle checks of the entry points.
Every wait is bounded."""
import os
import signal
import time

import pytest

import pyshmlock

pytestmark = pytest.mark.timeout(90)

EPOCHS = 1 << 15            # width of the epoch field of the state word


def _wait_for(pred, timeout=10.0, what="condition"):
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.002)


def _queued(lk, pid):
    return lk.info().queued_readers.get(pid, 0)


def read_once(q, name):
    lk = pyshmlock.RWLock(name)
    q.put("opened")
    ok = lk.acquire_read(60)
    if ok:
        lk.release_read()
    q.put(("read", ok))
    lk.close()


# ---------------------------------------------------------------- defect 1

def test_epoch_wrap_across_one_readers_wait_does_not_deadlock(lock, lock_name, children):
    """A reader queues at epoch E, requeues under a pause behind claim E+1,
    and 2^15 exclusive phases pass while paused.  The first claim after
    resume() has epoch E+1 again and waits for that reader: the reader must
    enter (it used to refuse because the epoch equalled its own: a hang)."""
    assert lock.acquire_write(5)                          # claim E
    c = children(read_once, lock_name)
    c.expect("opened")
    _wait_for(lambda: _queued(lock, c.pid) == 1, what="reader queued at E")
    lock.pause()
    lock.release_write()
    assert lock.acquire_write(5)                          # claim E+1, granted under the pause
    # the reader sees the granted claim E+1 and requeues behind it too
    _wait_for(lambda: _queued(lock, c.pid) == 2, what="reader requeued behind E+1")
    e1 = lock.info().epoch
    os.kill(c.pid, signal.SIGSTOP)      # it must not slip in while the gate opens below
    try:
        for _ in range(EPOCHS - 1):     # phases E+2 .. E+2^15, all under the pause
            lock.release_write()
            assert lock.acquire_write(5)
        assert lock.info().epoch == (e1 - 1) % EPOCHS
        lock.resume()                   # a write hold does not pin the pause
        lock.release_write()
        # The next claim has the reader's epoch again.
    finally:
        os.kill(c.pid, signal.SIGCONT)
    got = lock.acquire_write(10)
    assert got, "the claim after wrap-around waited forever for the owed reader"
    assert lock.info().epoch == e1
    lock.release_write()
    assert c.get(20) == ("read", True)
    c.join(10)


# ---------------------------------------------------------------- defect 3

def _churn(stop, errors, tag):
    """Open fresh locks (each open attaches under the core's re-attach lock),
    use and close them, until told to stop."""
    from conftest import unique_name
    try:
        while not stop.is_set():
            n = unique_name(tag)
            lk = pyshmlock.RWLock(n)
            try:
                assert lk.acquire_read(2)
                lk.release_read()
            finally:
                lk.close()
                pyshmlock.unlink(n, force=True)
    except BaseException as e:   # reported by the test
        errors.append(e)


def _reap(pid, timeout):
    """waitpid with a deadline: the exit status, or None (child killed)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.001)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


@pytest.mark.filterwarnings("ignore::DeprecationWarning")   # fork() with threads running
def test_fork_in_a_loop_while_other_threads_open_and_use_locks(lock):
    """Every fork lands at a random point of the other threads' opens; the
    child's first call re-attaches the inherited lock and must never block
    on a process-private mutex that a vanished thread held at fork()."""
    import threading
    stop = threading.Event()
    errors = []
    threads = [threading.Thread(target=_churn, args=(stop, errors, f"fork{k}"))
               for k in range(2)]
    for t in threads:
        t.start()
    hung = 0
    try:
        for _ in range(150):
            pid = os.fork()
            if pid == 0:   # child: only the C core and os._exit, no pytest
                ok = False
                try:
                    ok = lock.acquire_read(2)
                    lock.release_read()
                    n = f"{lock.name}-c{os.getpid()}"   # a fresh open in the child too
                    lk = pyshmlock.RWLock(n)
                    lk.close()
                    pyshmlock.unlink(n, force=True)
                finally:
                    os._exit(0 if ok else 1)
            status = _reap(pid, 5.0)
            if status is None:
                hung += 1
                break
            assert os.waitstatus_to_exitcode(status) == 0
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert not errors, errors
    assert hung == 0, "a forked child blocked forever on its first call"
