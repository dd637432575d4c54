"""What a process keeps for locks it has closed: nothing that grows with
history.  Closed handles are recycled, each under a new generation, so a
late call through an old token can never act on the lock a recycled handle
serves now.  (The CPU and memory figures are `pyshmlock bench`'s "process
footprint" rows, not timed here.)"""
import pytest

import pyshmlock
from pyshmlock._shmlock import ffi, lib

pytestmark = pytest.mark.timeout(120)


def handle_stats():
    o, a = ffi.new("uint32_t *"), ffi.new("uint32_t *")
    lib.shl_handle_stats(o, a)
    return o[0], a[0]


def test_many_opens_and_closes_keep_only_what_is_open(lock_name):
    open0, alloc0 = handle_stats()
    for i in range(7500):
        lk = pyshmlock.RWLock(lock_name)
        lk.close()
        other = pyshmlock.RWLock(f"{lock_name}-{i % 3}")
        other.close()
        pyshmlock.unlink(f"{lock_name}-{i % 3}")
    open1, alloc1 = handle_stats()
    assert open1 == open0
    assert alloc1 <= max(alloc0, 256), "the handle table grew with history"


def test_a_token_of_a_closed_handle_never_reaches_its_next_lock(lock_name):
    a = pyshmlock.RWLock(lock_name)
    stale = a._h                         # what a thread racing with close() holds
    a.close()
    index = int(ffi.cast("uintptr_t", stale)) & 0xFFFFFFFF
    for _ in range(1000):                # closed handles are reused first in, first out
        b = pyshmlock.RWLock(lock_name + "-b")
        if int(ffi.cast("uintptr_t", b._h)) & 0xFFFFFFFF == index:
            break
        b.close()
    try:
        assert int(ffi.cast("uintptr_t", b._h)) & 0xFFFFFFFF == index, \
            "the handle was not reused"
        assert lib.shl_pause(stale) == lib.SHL_ECLOSED
        w = ffi.new("shl_waiter *")
        w.kind = lib.SHL_KIND_READ
        assert lib.shl_try(stale, w) == lib.SHL_ECLOSED
        assert lib.shl_close(stale) == lib.SHL_ECLOSED
        assert not b.paused and b.acquire_read(0)
        b.release_read()
    finally:
        b.close()
        pyshmlock.unlink(lock_name + "-b")


@pytest.mark.parametrize("token", [1, 0xFFFFFFFF, (7 << 32) | 1, (1 << 63) | 5, 2**64 - 1])
def test_a_made_up_token_is_a_closed_lock(token):
    h = ffi.cast("shl_lock *", token)
    assert lib.shl_is_paused(h) == lib.SHL_ECLOSED
    assert lib.shl_close(h) == lib.SHL_ECLOSED
    w = ffi.new("shl_waiter *")
    w.kind = lib.SHL_KIND_READ
    assert lib.shl_try(h, w) == lib.SHL_ECLOSED
