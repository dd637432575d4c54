"""A lock object dropped without close() is a leak the library reports and
mends, as an unclosed file is: its finaliser warns (ResourceWarning) and
gives its reference to the process's attachment back, taking no lock (the
project's rule: no lock in a finaliser's path; the attachment is settled by
the next open or close of a lock in the process).  So the process's last
object of a lock is the last one, and its close() refuses while the
process holds the lock."""
import gc
import pickle
import subprocess
import sys
import textwrap
import warnings

import pytest

import pyshmlock

pytestmark = pytest.mark.timeout(60)


def _collect():
    """Collect what was dropped (a lock object is in a reference cycle with
    its holds: the cyclic collector finalises it); the ResourceWarnings."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        gc.collect()
    return [w for w in seen if issubclass(w.category, ResourceWarning)]


def test_a_dropped_lock_warns_and_gives_its_attachment_back(lock_name):
    _collect()              # what earlier tests in this worker left is not ours
    lk = pyshmlock.RWLock(lock_name)
    assert pyshmlock.inspect(lock_name).attached_pids == [__import__("os").getpid()]
    del lk
    seen = [w for w in _collect() if lock_name in str(w.message)]
    assert len(seen) == 1, [str(w.message) for w in seen]
    assert "close()" in str(seen[0].message)
    other = pyshmlock.RWLock(lock_name + "-other")   # the next open settles it
    other.close()
    pyshmlock.unlink(lock_name + "-other")
    assert pyshmlock.inspect(lock_name).attached_pids == [], \
        "the dropped object's attachment was never given back"


@pytest.mark.parametrize("second", ["open", "unpickle"])
def test_close_of_the_last_object_refuses_while_the_process_holds_the_write(lock_name,
                                                                           second):
    first = pyshmlock.RWLock(lock_name)
    other = (pyshmlock.RWLock(lock_name) if second == "open"
             else pickle.loads(pickle.dumps(first)))
    assert first.acquire_write(5)
    del first
    _collect()                        # the process still holds the write
    with pytest.raises(pyshmlock.LockInUseError):
        other.close()
    other.release_write()             # holds are the process's: any object releases
    other.close()
    assert pyshmlock.inspect(lock_name).attached_pids == []


def test_a_dropped_lock_that_held_keeps_its_attachment_until_released(lock_name):
    lk = pyshmlock.RWLock(lock_name)
    assert lk.acquire_read(5)
    del lk
    _collect()                        # dropped holding a read: nothing is closed
    again = pyshmlock.RWLock(lock_name)
    assert pyshmlock.inspect(lock_name).readers == {__import__("os").getpid(): 1}
    again.release_read()
    again.close()
    assert pyshmlock.inspect(lock_name).attached_pids == []


def test_the_finaliser_takes_no_lock(lock_name):
    """A collection can run anywhere, also in a thread that holds the
    registry's lock (inside an open): the finaliser must not wait for it."""
    code = textwrap.dedent("""
        import gc, sys, warnings
        import pyshmlock
        from pyshmlock import _attachment
        warnings.simplefilter("ignore")
        lk = pyshmlock.RWLock(sys.argv[1])
        gc.disable()
        del lk
        with _attachment._registry_lock:
            gc.collect()              # finalises the lock here
        print("collected")
        pyshmlock.RWLock(sys.argv[1]).close()
        print("settled", pyshmlock.inspect(sys.argv[1]).attached_pids)
    """)
    p = subprocess.run([sys.executable, "-c", code, lock_name], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert "collected" in p.stdout and "settled []" in p.stdout, (p.stdout, p.stderr)


def test_an_applications_finaliser_closing_a_lock_inside_an_open_is_refused_not_waited(
        lock_name):
    """An application's finaliser that closes its lock (a ``__del__`` as for
    a file) may be run by a collection inside this thread's own open or
    close, which holds the registry's lock: its close() gets
    WouldDeadlockError, printed as the finaliser's error, instead of waiting
    for good; the dropped lock object then gives its reference back through
    its own finaliser, and the next open settles it."""
    code = textwrap.dedent("""
        import gc, sys, warnings
        import pyshmlock
        from pyshmlock import _attachment
        warnings.simplefilter("ignore")
        seen = []
        sys.unraisablehook = lambda u: seen.append(type(u.exc_value).__name__)

        class Holder:                 # an application's object owning a lock
            def __init__(self, name):
                self.lock = pyshmlock.RWLock(name)
                self.me = self        # a cycle: freed by the collector
            def __del__(self):
                self.lock.close()

        gc.disable()
        Holder(sys.argv[1])
        with _attachment._registry_lock:    # as inside an open or a close
            gc.collect()
        print("collected", seen)
        pyshmlock.RWLock(sys.argv[1]).close()
        print("settled", pyshmlock.inspect(sys.argv[1]).attached_pids)
    """)
    p = subprocess.run([sys.executable, "-c", code, lock_name], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "collected ['WouldDeadlockError']" in p.stdout, (p.stdout, p.stderr)
    assert "settled []" in p.stdout, (p.stdout, p.stderr)
