"""Parking an asyncio task while its attempt waits (see pyshmlock.aio).

The attempt is C (``_fast.Attempt``: try, retry, withdraw, the deadline);
when its try must wait it calls :func:`park` here, with its registrations
kept, and its task awaits the :class:`_ParkFuture` that returns; woken, it
tries again and calls park() again or, once it ends, :func:`unpark`.  One
helper per (process, lock), :class:`_Helper`, owns the C watcher thread
(``shl_watcher``, which never takes the GIL) and one eventfd per event loop;
the loop's reader callback wakes that loop's parked tasks, each of which
retries its attempt right there.  The helpers are forgotten in a forked
child, and a lock's last close refuses while tasks of this process are
parked on it (a close hook), then stops the watcher.
"""
import asyncio
import collections
import contextvars
import os
import threading
import weakref
from typing import Any, Deque, Dict, List, Optional, Set, Tuple

from . import _fast
from ._attachment import _Attachment, _close_hooks, _taken_after
from ._fastpath import CALL_NAMES
from ._shmlock import ffi, lib
from .errors import LockClosingError, LockInUseError, error_for
from .lock import RWLock

__all__ = ["notify_closing", "park", "unpark"]


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
        """Complete it and run its callbacks (the task's wake-up) now, from
        the watcher's reader callback.  If a task is running (a loop that
        dispatches I/O inside a task, as a nested GUI loop does), a task
        cannot be stepped inside it: complete it as usual (call_soon)."""
        if self._state:
            return
        if asyncio.current_task(self._loop) is not None:
            self.set_result(None)
            return
        callbacks = self._callbacks
        i = 0
        try:
            self._state = 1
            self._callbacks = []
            while i < len(callbacks):
                fn, ctx = callbacks[i]
                i += 1
                try:
                    ctx.run(fn, self)
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException as exc:     # as a Handle would report it
                    self._loop.call_exception_handler({
                        "message": f"Exception in callback {fn!r}", "exception": exc,
                        "future": self})
        finally:
            # Interrupted (KeyboardInterrupt, SystemExit, or a signal handler
            # raising anywhere above): the callbacks not run yet still run,
            # as usual.  Nothing is lost.
            self._state = 1
            self._callbacks = []
            for fn, ctx in callbacks[i:]:
                self._loop.call_soon(fn, self, context=ctx)

    def __await__(self) -> Any:
        if not self._state:
            self._asyncio_future_blocking = True
            yield self
        if not self._state:
            raise RuntimeError("await wasn't used with future")
        return self.result()

    __iter__ = __await__


class _Parked:
    """The parking record of one attempt (kept across its parks): its loop,
    the future it waits on now, its registration with the watcher (gen, lw,
    and a copy of the waiter as registered), and its deadline's timer (one
    per attempt, not per park).

    The record refers to its attempt weakly: only the attempt's driver (its
    task) keeps it alive, so a driver that drops a parked attempt drops it,
    and the attempt withdraws its registration in the segment as it goes
    (an owed reader that nobody will ever retry must not shut other
    processes' writers out).  The watcher's count of it goes at the
    watcher's next wake-up."""
    __slots__ = ("attempt", "future", "gen", "helper", "loop", "lw", "timer", "waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop, attempt: Any) -> None:
        self.loop = loop
        self.attempt = weakref.ref(attempt)
        # What the watcher was told at the last park (what it reads at the
        # unpark too): a copy, valid whatever becomes of the attempt.
        self.waiter = ffi.new("shl_waiter *")
        self.future: Optional[_ParkFuture] = None
        self.helper: Optional[_Helper] = None
        self.gen = 0
        self.lw: Optional[_LoopWake] = None
        self.timer: Optional[asyncio.TimerHandle] = None

    def time_up(self) -> None:
        # The deadline's timer: the attempt sees the deadline passed when
        # it tries again (or, fired a hair early, parks with a new timer).
        self.timer = None
        f = self.future
        if f is not None and not f.done():
            f.set_result(None)


def _wake_futures(futures: List[_ParkFuture]) -> None:
    for f in futures:
        if not f.done():
            f.set_result(None)


def _futures(lw: "_LoopWake") -> List[_ParkFuture]:
    """The futures the attempts parked on lw wait on now."""
    return [p.future for p in list(lw.parked.values()) if p.future is not None]


class _Fd:
    """An eventfd number, -1 once closed (only under the helper's mu)."""
    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd


class _LoopWake:
    """One event loop's eventfd for one helper, and its parked attempts.

    Owned by the loop, through the reader callback registered for its fd:
    it lives while the loop watches the fd, so that parking again costs no
    system call, and goes with the loop.  The helper refers to it only
    weakly, so a parked task (which refers to its loop) never keeps a
    closed loop, or itself, alive: when both are dropped the task's
    coroutine is closed and withdraws its attempt.  When it goes, its fd is
    dropped from the watcher and closed (a finalizer on it)."""
    __slots__ = ("__weakref__", "box", "parked")

    def __init__(self, fd: int) -> None:
        self.box = _Fd(fd)
        self.parked: Dict[int, _Parked] = {}

    @property
    def fd(self) -> int:
        return self.box.fd


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
        # An RLock only for its exact _is_owned() (never entered twice):
        # see _holds_a_parking_lock.
        self.mu = threading.RLock()
        self.closed = False
        self._dead: Deque[_Fd] = collections.deque()   # fds of loops that are gone
        # Unparks that could not take mu (see unpark): done by the next
        # holder of mu.  deque.append takes no lock.
        self._unparked: Deque[_Parked] = collections.deque()
        # loop -> its _LoopWake, both weakly (see _LoopWake).
        self.loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop,
                                              weakref.ref[_LoopWake]] = \
            weakref.WeakKeyDictionary()
        self.watcher = lib.shl_watcher_new(handle)
        if self.watcher == ffi.NULL:
            raise MemoryError("pyshmlock: no memory for the asyncio watcher")
        self._gen = ffi.new("uint64_t *")
        _live_helpers.add(self)

    def forked(self) -> bool:
        """Whether this helper is the parent's, seen in a forked child.  Its
        watcher thread is not here and its C and Python mutexes may have
        been held at the fork (by a thread the child does not have): the
        child never calls into it, and retries or withdraws its tasks'
        attempts without it."""
        return os.getpid() != self.pid

    def park(self, p: _Parked) -> bool:
        """Register p (on p.loop's thread).  False: its word already changed,
        or this helper is closing; retry the attempt now."""
        if self.forked():
            return False
        with self.mu:
            if self.closed:
                return False
            self._reap_dead()
            ref = self.loops.get(p.loop)
            lw = ref() if ref is not None else None
            if lw is None:
                lw = self._add_loop(p.loop)
            rc = lib.shl_watcher_park(self.watcher, p.waiter, self._gen)
            if rc == lib.SHL_OK:
                p.gen = self._gen[0]
                p.lw = lw
                p.helper = self
                lw.parked[id(p)] = p
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
            # In an empty context: the reader lives as long as the loop and
            # must not keep the context (and request objects) of the task
            # that happened to park first.
            contextvars.Context().run(loop.add_reader, fd, self._on_wake, lw)
        except BaseException:
            lib.shl_watcher_drop_loop(self.watcher, fd)
            os.close(fd)
            raise
        self.loops[loop] = weakref.ref(lw)
        # When lw goes (its loop closed or gone), its fd is closed at the
        # helper's next park or close: a finalizer runs inside the garbage
        # collector, in whatever thread and under whatever lock that thread
        # holds, so it only queues the fd (deque.append takes no lock).
        weakref.finalize(lw, self._dead.append, lw.box)
        return lw

    def _reap_dead(self) -> None:
        # Caller holds mu: finish the unparks made without it, and close the
        # fds of loops that are gone.
        while self._unparked:
            p = self._unparked.popleft()
            if not self.closed:
                lib.shl_watcher_unpark(self.watcher, p.waiter, p.gen)
        while self._dead:
            box = self._dead.popleft()
            if box.fd >= 0 and os.getpid() == self.pid:
                if not self.closed:
                    lib.shl_watcher_drop_loop(self.watcher, box.fd)
                os.close(box.fd)
                box.fd = -1

    def unpark(self, p: _Parked) -> None:
        """Forget p (on p.loop's thread): cancelled, timed out, or woken
        (then _on_wake already forgot it, and this costs nothing)."""
        lw = p.lw
        # lw.parked changes only on the loop's thread (close() only reads it).
        if lw is None or lw.parked.pop(id(p), None) is None:
            return
        if self.forked():
            return       # the parent's watcher: not ours to touch (see forked)
        # The garbage collector reaches here: a task left parked on a closed
        # loop is a reference cycle, and its coroutine's `finally` runs
        # when the cycle is collected, which may happen at any allocation,
        # including one inside park() while this very thread holds mu.  So
        # this never waits for mu: without it, the unpark is queued for the
        # next holder (a registration left a little longer only costs the
        # watcher a spurious wake-up).  No code a finaliser can reach takes
        # a lock that allocating code holds.
        if self.mu._is_owned() or not self.mu.acquire(blocking=False):  # type: ignore[attr-defined]
            self._unparked.append(p)
            return
        try:
            self._reap_dead()
            if not self.closed:
                lib.shl_watcher_unpark(self.watcher, p.waiter, p.gen)
        finally:
            self.mu.release()

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
        woken = list(parked.values())
        lw.parked = {}
        i = 0
        try:
            self._forget_woken(woken)
            # Each task retries now, in this callback (nothing if it was
            # cancelled meanwhile).
            while i < len(woken):
                i += 1
                f = woken[i - 1].future
                if f is not None:
                    f.wake()
        finally:
            # Interrupted anywhere above (KeyboardInterrupt, SystemExit): the
            # tasks not woken yet still wake, through call_soon.
            for p in woken[i:]:
                f = p.future
                if f is not None and not f.done():
                    f.set_result(None)

    def _forget_woken(self, woken: List[_Parked]) -> None:
        # The registrations of this generation that the watcher still counts
        # (those of older ones were forgotten when it woke everybody).
        if self.forked():
            return       # the parent's watcher: the tasks just retry
        with self.mu:
            if not self.closed:
                gen = lib.shl_watcher_gen(self.watcher)
                for p in woken:
                    if p.gen == gen:
                        lib.shl_watcher_unpark(self.watcher, p.waiter, p.gen)

    def _close_fd(self, box: _Fd) -> None:
        # The loop is gone (or forgets us): the watcher writes to fd no more.
        if os.getpid() != self.pid:
            return      # a forked child: the parent's locks may be held forever
        with self.mu:
            if box.fd < 0:
                return
            if not self.closed:
                lib.shl_watcher_drop_loop(self.watcher, box.fd)
            os.close(box.fd)
            box.fd = -1

    def _forget(self, loop: asyncio.AbstractEventLoop, lw: _LoopWake) -> None:
        try:
            if lw.fd >= 0:
                loop.remove_reader(lw.fd)
        finally:
            self._close_fd(lw.box)

    def live_loops(self) -> List[Tuple[asyncio.AbstractEventLoop, _LoopWake]]:
        """(loop, its _LoopWake) for every loop still watched.  Caller holds mu."""
        found = [(loop, ref()) for loop, ref in list(self.loops.items())]
        return [(loop, lw) for loop, lw in found if lw is not None]

    def close(self) -> None:
        """Stop watching: mark closed, wake every parked task (each retries
        and sees the lock closed, or parks again on a fresh helper), then
        stop and join the thread.  Safe from any thread; idempotent."""
        with self.mu:
            if self.closed:
                return
            self._reap_dead()
            self.closed = True
            loops = self.live_loops()
            self.loops.clear()
        for loop, lw in loops:
            try:
                loop.call_soon_threadsafe(_wake_futures, _futures(lw))
            except RuntimeError:
                pass    # that loop is closed; its tasks are gone
        lib.shl_watcher_free(self.watcher)     # joins the thread: no more writes
        self.watcher = ffi.NULL
        for loop, lw in loops:
            try:
                loop.call_soon_threadsafe(self._forget, loop, lw)
            except RuntimeError:
                self._close_fd(lw.box)  # a closed loop watches nothing any more


_helpers: Dict[Tuple[int, int], _Helper] = {}
# An RLock only for its exact _is_owned(), never entered twice: the last
# close's hook takes it under the registry lock, so a finaliser that opens
# or closes a lock while this thread holds it is refused there.
_helpers_lock = threading.RLock()
# Every helper alive, also one a last close took out of _helpers and is
# closing (a WeakSet: a helper's collection only discards it, no lock).
_live_helpers: "weakref.WeakSet[_Helper]" = weakref.WeakSet()


def _holds_a_parking_lock() -> bool:
    """Whether this thread holds the helpers' lock or a helper's mu."""
    if _helpers_lock._is_owned():   # type: ignore[attr-defined]
        return True
    return any(h.mu._is_owned()   # type: ignore[attr-defined]
               for h in list(_live_helpers))


_taken_after.append(_holds_a_parking_lock)


def _reset_in_child() -> None:
    # After fork() no helper thread runs in the child, its parked futures
    # belong to the parent's loops, and a lock may have been held: start over.
    # The parent's watchers are left alone (their mutexes may have been held
    # at the fork); the child makes its own.
    global _helpers_lock
    _helpers_lock = threading.RLock()
    _helpers.clear()
    _live_helpers.clear()   # the parent's: the child never calls into them
    _closing.clear()        # the child's own attachments are not closing


os.register_at_fork(after_in_child=_reset_in_child)


def _before_close(att: _Attachment) -> None:
    """The last close of an attachment: refuse while tasks of this process
    are parked on it (LockInUseError); otherwise forget its helper and stop
    the watcher thread before the core closes the handle (the thread counts
    as a call in flight, so the core would refuse while it runs).

    Tasks parked on a loop that is closed can never run again: their
    attempts are withdrawn here (shl_cancel), as their own cancellation
    would have done, instead of refusing the close forever."""
    with _helpers_lock:
        helper = _helpers.get(att.key)
        if helper is None:
            _closing.discard(att.key)     # a later attachment starts afresh
            return
        with helper.mu:
            waiting = 0
            for loop, lw in helper.live_loops():
                # (A record whose attempt its driver dropped waits for
                # nothing: the attempt withdrew as it went.)
                live = [a for a in (p.attempt() for p in list(lw.parked.values()))
                        if a is not None]
                if loop.is_closed():
                    lw.parked = {}
                    for attempt in live:
                        attempt._cancel()
                else:
                    waiting += len(live)
        if waiting:
            raise LockInUseError(
                f"lock {att.name!r}: close() while {waiting} asyncio task(s) of this "
                "process are waiting for it; cancel them or let them finish first")
        del _helpers[att.key]
    helper.close()
    _closing.discard(att.key)


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


def _closing_error(lock: RWLock, kind: int) -> BaseException:
    return LockClosingError(f"lock {lock.name!r}: {CALL_NAMES.get(kind, 'wait')} ended: "
                            "notify_closing() was called (the process is shutting down)")


# Attachments (by segment key) whose waits notify_closing ended.  A set's
# add takes no lock a signal handler could find held.
_closing: Set[Tuple[int, int]] = set()


def notify_closing(lock: RWLock) -> None:
    """Mark the attachment closing and wake every task parked on it; the
    woken tasks see the mark and raise.  Takes no lock here: from a signal
    handler (which may run inside park(), under a helper's mu) the wake-up
    is handed to the running loop, or done at once if there is none."""
    att = lock._att
    if att is None:
        return
    _closing.add(att.key)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        _wake_for_closing(att.key)
        return
    loop.call_soon_threadsafe(_wake_for_closing, att.key)


def _wake_for_closing(key: Tuple[int, int]) -> None:
    helper = _helpers.get(key)
    if helper is None:
        return
    # Called at once from a signal handler when its thread runs no loop: that
    # thread may be inside `with helper.mu` itself (the close hook, a
    # helper's close), so never wait for mu here.  Held: another thread does
    # the wake-up, waiting for mu as long as it takes.
    if helper.mu._is_owned() or not helper.mu.acquire(blocking=False):  # type: ignore[attr-defined]
        threading.Thread(target=_wake_for_closing_waiting, args=(helper,),
                         name="pyshmlock-notify-closing", daemon=True).start()
        return
    try:
        parked = _parked_futures(helper)
    finally:
        helper.mu.release()
    _hand_wake_ups(parked)


def _wake_for_closing_waiting(helper: "_Helper") -> None:
    with helper.mu:
        parked = _parked_futures(helper)
    _hand_wake_ups(parked)


def _parked_futures(helper: "_Helper") -> List[Tuple[asyncio.AbstractEventLoop,
                                                     List[_ParkFuture]]]:
    # Caller holds helper.mu.
    return [(loop, _futures(lw)) for loop, lw in helper.live_loops()]


def _hand_wake_ups(parked: List[Tuple[asyncio.AbstractEventLoop, List[_ParkFuture]]]) -> None:
    for loop, futures in parked:
        if futures:
            try:
                loop.call_soon_threadsafe(_wake_futures, futures)
            except RuntimeError:
                pass    # a closed loop: its tasks are gone


def park(attempt: Any) -> Optional[_ParkFuture]:
    """Called by the attempt (C, on its loop's thread) when its try must
    wait: register it with the watcher and return the future its task is to
    wait on, or None if its word changed already (try again now).  Raises
    LockClosingError once notify_closing() was called (the attempt is then
    withdrawn).  The attempt's earlier registration, if any, goes first."""
    lock = attempt.lock
    att = lock._att
    if att is not None and att.key in _closing:
        raise _closing_error(lock, attempt.kind)
    p = attempt._parked
    if p is None:
        p = attempt._parked = _Parked(asyncio.get_running_loop(), attempt)
    elif p.helper is not None:
        p.helper.unpark(p)      # woken by its timer or set_result: still registered
    helper = _helper_for(lock)
    fut = p.future = _ParkFuture(p.loop)
    ffi.memmove(p.waiter, ffi.cast("shl_waiter *", attempt._waiter), ffi.sizeof("shl_waiter"))
    if not helper.park(p):
        return None             # its word changed already: try again now
    if p.timer is None:
        remaining = attempt.remaining
        if remaining is not None:
            p.timer = p.loop.call_later(remaining, p.time_up)
    fut._asyncio_future_blocking = True     # what `yield fut` in __await__ would set
    return fut


def unpark(attempt: Any) -> None:
    """Called by the attempt when it ends (had, timed out, failed, cancelled,
    closed or collected): forget its record.  Takes no lock it would wait
    for: the garbage collector runs it at any allocation (see
    _Helper.unpark)."""
    p = attempt._parked
    if p is None:
        return
    if p.helper is not None:
        p.helper.unpark(p)
    if p.timer is not None:
        p.timer.cancel()
        p.timer = None
    p.future = None


_fast.set_park(park, unpark)
