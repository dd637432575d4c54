"""asyncio-native waiting on a shared lock: :class:`AsyncRWLock`.

How a coroutine waits (docs/DESIGN.md §3, "The path of a hold"): every hold
and wait is one attempt of the C fast path (``_fast.Attempt``, the attempt a
blocking call makes too), awaited on the event-loop thread.

1. ``acquire_*()`` and a hold's ``__aenter__`` are C methods; the attempt
   tries on the loop thread.  Granted: the await completes at once, with no
   Python frame of ours.  Holds are only ever taken there.
2. If the attempt must wait, it hands itself, its registrations kept (an
   owed-reader count, or a writer's claim, which already blocks new
   readers), to the parking code (``_park.py``), and the task parks on the
   future that returns.
3. One watcher thread per lock per process (``shl_watcher``, in C, never
   holding the GIL) sleeps on the futex words that the parked attempts wait
   on, and on the processes they wait for.  When anything changes it writes
   to one eventfd per event loop; the loop's reader callback wakes its
   parked tasks, each of which retries its attempt right there.
4. Cancellation or timeout withdraws the attempt (``shl_cancel``): no hold,
   no waiter count and no writer claim is left behind, and readers that a
   cancelled writer was blocking get in at once.
"""
import asyncio
from typing import TYPE_CHECKING, Any, Awaitable, NoReturn, Optional

from . import _fastpath
from ._args import DEFAULT_MODE, check_bool
from ._fastpath import deadline_ns
from ._members import _NonWaitingMembers, no_plain_with
from ._park import notify_closing
from ._shmlock import lib
from .errors import ManagedLockError, managed_error
from .holds import hold_repr, hold_would_wait, own_holds
from .lock import DEFAULT_SESSION_TTL, RWLock, session_timeout, session_ttl_ns

__all__ = ["AsyncHold", "AsyncRWLock"]


class AsyncHold(_fastpath.Hold):
    """One kind of hold (``kind`` is "read", "write" or "update") of an
    :class:`AsyncRWLock`, shaped like :class:`asyncio.Lock`.

    ``async with hold:`` takes the hold for the block (TimeoutError if
    ``timeout`` was given and passes); ``await hold.acquire(timeout=None)``,
    ``release()`` and ``locked()`` follow asyncio.Lock, so
    ``asyncio.Condition(alock.writer_lock)`` works.  A plain ``with`` is a
    TypeError: it would block the event loop.
    """

    # ``AsyncHold(lock, code, timeout)``, ``lock`` the RWLock.  __aenter__/
    # __aexit__, release(), lock, kind and timeout are the C base's
    # (csrc/fastpath/hold.c): a granted `async with` runs no Python frame.
    __slots__ = ("__weakref__",)

    if TYPE_CHECKING:
        @property
        def lock(self) -> RWLock: ...

        def acquire(self, timeout: Optional[float] = None) -> Awaitable[bool]:
            """Take the hold: True once had, False on timeout (None waits forever)."""
    # (acquire is the C base's: csrc/fastpath/hold.c.)

    @property
    def _loop(self) -> asyncio.AbstractEventLoop:
        """The running loop.  Python 3.9's asyncio.Condition(lock) compares
        ``lock._loop`` with its own loop; a hold has no loop of its own (it
        works on any), so it answers with the caller's."""
        return asyncio.get_event_loop()

    def locked(self) -> bool:
        """Whether a new hold of this kind would have to wait now."""
        return hold_would_wait(self.lock, self._kind)

    def __enter__(self) -> NoReturn:
        raise TypeError(f"{self._what} of an AsyncRWLock: use `async with`, not `with` "
                        "(a plain `with` would block the event loop); RWLock's holds "
                        "take a plain `with`")

    def __exit__(self, *exc: Any) -> None:
        """Never reached: ``__enter__`` refuses."""

    def __repr__(self) -> str:
        return hold_repr(self, "AsyncHold")


class AsyncRWLock(_fastpath.AsyncLock, _NonWaitingMembers):
    """The asyncio view of a shared lock: same segment, same semantics as
    :class:`RWLock` (a process may hold both views of one name; holds belong
    to the process either way).

    ``AsyncRWLock(name, *, create=True, mode=0o600, max_processes=None)``:
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

    if TYPE_CHECKING:
        @property
        def _lock(self) -> RWLock:
            """The RWLock this object works on (the C base's)."""

    def __init__(self, name: str, *, create: bool = True, mode: int = DEFAULT_MODE,
                 max_processes: Optional[int] = None, group: Any = None,
                 stale: str = "reset", allow_no_robust: bool = False) -> None:
        self._bind(RWLock(name, create=create, mode=mode, max_processes=max_processes,
                          group=group, stale=stale, allow_no_robust=allow_no_robust))
        self.name = name
        self.reader_lock = AsyncHold(self._lock, lib.SHL_KIND_READ, None)
        self.writer_lock = AsyncHold(self._lock, lib.SHL_KIND_WRITE, None)
        self.update_lock = AsyncHold(self._lock, lib.SHL_KIND_UPDATE, None)
        # Their bound __aenter__/__aexit__ (and the completed awaitable of a
        # granted `async with`) are made once (csrc/fastpath/hold.c).
        for hold in (self.reader_lock, self.writer_lock, self.update_lock):
            hold._keep_bound()

    # -- awaitables ----------------------------------------------------
    # acquire_read/acquire_write/acquire_update(timeout=None) are the C
    # base's (_fastpath.AsyncLock): awaitables of True, or False on timeout,
    # that try when awaited and park only if they must wait.  So are the
    # releases (plain calls).

    def resume(self, timeout: Optional[float] = None, *,
               force: bool = False) -> Awaitable[bool]:
        """Open the gate; await the result for True once the lock runs, False
        on timeout (see RWLock.resume: DataSuspectError, ManagedLockError,
        ``force``).

        The first attempt is made during this call, not when the result is
        awaited: unless an update or update session pins the pause, the
        gate is open when resume() returns.  Waiting for an update or a
        session to release the pause needs the await: an un-awaited resume()
        of a pinned lock leaves it paused (Python warns about the unawaited
        coroutine)."""
        deadline = deadline_ns(timeout)           # a bad timeout raises now
        flags = lib.SHL_RESUME_FORCE if check_bool(force, "force") else 0
        try:
            attempt = self._attempt(lib.SHL_KIND_RESUME, deadline, flags, True)
        except ManagedLockError as e:
            raise managed_error(e, self._lock) from None
        if isinstance(attempt, _fastpath.Done):
            return attempt             # the gate is open: True at once
        return self._resume_rest(attempt)

    async def _resume_rest(self, attempt: Awaitable[bool]) -> bool:
        try:
            return await attempt
        except ManagedLockError as e:
            raise managed_error(e, self._lock) from None

    async def begin_session(self, ttl: float = DEFAULT_SESSION_TTL,
                            timeout: Optional[float] = None) -> int:
        """Begin an update session; returns its token (see RWLock.begin_session)."""
        # One C attempt, as RWLock.begin_session's.
        ttl_ns = session_ttl_ns(ttl)            # checked first, then the timeout
        token = await self._begin_session_attempt(deadline_ns(timeout), ttl_ns)
        if token is False:
            raise session_timeout(self.name, timeout)
        return int(token)

    def wait_resumed(self, timeout: Optional[float] = None) -> Awaitable[bool]:
        """Wait until the lock is not paused; False on timeout."""
        return self._attempt(lib.SHL_KIND_RESUMED, deadline_ns(timeout))

    def wait_drained(self, timeout: Optional[float] = None) -> Awaitable[bool]:
        """Wait until no read hold exists in any process; False on timeout."""
        return self._attempt(lib.SHL_KIND_DRAINED, deadline_ns(timeout))

    # -- plain methods -------------------------------------------------

    # release_read(), release_write(), release_update() are the C base's.
    # pause(), end_session(), session, fence, applied_update, raise_fence(),
    # fenced_update(), info(), attached() and the refusal of `with lock:`
    # are _NonWaitingMembers' (RWLock's too), on the RWLock of the C base.

    @property
    def paused(self) -> bool:
        """Whether the gate is closed (one shared-memory load)."""
        return self._lock.paused

    def locked(self) -> bool:
        """True if a write/update hold or any read hold exists anywhere
        (synchronous; ``await is_locked()`` is SGLang's spelling)."""
        return self._lock.is_locked()

    def close(self) -> None:
        """Detach (see RWLock.close)."""
        self._lock.close()

    def notify_closing(self) -> None:
        """End every wait for this lock in this process: each task parked on
        it (on any event loop) raises LockClosingError, and so does every
        later attempt that would have to wait; attempts granted at once still
        succeed.  For shutting a server down while requests wait at a paused
        gate (uvicorn waits for them, forever by default).  Safe from a signal
        handler; irreversible for this process's attachment."""
        notify_closing(self._lock)

    def notify_closing_on_signals(self, signals: Any = None) -> None:
        """Call :meth:`notify_closing` when one of ``signals`` (default
        SIGINT, SIGTERM) arrives, then the handler that was there before
        (uvicorn's, which starts its shutdown).  Call it from the main thread
        once the server has set its handlers, e.g. in a FastAPI lifespan
        startup."""
        import signal as _signal
        for sig in signals or (_signal.SIGINT, _signal.SIGTERM):
            previous = _signal.getsignal(sig)

            def handler(signum: int, frame: Any, previous: Any = previous) -> None:
                self.notify_closing()
                if callable(previous):
                    previous(signum, frame)
                elif previous == _signal.SIG_DFL:
                    _signal.signal(signum, _signal.SIG_DFL)
                    _signal.raise_signal(signum)

            _signal.signal(sig, handler)

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

    async def __aenter__(self) -> NoReturn:
        """Refused with TypeError: ``async with lock:`` would take no hold."""
        raise no_plain_with(self, "async with")

    async def __aexit__(self, *exc: Any) -> None:
        """Never reached: ``__aenter__`` refuses."""

    def __repr__(self) -> str:
        if self._lock._att is None:
            return f"<pyshmlock.AsyncRWLock {self.name!r} closed>"
        return (f"<pyshmlock.AsyncRWLock {self.name!r} "
                f"{'paused' if self.paused else 'running'}, this process "
                f"{own_holds(self._lock)}>")
