"""Segment states that the Python API cannot produce, written into the
segment directly (as a faulty or hostile neighbour process could): a claim
in the state word that names a slot nobody owns is reclaimed by the next
waiter, and a read-hold count at its limit makes a further read hold an
error instead of wrapping to zero.  Every wait is bounded."""
import mmap
import os

import pytest

import pyshmlock

pytestmark = pytest.mark.timeout(90)

STATE_OFF = 64              # the state word: first field of the header's 2nd cache line


def _raw(name):
    """A second, raw mapping of the segment: what a corrupt or hostile
    neighbour process can do to it."""
    fd = os.open(f"/dev/shm/pyshmlock.{name}", os.O_RDWR)
    try:
        return mmap.mmap(fd, 0)
    finally:
        os.close(fd)


def _u32(m, off):
    return int.from_bytes(m[off:off + 4], "little")


def _put_u32(m, off, v):
    m[off:off + 4] = int(v).to_bytes(4, "little")


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


# ------------------------------------------- a claim that nobody owns

def test_claim_naming_a_free_slot_is_reclaimed_by_a_waiter(lock_name):
    """The state word names a slot that no process owns (what a close()
    that did not wait for a call in flight would leave behind).  A waiter
    must reclaim it, not wait forever."""
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


# ------------------------------------------- the read-hold count's limit

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
