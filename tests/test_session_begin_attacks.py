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
import _thread
import asyncio
import gc
import os
import random
import signal
import threading
import time

import pytest
from conftest import FORK
from helpers import reap, wait_for, wait_until_waiting
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


# (wait_for's timeout cannot be moved to land after the bounce: an
# asyncio.timeout rescheduled there covers that step.)
@pytest.mark.parametrize("how,which", [
    (how, which) for how in ["cancel", "timeout", "wait_for", "notify_closing"]
    for which in STEPS if (how, which) != ("wait_for", "bounced")])
def test_an_asyncio_session_attempt_ended_in_each_step_leaves_nothing(
        lock_name, children, how, which):
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
        if how == "wait_for":
            # The step is in place before the call and stays until after:
            # the timeout lands in it whenever it fires.
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(alock.begin_session(ttl=30), 0.2)
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


# ------------------------------------------------ one deadline for every step

def test_an_asyncio_session_attempt_that_bounces_keeps_its_first_deadline(
        lock_name, children):
    """Parked for the update until half its timeout, then sent back to the
    wait until unpinned by a session another process pinned first: it times
    out at its one deadline, not a whole timeout after the bounce."""
    lock = pyshmlock.RWLock(lock_name)
    alock = pyshmlock.AsyncRWLock(lock_name)
    step = Step("bounced", lock_name, children)
    step.block(lock)
    T = 3.0

    async def main():
        t0 = time.monotonic()
        task = asyncio.create_task(alock.begin_session(ttl=30, timeout=T))
        await until_parked(task, lib.SHL_KIND_UPDATE)
        await asyncio.sleep(max(0.0, t0 + T / 2 - time.monotonic()))   # the bounce, late
        bounced_at = time.monotonic() - t0
        await step.reach(task)
        with pytest.raises(TimeoutError):
            await task
        return bounced_at, time.monotonic() - t0

    bounced_at, took = asyncio.run(main())
    other = step.finish()
    alock.close()
    # A deadline restarted at the bounce would end at bounced_at + T (>= 1.5 T).
    assert T <= took < bounced_at + T - 0.5, (bounced_at, took)
    assert_clean(lock, other)
    lock.close()


def test_a_blocking_session_attempt_that_bounces_keeps_its_first_deadline(
        lock_name, children):
    """As the asyncio one, for the blocking attempt."""
    lock = pyshmlock.RWLock(lock_name)
    step = Step("bounced", lock_name, children)
    step.block(lock)
    T = 3.0
    t0 = time.monotonic()
    bounced = []

    def bounce():
        wait_until_waiting(lock, os.getpid())          # in the update step
        time.sleep(max(0.0, t0 + T / 2 - time.monotonic()))
        bounced.append(time.monotonic() - t0)
        step.cmd.put("pin")
        step.other_session = step.child.get()

    t = threading.Thread(target=bounce)
    t.start()
    try:
        with pytest.raises(TimeoutError):
            lock.begin_session(ttl=30, timeout=T)
        took = time.monotonic() - t0
    finally:
        t.join(30)
    assert T <= took < bounced[0] + T - 0.5, (bounced, took)
    assert_clean(lock, step.finish())
    lock.close()


# -------------------------------------------- a parked attempt dropped (GC)

@pytest.mark.parametrize("which", STEPS)
def test_a_parked_session_attempt_dropped_by_its_driver_leaves_nothing(
        lock_name, children, which):
    """The attempt driven by hand (send) until it parks in the step, then
    dropped with the future it yielded: nobody will resume it, and it
    withdraws as it goes."""
    lock = pyshmlock.RWLock(lock_name)
    alock = pyshmlock.AsyncRWLock(lock_name)
    step = Step(which, lock_name, children)
    step.block(lock)

    async def main():
        aw = alock._begin_session_attempt(pyshmlock._fastpath.deadline_ns(None), 30 * 10**9)
        fut = aw.send(None)
        assert aw.kind == (lib.SHL_KIND_UNPINNED if which == "unpinned"
                           else lib.SHL_KIND_UPDATE) and not fut.done()
        if which == "bounced":
            step.cmd.put("pin")
            step.other_session = await asyncio.get_running_loop().run_in_executor(
                None, step.child.get)
            while not fut.done():                 # woken: the update is free
                await asyncio.sleep(0.005)
            fut = aw.send(None)                   # had, pinned first: back to the wait
            assert aw.kind == lib.SHL_KIND_UNPINNED and not fut.done()
        del aw, fut
        gc.collect()

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    gc.collect()
    other = step.finish()
    if other is not None:
        # The dropped attempt's watcher registration goes at the watcher's
        # next wake-up (a change of the word it watched): the session's end.
        lock.end_session(other)
    alock.close()
    assert_clean(lock)
    lock.close()


# ------------------------------------------- racing loops, threads and tasks

def test_two_loops_of_racing_session_tasks_some_cancelled_at_random_leave_nothing(
        lock_name):
    """Two event loops in two threads, each with many begin_session tasks
    parked behind one session; it ends, and some tasks are cancelled at
    random moments while the rest begin and end their sessions one at a
    time.  Every task ends with its own token or CancelledError."""
    lock = pyshmlock.RWLock(lock_name)
    first = lock.begin_session(ttl=30, timeout=5)
    rng = random.Random(os.getpid())
    parked = [threading.Event(), threading.Event()]
    go = threading.Event()
    results, errors = [], []
    inside = threading.Lock()

    def loop_main(i):
        async def one(a):
            t = await a.begin_session(ttl=30, timeout=30)
            assert inside.acquire(blocking=False), "two sessions at once"
            await asyncio.sleep(0)
            inside.release()
            a.end_session(t)
            return t

        async def main():
            a = pyshmlock.AsyncRWLock(lock_name)
            tasks = [asyncio.create_task(one(a)) for _ in range(8)]
            for task in tasks:
                await until_parked(task, lib.SHL_KIND_UNPINNED)
            parked[i].set()
            while not go.is_set():
                await asyncio.sleep(0.005)
            for task in rng.sample(tasks, 3):
                await asyncio.sleep(rng.random() * 0.01)
                task.cancel()
            got = await asyncio.gather(*tasks, return_exceptions=True)
            a.close()
            return got

        try:
            results.extend(asyncio.run(main()))
        except BaseException as e:       # reported below
            errors.append(e)

    threads = [threading.Thread(target=loop_main, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for e in parked:
        assert e.wait(20)
    lock.end_session(first)
    go.set()
    for t in threads:
        t.join(40)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    tokens = [r for r in results if not isinstance(r, BaseException)]
    others = [r for r in results if isinstance(r, BaseException)]
    assert all(isinstance(r, asyncio.CancelledError) for r in others), others
    assert len(results) == 16 and len(set(tokens)) == len(tokens) >= 10
    assert_clean(lock)
    lock.close()


# ------------------------------------------------------- Ctrl-C, blocking

@pytest.mark.parametrize("which", ["unpinned", "update"])
@pytest.mark.parametrize("how", ["signal", "interrupt_main"])
def test_ctrl_c_while_a_blocking_begin_session_waits_in_each_step_leaves_nothing(
        lock_name, children, which, how):
    """SIGINT sent to the process (taken by whichever thread), or
    _thread.interrupt_main (no signal: only the flag), while the main
    thread waits in begin_session: KeyboardInterrupt, nothing left."""
    lock = pyshmlock.RWLock(lock_name)
    step = Step(which, lock_name, children)
    step.block(lock)

    def interrupt():
        wait_until_waiting(lock, os.getpid())
        if how == "signal":
            os.kill(os.getpid(), signal.SIGINT)
        else:
            _thread.interrupt_main()

    t = threading.Thread(target=interrupt)
    t.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            lock.begin_session(ttl=30, timeout=20)
    finally:
        t.join(30)
    assert_clean(lock, step.finish())
    lock.close()


# ------------------------------------------------------------------- fork

@pytest.mark.parametrize("which", ["unpinned", "update"])
def test_a_child_forked_while_a_thread_waits_in_begin_session_can_begin_one(
        lock_name, children, which):
    """fork() while another thread waits in begin_session: the child (which
    has no such thread) begins and ends a session of its own; the parent's
    thread begins its own as well, one after the other."""
    lock = pyshmlock.RWLock(lock_name)
    step = Step(which, lock_name, children)
    step.block(lock)
    got = []

    def waiter():
        try:
            got.append(lock.begin_session(ttl=30, timeout=30))
        except BaseException as e:       # reported below
            got.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    wait_until_waiting(lock, os.getpid())
    pid = os.fork()
    if pid == 0:                         # the child: nothing of pytest's may run here
        code = 1
        try:
            lk = pyshmlock.RWLock(lock_name)
            token = lk.begin_session(ttl=30, timeout=30)
            lk.end_session(token)
            lk.close()
            code = 0
        finally:
            os._exit(code)
    try:
        wait_until_waiting(lock, pid)    # the child waits as well
        if which == "unpinned":
            lock.end_session(step.other_session)
            step.other_session = None
        step.finish()
        wait_for(lambda: got, 30, "the parent's thread to begin its session")
        assert isinstance(got[0], int), got
        lock.end_session(got[0])         # the child's may come after it
        status = reap(pid, 30)
    finally:
        t.join(30)
    assert status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert_clean(lock)
    lock.close()


# ----------------------------------------------------------------- SIGKILL

def begin_session_then_report(q, name, cmd):
    """begin_session (it waits), report the token, wait to be told."""
    lk = pyshmlock.RWLock(name)
    q.put("starting")
    q.put(lk.begin_session(ttl=30, timeout=30))
    cmd.get(timeout=30)


def settle(lock):
    """After a process was killed: its leftovers reclaimed (a bounded wait
    for the update: the dead process's claim is probed and reclaimed), its
    session, if it began one, ended."""
    assert lock.acquire_update(10)
    lock.release_update()
    info = lock.info()
    if info.session is not None:
        lock.end_session(info.session.token)
    if lock.info().paused:
        assert lock.resume(5, force=True)


@pytest.mark.needs_robust_futex
@pytest.mark.parametrize("which", ["unpinned", "update"])
def test_a_process_killed_while_its_begin_session_waits_in_each_step_leaves_nothing(
        lock_name, children, which):
    lock = pyshmlock.RWLock(lock_name)
    step = Step(which, lock_name, children)
    step.block(lock)
    cmd = FORK.Queue()
    c = children(begin_session_then_report, lock_name, cmd)
    c.expect("starting")
    wait_until_waiting(lock, c.pid)
    c.kill()
    other = step.finish()
    wait_for(lambda: c.pid not in lock.info().waiters, 10, "the dead waiter to go")
    info = lock.info()
    assert info.updater_pid is None and (info.session.token if info.session else None) == other
    assert_clean(lock, other)
    lock.close()


def begin_sessions_forever(q, name):
    """Begin, end and resume sessions in a loop until killed."""
    lk = pyshmlock.RWLock(name)
    q.put("looping")
    while True:
        token = lk.begin_session(ttl=30, timeout=30)
        lk.end_session(token)
        lk.resume(30)


@pytest.mark.needs_robust_futex
def test_processes_killed_at_random_points_of_begin_session_leave_only_their_session(
        lock_name, children):
    """A process that begins, ends and resumes sessions in a loop is
    SIGKILLed at random moments (some between its update's grant and its
    pin, or between its pin and its release): the update it held is
    reclaimed, and what may be left is only a session it began (its death
    ends nothing), which anybody can end."""
    lock = pyshmlock.RWLock(lock_name)
    rng = random.Random(os.getpid())
    for _ in range(25):
        c = children(begin_sessions_forever, lock_name)
        c.expect("looping")
        time.sleep(rng.random() * 0.005)       # where it dies: any point will do
        c.kill()
        settle(lock)
        info = lock.info()
        assert info.updater_pid is None and info.session is None and not info.paused
        assert not info.waiters.get(c.pid)
    assert_clean(lock)
    lock.close()


@pytest.mark.needs_robust_futex
def test_processes_killed_as_their_update_is_granted_leave_only_their_session(
        lock_name, children):
    """A process waits in begin_session for the update behind this
    process's reader; the reader leaves and the process is SIGKILLed within
    the next 300 microseconds (at random): around its grant, its pin and
    its release.  What it held is reclaimed; what may be left is only the
    session it began."""
    lock = pyshmlock.RWLock(lock_name)
    rng = random.Random(os.getpid())
    for _ in range(30):
        assert lock.acquire_read(5)
        cmd = FORK.Queue()
        c = children(begin_session_then_report, lock_name, cmd)
        c.expect("starting")
        wait_until_waiting(lock, c.pid)
        delay = rng.random() * 300e-6
        lock.release_read()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < delay:
            pass
        os.kill(c.pid, signal.SIGKILL)
        c.kill()                                   # reaped
        settle(lock)
        info = lock.info()
        assert info.updater_pid is None and info.session is None and not info.paused
        assert not info.waiters.get(c.pid)
    assert_clean(lock)
    lock.close()
