"""Regression tests from the outside review of the asyncio wake-up in the
reader callback, the kept bound methods and the read-only observers.  Each
failed on the code before its fix."""
import asyncio
import contextvars
import gc
import os
import stat
import subprocess
import sys
import time
import weakref

import pytest
from holders import timed_acquire

import pyshmlock
from pyshmlock import _fast

pytestmark = pytest.mark.timeout(60)


# ------------------------------------------------ observers and a FIFO (F7)

def test_a_fifo_under_a_locks_name_is_refused_at_once(lock_name):
    """Any local user can mkfifo /dev/shm/pyshmlock.X: looking at it (ls,
    status, inspect) or opening it must not block on the FIFO."""
    path = f"/dev/shm/pyshmlock.{lock_name}"
    os.mkfifo(path, 0o644)
    try:
        assert stat.S_ISFIFO(os.stat(path).st_mode)
        code = ("import sys, pyshmlock\n"
                "for f in (pyshmlock.inspect, pyshmlock.RWLock):\n"
                "    try:\n"
                "        f(sys.argv[1])\n"
                "    except pyshmlock.errors.ForeignSegmentError:\n"
                "        print('refused')\n")
        p = subprocess.run([sys.executable, "-c", code, lock_name], capture_output=True,
                           text=True, timeout=30, cwd="/")
        assert p.stdout.split() == ["refused", "refused"], (p.stdout, p.stderr[-2000:])
        ls = subprocess.run([sys.executable, "-m", "pyshmlock", "ls"], capture_output=True,
                            text=True, timeout=30, cwd="/")
        assert "Traceback" not in ls.stderr, ls.stderr
    finally:
        os.unlink(path)


# ------------------------------------------------ the kept bound methods (F5)

def test_the_kept_method_type_cannot_be_instantiated():
    kept = type(_fast.Hold.__dict__["__enter__"])
    with pytest.raises(TypeError):
        kept()


# ------------------------------------------- a wake-up while a task runs (F1)

def test_a_wake_up_dispatched_inside_a_running_task_is_not_lost(lock_name):
    """A loop may dispatch I/O callbacks while a task is current (a nested
    GUI loop does; modelled with the loop's own _run_once): the parked task
    must still wake, later, not be marked done and forgotten."""
    async def main():
        loop = asyncio.get_running_loop()
        errors = []
        loop.set_exception_handler(lambda _l, ctx: errors.append(ctx))
        alock = pyshmlock.AsyncRWLock(lock_name)
        try:
            alock._lock.acquire_write()
            b = asyncio.create_task(alock.acquire_read(10))
            await asyncio.sleep(0.05)                    # b parked
            alock._lock.release_write()                  # the watcher writes the eventfd
            # Bounded: a timer makes each selector wait end within 5 s.
            deadline = time.monotonic() + 5
            tick = loop.call_later(5, lambda: None)
            while _parked(alock) and time.monotonic() < deadline:
                loop._run_once()                         # the reader runs inside this task
            tick.cancel()
            assert not _parked(alock), "the reader never ran inside the task: nothing tested"
            assert await asyncio.wait_for(b, 5), "the parked reader never woke"
            assert not errors, errors
            alock.release_read()
        finally:
            alock.close()
    asyncio.run(main())


def _loops(alock):
    from pyshmlock import _park
    helper = _park._helpers.get(alock._lock._att.key)
    if helper is None:
        return []
    with helper.mu:
        return [lw for _loop, lw in helper.live_loops()]


def _parked(alock):
    return sum(len(lw.parked) for lw in _loops(alock))


# ------------------------------------- the reader callback's context (F3)

def test_the_reader_callback_keeps_no_tasks_context(lock_name):
    """The eventfd reader is registered once per loop; it must not keep the
    context of the first task that parked (and its request objects)."""
    var = contextvars.ContextVar("request")

    class Request:
        pass

    async def handler(alock, refs):
        r = Request()
        refs.append(weakref.ref(r))
        var.set(r)
        del r
        async with alock.reader_lock:
            pass

    async def main():
        alock = pyshmlock.AsyncRWLock(lock_name)
        try:
            alock._lock.acquire_write()
            refs = []
            t = asyncio.create_task(handler(alock, refs))
            await asyncio.sleep(0.05)                    # parked: the reader is added now
            alock._lock.release_write()
            await asyncio.wait_for(t, 5)
            del t
            await asyncio.sleep(0)
            gc.collect()
            assert refs[0]() is None, "the loop's reader keeps the task's context alive"
        finally:
            alock.close()
    asyncio.run(main())


# --------------------------------- a loop closed with a task parked (F2)

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


# -------------------- an interrupt inside the reader callback (F4)

def test_an_interrupt_inside_the_reader_callback_strands_no_task(lock_name, monkeypatch):
    """KeyboardInterrupt raised inside the reader callback before it hands
    the wake-ups out (a signal handler runs there, e.g. under
    loop.run_forever) must leave every parked task to be woken later."""
    from pyshmlock import _park
    real = _park.lib

    class Interrupting:
        armed = False

        def __getattr__(self, name):
            attr = getattr(real, name)
            if name == "shl_watcher_gen" and Interrupting.armed:
                Interrupting.armed = False

                def boom(*a):
                    raise KeyboardInterrupt
                return boom
            return attr
    monkeypatch.setattr(_park, "lib", Interrupting())
    alock = pyshmlock.AsyncRWLock(lock_name)
    loop = asyncio.new_event_loop()
    try:
        alock._lock.acquire_write()
        tasks = [loop.create_task(alock.acquire_read(10)) for _ in range(2)]
        loop.run_until_complete(asyncio.sleep(0.05))    # both parked
        Interrupting.armed = True
        alock._lock.release_write()
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(asyncio.sleep(2))
        assert loop.run_until_complete(asyncio.wait_for(asyncio.gather(*tasks), 5)) \
            == [True, True]
        for _ in tasks:
            alock.release_read()
    finally:
        for t in asyncio.all_tasks(loop):
            t.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()
        alock.close()
