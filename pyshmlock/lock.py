"""The blocking API: :class:`RWLock`, :func:`unlink`, :class:`LockInfo`.

A thin layer over the C core (``csrc/shmlock.c``): every method is one call
into C, which does its own waiting with the GIL released.  This module keeps
the Python-side rules: argument checking, timeouts, error mapping, signal
handling, and the per-process registry that makes every ``RWLock`` object of
one segment in one process share one attachment (holds belong to the
process, not to the Python object).
"""
import grp
import math
import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Dict, List, NoReturn, Optional, Tuple, Union

from ._shmlock import ffi, lib
from .errors import LockInUseError, error_for, open_error, untrusted_error

__all__ = ["RWLock", "SyncHold", "LockInfo", "Recovery", "AttachedProcess", "unlink",
           "inspect", "SHM_DIR", "SHM_PREFIX", "STALE_POLICIES"]

SHM_DIR = "/dev/shm"
SHM_PREFIX = "pyshmlock."
_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,200}\Z")

_OK = lib.SHL_OK
_TIMEDOUT = lib.SHL_TIMEDOUT
_EINTR = lib.SHL_EINTR

# The C entry points, bound once: the fast paths below are one Python frame
# around one C call (see bench/ for what that costs against a bare call).
_acquire_read = lib.shl_acquire_read
_release_read = lib.shl_release_read
_acquire_write = lib.shl_acquire_write
_release_write = lib.shl_release_write
_acquire_update = lib.shl_acquire_update
_release_update = lib.shl_release_update
_is_paused = lib.shl_is_paused

# Blocking C call -> the kind of its attempt (for _finish's own-hold wait).
_KIND_OF = {
    _acquire_read: lib.SHL_KIND_READ, _acquire_write: lib.SHL_KIND_WRITE,
    _acquire_update: lib.SHL_KIND_UPDATE, lib.shl_resume: lib.SHL_KIND_RESUME,
}

_LOST_NAMES = (
    (lib.SHL_LOST_WRITE, "write"),
    (lib.SHL_LOST_UPDATE, "update"),
    (lib.SHL_LOST_CLAIM, "exclusive claim"),
    (lib.SHL_LOST_READS, "reads"),
    (lib.SHL_LOST_WAITERS, "queued readers"),
    (lib.SHL_LOST_PAUSE, "pause"),
)

#: What an opener does with a stale segment (see RWLock, docs/OPERATIONS.md).
STALE_POLICIES = ("reset", "keep")


def check_name(name: Any) -> str:
    """Return ``name`` if it is a valid lock name, else raise ValueError."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(
            f"invalid lock name {name!r}: use 1-200 characters from [A-Za-z0-9._-]")
    return name


# Any wait this long or longer is "forever": 2**62 ns is 146 years, and a
# deadline of now + 2**62 ns cannot overflow int64 (CLOCK_MONOTONIC starts
# near boot).
_FOREVER_S = float(1 << 62) / 1e9


def deadline_ns(timeout: Optional[float]) -> int:
    """Convert a timeout in seconds to an absolute CLOCK_MONOTONIC deadline.

    None, ``float("inf")`` and any finite timeout of 146 years or more wait
    forever (-1); 0 tries once.  Negative or NaN is a ValueError.
    """
    if timeout is None:
        return -1
    try:
        t = float(timeout)
    except OverflowError:        # an int too large for a float
        t = math.inf if timeout > 0 else -math.inf
    if math.isnan(t) or t < 0:
        raise ValueError(f"timeout must be None or >= 0, not {timeout!r}")
    if t >= _FOREVER_S:
        return -1
    if t == 0:
        return 0
    return time.monotonic_ns() + int(t * 1e9)


class _Octal(int):
    """An int that shows as octal, so that help() prints ``mode=0o600``."""

    def __repr__(self) -> str:
        return oct(self)


DEFAULT_MODE = _Octal(0o600)


# ==================================================== C fast path (issue 14)
# RWLock's hold calls (acquire_*/release_*, paused) and the sync holds'
# __enter__/__exit__ are methods of C base types, pyshmlock._fast
# (csrc/fastpath.c): no Python frame, and the GIL is released only when a
# call must wait.  The base types call the core through the cffi module's
# entry points, handed over here with the timeout rule above (edge cases)
# and the error mapping.  Subclasses must not override those methods.
from . import _fastpath  # noqa: E402

_fastpath.setup(deadline_ns)
# ================================================ end of C fast path block


# ----------------------------------------------------------- attachments

class _Attachment:
    """One process's attachment to one segment, shared by its RWLock objects."""

    __slots__ = ("handle", "refs", "key", "name")

    def __init__(self, handle: Any, key: Tuple[int, int], name: str) -> None:
        self.handle = handle
        self.refs = 0
        self.key = key
        self.name = name


_registry: Dict[Tuple[int, int], _Attachment] = {}
_registry_lock = threading.Lock()


def _fresh_lock_in_child() -> None:
    # Another thread may have held the lock at fork(): the child would hang
    # on it forever.  The attachments stay: the C core gives the child slots
    # of its own on first use.
    global _registry_lock
    _registry_lock = threading.Lock()


os.register_at_fork(after_in_child=_fresh_lock_in_child)


def _segment_key(name: str) -> Optional[Tuple[int, int]]:
    try:
        st = os.stat(os.path.join(SHM_DIR, SHM_PREFIX + name))
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def check_group(group: Union[None, int, str]) -> int:
    """The gid for the ``group`` argument (-1 for None), else ValueError."""
    if group is None:
        return -1
    if isinstance(group, str):
        try:
            return grp.getgrnam(group).gr_gid
        except KeyError:
            raise ValueError(f"no such group {group!r}") from None
    if isinstance(group, int) and not isinstance(group, bool) and 0 <= group < 2**32 - 1:
        return group
    raise ValueError(f"group must be None, a group name or a gid, not {group!r}")


def _attach(name: str, create: bool, mode: int, max_processes: int,
            gid: int = -1) -> _Attachment:
    with _registry_lock:
        key = _segment_key(name)
        att = _registry.get(key) if key else None
        if att is None:
            out = ffi.new("shl_lock **")
            info = ffi.new("shl_open_info *")
            rc = lib.shl_open(name.encode(), int(create), mode, gid, max_processes,
                              out, info)
            if rc != _OK:
                raise open_error(rc, name, info, mode, gid)
            key = (info.dev, info.ino)
            att = _registry.get(key)
            if att is None:
                att = _Attachment(out[0], key, name)
                _registry[key] = att
            else:   # raced with our own stat: keep the existing attachment
                lib.shl_close(out[0])
        else:
            # Inherited through fork(): the child takes a slot of its own now,
            # so that it counts as attached from the moment it opens the lock.
            rc = lib.shl_attach(att.handle)
            if rc != _OK:
                raise error_for(rc, "open", name)
        att.refs += 1
        return att


# Run before the last close of an attachment: a hook raises LockInUseError
# to refuse, or stops what it runs on the handle (aio: the watcher thread).
# A hook, so that this module never imports pyshmlock.aio: aio imports lock.
_close_hooks: List[Callable[[_Attachment], None]] = []


def _detach(att: _Attachment) -> None:
    with _registry_lock:
        if att.refs == 1:
            for hook in _close_hooks:
                hook(att)
            rc = lib.shl_close(att.handle)
            if rc == lib.SHL_EBUSY:
                raise LockInUseError(
                    f"lock {att.name!r}: close() while this process still holds it; "
                    "release its holds first")
            if rc == lib.SHL_EINFLIGHT:
                raise LockInUseError(
                    f"lock {att.name!r}: close() while another thread or task of this "
                    "process is inside a call on it or waiting for it (calls in flight); "
                    "let them finish, or cancel them, first")
            if rc != _OK:
                raise error_for(rc, "close", att.name)
            del _registry[att.key]
        att.refs -= 1


# ------------------------------------------------------------ info types

@dataclass(frozen=True)
class Recovery:
    """A hold reclaimed from a process that died (or exited) holding it."""

    pid: int
    lost: Tuple[str, ...]
    reads: int
    queued_readers: int
    when: float          # time.time() seconds


@dataclass(frozen=True)
class AttachedProcess:
    """One attached process (one slot).  ``pid`` is only meaningful inside
    the PID namespace ``pid_namespace`` (the inode of /proc/<pid>/ns/pid, 0
    if unknown): two containers sharing /dev/shm may show the same pid."""

    pid: int
    pid_namespace: int
    slot: int
    readers: int
    queued_readers: int
    waiting: int
    is_self: bool        # this process's own attachment


@dataclass(frozen=True)
class LockInfo:
    """A snapshot of a lock as every process sees it (see RWLock.info)."""

    name: str
    paused: bool
    paused_by_pid: Optional[int]
    paused_at: Optional[float]
    pause_count: int
    writer_pid: Optional[int]
    updater_pid: Optional[int]
    #: True once the writer/updater holds the lock; False while its claim
    #: still waits for readers to leave.
    exclusive_granted: bool
    readers: Dict[int, int]
    waiters: Dict[int, int]
    queued_readers: Dict[int, int]
    attached_pids: List[int]
    epoch: int
    max_processes: int
    data_suspect: bool
    recoveries: List[Recovery] = field(default_factory=list)
    recovery_count: int = 0
    #: one entry per attached process; ``readers``/``waiters``/
    #: ``queued_readers`` above add up processes that show the same pid
    processes: List[AttachedProcess] = field(default_factory=list)
    #: Processes that died attached and are not reclaimed yet (only an
    #: observer sees them: an attached process reclaims them as it looks).
    dead_pids: List[int] = field(default_factory=list)
    #: Whether the process that paused still runs (None: not paused).
    paused_by_alive: Optional[bool] = None
    #: No live process is attached and the segment holds state left by dead
    #: ones (a pause whose pauser is gone, holds or claims of dead processes).
    stale: bool = False

    def to_dict(self) -> Dict[str, Any]:
        """The snapshot as plain JSON-serialisable data."""
        d = dict(self.__dict__)
        d["processes"] = [dict(p.__dict__) for p in self.processes]
        d["readers"] = {str(k): v for k, v in self.readers.items()}
        d["waiters"] = {str(k): v for k, v in self.waiters.items()}
        d["queued_readers"] = {str(k): v for k, v in self.queued_readers.items()}
        d["recoveries"] = [dict(r.__dict__, lost=list(r.lost)) for r in self.recoveries]
        return d


# -------------------------------------------------------------- the lock

def _finish(rc: int, fn: Callable[[Any, int], int], h: Any, deadline: int,
            what: str, name: str) -> bool:
    """Slow tail of every blocking call: signals, timeouts and errors.

    SHL_EINTR means a signal interrupted the wait with nothing left behind;
    looping back into Python runs the signal handlers (Ctrl-C raises
    KeyboardInterrupt here), then the wait resumes with the same deadline.
    """
    while rc == _EINTR:
        rc = fn(h, deadline)
    if rc == _OK:
        return True
    if rc == _TIMEDOUT:
        return False
    if rc == lib.SHL_EDEADLK and deadline >= 0 and fn in _KIND_OF:
        # This thread has the exclusive hold it asks for.  Only a wait
        # without end is refused (WouldDeadlockError); a try says False and
        # a timed wait waits, as threading.Lock's would (another thread of
        # this process may release the hold).
        return deadline > 0 and _wait_as_any_thread(h, _KIND_OF[fn], deadline, what, name)
    raise error_for(rc, what, name)


def _wait_as_any_thread(h: Any, kind: int, deadline: int, what: str, name: str) -> bool:
    """A timed wait that does not count this thread's own exclusive hold as
    a deadlock: the attempt is made as any thread of the process."""
    w = ffi.new("shl_waiter *")
    w.kind = kind
    w.shared_thread = 1
    try:
        while True:
            rc = lib.shl_try(h, w)
            if rc == _OK:
                return True
            if rc != lib.SHL_AGAIN:
                raise error_for(rc, what, name)
            rc = lib.shl_wait(h, w, deadline)
            if rc == _TIMEDOUT:
                break
            if rc not in (_OK, _EINTR):   # on EINTR, signal handlers run here
                raise error_for(rc, what, name)
    except BaseException:
        lib.shl_cancel(h, w)
        raise
    lib.shl_cancel(h, w)
    return False


# The state word's bits that say whether a new hold would wait (see the
# layout at the top of csrc/shmlock.c).
_ST_OWNER = 0x0FFF
_ST_PAUSED = 0x4000

#: The one table of hold kinds, for the blocking and the asyncio holds:
#: kind code -> (name, C acquire, C release, what a message calls it).
HOLD_KINDS: Dict[int, Tuple[str, Callable[[Any, int], int], Callable[[Any], int], str]] = {
    lib.SHL_KIND_READ: ("read", _acquire_read, _release_read, "read hold"),
    lib.SHL_KIND_WRITE: ("write", _acquire_write, _release_write, "write hold"),
    lib.SHL_KIND_UPDATE: ("update", _acquire_update, _release_update, "update hold"),
}

# Set by pyshmlock.aio when it is imported (pyshmlock's __init__ always
# imports it): the coroutine that waits for a hold without blocking a loop.
_async_acquire: Optional[Callable[..., Any]] = None


def hold_would_wait(lock: "RWLock", code: int) -> bool:
    """``locked()`` of a hold: whether a new hold of this kind would have to
    wait right now (a snapshot, like threading.Lock.locked())."""
    h = lock._handle()
    s = lib.shl_load_state(h)
    if code == lib.SHL_KIND_READ:
        return bool(s & (_ST_OWNER | _ST_PAUSED))
    if s & _ST_OWNER:
        return True
    if code == lib.SHL_KIND_UPDATE and s & _ST_PAUSED:
        return False          # a paused lock's readers do not hold an update back
    return lock.is_locked()


def hold_repr(hold: Any, cls: str) -> str:
    """``<locked pyshmlock.SyncHold object (write hold of lock 'x') at 0x...>``:
    the shape of threading.Lock's repr."""
    lock = hold.lock
    try:
        state = "locked" if hold.locked() else "unlocked"
    except ValueError:
        state = "closed"
    t = "" if hold.timeout is None else f", timeout {hold.timeout} s"
    return (f"<{state} pyshmlock.{cls} object ({hold.kind} hold of lock "
            f"{lock.name!r}{t}) at {id(hold):#x}>")


class SyncHold(_fastpath.Hold):
    """One kind of hold (``kind`` is "read", "write" or "update") of an
    :class:`RWLock`, shaped like :class:`threading.Lock`.

    ``with hold:`` takes the hold for the block (raising TimeoutError if
    ``timeout`` was given and passes); ``async with hold:`` does the same
    without blocking the event loop.  ``acquire(blocking=True,
    timeout=-1)``, ``release()`` and ``locked()`` follow threading.Lock, so
    ``threading.Condition(lock.writer_lock)`` works.  Holds belong to the
    process: any thread may release what another thread of the process
    acquired.  A thread that acquires a write or update hold it already
    holds gets WouldDeadlockError (``acquire(blocking=False)`` returns False).
    """

    # ``SyncHold(lock, code, timeout)``.  __enter__/__exit__ are the C base's
    # (csrc/fastpath.c): the uncontended enter and exit are one C call each,
    # with no Python frame.  Do not override them here.
    __slots__ = ("__weakref__",)

    @property
    def lock(self) -> "RWLock":
        """The lock this is a hold of."""
        return self._lock  # type: ignore[no-any-return]

    @property
    def kind(self) -> str:
        """"read", "write" or "update"."""
        return HOLD_KINDS[self._kind][0]

    @property
    def timeout(self) -> Optional[float]:
        """The timeout of ``with hold:`` (None: wait forever)."""
        return self._timeout  # type: ignore[no-any-return]

    @property
    def _code(self) -> int:
        return self._kind  # type: ignore[no-any-return]

    @property
    def _what(self) -> str:
        return HOLD_KINDS[self._kind][3]

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Take the hold, as threading.Lock.acquire: True once had, False if
        ``blocking`` is false and it is not free, or on timeout."""
        if not blocking:
            if timeout is not None and timeout != -1:
                raise ValueError("can't specify a timeout for a non-blocking call")
            t: Optional[float] = 0
        elif timeout is None or (timeout == -1 and not isinstance(timeout, bool)):
            t = None
        else:
            t = timeout
        # The lock's own (C) acquire_<kind>: the same rules and errors.
        return getattr(self._lock, "acquire_" + self.kind)(t)  # type: ignore[no-any-return]

    def release(self) -> None:
        """Give the hold back (NotHeldError, a RuntimeError, if this process
        has none)."""
        self.__exit__(None, None, None)

    def locked(self) -> bool:
        """Whether a new hold of this kind would have to wait now."""
        return hold_would_wait(self.lock, self._code)

    async def __aenter__(self) -> "SyncHold":
        assert _async_acquire is not None
        if not await _async_acquire(self.lock, self._code, self.timeout):
            raise TimeoutError(f"{self._what} of lock {self.lock.name!r} not had "
                               f"within {self.timeout} s")
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.__exit__()

    def __repr__(self) -> str:
        return hold_repr(self, "SyncHold")


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


def own_holds(lock: "RWLock") -> str:
    """This process's holds of the lock, for a repr: "read x2, write"."""
    h = lock._h
    snap = ffi.new("shl_snapshot *")
    if h == ffi.NULL or lib.shl_info(h, snap) != _OK:
        return "?"
    held = []
    slot = ffi.new("shl_slot_snapshot *")
    if snap.self_slot >= 0 and lib.shl_slot_info(h, snap.self_slot, slot) == _OK \
            and slot.readers:
        held.append(f"read x{slot.readers}")
    if snap.exclusive_slot >= 0 and snap.exclusive_slot == snap.self_slot:
        kind = "update" if snap.exclusive_kind == lib.SHL_KIND_UPDATE else "write"
        held.append(kind if snap.exclusive_granted else f"{kind} (claimed, waiting)")
    return "holds " + ", ".join(held) if held else "holds nothing"


def _reopen(cls: type, name: str) -> Any:
    """Unpickle a lock: open it again by name, never creating it."""
    return cls(name, create=False)


class RWLock(_fastpath.Lock):
    """A reader/writer lock with a pause gate, shared by every process that
    opens the same name.

    ``RWLock(name, *, create=True, mode=0o600, max_processes=256, group=None,
    stale="reset")``

    ``name`` is 1-200 characters of ``[A-Za-z0-9._-]``; the lock lives in the
    POSIX shared-memory object ``/pyshmlock.<name>``.  With ``create=True``
    (the default) the first opener creates it with permissions ``mode``
    (default ``0o600``: owner read/write) and room for ``max_processes``
    attached processes; later openers get the creator's values.
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
    name: unpickling opens it again with ``create=False``.

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
    takes ``timeout`` in seconds: None (or inf, or any very long time) waits
    forever, 0 tries once; it returns False on timeout.  Waiting releases the
    GIL and stays interruptible by Ctrl-C.
    """

    #: ``with lock.reader_lock:`` holds a read for the block (waits forever).
    reader_lock: SyncHold
    #: ``with lock.writer_lock:`` holds the write lock for the block.
    writer_lock: SyncHold
    #: ``with lock.update_lock:`` holds an update for the block.
    update_lock: SyncHold

    def __init__(self, name: str, *, create: bool = True, mode: int = DEFAULT_MODE,
                 max_processes: int = 256, group: Union[None, int, str] = None,
                 stale: str = "reset") -> None:
        check_name(name)
        gid = check_group(group)
        check_stale(stale)
        if not isinstance(mode, int) or not 0 <= mode <= 0o777:
            raise ValueError(f"mode must be a permission number 0..0o777, not {mode!r}")
        if (not isinstance(max_processes, int) or isinstance(max_processes, bool)
                or not 1 <= max_processes <= lib.SHL_MAX_PROCESSES_LIMIT):
            raise ValueError(f"max_processes must be 1..{lib.SHL_MAX_PROCESSES_LIMIT}, "
                             f"not {max_processes!r}")
        self.name = name
        self._att: Optional[_Attachment] = _attach(name, bool(create), mode, max_processes,
                                                   gid)
        self._h = self._att.handle
        self._fast_bind(_fastpath.address(self._h))   # the C methods' handle
        if self._att.refs == 1:      # this process's first attachment to the segment
            try:
                _apply_stale_policy(self._h, name, stale)
            except BaseException:
                _detach(self._att)
                raise
        self.reader_lock = SyncHold(self, lib.SHL_KIND_READ, None)
        self.writer_lock = SyncHold(self, lib.SHL_KIND_WRITE, None)
        self.update_lock = SyncHold(self, lib.SHL_KIND_UPDATE, None)

    def _handle(self) -> Any:
        h = self._h
        if h == ffi.NULL:
            raise ValueError(f"lock {self.name!r} is closed")
        return h

    # -- holds ---------------------------------------------------------
    # acquire_read/release_read, acquire_write/release_write and
    # acquire_update/release_update(timeout=None) are the C base's
    # (_fastpath.Lock); they return True, or False on timeout.

    # -- the pause gate ------------------------------------------------

    def pause(self) -> bool:
        """Close the gate: from now on no process gets a new read hold.

        Never blocks; existing read holds stay.  Returns True if this call
        paused the lock, False if it was already paused.
        """
        rc = lib.shl_pause(self._h)
        if rc < 0:
            raise error_for(rc, "pause", self.name)
        return rc == 1

    def resume(self, timeout: Optional[float] = None) -> bool:
        """Open the gate.  Waits while an update hold exists (however it was
        taken); True once the lock runs, False on timeout."""
        h = self._h
        d = deadline_ns(timeout)
        return _finish(lib.shl_resume(h, d), lib.shl_resume, h, d, "resume", self.name)

    # paused (a property) is the C base's: one shared-memory load.

    def wait_resumed(self, timeout: Optional[float] = None) -> bool:
        """Wait until the lock is not paused; False on timeout."""
        h = self._h
        d = deadline_ns(timeout)
        return _finish(lib.shl_wait_resumed(h, d), lib.shl_wait_resumed, h, d,
                       "wait_resumed", self.name)

    def wait_drained(self, timeout: Optional[float] = None) -> bool:
        """Wait until no read hold exists in any process; False on timeout."""
        h = self._h
        d = deadline_ns(timeout)
        return _finish(lib.shl_wait_drained(h, d), lib.shl_wait_drained, h, d,
                       "wait_drained", self.name)

    def is_locked(self) -> bool:
        """True if a write/update hold or any read hold exists anywhere."""
        rc = lib.shl_is_locked(self._h)
        if rc < 0:
            raise error_for(rc, "is_locked", self.name)
        return bool(rc)

    # -- context managers with timeouts --------------------------------

    def read(self, timeout: Optional[float] = None) -> SyncHold:
        """``with lock.read(timeout=1):`` - a read hold, TimeoutError if not had in time."""
        deadline_ns(timeout)   # validate now, not at __enter__
        return SyncHold(self, lib.SHL_KIND_READ, timeout)

    def write(self, timeout: Optional[float] = None) -> SyncHold:
        """``with lock.write(timeout=1):`` - the write hold, TimeoutError if not had in time."""
        deadline_ns(timeout)
        return SyncHold(self, lib.SHL_KIND_WRITE, timeout)

    def update(self, timeout: Optional[float] = None) -> SyncHold:
        """``with lock.update(timeout=1):`` - an update hold, TimeoutError if not had in time."""
        deadline_ns(timeout)
        return SyncHold(self, lib.SHL_KIND_UPDATE, timeout)

    # -- observability -------------------------------------------------

    def info(self) -> LockInfo:
        """A snapshot of the lock as seen by every process.

        Looking also reclaims holds of processes found dead.
        """
        h = self._handle()
        snap = ffi.new("shl_snapshot *")
        rc = lib.shl_info(h, snap)
        if rc != _OK:
            raise error_for(rc, "info", self.name)
        readers: Dict[int, int] = {}
        waiters: Dict[int, int] = {}
        queued: Dict[int, int] = {}
        pids: List[int] = []
        procs: List[AttachedProcess] = []
        slot = ffi.new("shl_slot_snapshot *")
        for i in range(snap.max_processes):
            if lib.shl_slot_info(h, i, slot) != _OK or not slot.alive:
                continue
            pids.append(slot.pid)
            procs.append(AttachedProcess(
                pid=slot.pid, pid_namespace=slot.pidns, slot=i, readers=slot.readers,
                queued_readers=slot.owed, waiting=slot.waiting, is_self=bool(slot.is_self)))
            if slot.readers:
                readers[slot.pid] = readers.get(slot.pid, 0) + slot.readers
            if slot.waiting:
                waiters[slot.pid] = waiters.get(slot.pid, 0) + slot.waiting
            if slot.owed:
                queued[slot.pid] = queued.get(slot.pid, 0) + slot.owed
        # Slot scanning may have reclaimed a dead holder: re-read the header.
        lib.shl_info(h, snap)
        recoveries = _recoveries(h, snap.recovery_count)
        pauser_alive = None
        if snap.paused:
            pauser_alive = (snap.paused_by_pid in pids or
                            _pid_running(snap.paused_by_pid, snap.paused_at_ns / 1e9))
        owner = snap.exclusive_pid or None
        kind = snap.exclusive_kind
        return LockInfo(
            name=self.name,
            paused=bool(snap.paused),
            paused_by_pid=(snap.paused_by_pid or None) if snap.paused else None,
            paused_at=(snap.paused_at_ns / 1e9) if snap.paused and snap.paused_at_ns else None,
            pause_count=snap.pause_count,
            writer_pid=owner if kind == lib.SHL_KIND_WRITE else None,
            updater_pid=owner if kind == lib.SHL_KIND_UPDATE else None,
            exclusive_granted=bool(snap.exclusive_granted),
            readers=readers,
            waiters=waiters,
            queued_readers=queued,
            attached_pids=sorted(pids),
            epoch=snap.epoch,
            max_processes=snap.max_processes,
            data_suspect=bool(snap.data_suspect),
            recoveries=recoveries,
            recovery_count=snap.recovery_count,
            processes=procs,
            paused_by_alive=pauser_alive,
        )

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
        Idempotent."""
        att = self._att
        if att is None:
            return
        _detach(att)
        self._att = None
        self._h = ffi.NULL            # the C core refuses a NULL handle
        self._fast_bind(0)
        self.__class__ = _ClosedRWLock

    def attached(self) -> ContextManager["RWLock"]:
        """``with RWLock(name).attached() as lock:`` - the lock for the block,
        closed when it ends (like contextlib.closing)."""
        return _Attached(self)

    def __enter__(self) -> NoReturn:
        """Refused with TypeError: ``with lock:`` would take no hold."""
        raise no_plain_with(self, "with")

    def __exit__(self, *exc: Any) -> None:
        """Never reached: ``__enter__`` refuses."""

    def __reduce__(self) -> Any:
        return (_reopen, (RWLock, self.name))

    def __repr__(self) -> str:
        return (f"<pyshmlock.RWLock {self.name!r} {'paused' if self.paused else 'running'}, "
                f"this process {own_holds(self)}>")


class _ClosedRWLock(RWLock):
    """What a closed RWLock becomes: every use raises ValueError."""

    def _closed(self, *args: Any, **kwargs: Any) -> Any:
        raise ValueError(f"lock {self.name!r} is closed")

    acquire_read = acquire_write = acquire_update = _closed
    release_read = release_write = release_update = _closed
    pause = resume = wait_resumed = wait_drained = is_locked = info = _closed
    read = write = update = _closed
    paused = property(_closed)   # type: ignore[assignment]

    def __reduce__(self) -> Any:
        return (_reopen, (RWLock, self.name))

    def close(self) -> None:
        """Already closed: nothing to do."""

    def __repr__(self) -> str:
        return f"<pyshmlock.RWLock {self.name!r} closed>"


def _recoveries(h: Any, count: int) -> List[Recovery]:
    rec = ffi.new("shl_recovery_record *")
    n = min(count, lib.SHL_RECOVERY_LOG)
    out = []
    for k in range(count - n, count):
        lib.shl_recovery_info(h, k % lib.SHL_RECOVERY_LOG, rec)
        lost = tuple(label for bit, label in _LOST_NAMES if rec.what & bit)
        out.append(Recovery(pid=rec.pid, lost=lost, reads=rec.reads,
                            queued_readers=rec.owed, when=rec.when_ns / 1e9))
    return out


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
    attached = ffi.new("uint32_t *")
    rc = lib.shl_unlink(name.encode(), int(bool(force)), attached)
    if rc == lib.SHL_EBUSY:
        raise LockInUseError(
            f"lock {name!r}: {attached[0]} other live process(es) attached; "
            "pass force=True to remove it anyway")
    if rc == lib.SHL_EPERM:
        raise untrusted_error(name, None, None, -1, unlinking=True)
    if rc != _OK:
        raise error_for(rc, "unlink", name)


# ------------------------------------------------------- stale segments

def check_stale(stale: Any) -> str:
    """Return ``stale`` if it is a stale-segment policy, else raise ValueError."""
    if stale not in STALE_POLICIES:
        raise ValueError(f"stale must be one of {STALE_POLICIES}, not {stale!r}")
    return stale


def _boot_time() -> float:
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("btime "):
                return float(line.split()[1])
    return 0.0


def _pid_running(pid: int, since: Optional[float] = None) -> bool:
    """Whether process ``pid`` of this PID namespace runs (not a zombie).

    With ``since`` (a time.time() value, e.g. when it paused), a process that
    started more than a second later is a newer process that reuses the pid,
    so it does not count.  When /proc cannot tell, the answer is True: the
    caller then keeps state rather than dropping it.
    """
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError:
        return True
    try:
        fields = data.rsplit(")", 1)[1].split()
        if fields[0] in ("Z", "X", "x"):
            return False
        if since:
            start = _boot_time() + int(fields[19]) / os.sysconf("SC_CLK_TCK")
            if start > since + 1.0:
                return False
    except (IndexError, ValueError, OSError):
        return True
    return True


def _apply_stale_policy(h: Any, name: str, stale: str) -> None:
    """After this process attached: with "reset", clear a pause that no live
    process stands behind (every other attached process is dead and the
    pauser no longer runs).  The C core makes the final decision atomically
    (shl_reset_stale); this only names the pauser it judged dead."""
    if stale == "keep":
        return
    snap = ffi.new("shl_snapshot *")
    rc = lib.shl_info(h, snap)
    if rc != _OK:
        raise error_for(rc, "open", name)
    if not snap.paused or not snap.paused_by_pid:
        return
    if _pid_running(snap.paused_by_pid, snap.paused_at_ns / 1e9 or None):
        return
    rc = lib.shl_reset_stale(h, snap.paused_by_pid)
    if rc < 0:
        raise error_for(rc, "open", name)


# ----------------------------------------------------------- observation

def inspect(name: str) -> LockInfo:
    """A snapshot of the lock ``name`` without attaching to it.

    The segment is mapped read-only, so this needs only read permission, takes
    no process slot (it works when all ``max_processes`` are taken), never
    lists the caller, and never changes the lock.  Processes that died
    attached are reported in ``dead_pids`` (their holds still count until an
    attached process reclaims them).  FileNotFoundError if there is no such
    lock; UninitializedSegmentError at once for an empty segment.
    """
    check_name(name)
    out = ffi.new("shl_observer **")
    rc = lib.shl_observe_open(name.encode(), out)
    if rc != _OK:
        raise error_for(rc, "inspect", name)
    o = out[0]
    try:
        return _observed_info(o, name)
    finally:
        lib.shl_observe_close(o)


def _observed_info(o: Any, name: str) -> LockInfo:
    snap = ffi.new("shl_snapshot *")
    rc = lib.shl_observe_info(o, snap)
    if rc != _OK:
        raise error_for(rc, "inspect", name)
    readers: Dict[int, int] = {}
    waiters: Dict[int, int] = {}
    queued: Dict[int, int] = {}
    live: List[int] = []
    dead: List[int] = []
    procs: List[AttachedProcess] = []
    slot = ffi.new("shl_slot_snapshot *")
    for i in range(snap.max_processes):
        if lib.shl_observe_slot(o, i, slot) != _OK:
            continue
        if not (slot.pid or slot.readers or slot.owed):
            continue                                  # free
        (live if slot.alive else dead).append(slot.pid)
        if slot.alive:
            procs.append(AttachedProcess(
                pid=slot.pid, pid_namespace=slot.pidns, slot=i, readers=slot.readers,
                queued_readers=slot.owed, waiting=slot.waiting, is_self=False))
        if slot.readers:
            readers[slot.pid] = readers.get(slot.pid, 0) + slot.readers
        if slot.waiting and slot.alive:
            waiters[slot.pid] = waiters.get(slot.pid, 0) + slot.waiting
        if slot.owed:
            queued[slot.pid] = queued.get(slot.pid, 0) + slot.owed
    rec = ffi.new("shl_recovery_record *")
    count = snap.recovery_count
    recoveries = []
    for k in range(count - min(count, lib.SHL_RECOVERY_LOG), count):
        lib.shl_observe_recovery(o, k % lib.SHL_RECOVERY_LOG, rec)
        lost = tuple(label for bit, label in _LOST_NAMES if rec.what & bit)
        recoveries.append(Recovery(pid=rec.pid, lost=lost, reads=rec.reads,
                                   queued_readers=rec.owed, when=rec.when_ns / 1e9))
    owner = snap.exclusive_pid or None
    kind = snap.exclusive_kind
    pauser_alive = None
    if snap.paused:
        pauser_alive = (snap.paused_by_pid in live or
                        _pid_running(snap.paused_by_pid, snap.paused_at_ns / 1e9))
    owner_dead = owner is not None and owner not in live
    # A granted exclusive holder that died makes the data suspect already; the
    # flag itself is set when an attached process reclaims the hold.
    suspect = bool(snap.data_suspect) or (owner_dead and bool(snap.exclusive_granted))
    stale = not live and bool((snap.paused and not pauser_alive) or dead or owner_dead)
    return LockInfo(
        name=name,
        paused=bool(snap.paused),
        paused_by_pid=(snap.paused_by_pid or None) if snap.paused else None,
        paused_at=(snap.paused_at_ns / 1e9) if snap.paused and snap.paused_at_ns else None,
        pause_count=snap.pause_count,
        writer_pid=owner if kind == lib.SHL_KIND_WRITE else None,
        updater_pid=owner if kind == lib.SHL_KIND_UPDATE else None,
        exclusive_granted=bool(snap.exclusive_granted),
        readers=readers,
        waiters=waiters,
        queued_readers=queued,
        attached_pids=sorted(live),
        epoch=snap.epoch,
        max_processes=snap.max_processes,
        data_suspect=suspect,
        recoveries=recoveries,
        recovery_count=count,
        processes=procs,
        dead_pids=sorted(set(dead) - set(live)),
        paused_by_alive=pauser_alive,
        stale=stale,
    )
