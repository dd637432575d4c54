"""What both lock classes have that never waits, written once:
:class:`_NonWaitingMembers` (the pause, the update session's end and the
session itself, the fences, ``info``, ``attached``, the refusal of ``with
lock:`` and pickling), the base of :class:`~pyshmlock.RWLock` and of
:class:`~pyshmlock.AsyncRWLock`; with what those members hand out:
:class:`FencedUpdate` and the ``attached()`` context.  Each member works on
``self._lock``, the RWLock (the object itself, or an AsyncRWLock's C
base's); what waits is each class's own (``lock.py``, ``aio.py``).
"""
from typing import TYPE_CHECKING, Any, ContextManager, NoReturn, Optional, Tuple, TypeVar

from ._args import check_bool
from ._shmlock import ffi, lib
from .errors import FencingError, error_for
from .info import LockInfo, SessionInfo, attached_info, session_of

if TYPE_CHECKING:
    from .lock import RWLock

_OK = lib.SHL_OK


def _token(token: Any) -> int:
    if isinstance(token, bool) or not isinstance(token, int):
        raise TypeError(f"a token is an int, not {type(token).__name__}")
    if not 0 <= token < 1 << 64:
        raise ValueError(f"a token is 0 .. 2**64-1, not {token!r}")
    return token


class FencedUpdate:
    """What ``RWLock.fenced_update(token)`` returns: a ``with`` (or
    ``async with``) block under an update hold that a stale token cannot
    take."""

    __slots__ = ("_hold", "_lock", "token")

    def __init__(self, lock: Any, token: int, hold: Any) -> None:
        self._lock, self.token, self._hold = lock, token, hold

    def _check(self) -> None:
        fence = self._lock.fence
        if self.token < fence:
            raise FencingError(
                f"lock {self._lock.name!r}: update token {self.token} is stale: this host "
                f"has seen token {fence} (a newer update); nothing was applied")
        self._lock.raise_fence(self.token)

    def _done(self, failed: bool) -> None:
        try:
            if not failed:
                rc = lib.shl_fence_applied(self._lock._h, self.token)
                if rc != _OK:
                    raise error_for(rc, "fenced_update", self._lock.name)
        finally:
            self._hold.release()

    def _check_held(self) -> "FencedUpdate":
        """The fence check once the update is held; refused: give it back."""
        try:
            self._check()
        except BaseException:
            self._hold.release()
            raise
        return self

    def __enter__(self) -> "FencedUpdate":
        self._hold.__enter__()
        return self._check_held()

    def __exit__(self, *exc: Any) -> None:
        self._done(exc[0] is not None)

    async def __aenter__(self) -> "FencedUpdate":
        await self._hold.__aenter__()
        return self._check_held()

    async def __aexit__(self, *exc: Any) -> None:
        self._done(exc[0] is not None)
class _Attached:
    """What ``attached()`` returns: the lock for a ``with`` (or ``async
    with``) block, closed when the block ends."""

    __slots__ = ("_lock",)

    def __init__(self, lock: Any) -> None:
        self._lock = lock

    def __enter__(self) -> Any:
        return self._lock

    def __exit__(self, *exc: Any) -> None:
        self._lock.close()

    async def __aenter__(self) -> Any:
        return self._lock

    async def __aexit__(self, *exc: Any) -> None:
        self._lock.close()


def no_plain_with(lock: Any, word: str) -> TypeError:
    """The error of ``with lock:`` on a lock object: it would take no hold."""
    kind = type(lock).__name__
    return TypeError(
        f"`{word} {kind}` would take no hold: use `{word} lock.reader_lock:` or "
        f"`{word} lock.writer_lock:` (or update_lock, read(timeout), "
        f"write(timeout), update(timeout)); to close the lock when a block ends "
        f"use `{word} {kind}(name).attached() as lock:`")


def _reopen(cls: type, name: str) -> Any:
    """Unpickle a lock: open it again by name, never creating it."""
    return cls(name, create=False)


_L = TypeVar("_L", bound="_NonWaitingMembers")


class _NonWaitingMembers:
    """The members that never wait, written once for :class:`RWLock` and
    :class:`~pyshmlock.AsyncRWLock`: each works on ``self._lock``, the RWLock
    (the object itself for an RWLock; the C base's for an AsyncRWLock).
    What waits differs between the two (a blocking call, an awaitable) and
    is each class's own, as are ``close`` and ``paused``."""

    name: str

    if TYPE_CHECKING:
        @property
        def _lock(self) -> "RWLock": ...

        def update(self, timeout: Optional[float] = None) -> Any: ...

    # -- the pause gate ------------------------------------------------

    def pause(self) -> bool:
        """Close the gate: from now on no process gets a new read hold.

        Never blocks; existing read holds stay.  Returns True if this call
        paused the lock, False if it was already paused.
        """
        rc = lib.shl_pause(self._lock._h)
        if rc < 0:
            raise error_for(rc, "pause", self.name)
        return rc == 1

    # -- update sessions ---------------------------------------------

    def end_session(self, token: int, *, lost: bool = False) -> None:
        """End the update session ``token`` (any process may).  The gate stays
        paused: resume() opens it.  SessionError if ``token`` is not the
        current session (it ended, or expired: see info().recoveries).

        ``lost=True`` ends it as lost, as its expiry would (for an operator
        whose session's process died, `pyshmlock session end NAME`): the
        data is marked suspect, so resume() refuses until a completed update
        or a forced resume."""
        check_bool(lost, "lost")
        call = lib.shl_session_abort if lost else lib.shl_session_end
        rc = call(self._lock._h, _token(token))
        if rc != _OK:
            raise error_for(rc, "end_session", self.name)

    @property
    def session(self) -> Optional[SessionInfo]:
        """The update session that pins the pause now, or None."""
        snap = ffi.new("shl_snapshot *")
        rc = lib.shl_info(self._lock._h, snap)
        if rc != _OK:
            raise error_for(rc, "session", self.name)
        return session_of(snap)

    # -- fencing (cluster) ---------------------------------------------

    @property
    def fence(self) -> int:
        """The highest fleet update token this lock has seen (0: none).  A
        fenced update with an older token is refused (FencingError)."""
        return self._fences()[0]

    @property
    def applied_update(self) -> int:
        """The token of the last update completed through fenced_update."""
        return self._fences()[1]

    def _fences(self) -> Tuple[int, int]:
        f, a = ffi.new("uint64_t *"), ffi.new("uint64_t *")
        rc = lib.shl_fence_get(self._lock._h, f, a)
        if rc != _OK:
            raise error_for(rc, "fence", self.name)
        return int(f[0]), int(a[0])

    def raise_fence(self, token: int) -> int:
        """Raise the fence to ``token`` (it never falls); returns the fence.
        From then on a fenced update with an older token is refused."""
        now = ffi.new("uint64_t *")
        rc = lib.shl_fence_raise(self._lock._h, _token(token), now)
        if rc != _OK:
            raise error_for(rc, "raise_fence", self.name)
        return int(now[0])

    def fenced_update(self, token: int, timeout: Optional[float] = None) -> "FencedUpdate":
        """``with lock.fenced_update(token):`` an update hold that refuses a
        stale token.  It takes the update hold, then raises FencingError if
        ``token`` is older than :attr:`fence` (a newer fleet update began:
        the caller must not write); otherwise it raises the fence to
        ``token``, and records ``applied_update = token`` when the block
        completes without an exception.  Apply each chunk of an update
        under its own fenced_update, so that none lands after a newer
        update is known here."""
        _token(token)
        return FencedUpdate(self._lock, token, self.update(timeout))

    # -- observability -------------------------------------------------

    def info(self) -> LockInfo:
        """A snapshot of the lock as seen by every process.

        Looking also reclaims holds of processes found dead.
        """
        return attached_info(self._lock._handle(), self.name)

    # -- lifetime ------------------------------------------------------

    def attached(self: _L) -> ContextManager[_L]:
        """``with RWLock(name).attached() as lock:`` (``async with`` for an
        AsyncRWLock): the lock for the block, closed when it ends (like
        contextlib.closing)."""
        return _Attached(self)

    def __enter__(self) -> NoReturn:
        """Refused with TypeError: ``with lock:`` would take no hold."""
        raise no_plain_with(self, "with")

    def __exit__(self, *exc: Any) -> None:
        """Never reached: ``__enter__`` refuses."""

    def __reduce__(self) -> Any:
        return (_reopen, (type(self), self.name))
