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

EPOCHS = 1 << 14            # width of the epoch field of the state word (layout 3)


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
        for _ in range(EPOCHS - 1):     # phases E+2 .. E+2^14, all under the pause
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


# ------------------------------------------------------ raw segment access

def _raw(name):
    """A second, raw mapping of the segment: what a corrupt or hostile
    neighbour process can do to it."""
    import mmap
    fd = os.open(f"/dev/shm/pyshmlock.{name}", os.O_RDWR)
    try:
        return mmap.mmap(fd, 0)
    finally:
        os.close(fd)


def _u32(m, off):
    return int.from_bytes(m[off:off + 4], "little")


def _put_u32(m, off, v):
    m[off:off + 4] = int(v).to_bytes(4, "little")


STATE_OFF = 64              # the state word: first field of the header's 2nd cache line


def _slot_base(m, i):
    return _u32(m, 8) + i * _u32(m, 12)      # header_size, slot_size


def _readers_off(m, slot, pid, readers):
    """Offset of slot.readers: the word after slot.pid, found by value."""
    base = _slot_base(m, slot)
    for off in range(base, base + _u32(m, 12) - 8, 4):
        if _u32(m, off) == pid and _u32(m, off + 4) == readers:
            return off + 4
    raise AssertionError("slot.pid/readers not found")


def _self_slot(lk):
    from pyshmlock._shmlock import ffi, lib
    snap = ffi.new("shl_snapshot *")
    assert lib.shl_info(lk._h, snap) == 0
    return snap.self_slot


# ---------------------------------------------------------------- defect 2

def hold_read_4s(q, name):
    lk = pyshmlock.RWLock(name)
    assert lk.acquire_read(5)
    q.put("reading")
    time.sleep(4)
    lk.release_read()
    lk.close()


def _close_under_a_blocked_writer(name, result_fd):
    """In a forked child: a thread blocks in acquire_write (its claim is in
    the state word) while the main thread closes the lock."""
    import threading
    lk = pyshmlock.RWLock(name)
    out = []
    t = threading.Thread(target=lambda: out.append(lk.acquire_write(3)))
    t.start()
    t0 = time.monotonic()
    while lk.info().writer_pid != os.getpid() and time.monotonic() - t0 < 5:
        time.sleep(0.005)
    try:
        lk.close()
        verdict = b"closed"
    except pyshmlock.LockInUseError as e:
        verdict = b"refused:" + str(e).encode()
    t.join(10)
    os.write(result_fd, verdict + b"|" + repr(out).encode())
    if verdict.startswith(b"refused"):
        lk.close()
    os._exit(0)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_close_while_another_thread_waits_is_refused_not_a_crash(lock_name, children):
    c = children(hold_read_4s, lock_name)
    c.expect("reading")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            _close_under_a_blocked_writer(lock_name, w)
        finally:
            os._exit(3)
    os.close(w)
    status = _reap(pid, 20.0)
    got = os.read(r, 4096).decode(errors="replace")
    os.close(r)
    assert status is not None, "the child hung"
    assert os.WIFEXITED(status), f"the child died of signal {os.WTERMSIG(status)} ({got!r})"
    assert got.startswith("refused:"), got
    assert "in flight" in got or "waiting" in got, got
    assert got.endswith("[False]"), got          # the writer timed out normally


def test_close_with_an_asyncio_task_parked_is_refused(lock_name, children):
    import asyncio
    c = children(hold_read_4s, lock_name)
    c.expect("reading")

    async def main():
        alk = pyshmlock.AsyncRWLock(lock_name)
        task = asyncio.ensure_future(alk.acquire_write(10))
        for _ in range(500):
            await asyncio.sleep(0.005)
            if alk.info().writer_pid == os.getpid():
                break
        with pytest.raises(pyshmlock.LockInUseError, match="waiting|in flight"):
            alk.close()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        alk.close()          # nothing in flight any more
        return alk

    alk = asyncio.run(asyncio.wait_for(main(), 30))
    with pytest.raises(ValueError, match="closed"):
        alk.pause()


def test_claim_naming_a_free_slot_is_reclaimed_by_a_waiter(lock_name):
    """What an unguarded close() left behind: the state word names a slot
    that no process owns.  A waiter must reclaim it, not wait forever."""
    lk = pyshmlock.RWLock(lock_name, max_processes=4)
    try:
        me = _self_slot(lk)
        free = 3 if me != 3 else 2
        m = _raw(lock_name)
        s = _u32(m, STATE_OFF)
        from pyshmlock._shmlock import lib
        assert s == lib.shl_load_state(lk._h)
        _put_u32(m, STATE_OFF, (s & ~0x3FFF) | (free + 1))   # a claim, not granted
        ok = lk.acquire_read(3)
        assert ok, "the reader waited for a claim that nobody owns"
        lk.release_read()
        assert lk.acquire_write(3)
        lk.release_write()
        assert any("exclusive claim" in r.lost for r in lk.info().recoveries)
        m.close()
    finally:
        lk.close()


# ------------------------------------------------------------ defect 7a

def acquire_write_once(q, name, timeout):
    lk = pyshmlock.RWLock(name)
    ok = lk.acquire_write(timeout)
    if ok:
        lk.release_write()
    q.put(ok)
    lk.close()


def test_read_hold_count_overflow_is_an_error_not_a_wrap(lock, lock_name, children):
    from pyshmlock._shmlock import lib
    assert lock.acquire_read(1)
    m = _raw(lock_name)
    off = _readers_off(m, _self_slot(lock), os.getpid(), 1)
    try:
        # 2^32 - 1 holds of this process, as far as the segment knows
        _put_u32(m, off, 0xFFFFFFFF)
        with pytest.raises(pyshmlock.TooManyReadHoldsError, match="read holds"):
            lock.acquire_read(1)
        assert _u32(m, off) == 0xFFFFFFFF          # nothing wrapped, nothing left
        # a writer elsewhere still waits for the holds
        c = children(acquire_write_once, lock_name, 0.3)
        assert c.get(10) is False
        # the documented cap: SHL_READ_HOLDS_MAX per process and lock
        _put_u32(m, off, lib.SHL_READ_HOLDS_MAX)
        with pytest.raises(pyshmlock.TooManyReadHoldsError):
            lock.acquire_read(0)
        _put_u32(m, off, lib.SHL_READ_HOLDS_MAX - 1)
        assert lock.acquire_read(0)
        lock.release_read()
    finally:
        _put_u32(m, off, 1)
        m.close()
        lock.release_read()


# ------------------------------------------------------------ defect 7c

def test_entry_points_refuse_a_null_handle_without_touching_it():
    """shl_wait, shl_info and shl_slot_info used to read through
    the handle before checking it.  Run in a child: the old core crashed."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            from pyshmlock._shmlock import ffi, lib
            w = ffi.new("shl_waiter *")
            w.kind = lib.SHL_KIND_READ
            rcs = [lib.shl_wait(ffi.NULL, w, 0),
                   lib.shl_info(ffi.NULL, ffi.new("shl_snapshot *")),
                   lib.shl_slot_info(ffi.NULL, 0, ffi.new("shl_slot_snapshot *")),
                   lib.shl_try(ffi.NULL, w), lib.shl_attach(ffi.NULL),
                   lib.shl_recovery_info(ffi.NULL, 0, ffi.new("shl_recovery_record *"))]
            lib.shl_cancel(ffi.NULL, w)
            code = 0 if all(rc == lib.SHL_ECLOSED for rc in rcs) else 2
        finally:
            os._exit(code)
    status = _reap(pid, 10)
    assert status is not None and os.WIFEXITED(status), f"child crashed: {status}"
    assert os.WEXITSTATUS(status) == 0


# ------------------------------------------------------------ defect 7e

def test_would_deadlock_names_only_the_thread_that_holds(lock):
    """Thread A takes and releases the write hold, then thread B holds it:
    A's attempt must time out, never see B's hold as its own.  (The arm64
    reordering of the old relaxed stores cannot show on x86; this checks
    the rule itself across many hand-overs.)"""
    import threading
    a_holds, b_holds, stop = threading.Event(), threading.Event(), threading.Event()
    errors = []

    def b():
        try:
            while not stop.is_set():
                if a_holds.wait(0.01):
                    continue
                if lock.acquire_write(1):
                    b_holds.set()
                    time.sleep(0.0005)
                    b_holds.clear()
                    lock.release_write()
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=b)
    t.start()
    try:
        for _ in range(300):
            assert lock.acquire_write(2)
            a_holds.set()
            with pytest.raises(pyshmlock.WouldDeadlockError):
                lock.acquire_write()         # A itself holds it: waiting forever is an error
            a_holds.clear()
            lock.release_write()
            b_holds.wait(0.05)
            lock.acquire_write(0) and lock.release_write()   # never WouldDeadlockError
    finally:
        stop.set()
        t.join(10)
    assert not errors, errors


def test_a_refused_close_never_disturbs_calls_of_other_threads(lock):
    """close() refused (a hold, or calls in flight) must leave the lock fully
    usable: concurrent calls neither fail as "closed" nor lose their count."""
    import threading
    assert lock.acquire_read(1)
    stop = threading.Event()
    errors = []

    def churn():
        try:
            while not stop.is_set():
                assert lock.acquire_read(2)
                lock.release_read()
                lock.is_locked()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=churn) for _ in range(2)]
    for t in threads:
        t.start()
    refused = 0
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < 1.0:
            with pytest.raises(pyshmlock.LockInUseError):
                lock.close()
            refused += 1
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert not errors, errors
    assert refused > 10
    lock.release_read()
    lock.close()                  # nothing in flight and nothing held: closes
    with pytest.raises(ValueError, match="closed"):
        lock.acquire_read(0)
