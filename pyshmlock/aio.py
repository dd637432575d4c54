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
   event loop; the loop's reader callback wakes its parked tasks, each of
   which retries its attempt right there, in the callback (a parked task
   awaits a :class:`_ParkFuture`).  Every woken task retries, so no
   wake-up is lost.
4. Cancellation or timeout withdraws the attempt (``shl_cancel``): no hold,
   no waiter count and no writer claim is left behind, and readers that a
   cancelled writer was blocking get in at once.
"""
import asyncio
import contextvars
import os
import threading
import time
import weakref
from typing import Any, ContextManager, Coroutine, Dict, List, NoReturn, Optional, Tuple

from . import holds as _holds
from ._args import DEFAULT_MODE
from ._attachment import _Attachment, _close_hooks
from ._deadline import deadline_ns
from ._shmlock import ffi, lib
from .errors import LockInUseError, error_for
from .holds import CALL_NAMES, HOLD_KINDS, hold_repr, hold_would_wait, own_holds
from .lock import RWLock, _Attached, _reopen, no_plain_with

__all__ = ["AsyncHold", "AsyncRWLock", "async_acquire"]

_try_read_once = lib.shl_acquire_read     # with a past deadline: one attempt


class _ParkFuture:
    """What a parked task awaits: a minimal asyncio Future (the protocol a
    Task drives: ``_asyncio_future_blocking``, ``get_loop``,
    ``add_done_callback``, ``result``, ``cancel``, ...) with one more method,
    :meth:`wake`, that runs the awaiting task's wake-up at once.

    The watcher's reader callback calls ``wake()``: the woken task retries
    in that same pass of the event loop, with no ``call_soon`` and no second
    pass (selector, ready queue) in between.  Everything else completes it
    as an ``asyncio.Future`` is completed: ``set_result`` (a timeout's timer,
    the helper's close) and ``cancel`` (Task.cancel: wait_for, timeouts)
    schedule the callbacks through ``call_soon``.  Single-threaded: only the
    loop's thread touches it."""
    __slots__ = ("_asyncio_future_blocking", "_callbacks", "_cancel_msg", "_loop", "_state")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._callbacks: List[Tuple[Any, contextvars.Context]] = []
        self._state = 0             # 0 pending, 1 done, 2 cancelled
        self._cancel_msg: Any = None
        self._asyncio_future_blocking = False

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def done(self) -> bool:
        return self._state != 0

    def cancelled(self) -> bool:
        return self._state == 2

    def result(self) -> None:
        if self._state == 2:
            raise (asyncio.CancelledError() if self._cancel_msg is None
                   else asyncio.CancelledError(self._cancel_msg))
        if self._state == 0:
            raise asyncio.InvalidStateError("Result is not ready.")
        return None

    def exception(self) -> Optional[BaseException]:
        self.result()
        return None

    def add_done_callback(self, fn: Any, *, context: Optional[contextvars.Context] = None) -> None:
        if context is None:
            context = contextvars.copy_context()
        if self._state:
            self._loop.call_soon(fn, self, context=context)
        else:
            self._callbacks.append((fn, context))

    def remove_done_callback(self, fn: Any) -> int:
        kept = [(f, c) for f, c in self._callbacks if f != fn]
        removed = len(self._callbacks) - len(kept)
        self._callbacks = kept
        return removed

    def cancel(self, msg: Any = None) -> bool:
        if self._state:
            return False
        self._state = 2
        self._cancel_msg = msg
        self._schedule()
        return True

    def set_result(self, result: None) -> None:
        if self._state:
            raise asyncio.InvalidStateError("invalid state")
        self._state = 1
        self._schedule()

    def _schedule(self) -> None:
        callbacks, self._callbacks = self._callbacks, []
        for fn, ctx in callbacks:
            self._loop.call_soon(fn, self, context=ctx)

    def wake(self) -> None:
        """Complete it and run its callbacks (the task's wake-up) now.  Only
        from a loop callback (no task running): the watcher's reader."""
        if self._state:
            return
        self._state = 1
        callbacks, self._callbacks = self._callbacks, []
        for i, (fn, ctx) in enumerate(callbacks):
            try:
                ctx.run(fn, self)
            except (SystemExit, KeyboardInterrupt):
                for later in callbacks[i + 1:]:     # not lost: run them as usual
                    self._loop.call_soon(later[0], self, context=later[1])
                raise
            except BaseException as exc:     # as a Handle would report it
                self._loop.call_exception_handler({
                    "message": f"Exception in callback {fn!r}", "exception": exc,
                    "future": self})

    def __await__(self) -> Any:
        if not self._state:
            self._asyncio_future_blocking = True
            yield self
        if not self._state:
            raise RuntimeError("await wasn't used with future")
        return self.result()

    __iter__ = __await__


class _Parked:
    __slots__ = ("future", "gen", "loop", "lw", "waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop, future: _ParkFuture,
                 waiter: Any) -> None:
        self.loop = loop
        self.future = future
        self.waiter = waiter
        self.gen = 0
        self.lw: Optional[_LoopWake] = None


def _wake_futures(futures: List[_ParkFuture]) -> None:
    for f in futures:
        if not f.done():
            f.set_result(None)


class _LoopWake:
    """One event loop's eventfd for one helper, and its parked attempts.

    Kept as long as the loop object lives, so that parking again costs no
    system call.  Holds no reference to its loop (the helper keys it weakly
    by loop).  fd is -1 once closed; only the helper's mu changes it."""
    __slots__ = ("__weakref__", "fd", "parked")

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
        self.loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWake] = \
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
        # Each task retries now, in this callback (nothing if it was
        # cancelled meanwhile).  If one raises out of it (KeyboardInterrupt,
        # SystemExit), the others still wake, through call_soon.
        woken = list(parked.values())
        i = 0
        try:
            while i < len(woken):
                i += 1
                woken[i - 1].future.wake()
        finally:
            for p in woken[i:]:
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


def _before_close(att: _Attachment) -> None:
    """The last close of an attachment: refuse while tasks of this process
    are parked on it (LockInUseError); otherwise forget its helper and stop
    the watcher thread before the core closes the handle (the thread counts
    as a call in flight, so the core would refuse while it runs)."""
    with _helpers_lock:
        helper = _helpers.get(att.key)
        if helper is None:
            return
        with helper.mu:
            waiting = sum(len(lw.parked) for lw in helper.loops.values())
        if waiting:
            raise LockInUseError(
                f"lock {att.name!r}: close() while {waiting} asyncio task(s) of this "
                "process are waiting for it; cancel them or let them finish first")
        del _helpers[att.key]
    helper.close()


_close_hooks.append(_before_close)


def _helper_for(lock: RWLock) -> _Helper:
    att = lock._att
    if att is None:
        raise ValueError(f"lock {lock.name!r} is closed")
    with _helpers_lock:
        helper = _helpers.get(att.key)
        if helper is None or helper.handle != att.handle or helper.closed:
            helper = _helpers[att.key] = _Helper(att.handle, lock.name)
        return helper


async def async_acquire(lock: RWLock, kind: int, timeout: Optional[float]) -> bool:
    """Wait for a hold (or condition) of `kind` without blocking the loop.

    Returns True once had, False on timeout; cancellation withdraws the
    attempt and re-raises.
    """
    h = lock._handle()
    deadline = deadline_ns(timeout)
    if kind == lib.SHL_KIND_READ and _read_at_once(lock, h):
        return True
    w = _shared_waiter(kind)
    loop = asyncio.get_running_loop()
    try:
        while True:
            if _attempt(lock, h, w, kind):
                return True
            remaining = None if deadline < 0 else (deadline - time.monotonic_ns()) / 1e9
            if remaining is not None and remaining <= 0:
                lib.shl_cancel(h, w)
                return False
            await _park(lock, loop, w, remaining)
    except BaseException:
        lib.shl_cancel(h, w)     # cancelled or failed: leave nothing behind
        raise


def _read_at_once(lock: RWLock, h: Any) -> bool:
    """The fast path of a read: one try in C with no allocation; the task
    parks only if it fails."""
    rc = _try_read_once(h, 0)
    if rc == lib.SHL_OK:
        return True
    # SHL_EDEADLK: this thread owns the exclusive hold.  A blocking call
    # would wait forever; a task waits for another task of its loop to
    # release it, so it parks (its attempt is shared_thread).
    if rc < 0 and rc != lib.SHL_EDEADLK:
        raise error_for(rc, "acquire_read", lock.name)
    return False


def _shared_waiter(kind: int) -> Any:
    """An attempt of `kind` made for the process, not this thread: a task
    may wait for a hold another task of its thread has."""
    w = ffi.new("shl_waiter *")
    w.kind = kind
    w.shared_thread = 1
    return w


def _attempt(lock: RWLock, h: Any, w: Any, kind: int) -> bool:
    """One non-blocking step of attempt w: True once had, False if it must
    wait (its registrations stay until shl_cancel)."""
    rc = lib.shl_try(h, w)
    if rc == lib.SHL_OK:
        return True
    if rc != lib.SHL_AGAIN:
        raise error_for(rc, CALL_NAMES.get(kind, "acquire"), lock.name)
    return False


async def _park(lock: RWLock, loop: asyncio.AbstractEventLoop, w: Any,
                remaining: Optional[float]) -> None:
    """Sleep until the watcher sees attempt w's word change, or `remaining`
    seconds pass; returns at once if the word changed already."""
    helper = _helper_for(lock)
    fut = _ParkFuture(loop)
    parked = _Parked(loop, fut, w)
    if not helper.park(parked):
        return          # its word changed already: retry at once
    timer = None if remaining is None else loop.call_later(remaining, _wake_futures, [fut])
    try:
        await fut
    finally:
        helper.unpark(parked)
        if timer is not None:
            timer.cancel()


_holds._async_acquire = async_acquire


def _try_once(lock: RWLock, kind: int) -> bool:
    """One attempt of `kind` on this thread, as a task makes it; nothing is
    left behind if it must wait."""
    h = lock._handle()
    w = _shared_waiter(kind)
    if _attempt(lock, h, w, kind):
        return True
    lib.shl_cancel(h, w)
    return False


class AsyncHold:
    """One kind of hold (``kind`` is "read", "write" or "update") of an
    :class:`AsyncRWLock`, shaped like :class:`asyncio.Lock`.

    ``async with hold:`` takes the hold for the block (TimeoutError if
    ``timeout`` was given and passes); ``await hold.acquire(timeout=None)``,
    ``release()`` and ``locked()`` follow asyncio.Lock, so
    ``asyncio.Condition(alock.writer_lock)`` works.  A plain ``with`` is a
    TypeError: it would block the event loop.
    """

    __slots__ = ("__weakref__", "_c_release", "_code", "_what", "kind", "lock", "timeout")

    def __init__(self, lock: RWLock, code: int, timeout: Optional[float]) -> None:
        self.lock = lock
        self._code = code
        self.kind, _, self._c_release, self._what = HOLD_KINDS[code]
        self.timeout = timeout

    async def acquire(self, timeout: Optional[float] = None) -> bool:
        """Take the hold: True once had, False on timeout (None waits forever)."""
        return await async_acquire(self.lock, self._code, timeout)

    def release(self) -> None:
        """Give the hold back (NotHeldError if this process has none)."""
        rc = self._c_release(self.lock._h)
        if rc:
            raise error_for(rc, "release of " + self._what, self.lock.name)

    def locked(self) -> bool:
        """Whether a new hold of this kind would have to wait now."""
        return hold_would_wait(self.lock, self._code)

    async def __aenter__(self) -> "AsyncHold":
        if not await async_acquire(self.lock, self._code, self.timeout):
            raise TimeoutError(f"{self._what} of lock {self.lock.name!r} not had "
                               f"within {self.timeout} s")
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.release()

    def __enter__(self) -> NoReturn:
        raise TypeError(f"{self._what} of an AsyncRWLock: use `async with`, not `with` "
                        "(a plain `with` would block the event loop); RWLock's holds "
                        "take a plain `with`")

    def __exit__(self, *exc: Any) -> None:
        """Never reached: ``__enter__`` refuses."""

    def __repr__(self) -> str:
        return hold_repr(self, "AsyncHold")


class AsyncRWLock:
    """The asyncio view of a shared lock: same segment, same semantics as
    :class:`RWLock` (a process may hold both views of one name; holds belong
    to the process either way).

    ``AsyncRWLock(name, *, create=True, mode=0o600, max_processes=256)``:
    the arguments of RWLock (``mode`` defaults to ``0o600``, owner
    read/write).

    Holds, as :class:`AsyncHold` objects shaped like asyncio.Lock:
    ``async with lock.reader_lock:``, ``lock.writer_lock``,
    ``lock.update_lock``, and ``lock.read(timeout)`` / ``write(timeout)`` /
    ``update(timeout)`` that raise TimeoutError.  A plain ``with`` on them is
    a TypeError, and so is ``with``/``async with`` on the lock itself (it
    would take no hold); ``async with AsyncRWLock(name).attached() as lock:``
    closes the lock when the block ends.  A lock pickles as its name.

    Waiting never blocks the event loop and never costs a thread per waiter.
    A task waits for holds that other tasks of its own loop have.  A
    cancelled waiter leaves nothing behind.  Also answers to SGLang's
    ``sglang.srt.utils.aio_rwlock.RWLock`` methods (``acquire_reader``,
    ``release_reader``, ``acquire_writer``, ``release_writer``,
    ``is_locked``, all coroutines), so a tokenizer worker can swap its
    ``model_update_lock`` and its ``is_pause``/``is_pause_cond`` pair for one
    shared object.

    ``stale`` is RWLock's stale-segment policy: ``"reset"`` (default) clears a
    pause left by processes that are all gone, ``"keep"`` keeps it.
    """

    #: ``async with lock.reader_lock:`` holds a read for the block.
    reader_lock: AsyncHold
    #: ``async with lock.writer_lock:`` holds the write lock for the block.
    writer_lock: AsyncHold
    #: ``async with lock.update_lock:`` holds an update for the block.
    update_lock: AsyncHold

    def __init__(self, name: str, *, create: bool = True, mode: int = DEFAULT_MODE,
                 max_processes: int = 256, group: Any = None,
                 stale: str = "reset") -> None:
        self._lock = RWLock(name, create=create, mode=mode, max_processes=max_processes,
                            group=group, stale=stale)
        self.name = name
        self.reader_lock = AsyncHold(self._lock, lib.SHL_KIND_READ, None)
        self.writer_lock = AsyncHold(self._lock, lib.SHL_KIND_WRITE, None)
        self.update_lock = AsyncHold(self._lock, lib.SHL_KIND_UPDATE, None)

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

    def resume(self, timeout: Optional[float] = None) -> Coroutine[Any, Any, bool]:
        """Open the gate; await the result for True once the lock runs, False
        on timeout.

        The first attempt is made during this call, not when the result is
        awaited: unless an update holds the pause, the gate is open when
        resume() returns, so a forgotten ``await`` cannot leave the lock
        paused (Python still warns about the unawaited coroutine).  Only
        waiting for an update to release the pause needs the await."""
        deadline_ns(timeout)           # a bad timeout raises now
        done = _try_once(self._lock, lib.SHL_KIND_RESUME)
        return self._resume_rest(done, timeout)

    async def _resume_rest(self, done: bool, timeout: Optional[float]) -> bool:
        if done:
            return True
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

    def locked(self) -> bool:
        """True if a write/update hold or any read hold exists anywhere
        (synchronous; ``await is_locked()`` is SGLang's spelling)."""
        return self._lock.is_locked()

    def info(self) -> Any:
        """A snapshot of the lock (see RWLock.info)."""
        return self._lock.info()

    def close(self) -> None:
        """Detach (see RWLock.close)."""
        self._lock.close()

    def attached(self) -> ContextManager["AsyncRWLock"]:
        """``async with AsyncRWLock(name).attached() as lock:`` (or ``with``):
        the lock for the block, closed when it ends."""
        return _Attached(self)

    def read(self, timeout: Optional[float] = None) -> AsyncHold:
        """``async with lock.read(timeout=1):`` - TimeoutError if not had in time."""
        deadline_ns(timeout)
        return AsyncHold(self._lock, lib.SHL_KIND_READ, timeout)

    def write(self, timeout: Optional[float] = None) -> AsyncHold:
        """``async with lock.write(timeout=1):`` - TimeoutError if not had in time."""
        deadline_ns(timeout)
        return AsyncHold(self._lock, lib.SHL_KIND_WRITE, timeout)

    def update(self, timeout: Optional[float] = None) -> AsyncHold:
        """``async with lock.update(timeout=1):`` - TimeoutError if not had in time."""
        deadline_ns(timeout)
        return AsyncHold(self._lock, lib.SHL_KIND_UPDATE, timeout)

    # -- SGLang RWLock (sglang.srt.utils.aio_rwlock.RWLock), method for method

    async def acquire_reader(self) -> None:
        """SGLang's name for ``await acquire_read()``."""
        await self.acquire_read()

    async def release_reader(self) -> None:
        """SGLang's name for ``release_read()`` (a coroutine there)."""
        self.release_read()

    async def acquire_writer(self) -> None:
        """SGLang's name for ``await acquire_write()``."""
        await self.acquire_write()

    async def release_writer(self) -> None:
        """SGLang's name for ``release_write()`` (a coroutine there)."""
        self.release_write()

    async def is_locked(self) -> bool:
        """SGLang's ``await lock.is_locked()``: see :meth:`locked`."""
        return self._lock.is_locked()

    # -- the lock itself is not a hold -----------------------------------

    def __enter__(self) -> NoReturn:
        """Refused with TypeError: ``with lock:`` would take no hold."""
        raise no_plain_with(self, "with")

    def __exit__(self, *exc: Any) -> None:
        """Never reached: ``__enter__`` refuses."""

    async def __aenter__(self) -> NoReturn:
        """Refused with TypeError: ``async with lock:`` would take no hold."""
        raise no_plain_with(self, "async with")

    async def __aexit__(self, *exc: Any) -> None:
        """Never reached: ``__aenter__`` refuses."""

    def __reduce__(self) -> Any:
        return (_reopen, (AsyncRWLock, self.name))

    def __repr__(self) -> str:
        if self._lock._att is None:
            return f"<pyshmlock.AsyncRWLock {self.name!r} closed>"
        return (f"<pyshmlock.AsyncRWLock {self.name!r} "
                f"{'paused' if self.paused else 'running'}, this process "
                f"{own_holds(self._lock)}>")
