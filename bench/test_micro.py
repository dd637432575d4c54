"""Uncontended costs, pyshmlock next to what Python users pick today, all in
one run:  pytest bench/   (needs the bench extra: pip install '.[bench]').

Each benchmark times one acquire+release pair (or one operation); the
summary at the end states each median as a ratio to the floor (two cffi calls
doing one atomic operation each on a shared-memory word) and to
posix_ipc.Semaphore's pair.  The floors (that one, and two calls of a bare
METH_NOARGS C function) are not part of the installed lock: they are compiled
on first use (pyshmlock_lab/bench/floors.py) and skipped without a C compiler."""
import asyncio
import fcntl
import multiprocessing as mp
import os
import uuid

import pytest
from conftest import PAIRS_PER_ASYNC_CALL

import pyshmlock
from pyshmlock_lab.bench.floors import FloorUnavailable, capi_floor, cffi_floor


def _floor(build):
    try:
        return build()
    except FloorUnavailable as e:
        pytest.skip(f"floor not built: {e.name} unavailable")


# ---------------------------------------------------------------- floors

def test_floor_two_cffi_atomic_calls(benchmark, shm_word):
    floor = _floor(cffi_floor)
    word = floor.ffi.cast("uint32_t *", floor.ffi.from_buffer(shm_word))
    add = floor.lib.floor_fetch_add

    def pair():
        add(word, 1)
        add(word, 0xFFFFFFFF)
    benchmark(pair)


def test_floor_one_cffi_call(benchmark, shm_word):
    floor = _floor(cffi_floor)
    word = floor.ffi.cast("uint32_t *", floor.ffi.from_buffer(shm_word))
    benchmark(floor.lib.floor_fetch_add, word, 0)


def test_floor_two_bare_capi_calls(benchmark):
    noop = _floor(capi_floor).noop

    def pair():
        noop()
        noop()
    benchmark(pair)


def test_floor_one_bare_capi_call(benchmark):
    benchmark(_floor(capi_floor).noop)


# ------------------------------------------------------------ pyshmlock

def test_read_pair_methods(benchmark, lock):
    acquire, release = lock.acquire_read, lock.release_read

    def pair():
        acquire()
        release()
    benchmark(pair)


def test_read_pair_methods_timeout(benchmark, lock):
    acquire, release = lock.acquire_read, lock.release_read

    def pair():
        acquire(5.0)
        release()
    benchmark(pair)


def test_read_pair_with_reader_lock(benchmark, lock):
    cm = lock.reader_lock

    def pair():
        with cm:
            pass
    benchmark(pair)


# ---------------------------------------------- asyncio, on both event loops

def _new_loop(which):
    if which == "uvloop":
        try:
            import uvloop
        except ImportError:
            pytest.skip("uvloop is not installed (pip install 'pyshmlock[bench]')")
        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


LOOPS = pytest.mark.parametrize("which", ["asyncio", "uvloop"])


@LOOPS
def test_read_pair_async_with(benchmark, lock, which):
    alock = pyshmlock.AsyncRWLock(lock.name)
    cm = alock.reader_lock

    async def pairs():
        for _ in range(PAIRS_PER_ASYNC_CALL):
            async with cm:
                pass
    loop = _new_loop(which)
    benchmark.extra_info["pairs_per_call"] = PAIRS_PER_ASYNC_CALL
    try:
        benchmark(lambda: loop.run_until_complete(pairs()))
    finally:
        loop.close()
        alock.close()


@LOOPS
def test_read_pair_await_acquire_release(benchmark, lock, which):
    alock = pyshmlock.AsyncRWLock(lock.name)
    acquire, release = alock.acquire_read, alock.release_read

    async def pairs():
        for _ in range(PAIRS_PER_ASYNC_CALL):
            await acquire()
            release()
    loop = _new_loop(which)
    benchmark.extra_info["pairs_per_call"] = PAIRS_PER_ASYNC_CALL
    try:
        benchmark(lambda: loop.run_until_complete(pairs()))
    finally:
        loop.close()
        alock.close()


@LOOPS
def test_peer_asyncio_lock_async_with(benchmark, which):
    lk = asyncio.Lock()

    async def pairs():
        for _ in range(PAIRS_PER_ASYNC_CALL):
            async with lk:
                pass
    loop = _new_loop(which)
    benchmark.extra_info["pairs_per_call"] = PAIRS_PER_ASYNC_CALL
    try:
        benchmark(lambda: loop.run_until_complete(pairs()))
    finally:
        loop.close()


def test_write_pair(benchmark, lock):
    acquire, release = lock.acquire_write, lock.release_write

    def pair():
        acquire()
        release()
    benchmark(pair)


def test_update_pair(benchmark, lock):
    acquire, release = lock.acquire_update, lock.release_update

    def pair():
        acquire()
        release()
    benchmark(pair)


def test_paused_property(benchmark, lock):
    # A getter is not callable: time it in a loop of 100 reads per call.
    def reads():
        for _ in range(100):
            lock.paused
    benchmark.extra_info["pairs_per_call"] = 100
    benchmark(reads)


def test_pause_resume(benchmark, lock):
    pause, resume = lock.pause, lock.resume

    def pair():
        pause()
        resume()
    benchmark(pair)


# ---------------------------------------------------------------- peers

def test_peer_multiprocessing_lock_pair(benchmark):
    lk = mp.Lock()

    def pair():
        lk.acquire()
        lk.release()
    benchmark(pair)


def test_peer_posix_ipc_semaphore_pair(benchmark):
    import posix_ipc
    sem = posix_ipc.Semaphore(f"/bench-{uuid.uuid4().hex[:8]}", posix_ipc.O_CREX,
                              initial_value=1)
    try:
        def pair():
            sem.acquire()
            sem.release()
        benchmark(pair)
    finally:
        sem.unlink()
        sem.close()


def test_peer_prwlock_read_pair(benchmark):
    prwlock = pytest.importorskip("prwlock")
    lk = prwlock.RWLock()

    def pair():
        lk.acquire_read()
        lk.release()
    benchmark(pair)


def test_peer_fcntl_flock_shared_pair(benchmark, tmp_path_file):
    fd = os.open(tmp_path_file, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        def pair():
            fcntl.flock(fd, fcntl.LOCK_SH)
            fcntl.flock(fd, fcntl.LOCK_UN)
        benchmark(pair)
    finally:
        os.close(fd)


def test_peer_fasteners_read_pair(benchmark, tmp_path_file):
    fasteners = pytest.importorskip("fasteners")
    lk = fasteners.InterProcessReaderWriterLock(tmp_path_file)

    def pair():
        lk.acquire_read_lock()
        lk.release_read_lock()
    benchmark(pair)


def test_peer_filelock_read_pair(benchmark, tmp_path_file):
    filelock = pytest.importorskip("filelock")
    lk = filelock.ReadWriteLock(tmp_path_file, is_singleton=False)

    def pair():
        lk.acquire_read()
        lk.release()
    benchmark(pair)
    lk.close()
