"""Holds: the blocking hold object :class:`SyncHold`, and the helpers both
hold types share (``locked()``, the repr, this process's holds for a lock's
repr).  Both hold types subclass the C base ``_fast.Hold``: ``with``,
``async with``, ``release()``, ``lock``, ``kind`` and ``timeout`` are its."""
from typing import TYPE_CHECKING, Any, Optional

# ================================================================ C fast path
# SyncHold's __enter__/__exit__/__aenter__/__aexit__ (and RWLock's hold
# calls, see lock.py) are methods of C base types, pyshmlock._fast
# (csrc/fastpath/).  Importing pyshmlock._fastpath hands the base types the
# core's entry points and the error mapping before any class below exists.
# Subclasses must not override those methods.
from . import _fastpath

# ================================================ end of C fast path block
from ._shmlock import ffi, lib

_OK = lib.SHL_OK

if TYPE_CHECKING:       # for annotations only: lock.py imports this module
    from .lock import RWLock


# The state word's bits that say whether a new hold would wait, exported by
# csrc/shmlock.h (see the layout in csrc/core/internal.h).
_ST_OWNER = lib.SHL_STATE_OWNER_MASK
_ST_PAUSED = lib.SHL_STATE_PAUSED

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

    # ``SyncHold(lock, code, timeout)``.  __enter__/__exit__, __aenter__/
    # __aexit__, release(), lock, kind and timeout are the C base's
    # (csrc/fastpath/hold.c): the uncontended enter and exit are one C call
    # each, with no Python frame.  Do not override them here.
    __slots__ = ("__weakref__",)

    if TYPE_CHECKING:
        @property
        def lock(self) -> "RWLock": ...

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
        return getattr(self.lock, "acquire_" + self.kind)(t)  # type: ignore[no-any-return]

    def locked(self) -> bool:
        """Whether a new hold of this kind would have to wait now."""
        return hold_would_wait(self.lock, self._kind)

    def __repr__(self) -> str:
        return hold_repr(self, "SyncHold")



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

