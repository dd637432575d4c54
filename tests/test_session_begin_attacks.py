"""begin_session() is one C attempt of steps (wait until no session pins the
pause, then the update hold, then at once the pin and the release; back to
the wait when another session pinned first).  These tests end that attempt
in each step, by every way an attempt can end without its result (asyncio
cancellation and timeouts, a dropped task, notify_closing and close of the
lock, Ctrl-C, another thread closing the lock, fork, SIGKILL), and check that
nothing is left behind: no update hold, no waiter, no session that nobody
began, and the next update and session are had at once.

The competitors are real: readers, updaters and sessions of other
processes, and a session pinned by another process in the window between
an attempt's wait until unpinned and its own pin (the core's own
shl_session_pin, called by a process that holds the update hold, exactly as
a competing begin_session does)."""
import asyncio
import os
import threading
import time

import pytest
from conftest import FORK
from helpers import wait_for, wait_until_waiting
from holders import hold_until_told

import pyshmlock
from pyshmlock._shmlock import ffi, lib

pytestmark = pytest.mark.timeout(60)


def assert_clean(lock, session=None):
    """Nothing of an ended begin_session is left: no update hold, no
    waiter, the session `session` only (None: none), and an update and a
    new session are had at once."""
    # (A process's asyncio watcher thread sleeps for its parked tasks: it
    # leaves the waiters at its next wake-up, which an unpark makes.)
    wait_for(lambda: not lock.info().waiters, 10, "the waiters to go")
    info = lock.info()
    assert info.updater_pid is None, info
    assert (info.session.token if info.session else None) == session, info
    if session is not None:
        lock.end_session(session)
    assert lock.acquire_update(0)
    lock.release_update()
    token = lock.begin_session(ttl=30, timeout=1)
    lock.end_session(token)
    assert lock.resume(5)


def pin_while_updating(q, name, cmd):
    """Take the update hold, say "updating"; told, pin a session with it
    (what a competing begin_session does between its grant and its pin),
    release the update, say the token; told again, exit."""
    lk = pyshmlock.RWLock(name)
    assert lk.acquire_update(5)
    q.put("updating")
    cmd.get(timeout=20)
    token = ffi.new("uint64_t *")
    rc = lib.shl_session_pin(lk._att.handle, 30 * 10**9, token)
    assert rc == lib.SHL_OK, rc
    lk.release_update()
    q.put(int(token[0]))
    cmd.get(timeout=20)
    lk.close()


def attempt_of(task):
    """The attempt the task awaits at the bottom of its await chain (or None)."""
    aw = task.get_coro()
    while hasattr(aw, "cr_await"):
        aw = aw.cr_await
    return aw


async def until_parked(task, kind, timeout=10.0):
    """Until task's begin_session attempt is parked in step `kind`."""
    end = time.monotonic() + timeout
    while True:
        a = attempt_of(task)
        p = a._parked if a is not None else None
        if (a is not None and a.kind == kind and p is not None
                and p.future is not None and not p.future.done()):
            return a
        assert time.monotonic() < end, f"not parked in step {kind}"
        await asyncio.sleep(0.005)


# --------------------------------------------------------- asyncio: the steps

class Step:
    """Keeps a begin_session attempt in one step, then lets it go: "unpinned"
    (behind a session of this process), "update" (behind a reader of another
    process), "bounced" (its update had after another process pinned a
    session: back to the wait until unpinned)."""

    def __init__(self, which, lock_name, children):
        self.which, self.name, self.children = which, lock_name, children
        self.cmd = FORK.Queue()
        self.other_session = None

    def block(self, lock):
        if self.which == "unpinned":
            self.other_session = lock.begin_session(ttl=30, timeout=5)
        elif self.which == "update":
            self.child = self.children(hold_until_told, self.name, self.cmd, "read")
            self.child.expect("reading")
        else:
            self.child = self.children(pin_while_updating, self.name, self.cmd)
            self.child.expect("updating")

    @property
    def kind(self):
        return lib.SHL_KIND_UPDATE if self.which == "update" else lib.SHL_KIND_UNPINNED

    async def reach(self, task):
        """Until the task's attempt is parked in this step."""
        if self.which == "bounced":
            await until_parked(task, lib.SHL_KIND_UPDATE)
            self.cmd.put("pin")
            self.other_session = await asyncio.get_running_loop().run_in_executor(
                None, self.child.get)
        return await until_parked(task, self.kind)

    def finish(self):
        """Let go of what blocked; the session left (another's) or None."""
        if self.which == "update":
            self.cmd.put("go")
            self.child.expect("released")
        elif self.which == "bounced":
            self.cmd.put("exit")
            assert self.child.join() == 0
        return self.other_session


STEPS = ["unpinned", "update", "bounced"]


@pytest.mark.parametrize("which", STEPS)
@pytest.mark.parametrize("how", ["cancel", "timeout", "notify_closing"])
def test_an_asyncio_session_attempt_ended_in_each_step_leaves_nothing(
        lock_name, children, which, how):
    lock = pyshmlock.RWLock(lock_name)
    alock = pyshmlock.AsyncRWLock(lock_name)
    step = Step(which, lock_name, children)
    step.block(lock)

    async def main():
        if how == "timeout":
            async def timed():
                async with asyncio.timeout(None) as cm:
                    box.append(cm)
                    return await alock.begin_session(ttl=30)
            box = []
            task = asyncio.create_task(timed())
            await step.reach(task)
            box[0].reschedule(asyncio.get_running_loop().time())   # expires now
            with pytest.raises(TimeoutError):
                await task
            return
        task = asyncio.create_task(alock.begin_session(ttl=30))
        await step.reach(task)
        if how == "cancel":
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        else:
            alock.notify_closing()
            with pytest.raises(pyshmlock.LockClosingError):
                await task

    asyncio.run(main())
    other = step.finish()
    alock.close()
    assert_clean(lock, other)
    lock.close()


# ------------------------------------------- closing the lock while it waits

@pytest.mark.parametrize("which", STEPS)
@pytest.mark.parametrize("last", [True, False], ids=["last-close", "other-object-open"])
def test_closing_an_asyncio_lock_while_a_session_attempt_waits_leaks_no_hold(
        lock_name, children, which, last):
    """close() of the AsyncRWLock while its begin_session task is parked:
    the last close of the segment in this process refuses
    (LockInUseError); a close while another object of the segment stays
    open closes only that object, and the attempt goes on through the
    segment's handle.  Either way the task ends with a session begun or an
    error, never with the update hold held unseen."""
    lock = pyshmlock.RWLock(lock_name)
    step = Step(which, lock_name, children)
    step.block(lock)
    if last:
        lock.close()       # the AsyncRWLock's is the last object of the segment
    alock = pyshmlock.AsyncRWLock(lock_name)

    async def main():
        task = asyncio.create_task(alock.begin_session(ttl=30, timeout=20))
        await step.reach(task)
        if last:
            with pytest.raises(pyshmlock.LockInUseError):
                alock.close()
        else:
            alock.close()
        return task

    async def finish(task):
        try:
            return await task
        except ValueError:
            return None

    loop = asyncio.new_event_loop()
    try:
        task = loop.run_until_complete(main())
        if step.which == "unpinned":
            (alock if last else lock).end_session(step.other_session)
            step.other_session = None
        other = step.finish()
        if step.which == "bounced":
            (alock if last else lock).end_session(other)
            other = None
        got = loop.run_until_complete(asyncio.wait_for(finish(task), 20))
    finally:
        loop.close()
    if last:
        alock.close()
        lock = pyshmlock.RWLock(lock_name)
    assert_clean(lock, got)
    lock.close()


@pytest.mark.parametrize("which", ["unpinned", "update"])
@pytest.mark.parametrize("last", [True, False], ids=["last-close", "other-object-open"])
def test_closing_a_lock_while_another_thread_waits_in_its_begin_session_leaks_no_hold(
        lock_name, children, which, last):
    """Another thread closes the RWLock a thread waits in begin_session on:
    the last close of the segment refuses (LockInUseError, the wait goes
    on); a close while another object of the segment stays open closes that
    object, and the waiting thread ends with a session begun or ValueError,
    never with the update hold held unseen."""
    other = pyshmlock.RWLock(lock_name)
    step = Step(which, lock_name, children)
    step.block(other)
    lock = pyshmlock.RWLock(lock_name)
    if last:
        other.close()
    got = []

    def waiter():
        try:
            got.append(lock.begin_session(ttl=30, timeout=20))
        except BaseException as e:     # reported below
            got.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    try:
        wait_until_waiting(lock if last else other, os.getpid())
        if last:
            with pytest.raises(pyshmlock.LockInUseError):
                lock.close()
        else:
            lock.close()
    finally:
        if step.which == "unpinned":
            (lock if last else other).end_session(step.other_session)
            step.other_session = None
        step.finish()
        t.join(25)
    assert not t.is_alive()
    assert len(got) == 1
    if isinstance(got[0], BaseException):
        assert isinstance(got[0], ValueError) and not last, got
        token = None
    else:
        token = got[0]
    if last:
        lock.close()
        other = pyshmlock.RWLock(lock_name)
    assert_clean(other, token)
    other.close()
