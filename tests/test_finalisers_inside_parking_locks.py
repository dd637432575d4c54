"""An application's finaliser that opens or closes a lock (a ``__del__``
calling ``close()``) may be run by a collection anywhere, also while this
thread holds one of the asyncio parking locks (``_park._helpers_lock`` in
an asyncio acquire's first park, a helper's ``mu`` in park()).  The last
close takes both (the close hook), so waiting there is waiting for itself,
or, with another thread in a last close holding the registry lock and
waiting for the parking lock, a lock-order deadlock.  Either way the
finaliser is refused (WouldDeadlockError, printed as its error) instead of
waiting, as inside the thread's own open or close, and the dropped lock
object gives its reference back through its own finaliser."""
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(120)

PRELUDE = textwrap.dedent("""
    import gc, sys, threading, time, warnings
    import pyshmlock
    from pyshmlock import _attachment, _park
    warnings.simplefilter("ignore")
    seen = []
    sys.unraisablehook = lambda u: seen.append(type(u.exc_value).__name__)
    name = sys.argv[1]

    class Holder:                 # an application's object owning a lock
        def __init__(self, name):
            self.lock = pyshmlock.RWLock(name)
            self.me = self        # a cycle: freed by the collector
        def __del__(self):
            self.lock.close()

    gc.disable()
""")


def run(body, name):
    p = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body), name],
                       capture_output=True, text=True, timeout=30)
    return p.returncode, p.stdout, p.stderr


def test_a_finaliser_run_under_the_helpers_lock_is_refused_not_waited(lock_name):
    rc, out, err = run("""
        Holder(name)
        with _park._helpers_lock:     # as inside an asyncio acquire's first park
            gc.collect()
        print("collected", seen, flush=True)
        pyshmlock.RWLock(name).close()
        print("settled", pyshmlock.inspect(name).attached_pids)
    """, lock_name)
    assert rc == 0, (out, err)
    assert "collected ['WouldDeadlockError']" in out and "settled []" in out, (out, err)


def test_a_finaliser_run_under_a_helpers_mu_is_refused_not_waited(lock_name):
    rc, out, err = run("""
        h = Holder(name)
        helper = _park._helper_for(h.lock)   # this lock's asyncio helper
        del h
        with helper.mu:               # as inside park() (_add_loop allocates)
            gc.collect()
        print("collected", seen, flush=True)
        pyshmlock.RWLock(name).close()
        print("settled", pyshmlock.inspect(name).attached_pids)
    """, lock_name)
    assert rc == 0, (out, err)
    assert "collected ['WouldDeadlockError']" in out and "settled []" in out, (out, err)


def test_a_finaliser_under_the_helpers_lock_beside_a_last_close_is_no_lock_order_deadlock(
        lock_name):
    """Thread A holds the helpers' lock and a collection there runs a
    finaliser that closes a lock; the main thread is in a last close, which
    holds the registry lock and waits for the helpers' lock (the close
    hook).  Waiting for the registry lock in A would be forever."""
    rc, out, err = run("""
        other = pyshmlock.RWLock(name + "-other")
        Holder(name)
        inside = threading.Event()
        def a():
            with _park._helpers_lock:
                inside.set()
                time.sleep(0.5)       # the main thread's close waits for it now
                gc.collect()
        t = threading.Thread(target=a, daemon=True)
        t.start()
        inside.wait()
        other.close()                 # registry lock, then the close hook
        t.join()
        print("collected", seen, flush=True)
        pyshmlock.RWLock(name).close()
        print("settled", pyshmlock.inspect(name).attached_pids)
        pyshmlock.unlink(name + "-other")
    """, lock_name)
    assert rc == 0, (out, err)
    assert "collected ['WouldDeadlockError']" in out and "settled []" in out, (out, err)


def test_a_signal_handler_opening_a_lock_inside_an_open_is_refused(lock_name):
    rc, out, err = run("""
        import signal
        got = []
        def handler(signum, frame):
            try:
                pyshmlock.RWLock(name).close()
                got.append("opened")
            except pyshmlock.WouldDeadlockError:
                got.append("refused")
        signal.signal(signal.SIGALRM, handler)
        with _attachment._registry_lock_unless_held():    # as inside an open
            signal.raise_signal(signal.SIGALRM)
        signal.raise_signal(signal.SIGALRM)                # outside: it opens
        print("got", got, pyshmlock.inspect(name).attached_pids)
    """, lock_name)
    assert rc == 0, (out, err)
    assert "got ['refused', 'opened'] []" in out, (out, err)


def test_a_finaliser_in_another_thread_waits_for_the_holder(lock_name):
    rc, out, err = run("""
        Holder(name)
        done = threading.Event()
        def b():
            gc.collect()
            done.set()
        with _attachment._registry_lock_unless_held():
            t = threading.Thread(target=b, daemon=True)
            t.start()
            time.sleep(0.5)
            print("waited", not done.is_set(), flush=True)
        t.join(20)
        print("closed", done.is_set(), seen, pyshmlock.inspect(name).attached_pids)
    """, lock_name)
    assert rc == 0, (out, err)
    assert "waited True" in out and "closed True [] []" in out, (out, err)
