"""The C fast path (csrc/fastpath/) keeps the exact behaviour of
the Python methods it replaced: results, timeouts, errors and their messages,
closed locks, signals during a wait; and it runs no Python frame and does not
release the GIL when the call does not wait.  Nothing here measures speed."""
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from conftest import unique_name
from helpers import remove_lock, wait_for
from holders import hold_until_told

import pyshmlock
from pyshmlock import _fast
from pyshmlock.lock import deadline_ns

pytestmark = pytest.mark.timeout(60)

HOLD_CALLS = ("acquire_read", "release_read", "acquire_write", "release_write",
              "acquire_update", "release_update")




@pytest.fixture
def writer(lock_name, children):
    """Another process holding the write lock until told to release it."""
    import multiprocessing as mp
    cmd = mp.get_context("fork").Queue()
    c = children(hold_until_told, lock_name, cmd, "write")
    c.expect("writing")
    yield c, cmd
    cmd.put("go")


# ------------------------------------------------------------ the wiring

def test_hold_calls_are_c_methods_of_the_base_types(lock):
    for name in HOLD_CALLS:
        assert getattr(pyshmlock.RWLock, name) is getattr(_fast.Lock, name), name
        assert type(getattr(lock, name)).__name__ == "builtin_function_or_method"
    assert pyshmlock.RWLock.paused is _fast.Lock.paused
    assert type(lock.reader_lock).__enter__ is _fast.Hold.__enter__
    assert type(lock.read(1)).__exit__ is _fast.Hold.__exit__


def test_with_on_a_locks_own_holds_allocates_nothing(lock):
    """lock.reader_lock/writer_lock/update_lock keep their bound
    __enter__/__exit__: a `with` on them allocates no object (on CPython
    before 3.14 each lookup would make a bound method); a short-lived hold
    (lock.read(timeout)) makes them as usual."""
    import tracemalloc

    def peak_of_two_withs(hold):
        with hold:
            pass
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            with hold:
                pass
            with hold:
                pass
            return tracemalloc.get_traced_memory()[1] - before
        finally:
            tracemalloc.stop()
    for hold in (lock.reader_lock, lock.writer_lock, lock.update_lock):
        assert peak_of_two_withs(hold) == 0, hold
    assert peak_of_two_withs(lock.read(1)) > 0     # the control: the probe sees allocations


def test_kept_bound_methods_look_like_the_usual_ones(lock):
    hold, short = lock.reader_lock, lock.read(1)
    for h in (hold, short):
        for name in ("__enter__", "__exit__"):
            m = getattr(h, name)
            assert type(m).__name__ == "builtin_function_or_method"
            assert m.__self__ is h and m.__name__ == name
            assert m.__qualname__ == f"SyncHold.{name}"
    assert hold.__enter__ is hold.__enter__            # kept
    assert short.__enter__ is not short.__enter__      # made at each lookup
    assert hold.__enter__() is hold and hold.__exit__(None, None, None) is None
    assert _fast.Hold.__enter__(short) is short
    assert _fast.Hold.__exit__(short, None, None, None) is None
    assert type(_fast.Hold.__enter__).__name__ == "method_descriptor"
    with pytest.raises(TypeError, match="doesn't apply to a 'object' object"):
        vars(_fast.Hold)["__enter__"].__get__(object(), _fast.Hold)
    assert not lock.is_locked()


def test_a_lock_with_kept_bound_methods_is_collected(lock_name):
    import gc
    import weakref
    lk = pyshmlock.RWLock(lock_name)
    with lk.writer_lock:
        pass
    refs = [weakref.ref(lk), weakref.ref(lk.reader_lock), weakref.ref(lk.writer_lock)]
    lk.close()
    del lk
    gc.collect()
    assert [r() for r in refs] == [None, None, None]


def test_no_python_frame_on_the_uncontended_path(lock):
    hold = lock.write(timeout=1.0)
    events = []

    def profile(frame, event, arg):
        events.append((event, getattr(arg, "__name__", None) if arg else frame.f_code.co_name))
    sys.setprofile(profile)
    try:
        lock.acquire_read()
        lock.release_read()
        lock.acquire_read(1.5)
        lock.release_read()
        lock.acquire_read(timeout=0)
        lock.release_read()
        with lock.reader_lock:
            lock.paused
        with hold:
            pass
        lock.acquire_update(2)
        lock.release_update()
    finally:
        sys.setprofile(None)
    python_frames = [e for e in events if e[0] == "call"]
    assert python_frames == [], python_frames
    c_calls = [name for ev, name in events if ev == "c_call"]
    assert c_calls.count("acquire_read") == 3 and c_calls.count("release_read") == 3


def _other_thread_ran_during(body, seconds=0.3):
    """Run body() in a loop while another thread, just woken, waits for the
    GIL with the switch interval made huge.  Returns whether the other
    thread ran before the loop ended, or None if it ran before the loop
    began (it took the GIL while os.write released it: no check made)."""
    r, w = os.pipe()
    ran = []

    def other():
        os.read(r, 1)           # waits with the GIL released
        ran.append(time.monotonic())
    t = threading.Thread(target=other, daemon=True)
    old = sys.getswitchinterval()
    # Huge before the thread exists: a thread already waiting for the GIL
    # would force a switch after the interval it started waiting with.
    sys.setswitchinterval(1000)
    try:
        t.start()
        time.sleep(0.05)        # the thread runs until it blocks in os.read
        os.write(w, b"x")
        early = bool(ran)
        end = time.monotonic() + seconds    # ample time for the thread to wake
        while not early and time.monotonic() < end:
            body()
        seen_before_sleep = bool(ran)
    finally:
        sys.setswitchinterval(old)
    t.join(10)
    os.close(r)
    os.close(w)
    assert ran, "the other thread never ran"
    return None if early else seen_before_sleep


def _gil_given_up_by(body):
    """_other_thread_ran_during, repeated until a run makes the check."""
    for _ in range(10):
        seen = _other_thread_ran_during(body)
        if seen is not None:
            return seen
    pytest.skip("the woken thread always took the GIL before the loop began")


def test_the_gil_is_kept_when_the_call_does_not_wait(lock):
    """A thread woken while the main thread makes uncontended calls can run
    only if a call gives the GIL up: with the switch interval made huge, it
    must not run until the main thread sleeps.  (Some interpreters switch
    anyway, CPython 3.9 even for an empty loop: the check is then void, and
    skipped, as a baseline run of an empty body shows.)"""
    def calls():
        lock.acquire_read()
        lock.release_read()
        lock.acquire_read(5.0)
        lock.release_read()
        with lock.reader_lock:
            pass
        lock.acquire_write()
        lock.release_write()
        lock.paused
    if _gil_given_up_by(lambda: None):
        pytest.skip("this interpreter lets a waiting thread run without any GIL release")
    assert not _gil_given_up_by(calls), "an uncontended call released the GIL"


def test_a_waiting_call_releases_the_gil(lock, writer):
    """Another thread runs Python while the call waits: it sees the main
    thread waiting and only then has the writer give the hold back.  A call
    that kept the GIL would wait to its deadline and fail."""
    c, cmd = writer
    me = os.getpid()

    def release_once_waiting():
        wait_for(lambda: lock.info().waiters.get(me, 0) > 0, 60, what="the main thread's wait")
        cmd.put("go")
    t = threading.Thread(target=release_once_waiting, daemon=True)
    t.start()
    try:
        assert lock.acquire_read(60) is True
        lock.release_read()
    finally:
        t.join(5)
    c.expect("released")


# --------------------------------------------------- results and timeouts

def test_results_and_timeouts(lock, writer, lock_name):
    c, cmd = writer
    for fn in (lock.acquire_read, lock.acquire_write, lock.acquire_update):
        assert fn(0) is False
        assert fn(timeout=0.0) is False
        t0 = time.monotonic()
        assert fn(0.1) is False
        assert 0.09 <= time.monotonic() - t0 < 5
    with pytest.raises(TimeoutError, match=r"^read hold of lock '.*' not had within 0\.05 s$"):
        with lock.read(0.05):
            pass
    with pytest.raises(TimeoutError, match=r"^write hold of lock '.*' not had within 0 s$"):
        with lock.write(0):
            pass
    info = lock.info()                  # the timeouts left nothing behind
    assert info.queued_readers == {} and info.readers == {} and info.waiters == {}
    cmd.put("go")
    c.expect("released")
    assert lock.acquire_read(None) is True
    assert lock.acquire_read(math.inf) is True
    assert lock.acquire_read(1) is True     # an int
    for _ in range(3):
        lock.release_read()


# (Timeouts of more than ~290 years overflow the int64 deadline in
# deadline_ns itself; making it saturate is another change.)
@pytest.mark.parametrize("timeout", [0, 0.0, -0.0, 1, 2.5, 1e8, 1e8 + 1, 1e9, True,
                                     "0.5", math.inf, None, -1, -0.001, math.nan, "x",
                                     object()])
def test_timeout_rule_is_deadline_ns(lock, timeout):
    """Whatever deadline_ns accepts or refuses, the C methods and the holds
    accept or refuse the same way, with the same exception."""
    try:
        deadline_ns(timeout)
        expected = None
    except Exception as e:
        expected = e
    for acquire, release in ((lock.acquire_read, lock.release_read),
                             (lock.acquire_write, lock.release_write)):
        if expected is None:
            assert acquire(timeout) is True
            release()
            assert acquire(timeout=timeout) is True
            release()
        else:
            with pytest.raises(type(expected)) as got:
                acquire(timeout)
            assert str(got.value) == str(expected)
    assert not lock.is_locked()


def test_argument_errors(lock):
    with pytest.raises(TypeError, match="unexpected keyword argument 'timout'"):
        lock.acquire_read(timout=1)
    with pytest.raises(TypeError, match="at most 1 argument"):
        lock.acquire_write(1, 2)
    with pytest.raises(TypeError, match="multiple values"):
        lock.acquire_update(1, timeout=2)
    with pytest.raises(TypeError):
        lock.release_read(1)
    assert not lock.is_locked()


# ------------------------------------------------------------------ errors

def test_release_without_hold_messages(lock, lock_name):
    for what in ("read", "write", "update"):
        with pytest.raises(pyshmlock.NotHeldError,
                           match=rf"^lock '{lock_name}': release_{what}: this process holds "
                                 r"no such hold$"):
            getattr(lock, f"release_{what}")()
    with pytest.raises(pyshmlock.NotHeldError,
                       match=rf"^lock '{lock_name}': release of write hold: this process"):
        lock.writer_lock.__exit__(None, None, None)


def test_would_deadlock_goes_through_the_error_mapping(lock, lock_name):
    assert lock.acquire_write()
    with pytest.raises(pyshmlock.WouldDeadlockError,
                       match=rf"^lock '{lock_name}': acquire_read: this thread holds"):
        lock.acquire_read()
    with pytest.raises(pyshmlock.WouldDeadlockError, match="read hold: this thread"):
        with lock.reader_lock:
            pass
    lock.release_write()


def test_closed_lock(lock_name):
    lk = pyshmlock.RWLock(lock_name)
    hold, timed = lk.reader_lock, lk.write(1)
    lk.close()
    for name in HOLD_CALLS:
        with pytest.raises(ValueError, match=rf"^lock '{lock_name}' is closed$"):
            getattr(lk, name)()
    with pytest.raises(ValueError, match=rf"^lock '{lock_name}' is closed$"):
        lk.paused
    # A hold kept from before close() refuses too, and takes nothing.
    with pytest.raises(ValueError, match="closed"):
        with hold:
            pass
    with pytest.raises(ValueError, match="closed"):
        with timed:
            pass


def test_a_hold_needs_an_rwlock():
    with pytest.raises(TypeError):
        _fast.Hold(object(), 1, None)
    with pytest.raises(ValueError):
        _fast.Hold(pyshmlock.RWLock.__new__(pyshmlock.RWLock), 9, None)


# ---------------------------------------------------------------- signals

@pytest.mark.parametrize("how", ["method", "with"])
def test_ctrl_c_during_a_wait_raises_and_leaves_nothing(lock, writer, how):
    c, cmd = writer
    # SIGINT aimed at the main thread, where a terminal's Ctrl-C lands.  (A
    # signal sent to the whole process may be taken by any of its threads;
    # the main thread then sees it only when its wait ends, with or without
    # the fast path.)
    # Three rounds: before the fast path checked for Ctrl-C after every
    # wake-up that did not grant the hold, a SIGINT landing while the
    # waiting thread was between two sleeps was seen only at the deadline
    # (about one round in five).
    for _ in range(3):
        timer = threading.Timer(0.3, signal.pthread_kill,
                                (threading.main_thread().ident, signal.SIGINT))
        timer.start()
        t0 = time.monotonic()
        try:
            with pytest.raises(KeyboardInterrupt):
                if how == "method":
                    lock.acquire_read(60)
                else:
                    with lock.reader_lock:
                        pass
        finally:
            timer.cancel()
            timer.join(5)
        assert time.monotonic() - t0 < 30      # not at the 60 s deadline
    info = lock.info()
    assert info.readers == {} and info.queued_readers == {} and info.waiters == {}
    cmd.put("go")
    c.expect("released")
    assert lock.acquire_write(5)        # nothing of ours is in the way
    lock.release_write()


def test_a_signal_handler_runs_during_the_wait_which_then_resumes(lock, writer):
    c, cmd = writer
    seen = []

    def handler(signum, frame):
        seen.append(time.monotonic())
        if len(seen) == 3:
            cmd.put("go")           # the writer releases after the third signal
    old = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 0.05, 0.05)
    try:
        assert lock.acquire_read(20) is True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert len(seen) >= 3
    lock.release_read()
    c.expect("released")
    cmd.put("go")   # (the fixture's own "go" is then harmless)




def test_a_handler_runs_with_no_attempt_registered(lock, lock_name, children):
    """While a write attempt waits for a reader it holds the exclusive claim.
    A Ctrl-C handler that itself takes a read must find no claim of ours in
    its way: the attempt is withdrawn before any Python code runs."""
    import multiprocessing as mp
    cmd = mp.get_context("fork").Queue()
    c = children(hold_until_told, lock_name, cmd)
    c.expect("reading")
    seen = []

    def handler(signum, frame):
        got = lock.acquire_read(0.5)
        seen.append(got)
        if got:
            lock.release_read()
        cmd.put("go")
    old = signal.signal(signal.SIGINT, handler)
    timer = threading.Timer(0.3, signal.pthread_kill,
                            (threading.main_thread().ident, signal.SIGINT))
    timer.start()
    try:
        assert lock.acquire_write(20) is True
    finally:
        timer.cancel()
        timer.join(5)
        signal.signal(signal.SIGINT, old)
    assert seen == [True]
    lock.release_write()
    c.expect("released")


def read_in_child(q, lk):
    q.put(lk.acquire_read(1))
    with lk.reader_lock:
        q.put(sorted(lk.info().readers.values()))
    lk.release_read()
    try:
        lk.release_read()
    except pyshmlock.NotHeldError:
        q.put("none left")


def test_fork_child_uses_the_fast_path_on_its_own_slot(lock, children):
    assert lock.acquire_read()
    c = children(read_in_child, lock)
    assert c.get() is True
    assert c.get() == [1, 2]        # parent 1, child 2
    c.expect("none left")
    assert c.join() == 0
    assert lock.info().readers == {os.getpid(): 1}
    lock.release_read()


def write_in_child(q, lk, cmd):
    assert lk.acquire_write(5)
    q.put(os.getpid())
    q.put(lk.info().writer_pid)
    cmd.get(timeout=30)
    lk.release_write()
    q.put("released")


def test_writer_pid_is_the_holders_own_after_fork(lock, children):
    """The core remembers its pid per attachment (getpid() is a system call);
    a forked child must still be reported as itself."""
    assert lock.acquire_write(1)
    assert lock.info().writer_pid == os.getpid()
    lock.release_write()
    import multiprocessing as mp
    cmd = mp.get_context("fork").Queue()
    c = children(write_in_child, lock, cmd)
    pid = c.get()
    assert c.get() == pid != os.getpid()
    assert lock.info().writer_pid == pid
    cmd.put("go")
    c.expect("released")
    assert c.join() == 0
    assert lock.acquire_update(1)
    assert lock.info().updater_pid == os.getpid()
    lock.release_update()


# ---------------------------------------------- Ctrl-C in every blocking wait

def _sigint_from_another_thread(delay):
    """SIGINT sent to the process while the main thread blocks it: another
    thread takes it (as when Ctrl-C reaches a process whose main thread is
    between two sleeps), so the main thread's futex wait sees no EINTR and
    only the fast path's check after a wake-up notices it."""
    def send():
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        time.sleep(delay)
        os.kill(os.getpid(), signal.SIGINT)
    t = threading.Thread(target=send, daemon=True)
    t.start()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    return t


@pytest.mark.parametrize("call", ["wait_resumed", "resume", "wait_drained",
                                  "acquire_read"])
def test_ctrl_c_taken_by_another_thread_ends_every_wait(lock, lock_name, children, call):
    """resume(), wait_resumed() and wait_drained() are interruptible by
    Ctrl-C like the hold calls: a wait that went through cffi would not
    notice it and would wait on to its deadline."""
    import multiprocessing as mp
    cmd = mp.get_context("fork").Queue()
    if call == "resume":                 # an update pins the pause
        c = children(hold_until_told, lock_name, cmd, "update")
        c.expect("updating")
        lock.pause()
    elif call == "wait_drained":         # a reader in another process
        c = children(hold_until_told, lock_name, cmd, "read")
        c.expect("reading")
    elif call == "acquire_read":
        c = children(hold_until_told, lock_name, cmd, "write")
        c.expect("writing")
    else:
        c = None
        lock.pause()
    sender = _sigint_from_another_thread(0.3)
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            try:
                getattr(lock, call)(60)
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
                # a KeyboardInterrupt pending from the unblock lands here
                time.sleep(0.01)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        sender.join(5)
    assert time.monotonic() - t0 < 30, "the wait went on to its 60 s deadline"
    info, me = lock.info(), os.getpid()
    assert me not in info.readers and me not in info.queued_readers
    assert info.writer_pid != me and info.updater_pid != me
    if c is not None:
        cmd.put("go")
        c.expect("released")
    if lock.paused:
        assert lock.resume(5)


# ------------------------------------------------------------ hold objects

def test_the_kept_method_type_cannot_be_instantiated():
    kept = type(_fast.Hold.__dict__["__enter__"])
    with pytest.raises(TypeError):
        kept()


# A hold object re-initialised (Hold.__init__) by another thread while its
# __enter__ waits with the GIL released: the old lock may be freed then, and
# the wait must not come back to it through a borrowed pointer.  Run with
# PYTHONMALLOC=debug, so a freed object's memory is overwritten at once and a
# use after free crashes instead of reading stale bytes.
_REINIT_DURING_ENTER = textwrap.dedent("""
    import gc, os, signal, sys, threading, time
    import pyshmlock
    from pyshmlock.lock import SyncHold
    from pyshmlock._shmlock import lib
    a, b = sys.argv[1], sys.argv[2]
    try:
        keep = pyshmlock.RWLock(a)         # keeps the attachment; holds the write
        lk = pyshmlock.RWLock(a)
        other = pyshmlock.RWLock(b)
        hold = SyncHold(lk, lib.SHL_KIND_READ, 20.0)
        signal.signal(signal.SIGUSR1, lambda *args: None)
        keep.acquire_write()

        def meddle():
            while not keep.info().waiters:  # until the main thread waits in __enter__
                time.sleep(0.01)
            hold.__init__(other, lib.SHL_KIND_READ, 20.0)
            global lk
            lk.reader_lock = lk.writer_lock = lk.update_lock = None
            del lk
            gc.collect()                   # frees lk, unless __enter__ owns a reference
            for _ in range(20):            # EINTR: the handler runs, then a new attempt
                time.sleep(0.05)
                os.kill(os.getpid(), signal.SIGUSR1)
            keep.release_write()

        t = threading.Thread(target=meddle)
        t.start()
        hold.__enter__()                   # the read hold of lock a
        t.join()
        keep.release_read()
        print("survived", flush=True)
    finally:
        pyshmlock.unlink(a, force=True)
        pyshmlock.unlink(b, force=True)
""")


def test_hold_reinitialised_while_enter_waits_does_not_use_the_freed_lock():
    a, b = unique_name("reinit-a"), unique_name("reinit-b")
    env = dict(os.environ, PYTHONMALLOC="debug")
    try:
        p = subprocess.run([sys.executable, "-c", _REINIT_DURING_ENTER, a, b], env=env,
                           capture_output=True, text=True, timeout=40)
    finally:
        for n in (a, b):
            remove_lock(n)
    assert p.returncode == 0 and "survived" in p.stdout, (p.returncode, p.stdout, p.stderr)
