"""Parking an asyncio task while its attempt waits (see pyshmlock.aio).

A parked task awaits a :class:`_ParkFuture`.  One helper per (process,
lock), :class:`_Helper`, owns the C watcher thread (``shl_watcher``, which
never takes the GIL) and one eventfd per event loop; the loop's reader
callback wakes that loop's parked tasks, each of which retries its attempt
right there.  The helpers are forgotten in a forked child, and a lock's
last close refuses while tasks of this process are parked on it (a close
hook), then stops the watcher.
"""
import asyncio
import contextvars
import os
import threading
import weakref
from typing import Any, Dict, List, Optional, Tuple

from ._attachment import _Attachment, _close_hooks
from ._shmlock import ffi, lib
from .errors import LockInUseError, error_for
from .lock import RWLock

__all__ = ["park"]


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


async def park(lock: RWLock, loop: asyncio.AbstractEventLoop, w: Any,
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
