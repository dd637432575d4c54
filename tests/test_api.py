"""API conformance: the lock-like protocol of holds, timeouts of any size,
asyncio waiting behind this process's own holds, truthful status, pickling,
scoping of the attachment, help text and repr, and the bookkeeping of the
asyncio helper."""
import asyncio
import multiprocessing as mp
import os
import pickle
import pydoc
import subprocess
import sys
import threading
import time

import pytest
from holders import hold_until_told

import pyshmlock
from pyshmlock import _park

pytestmark = pytest.mark.timeout(60)


# ------------------------------------------------ asyncio and own holds

def test_async_reader_parks_behind_its_own_loops_writer(lock_name):
    """SGLang's case: a request arrives while the same worker updates weights."""
    alock = pyshmlock.AsyncRWLock(lock_name)
    order = []

    async def main():
        async with alock.writer_lock:
            reader = asyncio.create_task(read())
            await asyncio.sleep(0.05)
            assert not reader.done(), "the reader must wait, not fail or enter"
            order.append("write done")
        await asyncio.wait_for(reader, 5)

    async def read():
        async with alock.reader_lock:
            order.append("read")

    asyncio.run(main())
    assert order == ["write done", "read"]
    alock.close()


def test_async_update_and_write_park_behind_own_loops_holds(lock_name):
    alock = pyshmlock.AsyncRWLock(lock_name)

    async def main():
        await alock.acquire_read()
        w = asyncio.create_task(alock.acquire_write())
        await asyncio.sleep(0.05)
        assert not w.done()
        alock.release_read()
        assert await asyncio.wait_for(w, 5)
        r = asyncio.create_task(alock.acquire_read(timeout=0.1))
        assert await r is False          # a timed wait behind our own writer
        alock.release_write()

    asyncio.run(main())
    alock.close()


def test_sync_with_on_async_holds_is_a_clear_type_error(lock_name):
    alock = pyshmlock.AsyncRWLock(lock_name)
    for hold in (alock.reader_lock, alock.writer_lock, alock.update_lock, alock.read(1)):
        with pytest.raises(TypeError, match="async with"):
            with hold:
                pass
    assert not alock.locked()
    lk = pyshmlock.RWLock(lock_name)

    async def main():                 # a blocking lock's holds work both ways
        async with lk.reader_lock:
            assert lk.info().readers == {os.getpid(): 1}
        with lk.writer_lock:
            assert lk.info().writer_pid == os.getpid()

    asyncio.run(main())
    lk.close()
    alock.close()


# ---------------------------------------------------------- SGLang shape

def test_async_lock_matches_sglang_coroutines(lock_name):
    import inspect
    alock = pyshmlock.AsyncRWLock(lock_name)
    for name in ("acquire_reader", "release_reader", "acquire_writer", "release_writer",
                 "is_locked"):
        assert inspect.iscoroutinefunction(getattr(alock, name)), name
        assert list(inspect.signature(getattr(alock, name)).parameters) == [], name

    async def main():
        assert await alock.is_locked() is False
        await alock.acquire_reader()
        assert await alock.is_locked() is True and alock.locked() is True
        await alock.release_reader()
        assert alock.locked() is False

    asyncio.run(main())
    alock.close()


# -------------------------------------------------------------- timeouts

@pytest.mark.parametrize("timeout", [threading.TIMEOUT_MAX, 1e100, 1e308, float("inf"),
                                     10 ** 400, 9.3e9])
def test_any_large_timeout_waits_practically_forever(lock, timeout):
    assert lock.acquire_write(timeout=timeout)
    lock.release_write()
    assert lock.acquire_read(timeout=timeout)
    lock.release_read()
    with lock.write(timeout):
        pass
    assert lock.writer_lock.acquire(timeout=timeout)
    lock.writer_lock.release()
    assert lock.wait_drained(timeout) and lock.resume(timeout)

    alock = pyshmlock.AsyncRWLock(lock.name)

    async def main():
        assert await alock.acquire_write(timeout)
        alock.release_write()

    asyncio.run(main())
    alock.close()


@pytest.mark.parametrize("timeout", [-0.5, -2, float("nan"), -float("inf")])
def test_negative_and_nan_timeouts_raise(lock, timeout):
    with pytest.raises(ValueError):
        lock.acquire_write(timeout=timeout)
    with pytest.raises(ValueError):
        lock.read(timeout)
    with pytest.raises(ValueError):
        lock.reader_lock.acquire(timeout=timeout)
    assert not lock.is_locked()


def test_hold_acquire_has_threading_lock_signature(lock):
    wl = lock.writer_lock
    with pytest.raises(ValueError):
        wl.acquire(False, 1)            # no timeout on a non-blocking call
    assert wl.acquire(timeout=-1)       # -1: forever, like threading.Lock
    assert wl.locked()
    assert wl.acquire(blocking=False) is False   # held (by this thread): a try fails
    wl.release()
    assert not wl.locked()


# ------------------------------- truthful status: a claim is not a hold



def _status(name):
    p = subprocess.run([sys.executable, "-m", "pyshmlock", "status", name],
                       capture_output=True, text=True, timeout=30, cwd="/")
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_status_says_claimed_while_the_writer_waits_for_readers(lock, children):
    from conftest import FORK
    cmd = FORK.Queue()
    c = children(hold_until_told, lock.name, cmd)
    c.expect("reading")
    got = []
    t = threading.Thread(target=lambda: got.append(lock.acquire_write(20)))
    t.start()
    try:
        deadline = time.monotonic() + 5
        while lock.info().writer_pid is None:
            assert time.monotonic() < deadline, "the writer never claimed"
            time.sleep(0.005)
        info = lock.info()
        assert info.writer_pid == os.getpid()
        assert info.exclusive_granted is False
        assert info.readers == {c.pid: 1}
        out = _status(lock.name)
        assert f"write by pid {os.getpid()} (claimed, waiting for 1 reader)" in out, out
        assert "(held)" not in out
    finally:
        cmd.put("release")
        t.join(10)
    assert got == [True]
    info = lock.info()
    assert info.exclusive_granted is True and info.writer_pid == os.getpid()
    assert f"write by pid {os.getpid()} (held)" in _status(lock.name)
    lock.release_write()
    assert c.join() == 0


# ---------------- upgrade and nested reads time out instead of deadlocking

def _queue_writer(q, name):
    lk = pyshmlock.RWLock(name)
    q.put("claiming")
    ok = lk.acquire_write(10)
    q.put(ok)
    if ok:
        lk.release_write()
    lk.close()


def test_read_to_write_upgrade_in_one_thread_times_out(lock):
    assert lock.acquire_read()
    t0 = time.monotonic()
    assert lock.acquire_write(timeout=0.2) is False
    assert lock.writer_lock.acquire(timeout=0.2) is False
    assert time.monotonic() - t0 < 5
    lock.release_read()
    assert not lock.is_locked() and lock.info().writer_pid is None


def test_nested_read_behind_a_queued_writer_times_out(lock, children):
    assert lock.acquire_read()
    c = children(_queue_writer, lock.name)
    c.expect("claiming")
    deadline = time.monotonic() + 5
    while lock.info().writer_pid is None:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert lock.acquire_read(timeout=0.2) is False   # documented: would wait forever
    lock.release_read()
    c.expect(True)
    assert c.join() == 0


# ------------------- lock-like holds: threading/asyncio Condition on them

def test_threading_condition_on_the_writer_lock(lock):
    cond = threading.Condition(lock.writer_lock)
    box = []

    def producer():
        with cond:
            box.append(1)
            cond.notify()

    with cond:
        t = threading.Thread(target=producer)
        t.start()
        assert cond.wait_for(lambda: box, timeout=10)
    t.join(10)
    assert not lock.writer_lock.locked() and not lock.is_locked()


def test_asyncio_condition_on_async_writer_lock(lock_name):
    alock = pyshmlock.AsyncRWLock(lock_name)

    async def main():
        cond = asyncio.Condition(alock.writer_lock)
        box = []

        async def producer():
            async with cond:
                box.append(1)
                cond.notify()

        async with cond:
            t = asyncio.create_task(producer())
            await asyncio.wait_for(cond.wait_for(lambda: box), 5)
        await t
        assert not alock.writer_lock.locked()
        assert await alock.reader_lock.acquire()
        assert alock.writer_lock.locked()      # a write would have to wait
        alock.reader_lock.release()

    asyncio.run(main())
    alock.close()


def test_hold_types_are_public(lock_name):
    lk = pyshmlock.RWLock(lock_name)
    alock = pyshmlock.AsyncRWLock(lock_name)
    assert type(lk.reader_lock) is pyshmlock.SyncHold
    assert type(lk.write(1)) is pyshmlock.SyncHold
    assert type(alock.writer_lock) is pyshmlock.AsyncHold
    assert not issubclass(pyshmlock.AsyncHold, pyshmlock.SyncHold)
    assert {lk.reader_lock.kind, lk.writer_lock.kind, lk.update_lock.kind} == {
        "read", "write", "update"}
    alock.close()
    lk.close()


# ------------------- `with lock:` refuses; attached() scopes the attachment

def test_with_lock_refuses_and_attached_scopes(lock_name):
    lk = pyshmlock.RWLock(lock_name)
    with pytest.raises(TypeError, match="reader_lock.*writer_lock"):
        with lk:
            pass
    assert not lk.is_locked()            # still open, nothing held
    alock = pyshmlock.AsyncRWLock(lock_name)

    async def main():
        with pytest.raises(TypeError, match="reader_lock.*writer_lock"):
            async with alock:
                pass
        async with pyshmlock.AsyncRWLock(lock_name).attached() as inner:
            assert await inner.acquire_read(1)
            inner.release_read()
        assert "closed" in repr(inner)

    asyncio.run(main())
    with pyshmlock.RWLock(lock_name, create=False).attached() as other:
        assert other.acquire_read(1)
        other.release_read()
    assert "closed" in repr(other)
    with pytest.raises(ValueError, match="closed"):
        other.acquire_read(0)
    alock.close()
    lk.close()


# ------------------------------------------------------------- pickling

class AppLock(pyshmlock.RWLock):
    """A subclass, as an application makes one (pickles as itself)."""


class AppAsyncLock(pyshmlock.AsyncRWLock):
    """The asyncio one."""


def _use_pickled(q, lk):
    assert isinstance(lk, (pyshmlock.RWLock, pyshmlock.AsyncRWLock))
    if isinstance(lk, pyshmlock.AsyncRWLock):
        async def take():
            return await lk.acquire_read(5)
        ok = asyncio.run(take())
    else:
        ok = lk.acquire_read(5)
    q.put((ok, os.getpid(), lk.name))
    lk.release_read()
    lk.close()


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
@pytest.mark.parametrize("cls", ["RWLock", "AsyncRWLock"])
def test_locks_pickle_as_their_name(lock_name, children, method, cls):
    lk = getattr(pyshmlock, cls)(lock_name)
    again = pickle.loads(pickle.dumps(lk))
    assert type(again) is type(lk) and again.name == lock_name
    again.close()
    c = children(_use_pickled, lk, ctx=mp.get_context(method))
    ok, pid, name = c.get(timeout=30)
    assert ok and pid != os.getpid() and name == lock_name
    assert c.join(30) == 0
    lk.close()


@pytest.mark.parametrize("cls", [AppLock, AppAsyncLock])
def test_a_subclass_pickles_as_itself(lock_name, children, cls):
    lk = cls(lock_name)
    again = pickle.loads(pickle.dumps(lk))
    assert type(again) is cls and again.name == lock_name
    again.close()
    c = children(_use_pickled, lk, ctx=mp.get_context("spawn"))
    ok, pid, name = c.get(timeout=30)
    assert ok and pid != os.getpid() and name == lock_name
    assert c.join(30) == 0
    lk.close()


def test_unpickling_a_removed_lock_does_not_create_it(lock_name):
    data = pickle.dumps(pyshmlock.RWLock(lock_name))
    pyshmlock.unlink(lock_name, force=True)
    with pytest.raises(FileNotFoundError):
        pickle.loads(data)
    assert not os.path.exists(f"/dev/shm/pyshmlock.{lock_name}")


# ------------------------------------------------------------ help and repr

def test_help_text_names_holds_and_mode_readably():
    text = pydoc.render_doc(pyshmlock.RWLock, renderer=pydoc.plaintext)
    for word in ("reader_lock", "writer_lock", "update_lock", "0o600", "SyncHold",
                 "attached"):
        assert word in text, word
    assert "_Hold" not in text and "384" not in text
    assert "mode: int = 0o600" in text
    atext = pydoc.render_doc(pyshmlock.AsyncRWLock, renderer=pydoc.plaintext)
    for word in ("reader_lock", "writer_lock", "update_lock", "0o600", "AsyncHold"):
        assert word in atext, word


def test_repr_shows_this_process_holds(lock):
    assert "holds nothing" in repr(lock)
    lock.acquire_read()
    lock.acquire_read()
    assert "read x2" in repr(lock)
    lock.release_read()
    lock.release_read()
    with lock.writer_lock:
        assert "write" in repr(lock) and "write" in repr(lock.writer_lock)
        assert "locked" in repr(lock.writer_lock)


def test_unawaited_resume_still_resumes(lock_name):
    alock = pyshmlock.AsyncRWLock(lock_name)
    alock.pause()
    alock.resume().close()             # never awaited
    assert not alock.paused

    async def main():
        alock.pause()
        assert await alock.resume() is True
        assert not alock.paused
        alock.pause()
        await alock.acquire_update()
        pending = alock.resume(timeout=0.1)     # an update pins the pause
        assert await pending is False and alock.paused
        alock.release_update()
        assert await alock.resume(1) and not alock.paused

    asyncio.run(main())
    alock.close()


# --------------------- asyncio bookkeeping: close() prunes helper and thread

def test_close_prunes_helper_and_its_thread(lock_name):
    alock = pyshmlock.AsyncRWLock(lock_name)
    key = alock._lock._att.key
    alock.pause()

    async def main():
        t = asyncio.create_task(alock.wait_resumed())
        await asyncio.sleep(0.05)
        assert key in _park._helpers
        await alock.resume()
        await asyncio.wait_for(t, 5)

    asyncio.run(main())
    threads = [t for t in threading.enumerate() if t.name == f"pyshmlock-aio-{lock_name}"]
    alock.close()
    assert key not in _park._helpers
    for t in threads:
        t.join(2)
        assert not t.is_alive(), "the helper thread outlived close()"


def test_every_call_on_a_closed_lock_says_closed_the_same_way(lock_name):
    # One closed mechanism (the C core's SHL_ECLOSED, plus one
    # Python check for the methods that do not reach C), one message.
    lk = pyshmlock.RWLock(lock_name)
    hold = lk.reader_lock
    lk.close()
    calls = ["acquire_read", "acquire_write", "acquire_update", "release_read",
             "release_write", "release_update", "pause", "resume", "wait_resumed",
             "wait_drained", "is_locked", "info", "read", "write", "update"]
    for call in calls:
        with pytest.raises(ValueError, match=rf"^lock '{lock_name}' is closed$"):
            getattr(lk, call)()
    for use in (lambda: lk.paused, hold.locked, hold.acquire, hold.release):
        with pytest.raises(ValueError, match=rf"^lock '{lock_name}' is closed$"):
            use()
    lk.close()                                   # idempotent
    assert repr(lk) == f"<pyshmlock.RWLock {lock_name!r} closed>"
