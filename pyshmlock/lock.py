"""The blocking API: :class:`RWLock` and :func:`unlink`.

A thin layer over the C core (``csrc/core/``): RWLock's hold calls and
waits are the C fast path's (``pyshmlock._fast``, a base type, whose one
attempt does every wait: csrc/fastpath/attempt.c), every other method is one
call into C.  This module keeps the Python-side policy of those calls:
argument checking and error mapping.  The other concerns live next door:
opening and the per-process registry in ``_attachment``, hold objects in
``holds``, snapshots in ``info``, stale segments in ``stale``, what
both lock classes share that never waits in ``_members``.  Their public
names are re-exported here, as before.
"""
import warnings
from typing import Any, Optional, Union

# C fast path: RWLock subclasses _fastpath.Lock, whose methods
# are the hold calls; importing _fastpath sets the base types up.
from . import _fastpath
from ._args import DEFAULT_MODE, check_bool, check_group, check_max_processes, check_mode
from ._args import check_name as check_name
from ._attachment import (
    SHM_DIR,
    SHM_PREFIX,
    _attach,
    _attach_operator,
    _Attachment,
    release_after_close,
)
from ._attachment import _detach as _detach
from ._attachment import drop as _drop_attachment
from ._fastpath import deadline_ns as deadline_ns
from ._hostconf import fail_closed_for
from ._members import _NonWaitingMembers
from ._shmlock import ffi, lib
from .errors import (
    LockInUseError,
    ManagedLockError,
    advised,
    error_for,
    managed_error,
    untrusted_error,
)
from .holds import SyncHold, own_holds
from .info import (
    AttachedProcess,
    LockInfo,
    Recovery,
    SessionInfo,
    inspect,
)
from .stale import STALE_POLICIES, _apply_stale_policy, check_stale

__all__ = [
    "DEFAULT_SESSION_TTL",
    "MAX_SESSION_TTL",
    "SHM_DIR",
    "SHM_PREFIX",
    "STALE_POLICIES",
    "AttachedProcess",
    "LockInfo",
    "RWLock",
    "Recovery",
    "SessionInfo",
    "SyncHold",
    "inspect",
    "segment_size",
    "unlink",
]

_OK = lib.SHL_OK

#: The default lifetime of an update session (RWLock.begin_session): long
#: enough for a large model's weights to load, short enough that a session
#: whose end never comes does not pin a server for the day.
DEFAULT_SESSION_TTL = 600.0

#: The process slots a lock gets when its creator does not give
#: ``max_processes``.
DEFAULT_MAX_PROCESSES = 256

#: The longest lifetime of an update session, in seconds: 400 days (the C
#: core's SHL_SESSION_TTL_MAX_S).  A session is a bounded pin: a longer ttl,
#: or inf, is a ValueError.
MAX_SESSION_TTL = float(lib.SHL_SESSION_TTL_MAX_S)


def session_ttl_ns(ttl: Any) -> int:
    """A session ttl in seconds -> nanoseconds (TypeError/ValueError)."""
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)):
        raise TypeError(f"ttl must be a number of seconds, not {type(ttl).__name__}")
    if not ttl > 0 or ttl != ttl:
        raise ValueError(f"ttl must be > 0 seconds, not {ttl!r}")
    if ttl > MAX_SESSION_TTL:
        raise ValueError(f"ttl must be at most {MAX_SESSION_TTL:.0f} s (400 days), not "
                         f"{ttl!r}: a session is a bounded pin (an update that takes longer "
                         "ends its session and begins another)")
    return max(1, int(ttl * 1e9))


def session_timeout(name: str, timeout: Any) -> TimeoutError:
    return TimeoutError(f"lock {name!r}: update session not begun within {timeout} s")


class RWLock(_fastpath.Lock, _NonWaitingMembers):
    """A reader/writer lock with a pause gate, shared by every process that
    opens the same name.

    ``RWLock(name, *, create=True, mode=0o600, max_processes=None, group=None,
    stale="reset")``

    ``name`` is 1-200 characters of ``[A-Za-z0-9._-]``; the lock lives in the
    POSIX shared-memory object ``/pyshmlock.<name>``.  With ``create=True``
    (the default) the first opener creates it with permissions ``mode``
    (default ``0o600``: owner read/write) and room for ``max_processes``
    attached processes (None: 256); later openers get the creator's values.
    An opener that gives ``max_processes`` and finds a lock of another size
    that no process has open and that holds no pause, hold, update session,
    host lease, fence or data-suspect mark re-creates it at that size (a
    restart with more workers); one that stays and has fewer slots than
    asked raises TooManyProcessesError at once, naming both values.
    ``create=False`` raises FileNotFoundError if it does not exist.

    Holds, as :class:`SyncHold` objects shaped like threading.Lock:

    - ``with lock.reader_lock:`` a shared (read) hold for the block;
    - ``with lock.writer_lock:`` the exclusive (write) hold;
    - ``with lock.update_lock:`` the pause-aware exclusive (update) hold;
    - ``with lock.read(timeout)`` / ``write(timeout)`` / ``update(timeout)``:
      the same, raising TimeoutError if not had in time.

    Each also works with ``async with`` and has ``acquire(blocking=True,
    timeout=-1)`` / ``release()`` / ``locked()``.  ``with lock:`` itself is a
    TypeError (it would take no hold); ``with RWLock(name).attached() as
    lock:`` closes the lock when the block ends.  A lock pickles as its
    name: unpickling opens it again with ``type(lock)(name, create=False)``,
    so a subclass comes back as itself (one whose ``__init__`` takes other
    arguments defines its own ``__reduce__``).

    Whoever can write the segment must be trusted (docs/DESIGN.md, "Trust
    model"), so an existing segment is used only if this user owns it, or,
    with ``group`` (a group name or gid), if that is its group; and only if
    it grants no group/other write beyond ``mode``.  Otherwise
    PermissionError names its owner and mode.  A new segment gets exactly
    ``mode`` and, with ``group``, that group.

    ``stale`` says what this process does when it is the first to attach to a
    *stale* segment: one that is paused while no other process is attached
    and the process that paused it no longer runs (every process that used
    it died, e.g. a server restarted on the same name).  ``"reset"`` (the
    default, what a restarted server needs) clears that pause, recorded in
    ``info().recoveries`` as a lost "pause"; ``"keep"`` leaves it (an agent
    that means its pause to outlive itself, and the ``pyshmlock`` CLI).  A
    pause that a live process stands behind is never cleared.

    Holds belong to the process: any thread of the process that took a hold
    may release it, and a forked child holds nothing.  Every ``acquire_*``
    takes ``timeout`` in seconds (an int or a float): None (or inf, or any
    timeout of 146 years or more) waits forever, 0 tries once; it returns
    False on timeout.  Waiting releases the GIL and stays interruptible by
    Ctrl-C.
    """

    #: ``with lock.reader_lock:`` holds a read for the block (waits forever).
    reader_lock: SyncHold
    #: ``with lock.writer_lock:`` holds the write lock for the block.
    writer_lock: SyncHold
    #: ``with lock.update_lock:`` holds an update for the block.
    update_lock: SyncHold

    def __init__(self, name: str, *, create: bool = True, mode: int = DEFAULT_MODE,
                 max_processes: Optional[int] = None,
                 group: Union[int, str, None] = None,
                 stale: str = "reset", allow_no_robust: bool = False) -> None:
        check_name(name)
        # A cluster host's lock (its host setting says so) is created paused.
        fail_closed = bool(create) and fail_closed_for(name)
        gid = check_group(group)
        check_stale(stale)
        check_mode(mode)
        sized = max_processes is not None
        slots = DEFAULT_MAX_PROCESSES if max_processes is None else max_processes
        check_max_processes(slots, lib.SHL_MAX_PROCESSES_LIMIT)
        check_bool(create, "create")
        check_bool(allow_no_robust, "allow_no_robust")
        self.name = name
        self._att: Optional[_Attachment] = _attach(name, bool(create), mode, slots,
                                                   gid, fail_closed, allow_no_robust, sized)
        self._h = self._att.handle
        self._fast_bind(_fastpath.address(self._h))   # the C methods' handle
        if self._att.refs == 1:      # this process's first attachment to the segment
            try:
                _apply_stale_policy(self._h, name, stale)
            except BaseException:
                _detach(self._att, self)
                raise
        self.reader_lock = SyncHold(self, lib.SHL_KIND_READ, None)
        self.writer_lock = SyncHold(self, lib.SHL_KIND_WRITE, None)
        self.update_lock = SyncHold(self, lib.SHL_KIND_UPDATE, None)
        # Their bound __enter__/__exit__ are made once, not at every `with`
        # (see "Bound methods kept" in csrc/fastpath/hold.c).
        for hold in (self.reader_lock, self.writer_lock, self.update_lock):
            hold._keep_bound()

    @classmethod
    def _operator(cls, name: str, *, mode: int = DEFAULT_MODE,
                  group: Union[int, str, None] = None) -> "RWLock":
        """An operator's view of the existing lock ``name`` (the ``pyshmlock``
        command's pause and resume): it takes no process slot, so it works on
        a lock whose ``max_processes`` slots are all taken, never appears
        among the attached processes, and never resets a stale pause.  pause,
        resume, wait_resumed, info work; holds are refused (ValueError).
        ``mode`` and ``group`` are the trust opt-ins, as RWLock's."""
        check_name(name)
        gid = check_group(group)
        check_mode(mode)
        self = cls.__new__(cls)
        self.name = name
        self._att = _attach_operator(name, mode, gid)
        self._h = self._att.handle
        self._fast_bind(_fastpath.address(self._h))
        self.reader_lock = SyncHold(self, lib.SHL_KIND_READ, None)
        self.writer_lock = SyncHold(self, lib.SHL_KIND_WRITE, None)
        self.update_lock = SyncHold(self, lib.SHL_KIND_UPDATE, None)
        return self

    @property
    def _lock(self) -> "RWLock":
        """The RWLock the shared members (_NonWaitingMembers) work on: this one."""
        return self

    def _handle(self) -> Any:
        """The C handle, or ValueError if this object is closed.

        One closed mechanism: close() sets the handle to NULL and the C core
        answers every call on it with SHL_ECLOSED (also a call already
        waiting in C when another thread closes), which error_for turns into
        ValueError "lock ... is closed".  Only methods that do not reach C
        (read/write/update, info, a hold's locked()) check here first."""
        h = self._h
        if h == ffi.NULL:
            raise ValueError(f"lock {self.name!r} is closed")
        return h

    # -- holds ---------------------------------------------------------
    # acquire_read/release_read, acquire_write/release_write and
    # acquire_update/release_update(timeout=None) are the C base's
    # (_fastpath.Lock); they return True, or False on timeout.

    # -- the pause gate ------------------------------------------------
    # pause(), the session members, the fences, info(), attached() and the
    # refusal of `with lock:` are _NonWaitingMembers' (shared with
    # AsyncRWLock).

    def resume(self, timeout: Optional[float] = None, *, force: bool = False) -> bool:
        """Open the gate.  Waits while an update hold or an update session
        pins the pause (however it was taken); True once the lock runs,
        False on timeout.

        A paused lock whose data is suspect (a process died holding the
        write or update hold, or an update session expired) stays shut:
        DataSuspectError, until a completed write/update clears the mark.
        A lock whose host lease is armed belongs to its cluster agent:
        ManagedLockError.  ``force=True`` opens it anyway (and clears the
        data-suspect mark: the caller vouches for the data)."""
        return self._resume(timeout, lib.SHL_RESUME_FORCE if check_bool(force, "force") else 0)

    def _resume_as_manager(self, timeout: Optional[float] = None) -> bool:
        """resume() for the host's cluster agent: an armed lease does not
        refuse it (a suspect mark still does)."""
        return self._resume(timeout, lib.SHL_RESUME_MANAGER)

    def _resume(self, timeout: Optional[float], flags: int) -> bool:
        try:
            return self._attempt_block(lib.SHL_KIND_RESUME, deadline_ns(timeout), flags)
        except ManagedLockError as e:
            raise managed_error(e, self) from None

    def begin_session(self, ttl: float = DEFAULT_SESSION_TTL,
                      timeout: Optional[float] = None) -> int:
        """Begin an update session and return its token: an update pin owned
        by the token, not by this process, for an update made of several
        calls (possibly in several processes).

        Waits until no other session pins the pause, takes an update hold
        (which drains every reader unless the lock is paused), pauses the
        gate and pins the pause.  Until :meth:`end_session` (from any
        process) or the session's expiry after ``ttl`` seconds (default
        DEFAULT_SESSION_TTL, 600 s; at most MAX_SESSION_TTL, 400 days), resume()
        waits, and update holds are
        granted at once (the gate is paused).  An expired session leaves the
        gate paused and the data marked suspect (resume() then refuses with
        DataSuspectError).  The process that began it may exit or die: that
        ends nothing.  TimeoutError if not begun within ``timeout``."""
        # One C attempt (the wait, the update and, at once, the pin and the
        # release): no Python code, a signal handler that raises, runs while
        # the update is held.
        ttl_ns = session_ttl_ns(ttl)            # checked first, then the timeout
        token = self._begin_session_block(deadline_ns(timeout), ttl_ns)
        if token is False:
            raise session_timeout(self.name, timeout)
        return int(token)

    # paused (a property) is the C base's: one shared-memory load.
    # wait_resumed(timeout=None) and wait_drained(timeout=None) are the C
    # base's too: blocking attempts, interruptible by Ctrl-C like the holds.

    def is_locked(self) -> bool:
        """True if a write/update hold or any read hold exists anywhere."""
        rc = lib.shl_is_locked(self._h)
        if rc < 0:
            raise error_for(rc, "is_locked", self.name)
        return bool(rc)

    # -- context managers with timeouts --------------------------------

    def read(self, timeout: Optional[float] = None) -> SyncHold:
        """``with lock.read(timeout=1):`` - a read hold, TimeoutError if not had in time."""
        self._handle()
        deadline_ns(timeout)   # validate now, not at __enter__
        return SyncHold(self, lib.SHL_KIND_READ, timeout)

    def write(self, timeout: Optional[float] = None) -> SyncHold:
        """``with lock.write(timeout=1):`` - the write hold, TimeoutError if not had in time."""
        self._handle()
        deadline_ns(timeout)
        return SyncHold(self, lib.SHL_KIND_WRITE, timeout)

    def update(self, timeout: Optional[float] = None) -> SyncHold:
        """``with lock.update(timeout=1):`` - an update hold, TimeoutError if not had in time."""
        self._handle()
        deadline_ns(timeout)
        return SyncHold(self, lib.SHL_KIND_UPDATE, timeout)

    # -- observability -------------------------------------------------

    @staticmethod
    def observe(name: str) -> LockInfo:
        """A snapshot of the lock ``name`` without opening it: the same as
        :func:`pyshmlock.inspect` (read-only, takes no slot)."""
        return inspect(name)

    # -- lifetime ------------------------------------------------------

    def close(self) -> None:
        """Detach this object.  The process detaches from the segment when its
        last RWLock of that segment closes; that raises LockInUseError if the
        process still holds the lock, or if another thread is inside a call
        on it or an asyncio task waits for it (the object stays open then).
        Idempotent.  An object dropped without close() warns
        (ResourceWarning) and gives its reference back (see __del__)."""
        att = self._att
        if att is None:
            return
        # A `with` block of this object that another thread is inside gives
        # its hold back through the attachment (_release_closed).  Set before
        # the object forgets its handle: the GIL may pass to that thread
        # between any two of the statements below.
        self._closed_att = att
        # The fast methods skip the core's in-flight count (shl_fast_handle):
        # a close that is decided makes this object forget the handle before
        # any other thread runs (_fast.close); a refused one changes nothing.
        _detach(att, self)
        self._fast_bind(0)
        self._att = None
        self._h = ffi.NULL            # the C core refuses a NULL handle

    def _release_closed(self, kind: int) -> bool:
        """A hold's release (its ``__exit__``, ``__aexit__`` or
        ``release()``, in C) found this object closed: another thread closed
        it inside the block.  The hold is the process's: give it back
        through the attachment the process keeps for its other objects of
        the segment.  False if none keeps it (the caller raises "closed")."""
        att = getattr(self, "_closed_att", None)
        return att is not None and release_after_close(att, kind)

    def __del__(self) -> None:
        """Dropped without close(): warn as an unclosed file does
        (ResourceWarning), and give this object's reference to the process's
        attachment back.  No lock is taken here (a collection may run in a
        thread that holds one): the reference is queued, and the next open
        or close of a lock in this process settles it (closing the
        attachment if no object uses it and the process holds nothing)."""
        att = getattr(self, "_att", None)     # None: closed, or never opened
        if att is None:
            return
        self._att = None
        try:
            warnings.warn(f"unclosed lock {self.name!r}: call close() (or use "
                          "`with RWLock(name).attached() as lock:`)", ResourceWarning,
                          stacklevel=2, source=self)
        except Exception:             # interpreter shutdown: nothing left to warn with
            pass
        _drop_attachment(att)

    def __repr__(self) -> str:
        if self._att is None:
            return f"<pyshmlock.RWLock {self.name!r} closed>"
        return (f"<pyshmlock.RWLock {self.name!r} {'paused' if self.paused else 'running'}, "
                f"this process {own_holds(self)}>")


def segment_size(max_processes: int = 256) -> int:
    """The bytes a lock with room for ``max_processes`` processes takes in
    /dev/shm (tmpfs rounds it up to whole pages), to size a container's
    ``--shm-size``."""
    check_max_processes(max_processes, lib.SHL_MAX_PROCESSES_LIMIT)
    return int(lib.shl_segment_size(max_processes))


def unlink(name: str, force: bool = False) -> None:
    """Remove the lock ``name`` from the system.

    Refuses (LockInUseError) while other live processes are attached, unless
    ``force`` is true; this process's own attachments do not count.  It
    removes exactly the segment it looked at: if the lock is removed and
    created anew meanwhile, the new one is looked at instead.  Without
    ``force`` it looks inside only segments this user owns (PermissionError
    otherwise); ``force=True`` removes the name without looking inside.
    Processes still attached keep working on the old segment; a later open
    creates a fresh lock.  FileNotFoundError if there is no such lock.
    """
    check_name(name)
    check_bool(force, "force")
    attached = ffi.new("uint32_t *")
    rc = lib.shl_unlink(name.encode(), int(bool(force)), attached)
    if rc == lib.SHL_EBUSY:
        who = ("processes whose segment (another release's layout) cannot be read"
               if attached[0] == 0xFFFFFFFF else
               f"{attached[0]} other live process(es) attached")
        raise advised(
            LockInUseError(f"lock {name!r}: {who}; pass force=True to remove it anyway"),
            f"lock {name!r}: {who}; `pyshmlock rm --force {name}` removes it anyway")
    if rc == lib.SHL_EPERM:
        raise untrusted_error(name, None, None, -1, unlinking=True)
    if rc != _OK:
        raise error_for(rc, "unlink", name)

