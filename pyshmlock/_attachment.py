"""Attachments: the per-process registry that makes every ``RWLock`` object
of one segment in one process share one C handle (holds belong to the
process, not to the Python object); opening, the last close and its hooks,
and the registry's reset in a forked child."""
import collections
import os
import threading
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from . import _fast
from ._args import SHM_DIR as SHM_DIR
from ._args import SHM_PREFIX as SHM_PREFIX
from ._args import segment_path
from ._fastpath import address, close_handle
from ._shmlock import ffi, lib
from .errors import LockInUseError, WouldDeadlockError, error_for, open_error, slots_refusal

_OK = lib.SHL_OK


class _Attachment:
    """One process's attachment to one segment, shared by its RWLock objects."""

    __slots__ = ("handle", "key", "max_processes", "name", "refs", "registered")

    def __init__(self, handle: Any, key: Tuple[int, int], name: str,
                 registered: bool = True, max_processes: int = 0) -> None:
        self.handle = handle
        self.refs = 0
        self.key = key
        self.name = name
        self.registered = registered   # False: an operator's handle of its own
        self.max_processes = max_processes   # the segment's slots


_registry: Dict[Tuple[int, int], _Attachment] = {}
# Every open and close of a lock takes the registry lock, always as
# `with _registry_lock_unless_held():`.  A garbage collection may run inside
# one and call a finaliser of the application's (a __del__ that closes a
# lock, say); with a plain lock that thread would wait for itself for good.
# It is refused instead (WouldDeadlockError, printed as the finaliser's
# error; the dropped lock object then gives its reference back through its
# own finaliser, which takes no lock).  An RLock only for its _is_owned(),
# exact and in C: it is never entered twice.  Entered and left by its C
# __enter__/__exit__, so a Ctrl-C between the two cannot leave it held.
_registry_lock = threading.RLock()


# Other locks a last close waits for (the asyncio parking locks, _park):
# each callable says whether this thread holds one of them.  A finaliser
# run there that opens or closes a lock would, in the last close's hook,
# wait for a lock its own thread holds, or hold it while waiting for the
# registry lock that another thread's last close holds while it waits for
# that very lock: it is refused as the registry lock's holder is.
_taken_after: List[Callable[[], bool]] = []


def _registry_lock_unless_held() -> Any:
    """The registry lock, to enter; WouldDeadlockError if this thread
    holds it already, or holds a lock the last close takes under it."""
    held = _registry_lock._is_owned()   # type: ignore[attr-defined]
    if held or any(holds() for holds in _taken_after):
        raise WouldDeadlockError(
            "a lock opened or closed from inside this thread's own open or "
            "close of a lock, or its asyncio wait for one (a finaliser, such "
            "as a __del__ that closes a lock, run by a garbage collection "
            "there) would wait for itself; "
            "drop the lock object instead: its own finaliser gives it back "
            "without waiting")
    return _registry_lock


def _fresh_lock_in_child() -> None:
    # Another thread may have held the lock at fork(): the child would hang
    # on it forever.  The attachments stay: the C core gives the child slots
    # of its own on first use.
    global _registry_lock
    _registry_lock = threading.RLock()


os.register_at_fork(after_in_child=_fresh_lock_in_child)


def _segment_key(name: str) -> Optional[Tuple[int, int]]:
    try:
        st = os.stat(segment_path(name))
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


#: The environment's opt-out of crash recovery where robust futexes are
#: missing (see NoCrashRecoveryError).
ALLOW_NO_ROBUST_ENV = "PYSHMLOCK_ALLOW_NO_ROBUST"


def allow_no_robust(asked: bool) -> bool:
    """Whether this open may run without crash recovery: asked by the
    caller, or by the environment (``PYSHMLOCK_ALLOW_NO_ROBUST=1``)."""
    return asked or os.environ.get(ALLOW_NO_ROBUST_ENV) == "1"


def _attach(name: str, create: bool, mode: int, max_processes: int,
            gid: int = -1, fail_closed: bool = False,
            no_robust: bool = False, sized: bool = False) -> _Attachment:
    """This process's attachment to the segment ``name``, one more reference.

    The C open runs outside the registry lock: it may wait (up to 2 s) for a
    creator still initialising the segment, and opens of other names must
    not queue behind it.  Two threads opening one name at once then both
    open it; the registry, keyed by the segment's dev/ino, keeps the first
    handle and the other is closed.

    ``fail_closed``: a segment this call creates starts paused under an
    already-passed host lease (a cluster host's lock, see shl_open).
    ``no_robust``: open even without robust futexes (no crash recovery).
    ``sized``: max_processes was asked for (SHL_OPEN_SIZED: an unused lock
    of another size is re-created at it), not the default."""
    key = _segment_key(name)
    with _registry_lock_unless_held():
        _settle_dropped()
        att = _registry.get(key) if key else None
        if att is not None:
            # This process has the segment open (or inherited it): it stays,
            # so an ask for more slots than it has is refused, as shl_open
            # refuses it.
            if sized and max_processes > att.max_processes:
                raise slots_refusal(name, att.max_processes, max_processes)
            shared = _share_open(att)
            if shared is not None:
                return shared
    out = ffi.new("shl_lock **")
    info = ffi.new("shl_open_info *")
    flags = (lib.SHL_OPEN_CREATE if create else 0) | \
        (lib.SHL_OPEN_FAIL_CLOSED if fail_closed else 0) | \
        (lib.SHL_OPEN_NO_ROBUST if allow_no_robust(no_robust) else 0) | \
        (lib.SHL_OPEN_SIZED if sized else 0)
    rc = lib.shl_open(name.encode(), flags, mode, gid, max_processes, out, info)
    if rc != _OK:
        raise open_error(rc, name, info, mode, gid, max_processes if create or sized else 0)
    key = (info.dev, info.ino)
    with _registry_lock_unless_held():
        att = _registry.get(key)
        if att is None:
            att = _registry[key] = _Attachment(out[0], key, name,
                                               max_processes=info.max_processes)
            att.refs += 1
            return att
        # Another thread of this process opened the same segment meanwhile:
        # keep its attachment, drop this handle (unless it is a closed one).
        shared = _share_open(att)
        if shared is not None:
            close_handle(out[0])
            return shared
        att = _registry[key] = _Attachment(out[0], key, name,
                                           max_processes=info.max_processes)
        att.refs += 1
        return att


def _attach_operator(name: str, mode: int = 0, gid: int = -1) -> _Attachment:
    """An operator's attachment to the existing lock ``name``: a handle of
    its own that takes no process slot (SHL_OPEN_NO_SLOT), so it opens a lock
    whose slots are all taken; it may pause, resume and look, never hold.
    Not shared through the registry: closing it touches no other object.
    ``mode`` and ``gid`` are the trust check's, as RWLock's (the `pyshmlock`
    command's --mode and --group); mode 0: DEFAULT_OPERATOR_MODE."""
    mode = mode or DEFAULT_OPERATOR_MODE
    out = ffi.new("shl_lock **")
    info = ffi.new("shl_open_info *")
    rc = lib.shl_open(name.encode(), lib.SHL_OPEN_NO_SLOT, mode, gid, 0, out, info)
    if rc != _OK:
        raise open_error(rc, name, info, mode, gid)
    att = _Attachment(out[0], (info.dev, info.ino), name, registered=False)
    att.refs = 1
    return att


# The mode an operator's open checks an existing segment against: it trusts
# a segment that grants group/other write only if this allows it, as a
# default RWLock does.
DEFAULT_OPERATOR_MODE = 0o600


def _share_open(att: _Attachment) -> Optional[_Attachment]:
    """_share(att), or None if att's handle is closed and att is dropped
    from the registry (caller holds the registry lock): a forked child can
    inherit the entry of an attachment another thread of its parent was
    closing at the fork."""
    try:
        return _share(att)
    except ValueError:            # SHL_ECLOSED: closed under the registry
        if _registry.get(att.key) is att:
            del _registry[att.key]
        return None


def _share(att: _Attachment) -> _Attachment:
    """One more reference to an existing attachment (caller holds the
    registry lock)."""
    # Inherited through fork(): the child takes a slot of its own now, so
    # that it counts as attached from the moment it opens the lock.
    rc = lib.shl_attach(att.handle)
    if rc != _OK:
        raise error_for(rc, "open", att.name)
    att.refs += 1
    return att


# Run before the last close of an attachment: a hook raises LockInUseError
# to refuse, or stops what it runs on the handle (aio: the watcher thread).
# A hook, so that this module never imports pyshmlock.aio: aio imports it.
_close_hooks: List[Callable[[_Attachment], None]] = []


# References given back by the finaliser of a lock object dropped without
# close() (RWLock.__del__).  A finaliser may run anywhere, also in a thread
# that holds _registry_lock, so it takes no lock: it only appends here
# (deque.append is atomic), and whoever next takes the registry lock (any
# open or close of a lock in this process) settles them (_settle_dropped).
_dropped: Deque[_Attachment] = collections.deque()
# Attachments whose last reference was dropped but which could not be
# closed then (the process still held the lock through them, or calls were
# in flight): kept open and registered, a later open shares them, and every
# settling tries again to close them.
_orphans: List[_Attachment] = []


def drop(att: _Attachment) -> None:
    """Give back the reference of a dropped lock object (a finaliser's
    call: no lock, no system call)."""
    _dropped.append(att)


def _settle_dropped() -> None:
    """Apply the references dropped objects gave back (caller holds the
    registry lock): an attachment nobody uses any more is closed, or kept
    for a later try if it cannot be yet."""
    while True:
        try:
            att = _dropped.popleft()
        except IndexError:
            break
        att.refs -= 1
        if att.refs <= 0:
            _orphans.append(att)
    for att in list(_orphans):
        if att.refs > 0:
            _orphans.remove(att)          # opened again: an object uses it
        elif _close(att, quiet=True):
            _orphans.remove(att)


def _close(att: _Attachment, quiet: bool = False, owner: Any = None) -> bool:
    """Close the attachment's handle (caller holds the registry lock, or the
    attachment is an unregistered operator's).  LockInUseError while the
    process holds the lock or calls are in flight, or with quiet, False.
    owner: the RWLock whose close this is, forgetting the handle as it
    closes (_fastpath.close_handle)."""
    try:
        if att.registered:
            for hook in _close_hooks:
                hook(att)
        rc = close_handle(att.handle, owner)
    except LockInUseError:
        if quiet:
            return False
        raise
    if rc == lib.SHL_EBUSY and not quiet:
        raise LockInUseError(
            f"lock {att.name!r}: close() while this process still holds it; "
            "release its holds first")
    if rc == lib.SHL_EINFLIGHT and not quiet:
        raise LockInUseError(
            f"lock {att.name!r}: close() while another thread or task of this "
            "process is inside a call on it or waiting for it (calls in flight); "
            "let them finish, or cancel them, first")
    if rc in (lib.SHL_EBUSY, lib.SHL_EINFLIGHT):
        return False
    if rc != _OK and rc != lib.SHL_ECLOSED:
        if quiet:
            return False
        raise error_for(rc, "close", att.name)
    if att.registered and _registry.get(att.key) is att:
        del _registry[att.key]
    return True


_RELEASE_CALL = {lib.SHL_KIND_READ: "release_read", lib.SHL_KIND_WRITE: "release_write",
                 lib.SHL_KIND_UPDATE: "release_update"}


def release_after_close(att: _Attachment, kind: int) -> bool:
    """The end of a ``with`` block whose lock object another thread closed
    inside it: give the hold back through the process's attachment, which
    still serves the process's other objects of the segment (holds are the
    process's).  False if the attachment is closed (then the process holds
    nothing through it: its last close refuses while the process holds the
    lock).  An attachment stays registered exactly while its handle is open,
    also once no object uses it any more: the last object dropped without
    close() leaves it open, an orphan, while the process holds the lock
    (_settle_dropped), and this release is what lets it close.  Under the
    registry lock, so that no last close runs meanwhile; the release is the
    hold calls' own (_fast.release, with the GIL held)."""
    with _registry_lock_unless_held():
        if not att.registered or _registry.get(att.key) is not att:
            return False
        rc = _fast.release(address(att.handle), kind)
    if rc != _OK:
        raise error_for(rc, _RELEASE_CALL[kind], att.name)
    return True


def _detach(att: _Attachment, owner: Any = None) -> None:
    """Drop one reference to att; close its handle with the last one (owner:
    the RWLock whose close this is)."""
    if not att.registered:
        _close(att, owner=owner)
        att.refs = 0
        return
    with _registry_lock_unless_held():
        _settle_dropped()
        if att.refs == 1:
            _close(att, owner=owner)
        att.refs -= 1

