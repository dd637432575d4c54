"""The blocking API: :class:`RWLock`, :func:`unlink`, :class:`LockInfo`.

A thin layer over the C core (``csrc/shmlock.c``): every method is one call
into C, which does its own waiting with the GIL released.  This module keeps
the Python-side rules: argument checking, timeouts, error mapping, signal
handling, and the per-process registry that makes every ``RWLock`` object of
one segment in one process share one attachment (holds belong to the
process, not to the Python object).
"""
import math
import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from ._shmlock import ffi, lib
from .errors import LockInUseError, error_for

__all__ = ["RWLock", "LockInfo", "Recovery", "unlink", "SHM_DIR", "SHM_PREFIX"]

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

_LOST_NAMES = (
    (lib.SHL_LOST_WRITE, "write"),
    (lib.SHL_LOST_UPDATE, "update"),
    (lib.SHL_LOST_CLAIM, "exclusive claim"),
    (lib.SHL_LOST_READS, "reads"),
    (lib.SHL_LOST_WAITERS, "queued readers"),
)


def check_name(name: Any) -> str:
    """Return ``name`` if it is a valid lock name, else raise ValueError."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(
            f"invalid lock name {name!r}: use 1-200 characters from [A-Za-z0-9._-]")
    return name


def deadline_ns(timeout: Optional[float]) -> int:
    """Convert a timeout in seconds to an absolute CLOCK_MONOTONIC deadline.

    None waits forever (-1); 0 tries once.  Negative or NaN is a ValueError.
    """
    if timeout is None:
        return -1
    t = float(timeout)
    if math.isnan(t) or t < 0:
        raise ValueError(f"timeout must be None or >= 0, not {timeout!r}")
    if math.isinf(t):
        return -1
    if t == 0:
        return 0
    return time.monotonic_ns() + int(t * 1e9)


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


def _attach(name: str, create: bool, mode: int, max_processes: int) -> _Attachment:
    with _registry_lock:
        key = _segment_key(name)
        att = _registry.get(key) if key else None
        if att is None:
            out = ffi.new("shl_lock **")
            created = ffi.new("int *")
            dev = ffi.new("uint64_t *")
            ino = ffi.new("uint64_t *")
            rc = lib.shl_open(name.encode(), int(create), mode, max_processes,
                              out, created, dev, ino)
            if rc != _OK:
                raise error_for(rc, "open", name)
            key = (dev[0], ino[0])
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


def _detach(att: _Attachment) -> None:
    with _registry_lock:
        if att.refs == 1:
            rc = lib.shl_close(att.handle)
            if rc == lib.SHL_EBUSY:
                raise LockInUseError(
                    f"lock {att.name!r}: close() while this process still holds it; "
                    "release its holds first")
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
class LockInfo:
    """A snapshot of a lock as every process sees it (see RWLock.info)."""

    name: str
    paused: bool
    paused_by_pid: Optional[int]
    paused_at: Optional[float]
    pause_count: int
    writer_pid: Optional[int]
    updater_pid: Optional[int]
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

    def to_dict(self) -> Dict[str, Any]:
        """The snapshot as plain JSON-serialisable data."""
        d = dict(self.__dict__)
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
    raise error_for(rc, what, name)


class _Hold(_fastpath.Hold):
    """Context manager for one kind of hold; also usable with ``async with``.

    ``_Hold(lock, kind, timeout)``; ``__enter__``/``__exit__`` are the C base's
    (csrc/fastpath.c): with no timeout the same cost as acquire_*/release_*."""

    __slots__ = ()

    async def __aenter__(self) -> "_Hold":
        from .aio import async_acquire
        if not await async_acquire(self._lock, self._kind, self._timeout):
            raise TimeoutError(f"{_HOLD_KINDS[self._kind][2]} of lock {self._lock.name!r} "
                               f"not had within {self._timeout} s")
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.__exit__()


_HOLD_KINDS = {
    lib.SHL_KIND_READ: (_acquire_read, _release_read, "read hold"),
    lib.SHL_KIND_WRITE: (_acquire_write, _release_write, "write hold"),
    lib.SHL_KIND_UPDATE: (_acquire_update, _release_update, "update hold"),
}


class RWLock(_fastpath.Lock):
    """A reader/writer lock with a pause gate, shared by every process that
    opens the same name.

    ``name`` is 1-200 characters of ``[A-Za-z0-9._-]``; the lock lives in the
    POSIX shared-memory object ``/pyshmlock.<name>``.  With ``create=True``
    (the default) the first opener creates it with permissions ``mode`` and
    room for ``max_processes`` attached processes; later openers get the
    creator's values.  ``create=False`` raises FileNotFoundError if it does
    not exist.

    Holds belong to the process: any thread of the process that took a hold
    may release it, and a forked child holds nothing.  Every ``acquire_*``
    takes ``timeout`` in seconds: None waits forever, 0 tries once; it
    returns False on timeout.  Waiting releases the GIL and stays
    interruptible by Ctrl-C.
    """

    def __init__(self, name: str, *, create: bool = True, mode: int = 0o600,
                 max_processes: int = 256) -> None:
        check_name(name)
        if not isinstance(mode, int) or not 0 <= mode <= 0o777:
            raise ValueError(f"mode must be a permission number 0..0o777, not {mode!r}")
        if (not isinstance(max_processes, int) or isinstance(max_processes, bool)
                or not 1 <= max_processes <= lib.SHL_MAX_PROCESSES_LIMIT):
            raise ValueError(f"max_processes must be 1..{lib.SHL_MAX_PROCESSES_LIMIT}, "
                             f"not {max_processes!r}")
        self.name = name
        self._att: Optional[_Attachment] = _attach(name, bool(create), mode, max_processes)
        self._h = self._att.handle
        self._fast_bind(_fastpath.address(self._h))   # the C methods' handle
        #: ``with lock.reader_lock:`` holds a read for the block (waits forever).
        self.reader_lock = _Hold(self, lib.SHL_KIND_READ, None)
        #: ``with lock.writer_lock:`` holds the write lock for the block.
        self.writer_lock = _Hold(self, lib.SHL_KIND_WRITE, None)
        #: ``with lock.update_lock:`` holds an update for the block.
        self.update_lock = _Hold(self, lib.SHL_KIND_UPDATE, None)

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

    def read(self, timeout: Optional[float] = None) -> _Hold:
        """``with lock.read(timeout=1):`` - a read hold, TimeoutError if not had in time."""
        deadline_ns(timeout)   # validate now, not at __enter__
        return _Hold(self, lib.SHL_KIND_READ, timeout)

    def write(self, timeout: Optional[float] = None) -> _Hold:
        """``with lock.write(timeout=1):`` - the write hold, TimeoutError if not had in time."""
        deadline_ns(timeout)
        return _Hold(self, lib.SHL_KIND_WRITE, timeout)

    def update(self, timeout: Optional[float] = None) -> _Hold:
        """``with lock.update(timeout=1):`` - an update hold, TimeoutError if not had in time."""
        deadline_ns(timeout)
        return _Hold(self, lib.SHL_KIND_UPDATE, timeout)

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
        slot = ffi.new("shl_slot_snapshot *")
        for i in range(snap.max_processes):
            if lib.shl_slot_info(h, i, slot) != _OK or not slot.alive:
                continue
            pids.append(slot.pid)
            if slot.readers:
                readers[slot.pid] = readers.get(slot.pid, 0) + slot.readers
            if slot.waiting:
                waiters[slot.pid] = waiters.get(slot.pid, 0) + slot.waiting
            if slot.owed:
                queued[slot.pid] = queued.get(slot.pid, 0) + slot.owed
        # Slot scanning may have reclaimed a dead holder: re-read the header.
        lib.shl_info(h, snap)
        recoveries = _recoveries(h, snap.recovery_count)
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
            attached_pids=sorted(set(pids)),
            epoch=snap.epoch,
            max_processes=snap.max_processes,
            data_suspect=bool(snap.data_suspect),
            recoveries=recoveries,
            recovery_count=snap.recovery_count,
        )

    # -- lifetime ------------------------------------------------------

    def close(self) -> None:
        """Detach this object.  The process detaches from the segment when its
        last RWLock of that segment closes; that raises LockInUseError if the
        process still holds the lock.  Idempotent."""
        att = self._att
        if att is None:
            return
        _detach(att)
        self._att = None
        self._h = ffi.NULL            # the C core refuses a NULL handle
        self._fast_bind(0)
        self.__class__ = _ClosedRWLock

    def __enter__(self) -> "RWLock":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<pyshmlock.RWLock {self.name!r} {'paused' if self.paused else 'running'}>"


class _ClosedRWLock(RWLock):
    """What a closed RWLock becomes: every use raises ValueError."""

    def _closed(self, *args: Any, **kwargs: Any) -> Any:
        raise ValueError(f"lock {self.name!r} is closed")

    acquire_read = acquire_write = acquire_update = _closed
    release_read = release_write = release_update = _closed
    pause = resume = wait_resumed = wait_drained = is_locked = info = _closed
    read = write = update = _closed
    paused = property(_closed)   # type: ignore[assignment]

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
    ``force`` is true; this process's own attachment does not count.
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
    if rc != _OK:
        raise error_for(rc, "unlink", name)
