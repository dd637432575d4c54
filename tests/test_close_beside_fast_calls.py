"""close() against the fast calls (made without the handle's in-flight
count, safe only because every close begins with the GIL held and an object
being closed forgets its fast handle first): closes of the same object and
of other objects of the same name while other threads hammer holds, closes
spinning beside a blocked acquire, RWLocks dropped to the garbage
collector, asyncio locks on the same segment, and an asyncio attempt made
on a lock whose handle was closed and recycled for another lock."""
import asyncio
import gc
import threading

import pytest
from conftest import FORK, unique_name
from helpers import remove_lock
from holders import hold_until_told

import pyshmlock

pytestmark = pytest.mark.timeout(90)


def _whole(name):
    """The lock `name` is free for a writer and a reader (nothing stranded)."""
    f = pyshmlock.RWLock(name)
    try:
        assert f.acquire_write(5), f.info()
        f.release_write()
        assert f.acquire_read(5), f.info()
        f.release_read()
        info = f.info()
        assert not info.readers and not info.waiters and not info.queued_readers, info
        assert info.writer_pid is None and info.updater_pid is None, info
    finally:
        f.close()


@pytest.mark.parametrize("kind", ["read", "write", "update"])
def test_a_close_spinning_beside_a_blocked_acquire_strands_nothing(lock_name, children, kind):
    """Another process holds what blocks `kind`; a thread's timed acquire
    waits (its claim or owed reader up) and times out; the main thread spins
    close() of the same object the whole time.  Closes are refused while
    the attempt lives; one succeeds after; nothing is left behind."""
    cmd = FORK.Queue()
    holder = children(hold_until_told, lock_name, cmd, "write" if kind == "read" else "read")
    holder.expect("reading" if kind != "read" else "writing")
    x = pyshmlock.RWLock(lock_name)
    res = []
    started = threading.Event()

    def waiter():
        started.set()
        res.append(getattr(x, f"acquire_{kind}")(0.5))

    t = threading.Thread(target=waiter)
    t.start()
    started.wait(30)
    closed = False
    while not closed:
        try:
            x.close()
            closed = True
        except pyshmlock.LockInUseError:
            pass
    t.join(30)
    assert res == [False], res       # the conflicting hold never left
    cmd.put("go")
    holder.expect("released")
    assert holder.join() == 0
    _whole(lock_name)


def test_closing_other_objects_of_the_name_beside_a_hammering_thread(lock_name):
    """Thread A hammers holds on object Y with the fast calls; thread B opens,
    uses and closes (or drops to the collector) other objects of the same
    name, each close the last but Y's.  A never sees an error; the lock ends
    whole."""
    y = pyshmlock.RWLock(lock_name)
    stop = threading.Event()
    errors = []
    count = [0]

    def hammer():
        try:
            while not stop.is_set():
                for kind, t in (("read", None), ("write", 0), ("update", 5), ("read", 0.0)):
                    if getattr(y, f"acquire_{kind}")(t):
                        getattr(y, f"release_{kind}")()
                        count[0] += 1
        except BaseException as e:
            errors.append(repr(e))

    def churn():
        try:
            for i in range(300):
                x = pyshmlock.RWLock(lock_name)
                if x.acquire_read(0):
                    x.release_read()
                if i % 3:
                    x.close()
                else:
                    del x
                    gc.collect()
        except BaseException as e:
            errors.append(repr(e))
        finally:
            stop.set()

    ts = [threading.Thread(target=hammer), threading.Thread(target=churn)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errors, errors
    assert count[0] > 0
    y.close()
    _whole(lock_name)


def test_closing_the_object_another_thread_hammers(lock_name):
    """Thread A hammers holds on X until X is closed under it; the main
    thread closes X (retrying while A holds).  A's calls then fail with the
    closed error only, no hold is left, and the lock ends whole."""
    for _ in range(20):
        x = pyshmlock.RWLock(lock_name)
        errors, closed_seen = [], []
        go = threading.Event()

        def hammer(x=x, errors=errors, closed_seen=closed_seen, go=go):
            go.set()
            n = 0
            while True:
                kind = ("read", "write", "update")[n % 3]
                n += 1
                try:
                    got = getattr(x, f"acquire_{kind}")(0 if n % 2 else None)
                except ValueError as e:
                    closed_seen.append(str(e))
                    return
                except BaseException as e:
                    errors.append(repr(e))
                    return
                if got:
                    try:
                        getattr(x, f"release_{kind}")()
                    except BaseException as e:
                        errors.append(repr(e))
                        return

        t = threading.Thread(target=hammer)
        t.start()
        go.wait(30)
        while True:
            try:
                x.close()
                break
            except pyshmlock.LockInUseError:
                pass
        t.join(30)
        assert not t.is_alive()
        assert not errors, errors
        assert closed_seen and "closed" in closed_seen[0], closed_seen
        _whole(lock_name)


def test_asyncio_and_threads_on_one_segment_with_closes(lock_name):
    """An AsyncRWLock's tasks and a thread's RWLock hammer one segment; the
    thread opens and closes RWLock objects of the name meanwhile, and the
    loop opens, uses and closes other AsyncRWLock objects of it; each close
    is never the last (alock stays open), none disturbs a call."""
    alock = pyshmlock.AsyncRWLock(lock_name)
    stop = threading.Event()
    errors = []

    def thread_side():
        try:
            while not stop.is_set():
                x = pyshmlock.RWLock(lock_name)
                for kind, t in (("write", 0.05), ("read", None), ("update", 0)):
                    if getattr(x, f"acquire_{kind}")(t):
                        getattr(x, f"release_{kind}")()
                x.close()
        except BaseException as e:
            errors.append(repr(e))

    async def task(i):
        got = 0
        for j in range(200):
            kind = ("read", "write", "update")[(i + j) % 3]
            if await getattr(alock, f"acquire_{kind}")(1):
                await asyncio.sleep(0)
                getattr(alock, f"release_{kind}")()
                got += 1
        return got

    async def churn(ts):
        n = 0
        while not all(t.done() for t in ts):
            b = pyshmlock.AsyncRWLock(lock_name)
            if await b.acquire_read(0):
                b.release_read()
            b.close()
            n += 1
            await asyncio.sleep(0)
        return n

    async def main():
        ts = [asyncio.ensure_future(task(i)) for i in range(4)]
        n = await churn(ts)
        return [t.result() for t in ts], n

    th = threading.Thread(target=thread_side)
    th.start()
    try:
        got, churned = asyncio.run(main())
    finally:
        stop.set()
        th.join(60)
    assert not errors, errors
    assert sum(got) > 0 and churned > 0
    alock.close()
    _whole(lock_name)


def test_an_attempt_on_a_closed_lock_never_touches_the_lock_its_handle_serves_next(lock_name):
    """An asyncio attempt made on AsyncRWLock A, A closed (its handle given
    back), a lock of another name opened (it may take the recycled handle):
    driving the old attempt raises, and the other lock is untouched."""
    other = unique_name("recycled")
    try:
        for kind in ("read", "write", "update"):
            a = pyshmlock.AsyncRWLock(lock_name)
            attempt = getattr(a, f"acquire_{kind}")(5)
            try:
                a.close()
            except pyshmlock.LockInUseError:
                # an attempt not yet started may keep it open: then end it
                attempt.close()
                a.close()
                continue
            b = pyshmlock.RWLock(other)
            try:
                with pytest.raises((ValueError, RuntimeError)):
                    asyncio.run(_drive(attempt))
                info = b.info()
                assert info.writer_pid is None and info.updater_pid is None, info
                assert not info.readers and not info.waiters, info
                assert b.acquire_write(0)
                b.release_write()
            finally:
                b.close()
    finally:
        remove_lock(other)


async def _drive(attempt):
    return await attempt


def test_a_cancelled_parked_attempt_driven_again_after_its_handle_is_recycled(lock_name,
                                                                             children):
    """An asyncio write attempt parks (another process reads), its task is
    cancelled, the AsyncRWLock closed, a lock of another name opened (it may
    take the recycled handle); the old attempt object, driven again, must
    neither take nor disturb a hold of the other lock."""
    cmd = FORK.Queue()
    reader = children(hold_until_told, lock_name, cmd, "read")
    reader.expect("reading")
    other = unique_name("recycled2")
    a = pyshmlock.AsyncRWLock(lock_name)
    kept = []

    async def main():
        attempt = a.acquire_write(30)
        kept.append(attempt)
        task = asyncio.ensure_future(_drive(attempt))
        for _ in range(20):
            await asyncio.sleep(0.01)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(main())
        a.close()
        b = pyshmlock.RWLock(other)
        try:
            attempt = kept[0]
            for drive in (lambda: attempt.send(None), lambda: attempt.throw(ValueError),
                          attempt.close):
                try:
                    drive()
                except (StopIteration, RuntimeError, ValueError):
                    pass
            info = b.info()
            assert info.writer_pid is None and not info.readers and not info.waiters, info
            assert b.acquire_write(0)
            b.release_write()
        finally:
            b.close()
    finally:
        cmd.put("go")
        reader.expect("released")
        remove_lock(other)
    _whole(lock_name)
