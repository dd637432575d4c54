"""asyncio waiting: many parked tasks, a loop that never blocks, cancellation
that leaves nothing behind, and a loop's eventfd reader callback that loses
no wake-up and keeps no task's context.  The other side of each case is
another process or a blocking hold of this one."""
import asyncio
import os
import threading
import time

import pytest
from conftest import FORK
from helpers import wait_for
from holders import hold_until_told, timed_acquire

import pyshmlock

pytestmark = pytest.mark.timeout(60)


def os_threads():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError("no Threads: line")


def resume_after(q, name, delay):
    lk = pyshmlock.RWLock(name)
    time.sleep(delay)
    q.put(("resuming", time.monotonic()))
    assert lk.resume(5)
    lk.close()






def pause_now(q, name):
    lk = pyshmlock.RWLock(name)
    lk.pause()
    q.put("paused")
    lk.close()




def test_5000_parked_tasks_on_a_paused_lock(lock_name, children):
    alock = pyshmlock.AsyncRWLock(lock_name)
    alock.pause()

    async def main():
        got = []

        async def request(i):
            async with alock.reader_lock:
                got.append((i, alock.paused))

        before = os_threads()
        tasks = [asyncio.create_task(request(i)) for i in range(5000)]
        await asyncio.sleep(0.5)
        assert got == [], "a task got a read hold while paused"
        assert os_threads() - before <= 2
        c = children(resume_after, lock_name, 0.0)
        await asyncio.get_running_loop().run_in_executor(None, c.get)
        # How fast they get in is the benchmarks' business (bench/); here,
        # that every one does, bounded for a slow (emulated) machine.
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        assert len(got) == 5000 and not any(p for _, p in got)

    asyncio.run(main())
    assert not alock.locked()
    alock.close()


def test_loop_keeps_ticking_while_a_writer_waits(lock_name, children):
    """While a write attempt waits for another process's hold, the loop runs
    other tasks: a ticker ticks 20 times, and only then is the hold given
    back.  An attempt that blocked the loop would never see it given back."""
    alock = pyshmlock.AsyncRWLock(lock_name)
    cmd = FORK.Queue()
    c = children(hold_until_told, lock_name, cmd, "write")
    c.expect("writing")

    async def main():
        ticked = asyncio.Event()

        async def ticker():
            for _ in range(20):
                await asyncio.sleep(0.01)
                assert not attempt.done()
            ticked.set()

        attempt = asyncio.create_task(alock.acquire_write(60))
        t = asyncio.create_task(ticker())
        await asyncio.wait_for(ticked.wait(), 60)
        cmd.put("go")                          # the ticks happened while it waited
        assert await attempt
        alock.release_write()
        await t

    asyncio.run(main())
    c.expect("released")
    alock.close()


@pytest.mark.parametrize("kind", ["read", "write", "update", "wait_resumed"])
def test_cancelled_waiter_leaves_nothing_behind(lock_name, children, kind):
    alock = pyshmlock.AsyncRWLock(lock_name)
    cmd = FORK.Queue()
    if kind == "read":
        blocker = children(hold_until_told, lock_name, cmd, "write")
        blocker.expect("writing")
        coro = alock.acquire_read
    elif kind in ("write", "update"):
        blocker = children(hold_until_told, lock_name, cmd)
        blocker.expect("reading")
        coro = alock.acquire_write if kind == "write" else alock.acquire_update
    else:
        alock.pause()
        coro = alock.wait_resumed

    async def main():
        task = asyncio.create_task(coro())
        await asyncio.sleep(0.2)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    info = alock.info()
    me = os.getpid()
    # The helper thread may still be in its last (bounded) sleep; it holds
    # nothing, but wait for it so `waiters` is checked too.
    wait_for(lambda: me not in alock.info().waiters, 30, what="the helper's last sleep")
    info = alock.info()
    assert me not in info.readers and me not in info.queued_readers and me not in info.waiters
    assert info.writer_pid != me and info.updater_pid != me
    if kind in ("write", "update"):
        # The cancelled claim blocked new readers; they get in at once.
        assert alock._lock.acquire_read(0)
        alock.release_read()
        cmd.put("go")
    if kind == "read":
        cmd.put("go")
    if kind == "wait_resumed":
        assert alock._lock.resume(1)
    # Nothing left behind blocks a writer (a stranded claim or read would
    # hold it to its timeout).
    w = children(timed_acquire, lock_name, "write", 30)
    ok, _ = w.get(timeout=40)
    assert ok
    alock.close()


def test_timeouts_and_context_managers(lock_name, children):
    alock = pyshmlock.AsyncRWLock(lock_name)
    cmd = FORK.Queue()
    c = children(hold_until_told, lock_name, cmd, "write")
    c.expect("writing")

    async def main():
        assert await alock.acquire_read(0) is False
        assert await alock.acquire_read(0.1) is False
        with pytest.raises(TimeoutError):
            async with alock.read(0.05):
                pass
        cmd.put("go")
        async with alock.read(30):
            assert alock.locked()
        async with alock.writer_lock:
            assert alock.info().writer_pid == os.getpid()
        alock.pause()
        async with alock.update(1):
            assert alock.info().updater_pid == os.getpid()
        assert await alock.resume(1)
        # The blocking RWLock's context managers work under `async with` too.
        lk = pyshmlock.RWLock(lock_name)
        async with lk.reader_lock:
            assert lk.is_locked()
        lk.close()
        with pytest.raises(ValueError):
            await alock.acquire_read(-1)

    asyncio.run(main())
    assert not alock.locked()
    alock.close()


def test_parked_update_proceeds_when_another_process_pauses(lock_name, children):
    alock = pyshmlock.AsyncRWLock(lock_name)
    cmd = FORK.Queue()
    r = children(hold_until_told, lock_name, cmd)
    r.expect("reading")

    async def main():
        task = asyncio.create_task(alock.acquire_update(10))
        await asyncio.sleep(0.3)
        assert not task.done(), "an unpaused update must wait for readers"
        assert not await alock.acquire_read(0.05)
        p = children(pause_now, lock_name)
        await asyncio.get_running_loop().run_in_executor(None, p.get)
        assert await asyncio.wait_for(task, 30)
        resume = asyncio.create_task(alock.resume(30))
        await asyncio.sleep(0.2)
        assert not resume.done(), "resume must wait for the update"
        alock.release_update()
        assert await asyncio.wait_for(resume, 30)

    asyncio.run(main())
    cmd.put("go")
    alock.close()


def test_sglang_method_names(lock_name):
    alock = pyshmlock.AsyncRWLock(lock_name)

    async def main():
        await alock.acquire_reader()
        assert await alock.is_locked()
        await alock.release_reader()
        await alock.acquire_writer()
        assert alock.info().writer_pid == os.getpid()
        await alock.release_writer()
        assert not await alock.is_locked()

    asyncio.run(main())
    alock.close()


def test_several_loops_in_several_threads(lock_name, children):
    alock = pyshmlock.AsyncRWLock(lock_name)
    alock.pause()
    results = []

    def run_loop():
        async def main():
            ok = await asyncio.gather(*(alock.acquire_read(10) for _ in range(50)))
            for _ in ok:
                alock.release_read()
            return all(ok)
        results.append(asyncio.run(main()))

    threads = [threading.Thread(target=run_loop) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    assert not results
    c = children(resume_after, lock_name, 0.0)
    c.get()
    for t in threads:
        t.join(10)
    assert results == [True, True, True]
    assert not alock.locked()
    alock.close()


def test_late_parked_drain_waiter_is_watched_at_once(lock_name):
    """A task that parks on wait_drained while the helper
    already sleeps for a task parked on the state word alone is watched
    within a few ms, not at the end of a sleep slice.  Compared, in the same
    run, with a drain waiter that parks while nothing else is parked."""
    blocking = pyshmlock.RWLock(lock_name)
    alock = pyshmlock.AsyncRWLock(lock_name)

    async def drain_wake(late):
        blocking.acquire_read()
        gate = None
        if late:
            alock.pause()
            gate = asyncio.ensure_future(alock.wait_resumed(timeout=10))
            await asyncio.sleep(0.01)          # the helper now sleeps on the state word
        drained = asyncio.ensure_future(alock.wait_drained(timeout=10))
        await asyncio.sleep(0.01)              # parked
        assert not drained.done()
        t0 = time.monotonic()
        blocking.release_read()
        assert await drained is True
        took = time.monotonic() - t0
        if gate is not None:
            await alock.resume(timeout=5)
            assert await gate is True
        return took

    async def main():
        early = [await drain_wake(False) for _ in range(5)]
        late = [await drain_wake(True) for _ in range(5)]
        return sorted(early)[2], min(late)

    try:
        early, late = asyncio.run(main())
        # Noticed only when the helper's sleep slice ends, the late waiter
        # would wake 80-200 ms late here, every time.  Watched at once, it
        # wakes like the early one (the best of five: a loaded machine
        # delays some wake-ups by tens of ms, not all five).
        assert late < max(10 * early, 0.06), (early, late)
    finally:
        alock.close()
        blocking.close()


def async_read_in_child(q, name):
    alock = pyshmlock.AsyncRWLock(name)

    async def main():
        t = asyncio.ensure_future(alock.acquire_read(10))
        await asyncio.sleep(0.1)
        assert not t.done()
        q.put("parked")
        ok = await t
        alock.release_read()
        return ok

    q.put(("child", asyncio.run(main())))
    alock.close()


def test_fork_child_watches_with_its_own_thread(lock_name, children):
    """A child forked while this process's watcher thread sleeps for a
    parked task has no such thread: it starts its own, and both wake."""
    alock = pyshmlock.AsyncRWLock(lock_name)
    alock.pause()
    result = []

    def parent_loop():
        async def main():
            ok = await alock.acquire_read(10)
            alock.release_read()
            return ok
        result.append(asyncio.run(main()))

    t = threading.Thread(target=parent_loop)
    t.start()
    time.sleep(0.2)                 # parked: the watcher thread sleeps
    c = children(async_read_in_child, lock_name)
    c.expect("parked")
    children(resume_after, lock_name, 0.0).get()
    c.expect(("child", True))
    t.join(10)
    assert result == [True]
    assert not alock.locked()
    alock.close()


def test_close_stops_the_watcher_thread(lock_name):
    """The watcher thread is joined when the last object of the lock closes;
    a loop that parked on it leaves no descriptor open."""
    alock = pyshmlock.AsyncRWLock(lock_name)     # starts the keeper thread
    alock.pause()
    before = set(os.listdir("/proc/self/task"))
    before_fds = len(os.listdir("/proc/self/fd"))
    during = set()

    async def main():
        assert await alock.acquire_read(0.05) is False      # parked, timed out
        during.update(os.listdir("/proc/self/task"))

    asyncio.run(main())
    started = during - before
    assert started, "parking started no watcher thread"
    alock.close()
    # The threads parking started are gone (threads the runtime starts on
    # its own, e.g. a sanitizer's, do not count).
    assert not started & set(os.listdir("/proc/self/task"))
    # No eventfd is left; the lock's own descriptor (its liveness lock)
    # closed with it.
    assert len(os.listdir("/proc/self/fd")) == before_fds - 1


# ------------------------------------------- the wake-up runs the task at once

def test_a_woken_park_future_runs_its_task_inside_the_wake_call():
    """_ParkFuture.wake() (what the watcher's reader callback calls) runs the
    parked task's step before it returns: no call_soon, no second pass of the
    loop.  set_result() and cancel() schedule it, as asyncio.Future does."""
    from pyshmlock._park import _ParkFuture

    async def main():
        loop = asyncio.get_running_loop()
        steps = []

        async def parked(fut):
            try:
                await fut
                steps.append("resumed")
            except asyncio.CancelledError as e:
                steps.append(("cancelled", e.args))
                raise

        def run_case(how):
            fut = _ParkFuture(loop)
            task = loop.create_task(parked(fut))
            return fut, task

        fut, task = run_case("wake")
        await asyncio.sleep(0)                    # the task is parked on fut
        loop.call_soon(lambda: (fut.wake(), steps.append("wake returned")))
        await task
        assert steps == ["resumed", "wake returned"]
        fut.wake()                                # done: nothing happens
        assert fut.done() and not fut.cancelled() and fut.result() is None

        steps.clear()
        fut, task = run_case("set_result")
        await asyncio.sleep(0)
        loop.call_soon(lambda: (fut.set_result(None), steps.append("set")))
        await task
        assert steps == ["set", "resumed"]
        with pytest.raises(asyncio.InvalidStateError):
            fut.set_result(None)

        steps.clear()
        fut, task = run_case("cancel")
        await asyncio.sleep(0)
        task.cancel("why")
        fut.wake()                                # cancelled already: no effect
        with pytest.raises(asyncio.CancelledError):
            await task
        assert fut.cancelled() and steps == [("cancelled", ("why",))]
        with pytest.raises(asyncio.CancelledError):
            fut.result()

    asyncio.run(main())


def test_a_task_raising_out_of_its_wake_up_does_not_strand_the_others(lock_name):
    """Woken tasks run inside the reader callback; if one raises
    KeyboardInterrupt there (it ends the loop's run), the other tasks parked
    on that loop are still woken and get their holds."""
    alock = pyshmlock.AsyncRWLock(lock_name)
    other = pyshmlock.RWLock(lock_name)
    alock.pause()
    loop = asyncio.new_event_loop()
    got = []

    async def interrupted():
        assert await alock.acquire_read(10)
        got.append("first")
        raise KeyboardInterrupt

    async def reader():
        assert await alock.acquire_read()       # no timeout: nothing else wakes it
        got.append("second")

    async def park_both():
        t1 = loop.create_task(interrupted())
        t2 = loop.create_task(reader())
        await asyncio.sleep(0.05)                 # both parked
        return t1, t2

    try:
        t1, t2 = loop.run_until_complete(park_both())
        # Resume only once the loop has stopped: a wake-up inside the run
        # above would raise KeyboardInterrupt out of it, into the test runner.
        threading.Thread(target=other.resume).start()
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(t1)
        assert got == ["first"]
        loop.run_until_complete(asyncio.wait_for(t2, 5))
        assert got == ["first", "second"]
        assert alock.info().readers == {os.getpid(): 2}
    finally:
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for t in pending:           # a stranded reader (the failure this test catches)
            t.cancel()
        if pending:
            loop.run_until_complete(asyncio.wait(pending))
        loop.close()
        for _ in range(alock.info().readers.get(os.getpid(), 0)):
            alock.release_read()
        other.close()
        alock.close()


# ----------------------------- the loop's eventfd reader callback

def _loops(alock):
    from pyshmlock import _park
    helper = _park._helpers.get(alock._lock._att.key)
    if helper is None:
        return []
    with helper.mu:
        return [lw for _loop, lw in helper.live_loops()]


def _parked(alock):
    return sum(len(lw.parked) for lw in _loops(alock))


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


def test_the_reader_callback_keeps_no_tasks_context(lock_name):
    """The eventfd reader is registered once per loop; it must not keep the
    context of the first task that parked (and its request objects)."""
    import contextvars
    import gc
    import weakref
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


# ---------------- one attempt, written once: the C awaitables of a hold

PACKAGE_DIR = os.path.dirname(pyshmlock.__file__)


def test_an_uncontended_asyncio_hold_enters_no_python_frame_of_ours(lock_name):
    """`async with alock.reader_lock:`, `await acquire_*()` and a blocking
    lock's holds under `async with` are C all the way when granted: the
    profiler sees no frame of a pyshmlock module."""
    import sys
    alock = pyshmlock.AsyncRWLock(lock_name)
    lk = alock._lock
    ours = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(PACKAGE_DIR):
            ours.append(frame.f_code.co_name)

    async def main():
        timed = alock.read(5)
        sys.setprofile(profile)
        try:
            async with alock.reader_lock:
                pass
            async with timed:
                pass
            assert await alock.acquire_read() is True
            alock.release_read()
            assert await alock.acquire_write(1.5) is True
            alock.release_write()
            async with alock.update_lock as h:
                assert h is alock.update_lock
            async with lk.reader_lock:
                pass
            assert await alock.reader_lock.acquire() is True
            alock.reader_lock.release()
        finally:
            sys.setprofile(None)

    asyncio.run(main())
    assert ours == [], ours
    assert not alock.locked()
    alock.close()


def test_a_granted_async_with_allocates_nothing(lock_name):
    """A lock's own holds keep their bound __aenter__/__aexit__ and the
    completed awaitable a granted `async with` returns.  (Only where `await`
    sends through am_send, 3.10 and 3.11: 3.9 has no am_send, and from 3.12
    on the interpreter's SEND calls tp_iternext, which returns the hold in a
    StopIteration, one allocation per `async with`.)"""
    import sys
    import tracemalloc
    if not (3, 10) <= sys.version_info[:2] < (3, 12):
        pytest.skip("`await` on this interpreter makes a StopIteration for the result")
    alock = pyshmlock.AsyncRWLock(lock_name)

    async def peak_of_two(hold):
        async with hold:
            pass
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            async with hold:
                pass
            async with hold:
                pass
            return tracemalloc.get_traced_memory()[1] - before
        finally:
            tracemalloc.stop()

    async def main():
        for hold in (alock.reader_lock, alock.writer_lock, alock.update_lock,
                     alock._lock.reader_lock):
            assert await peak_of_two(hold) == 0, hold
        assert await peak_of_two(alock.read(1)) > 0      # the control

    asyncio.run(main())
    alock.close()


def test_a_contended_async_with_hands_its_registration_to_the_park(lock_name, children):
    """`async with` under a writer tries once, when __aenter__ is called: the
    owed-reader registration it made is the one the parked task keeps (not
    withdrawn and made again), and it is withdrawn when the task is
    cancelled."""
    alock = pyshmlock.AsyncRWLock(lock_name)
    cmd = FORK.Queue()
    c = children(hold_until_told, lock_name, cmd, "write")
    c.expect("writing")
    me = os.getpid()

    async def main():
        entering = alock.reader_lock.__aenter__()      # tried here
        assert not isinstance(entering, pyshmlock._fast.Done)
        assert alock.info().queued_readers == {me: 1}
        task = asyncio.ensure_future(entering)
        await asyncio.sleep(0.1)                         # parked
        assert not task.done()
        assert alock.info().queued_readers == {me: 1}
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert me not in alock.info().queued_readers

    try:
        asyncio.run(main())
    finally:
        cmd.put("go")
        c.expect("released")
    alock.close()


def test_the_awaitables_behave_like_coroutines(lock_name):
    import gc
    import inspect
    import warnings
    alock = pyshmlock.AsyncRWLock(lock_name)

    async def main():
        # create_task / ensure_future / wait_for / gather take them
        assert await asyncio.create_task(alock.acquire_read()) is True
        assert await asyncio.wait_for(alock.acquire_read(1), 5) is True
        assert await asyncio.gather(alock.acquire_read(), alock.acquire_read(0)) \
            == [True, True]
        for _ in range(4):
            alock.release_read()
        aw = alock.acquire_write()
        assert inspect.isawaitable(aw) and asyncio.iscoroutine(aw)
        assert await aw is True
        with pytest.raises(RuntimeError, match="already awaited"):
            await aw
        alock.release_write()
        # a thrown exception withdraws and propagates
        aw = alock.acquire_read()
        with pytest.raises(KeyError):
            aw.throw(KeyError("x"))
        assert not alock.locked()
        aw.close()

    asyncio.run(main())
    assert asyncio.run(alock.acquire_read()) is True      # asyncio.run takes one
    alock.release_read()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        alock.acquire_read()            # never awaited: nothing taken, a warning
        gc.collect()
    assert any("never awaited" in str(x.message) for x in w), [str(x.message) for x in w]
    assert not alock.locked()
    aw = alock.acquire_read(0)
    aw.close()                          # closed: no warning
    for made in (aw, alock.reader_lock.__aenter__()):
        with pytest.raises(TypeError):
            type(made)()                # only pyshmlock makes them
    alock.release_read()
    alock.close()
