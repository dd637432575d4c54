"""asyncio-native waiting on a shared lock: :class:`AsyncRWLock`.

How a coroutine waits:

1. It makes a non-blocking attempt (``shl_try``) on the event-loop thread.
   Holds are only ever taken there.
2. If the attempt must wait, the task parks on a future.  Its attempt keeps
   its place in the protocol (an owed-reader registration, or a writer's
   claim, which already blocks new readers).
3. One helper thread per lock per process (``shl_watcher``, in C, never
   holding the GIL) sleeps on the futex words that the parked attempts wait
   on, and on the processes they wait for.  A newly parked attempt is
   watched at once.  When anything changes it writes to one eventfd per
   event loop; the loop's reader callback wakes its parked tasks.  Every
   woken task retries its attempt, so no wake-up is lost.
4. Cancellation or timeout withdraws the attempt (``shl_cancel``): no hold,
   no waiter count and no writer claim is left behind, and readers that a
   cancelled writer was blocking get in at once.
"""
import asyncio
import os
import threading
import time
import weakref
from typing import Any, Dict, List, Optional, Tuple

from ._shmlock import ffi, lib
from .errors import error_for
from .lock import RWLock, _Hold, _close_hooks, deadline_ns

__all__ = ["AsyncRWLock", "async_acquire"]

_try_read_once = lib.shl_acquire_read     # with a past deadline: one attempt


class _Parked:
    __slots__ = ("loop", "future", "waiter", "gen", "lw")

    def __init__(self, loop: asyncio.AbstractEventLoop, future: "asyncio.Future[None]",
                 waiter: Any) -> None:
        self.loop = loop
        self.future = future
        self.waiter = waiter
        self.gen = 0
        self.lw: Optional[_LoopWake] = None


def _wake_futures(futures: List["asyncio.Future[None]"]) -> None:
    for f in futures:
        if not f.done():
            f.set_result(None)


class _LoopWake:
    """One event loop's eventfd for one helper, and its parked attempts.

    Kept as long as the loop object lives, so that parking again costs no
    system call.  Holds no reference to its loop (the helper keys it weakly
    by loop).  fd is -1 once closed; only the helper's mu changes it."""
    __slots__ = ("fd", "parked", "__weakref__")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.parked: Dict[int, _Parked] = {}


class _Helper:
    """The one thread per (process, lock) that sleeps for the parked tasks.

    The thread is C (``shl_watcher``): it never takes the GIL.  When a word
    that a parked attempt waits on changes, it writes to one eventfd per
    event loop; the loop's reader callback wakes that loop's parked tasks,
    and each retries its attempt on its own loop.  Parking registers the
    attempt with the thread at once (a kick), whatever word it waits on.
    """

    def __init__(self, handle: Any, name: str) -> None:
        self.handle = handle
        self.name = name
        self.pid = os.getpid()
        self.mu = threading.Lock()
        self.closed = False
        self.loops: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWake]" = \
            weakref.WeakKeyDictionary()
        self.watcher = lib.shl_watcher_new(handle)
        if self.watcher == ffi.NULL:
            raise MemoryError("pyshmlock: no memory for the asyncio watcher")
        self._gen = ffi.new("uint64_t *")

    def park(self, p: _Parked) -> bool:
        """Register p (on p.loop's thread).  False: its word already changed,
        or this helper is closing; retry the attempt now."""
        with self.mu:
            if self.closed:
                return False
            lw = self.loops.get(p.loop)
            if lw is None:
                lw = self._add_loop(p.loop)
            rc = lib.shl_watcher_park(self.watcher, p.waiter, self._gen)
            if rc == lib.SHL_OK:
                p.gen = self._gen[0]
                p.lw = lw
                lw.parked[id(p.future)] = p
                return True
        if rc == lib.SHL_AGAIN or rc == lib.SHL_ECLOSED:
            return False
        raise error_for(rc, "park", self.name)

    def _add_loop(self, loop: asyncio.AbstractEventLoop) -> _LoopWake:
        # Caller holds mu and runs on loop's thread.
        fd = lib.shl_watcher_add_loop(self.watcher)
        if fd < 0:
            raise error_for(fd, "park", self.name)
        lw = _LoopWake(fd)
        try:
            loop.add_reader(fd, self._on_wake, lw)
        except BaseException:
            lib.shl_watcher_drop_loop(self.watcher, fd)
            os.close(fd)
            raise
        self.loops[loop] = lw
        weakref.finalize(loop, self._close_fd, lw)
        return lw

    def unpark(self, p: _Parked) -> None:
        """Forget p (on p.loop's thread): cancelled, timed out, or woken
        (then _on_wake already forgot it, and this costs nothing)."""
        lw = p.lw
        # lw.parked changes only on the loop's thread (close() only reads it).
        if lw is None or lw.parked.pop(id(p.future), None) is None:
            return
        with self.mu:
            if not self.closed:
                lib.shl_watcher_unpark(self.watcher, p.waiter, p.gen)

    def _on_wake(self, lw: _LoopWake) -> None:
        # On the loop's thread: the watcher wrote to our eventfd.  Every task
        # parked here retries.  Their registrations were forgotten when the
        # watcher woke everybody, except those made since (still counted).
        try:
            os.read(lw.fd, 8)
        except OSError:
            pass        # nothing to read (a wake-up already consumed), or closed
        parked = lw.parked
        if not parked:
            return
        lw.parked = {}
        with self.mu:
            if not self.closed:
                gen = lib.shl_watcher_gen(self.watcher)
                for p in parked.values():
                    if p.gen == gen:
                        lib.shl_watcher_unpark(self.watcher, p.waiter, p.gen)
        for p in parked.values():
            if not p.future.done():
                p.future.set_result(None)

    def _close_fd(self, lw: _LoopWake) -> None:
        # The loop is gone (or forgets us): the watcher writes to fd no more.
        if os.getpid() != self.pid:
            return      # a forked child: the parent's locks may be held forever
        with self.mu:
            if lw.fd < 0:
                return
            if not self.closed:
                lib.shl_watcher_drop_loop(self.watcher, lw.fd)
            os.close(lw.fd)
            lw.fd = -1

    def _forget(self, loop: asyncio.AbstractEventLoop, lw: _LoopWake) -> None:
        try:
            if lw.fd >= 0:
                loop.remove_reader(lw.fd)
        finally:
            self._close_fd(lw)

    def close(self) -> None:
        """Stop watching: mark closed, wake every parked task (each retries
        and sees the lock closed, or parks again on a fresh helper), then
        stop and join the thread.  Safe from any thread; idempotent."""
        with self.mu:
            if self.closed:
                return
            self.closed = True
            loops = list(self.loops.items())
            self.loops.clear()
        for loop, lw in loops:
            try:
                loop.call_soon_threadsafe(_wake_futures,
                                          [p.future for p in list(lw.parked.values())])
            except RuntimeError:
                pass    # that loop is closed; its tasks are gone
        lib.shl_watcher_free(self.watcher)     # joins the thread: no more writes
        self.watcher = ffi.NULL
        for loop, lw in loops:
            try:
                loop.call_soon_threadsafe(self._forget, loop, lw)
            except RuntimeError:
                self._close_fd(lw)      # a closed loop watches nothing any more


_helpers: Dict[Tuple[int, int], _Helper] = {}
_helpers_lock = threading.Lock()


def _reset_in_child() -> None:
    # After fork() no helper thread runs in the child, its parked futures
    # belong to the parent's loops, and a lock may have been held: start over.
    # The parent's watchers are left alone (their mutexes may have been held
    # at the fork); the child makes its own.
    global _helpers_lock
    _helpers_lock = threading.Lock()
    _helpers.clear()


os.register_at_fork(after_in_child=_reset_in_child)


def _helper_for(lock: RWLock) -> _Helper:
    att = lock._att
    if att is None:
        raise ValueError(f"lock {lock.name!r} is closed")
    with _helpers_lock:
        helper = _helpers.get(att.key)
        if helper is None or helper.handle != att.handle or helper.closed:
            helper = _helpers[att.key] = _Helper(att.handle, lock.name)
        return helper


def _close_helper(key: Tuple[int, int]) -> None:
    """Stop the helper of an attachment that is about to be closed."""
    with _helpers_lock:
        helper = _helpers.pop(key, None)
    if helper is not None:
        helper.close()


_close_hooks.append(_close_helper)


async def async_acquire(lock: RWLock, kind: int, timeout: Optional[float]) -> bool:
    """Wait for a hold (or condition) of `kind` without blocking the loop.

    Returns True once had, False on timeout; cancellation withdraws the
    attempt and re-raises.
    """
    h = lock._handle()
    deadline = deadline_ns(timeout)
    if kind == lib.SHL_KIND_READ:
        # Fast path: one try in C with no allocation; parking only if it fails.
        rc = _try_read_once(h, 0)
        if rc == lib.SHL_OK:
            return True
        if rc < 0:
            raise error_for(rc, "acquire_read", lock.name)
    w = ffi.new("shl_waiter *")
    w.kind = kind
    w.shared_thread = 1
    loop = asyncio.get_running_loop()
    try:
        while True:
            rc = lib.shl_try(h, w)
            if rc == lib.SHL_OK:
                return True
            if rc != lib.SHL_AGAIN:
                raise error_for(rc, _KIND_NAMES.get(kind, "acquire"), lock.name)
            remaining = None if deadline < 0 else (deadline - time.monotonic_ns()) / 1e9
            if remaining is not None and remaining <= 0:
                lib.shl_cancel(h, w)
                return False
            helper = _helper_for(lock)
            fut: "asyncio.Future[None]" = loop.create_future()
            parked = _Parked(loop, fut, w)
            if not helper.park(parked):
                continue        # its word changed already: retry at once
            timer = None if remaining is None else loop.call_later(
                remaining, _wake_futures, [fut])
            try:
                await fut
            finally:
                helper.unpark(parked)
                if timer is not None:
                    timer.cancel()
    except BaseException:
        lib.shl_cancel(h, w)     # cancelled or failed: leave nothing behind
        raise


_KIND_NAMES = {
    lib.SHL_KIND_READ: "acquire_read", lib.SHL_KIND_WRITE: "acquire_write",
    lib.SHL_KIND_UPDATE: "acquire_update", lib.SHL_KIND_RESUME: "resume",
    lib.SHL_KIND_RESUMED: "wait_resumed", lib.SHL_KIND_DRAINED: "wait_drained",
}


class AsyncRWLock:
    """The asyncio view of a shared lock: same segment, same semantics as
    :class:`RWLock` (a process may hold both views of one name; holds belong
    to the process either way).

    Waiting never blocks the event loop and never costs a thread per waiter.
    A cancelled waiter leaves nothing behind.  Also answers to the method
    names of SGLang's in-process ``RWLock`` (``acquire_reader`` ...), so a
    tokenizer worker can swap its ``model_update_lock`` and its
    ``is_pause``/``is_pause_cond`` pair for one shared object.
    """

    def __init__(self, name: str, *, create: bool = True, mode: int = 0o600,
                 max_processes: int = 256) -> None:
        self._lock = RWLock(name, create=create, mode=mode, max_processes=max_processes)
        self.name = name
        #: ``async with lock.reader_lock:`` holds a read for the block.
        self.reader_lock = self._hold(lib.SHL_KIND_READ, None)
        #: ``async with lock.writer_lock:`` holds the write lock for the block.
        self.writer_lock = self._hold(lib.SHL_KIND_WRITE, None)
        #: ``async with lock.update_lock:`` holds an update for the block.
        self.update_lock = self._hold(lib.SHL_KIND_UPDATE, None)

    def _hold(self, kind: int, timeout: Optional[float]) -> _Hold:
        return _Hold(self._lock, kind, timeout)

    # -- coroutines ----------------------------------------------------

    async def acquire_read(self, timeout: Optional[float] = None) -> bool:
        """Take a shared hold; False on timeout (see RWLock.acquire_read)."""
        return await async_acquire(self._lock, lib.SHL_KIND_READ, timeout)

    async def acquire_write(self, timeout: Optional[float] = None) -> bool:
        """Take the exclusive hold; False on timeout (see RWLock.acquire_write)."""
        return await async_acquire(self._lock, lib.SHL_KIND_WRITE, timeout)

    async def acquire_update(self, timeout: Optional[float] = None) -> bool:
        """Take the pause-aware exclusive hold (see RWLock.acquire_update)."""
        return await async_acquire(self._lock, lib.SHL_KIND_UPDATE, timeout)

    async def resume(self, timeout: Optional[float] = None) -> bool:
        """Open the gate once no update holds it; False on timeout."""
        return await async_acquire(self._lock, lib.SHL_KIND_RESUME, timeout)

    async def wait_resumed(self, timeout: Optional[float] = None) -> bool:
        """Wait until the lock is not paused; False on timeout."""
        return await async_acquire(self._lock, lib.SHL_KIND_RESUMED, timeout)

    async def wait_drained(self, timeout: Optional[float] = None) -> bool:
        """Wait until no read hold exists in any process; False on timeout."""
        return await async_acquire(self._lock, lib.SHL_KIND_DRAINED, timeout)

    # -- plain methods -------------------------------------------------

    def release_read(self) -> None:
        """Give back one read hold of this process."""
        self._lock.release_read()

    def release_write(self) -> None:
        """Give back this process's write hold."""
        self._lock.release_write()

    def release_update(self) -> None:
        """Give back this process's update hold."""
        self._lock.release_update()

    def pause(self) -> bool:
        """Close the gate everywhere; never blocks (see RWLock.pause)."""
        return self._lock.pause()

    @property
    def paused(self) -> bool:
        """Whether the gate is closed (one shared-memory load)."""
        return self._lock.paused

    def is_locked(self) -> bool:
        """True if a write/update hold or any read hold exists anywhere."""
        return self._lock.is_locked()

    def info(self) -> Any:
        """A snapshot of the lock (see RWLock.info)."""
        return self._lock.info()

    def close(self) -> None:
        """Detach (see RWLock.close)."""
        self._lock.close()

    def read(self, timeout: Optional[float] = None) -> _Hold:
        """``async with lock.read(timeout=1):`` - TimeoutError if not had in time."""
        deadline_ns(timeout)
        return self._hold(lib.SHL_KIND_READ, timeout)

    def write(self, timeout: Optional[float] = None) -> _Hold:
        """``async with lock.write(timeout=1):`` - TimeoutError if not had in time."""
        deadline_ns(timeout)
        return self._hold(lib.SHL_KIND_WRITE, timeout)

    def update(self, timeout: Optional[float] = None) -> _Hold:
        """``async with lock.update(timeout=1):`` - TimeoutError if not had in time."""
        deadline_ns(timeout)
        return self._hold(lib.SHL_KIND_UPDATE, timeout)

    # -- SGLang RWLock compatibility (sglang.srt.aio_rwlock.RWLock) -----

    async def acquire_reader(self) -> None:
        """SGLang name for ``await acquire_read()``."""
        await self.acquire_read()

    async def release_reader(self) -> None:
        """SGLang name for ``release_read()``."""
        self.release_read()

    async def acquire_writer(self) -> None:
        """SGLang name for ``await acquire_write()``."""
        await self.acquire_write()

    async def release_writer(self) -> None:
        """SGLang name for ``release_write()``."""
        self.release_write()

    def __repr__(self) -> str:
        return f"<pyshmlock.AsyncRWLock {self.name!r}>"
