"""Exceptions raised by pyshmlock, and the mapping from C return codes to them.

Hold misuse raises :class:`RuntimeError` subclasses, bad arguments raise
:class:`ValueError`, operating-system failures raise the matching
:class:`OSError` subclass (``FileNotFoundError``, ``PermissionError``), and
problems with the shared segment itself raise :class:`SegmentError`.
"""
import errno as _errno
import grp
import os
import pwd
from dataclasses import dataclass
from typing import Any, Optional, Tuple, TypeVar

from ._args import segment_path
from ._shmlock import ffi, lib


class PyshmlockError(Exception):
    """Base class of every error pyshmlock defines itself."""


class SegmentError(PyshmlockError):
    """The shared-memory segment under the lock's name cannot be used."""


class ForeignSegmentError(SegmentError):
    """The segment under our name was not written by pyshmlock."""


class LayoutVersionError(SegmentError):
    """The segment is a pyshmlock lock of a different layout version."""


class CorruptSegmentError(SegmentError):
    """The segment holds values no pyshmlock process writes.  ``reason``
    says which, where known (``"slot 3 names pid 4167930979, ..."``)."""

    reason: str = ""


class SegmentSizeError(CorruptSegmentError):
    """The segment's size is not the size its header describes."""


class UninitializedSegmentError(SegmentError):
    """The segment's creator never finished initialising it (it probably died)."""


class TooManyProcessesError(PyshmlockError):
    """Every process slot of the lock is owned by a live process."""


class NotHeldError(PyshmlockError, RuntimeError):
    """A release without a matching hold in this process."""


class WouldDeadlockError(PyshmlockError, RuntimeError):
    """The calling thread would wait for a hold it owns itself."""


class LockInUseError(PyshmlockError, RuntimeError):
    """close() while holding or while calls or waiting tasks of this process use
    the lock, or unlink() while other live processes are attached."""


class TooManyReadHoldsError(PyshmlockError, RuntimeError):
    """This process already has the maximum number of read holds on the lock
    (2**31 - 1): one more would overflow the shared count."""


class DataSuspectError(PyshmlockError, RuntimeError):
    """resume() of a paused lock whose protected data is suspect: a process
    died holding the write or update hold (not a claim still waiting for
    readers), or an update session expired before its end.  A completed
    write/update claimed after the loss, or a session ended normally, clears
    the mark; ``resume(force=True)`` (``pyshmlock resume --force``) opens
    the gate anyway and clears it."""


class ManagedLockError(PyshmlockError, RuntimeError):
    """resume() of a lock that a cluster agent manages (its host lease is
    armed): the agent opens it when the cluster does; ``force=True``
    overrides."""


class SessionError(PyshmlockError, RuntimeError):
    """end_session() with a token that names no current update session
    (it ended or expired, or never was)."""


class LockClosingError(PyshmlockError, RuntimeError):
    """A wait for the lock was ended by ``AsyncRWLock.notify_closing()``:
    the process is shutting down (nothing was acquired)."""


class NoCrashRecoveryError(PyshmlockError, RuntimeError):
    """The platform has no robust futexes (``set_robust_list`` fails, as
    under qemu-user emulation), so a process that died holding the lock
    would never be reclaimed: opening is refused unless the caller runs
    without crash recovery by choice (``allow_no_robust=True`` or
    ``PYSHMLOCK_ALLOW_NO_ROBUST=1``)."""


class FencingError(PyshmlockError, RuntimeError):
    """An update fenced with a token older than the newest this lock has
    seen: a newer update superseded the caller, which must not write."""


#: The attribute an exception carries its message for the `pyshmlock`
#: command under: the same facts, with the fix as a command line instead of
#: a Python call (:func:`cli_message` reads it).
CLI_MESSAGE = "_pyshmlock_cli_message"

E = TypeVar("E", bound=BaseException)


def advised(e: E, cli: str) -> E:
    """``e``, whose message for the `pyshmlock` command is ``cli``."""
    setattr(e, CLI_MESSAGE, cli)
    return e


def cli_message(e: BaseException) -> str:
    """What the `pyshmlock` command prints for ``e``: its CLI message, or
    its own (an OSError's with the file it names)."""
    text = getattr(e, CLI_MESSAGE, None)
    if isinstance(text, str):
        return text
    if isinstance(e, OSError) and e.strerror:
        msg = e.strerror
        if e.filename and str(e.filename) not in msg:
            msg = f"{msg}: {e.filename}"
        return msg
    return str(e)


def _cmd(name: Optional[str]) -> str:
    return name if name is not None else "NAME"


def corruption_text(why: Any) -> str:
    """What a validation found (a shl_corruption), in words; "" if nothing."""
    if why is None or not why.what:
        return ""
    v, i = int(why.value), int(why.slot)
    slot = f"slot {i}"
    return {
        lib.SHL_CORRUPT_SIZES: f"its header and slot sizes ({v >> 32}, {v & 0xFFFFFFFF}) are "
                               "not this layout's",
        lib.SHL_CORRUPT_MAX: f"its max_processes is {v}, not 1..{lib.SHL_MAX_PROCESSES_LIMIT}",
        lib.SHL_CORRUPT_TOTAL: f"its total size field is {v}, not its layout's size",
        lib.SHL_CORRUPT_OWNER: f"its state word names slot {v - 1}, beyond its slots",
        lib.SHL_CORRUPT_MUTEX: f"{slot}'s mutex is not a pyshmlock mutex (glibc kind {v})",
        lib.SHL_CORRUPT_PID: f"{slot} names pid {v}, above the kernel's limit "
                             f"({lib.SHL_PID_LIMIT})",
        lib.SHL_CORRUPT_READERS: f"{slot} counts {v} read holds, more than a process can have",
        lib.SHL_CORRUPT_WAITING: f"{slot} counts {v} sleeping threads, more than a process "
                                 "can have",
        lib.SHL_CORRUPT_OWED: f"{slot} counts {v} queued readers, more than any process makes",
    }.get(int(why.what), f"check {int(why.what)} failed at {slot}")


def error_for(rc: int, what: str, name: Optional[str] = None,
              corrupt: Any = None) -> BaseException:
    """Build the exception for a negative C return code ``rc`` of call
    ``what`` (``corrupt``: the shl_corruption of an SHL_ECORRUPT)."""
    where = f"lock {name!r}: " if name else ""
    if rc == lib.SHL_ENOHOLD:
        return NotHeldError(f"{where}{what}: this process holds no such hold")
    if rc == lib.SHL_EDEADLK:
        return WouldDeadlockError(
            f"{where}{what}: this thread holds the exclusive hold it would wait for")
    if rc == lib.SHL_EFULL:
        return TooManyProcessesError(
            f"{where}all process slots are taken by live processes "
            "(max_processes is fixed by the lock's creator)")
    if rc == lib.SHL_EFOREIGN:
        seg = segment_path(name) if name else "/dev/shm/pyshmlock.NAME"
        fact = (f"{where}the shared-memory segment under this name is not a pyshmlock lock "
                f"(something else made {seg}); find out what did (`ls -l {seg}`), then "
                "remove it")
        return advised(ForeignSegmentError(f"{fact}: pyshmlock.unlink(name, force=True)"),
                       f"{fact}: `pyshmlock rm --force {_cmd(name)}`")
    if rc == lib.SHL_EVERSION:
        return LayoutVersionError(
            f"{where}the segment is a pyshmlock lock of another layout version; "
            "every process must use the same pyshmlock release")
    if rc == lib.SHL_ECORRUPT:
        reason = corruption_text(corrupt)
        fact = (f"{where}{what}: the shared segment is corrupt"
                f"{f' ({reason})' if reason else ''}; stop the processes that use it, then "
                "remove it")
        e = advised(CorruptSegmentError(f"{fact}: pyshmlock.unlink(name, force=True)"),
                    f"{fact}: `pyshmlock rm --force {_cmd(name)}`")
        e.reason = reason
        return e
    if rc == lib.SHL_ESIZE:
        fact = (f"{where}{what}: the segment's size is not the size its header describes; "
                "stop the processes that use it, then remove it")
        return advised(SegmentSizeError(f"{fact}: pyshmlock.unlink(name, force=True)"),
                       f"{fact}: `pyshmlock rm --force {_cmd(name)}`")
    if rc == lib.SHL_EPERM:
        return PermissionError(_errno.EPERM, f"{where}{what}: the segment is owned by "
                               "another user or grants more than the requested mode")
    if rc == lib.SHL_EINIT:
        fact = (f"{where}the segment was never initialised (its creator died while "
                "creating it?); remove it")
        return advised(UninitializedSegmentError(
            f"{fact} with pyshmlock.unlink(name, force=True)"),
            f"{fact}: `pyshmlock rm --force {_cmd(name)}`")
    if rc == lib.SHL_EBUSY:
        return LockInUseError(f"{where}{what}: the lock is in use")
    if rc == lib.SHL_EOVERFLOW:
        return TooManyReadHoldsError(
            f"{where}{what}: this process already has {lib.SHL_READ_HOLDS_MAX} read holds "
            "on this lock; release some first")
    if rc == lib.SHL_EINFLIGHT:
        return LockInUseError(
            f"{where}{what}: another thread or task of this process is inside a call "
            "on this lock or waiting for it (calls in flight); let them finish first")
    if rc == lib.SHL_ESUSPECT:
        fact = (f"{where}{what} refused: the data is suspect (a process died holding the "
                "write or update hold, or an update session expired or was ended by an "
                "operator")
        fix = "Redo the update (a completed update clears the mark), or force it: "
        return advised(DataSuspectError(
            f"{fact}; see info().recoveries). {fix}resume(force=True), "
            f"`pyshmlock resume --force {_cmd(name)}`"),
            f"{fact}; see `pyshmlock status {_cmd(name)}`). {fix}"
            f"`pyshmlock resume --force {_cmd(name)}`")
    if rc == lib.SHL_EMANAGED:
        fact = (f"{where}{what} refused: a cluster agent manages this lock (its host lease "
                "is armed); resume the cluster instead (`pyshmlock cluster resume`), or "
                "force it: ")
        return advised(ManagedLockError(f"{fact}resume(force=True)"),
                       f"{fact}`pyshmlock resume --force {_cmd(name)}`")
    if rc == lib.SHL_ENOSESSION:
        fact = f"{where}{what}: no current update session has this token (it ended or expired"
        return advised(SessionError(f"{fact}; see info().recoveries)"),
                       f"{fact}; see `pyshmlock status {_cmd(name)}`)")
    if rc == lib.SHL_ECLOSED:     # the one "closed" error, see RWLock._handle
        return ValueError(f"lock {name!r} is closed" if name else
                          f"{what}: the lock object is closed")
    if rc == lib.SHL_EINVAL:
        return ValueError(f"{where}{what}: invalid argument")
    if rc == lib.SHL_ESYS:
        err = ffi.errno or _errno.EIO
        if name and err in (_errno.EACCES, _errno.EPERM):
            return access_error(name, {"inspect": "look", "unlink": "remove"}.get(what, "open"),
                                err)
        path = segment_path(name) if name else None
        return OSError(err, f"{what}: {os.strerror(err)}", path)
    return PyshmlockError(f"{where}{what}: unexpected return code {rc}")


def managed_error(e: BaseException, lock: Any) -> ManagedLockError:
    """The ManagedLockError of a refused resume, naming who holds the lease
    and, from the host setting the agent wrote, its cluster."""
    from ._hostconf import read_setting
    info = ffi.new("shl_lease_info *")
    who = ""
    if lib.shl_lease_get(lock._h, info) == lib.SHL_OK and info.pid:
        who = f"the lease is armed by pid {info.pid}"
    setting = read_setting(lock.name) or {}
    cluster = setting.get("cluster")
    if cluster:
        etcd = setting.get("etcd")
        urls = ",".join(etcd) if isinstance(etcd, list) else str(etcd or "URLS")
        who += (", " if who else "") + (
            f"the agent of cluster {cluster!r} (host {setting.get('host_id')!r}); open it with "
            f"`pyshmlock cluster resume --etcd {urls} {cluster}`")
    out = ManagedLockError(f"{e} ({who})" if who else str(e))
    cli = cli_message(e)
    return advised(out, f"{cli} ({who})" if who else cli)


def _user(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def _group(gid: int) -> str:
    try:
        return f"gid {gid} ({grp.getgrgid(gid).gr_name})"
    except KeyError:
        return f"gid {gid}"


@dataclass(frozen=True)
class Refusal:
    """Why a lock's segment is refused to this process, as facts a fix can be
    made of (the `pyshmlock` command makes a command line of them).  A
    PermissionError of pyshmlock carries one (:func:`refusal_of`)."""

    name: str
    path: str
    uid: int                      # the segment's owner (-1: unknown)
    gid: int
    mode: int
    #: what was refused: "look" (read), "open" (read and write), "remove"
    need: str
    #: owned by this process's effective uid
    ours: bool
    #: the group a group-writable segment is shared with (its opt-in), or None
    shared_group: Optional[str] = None
    #: the segment grants write to every user beyond the mode asked for
    open_to_all: bool = False
    #: the mode the caller asked (the trust check's), or None
    asked_mode: Optional[int] = None


#: The attribute a PermissionError carries its Refusal under.
REFUSAL = "_pyshmlock_refusal"


def refusal_of(e: BaseException) -> Optional[Refusal]:
    """The Refusal a PermissionError of pyshmlock carries, or None."""
    r = getattr(e, REFUSAL, None)
    return r if isinstance(r, Refusal) else None


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _stat_facts(path: str) -> Tuple[int, int, int]:
    """(owner uid, gid, mode) of the segment, or -1s if it cannot be seen."""
    try:
        st = os.stat(path)
    except OSError:
        return -1, -1, -1
    return st.st_uid, st.st_gid, st.st_mode & 0o7777


def _facts(name: str, uid: int, gid: int, mode: int) -> str:
    if uid < 0:
        return f"lock {name!r}"
    return f"lock {name!r} is owned by {_user(uid)}, group {_group(gid)}, mode {mode:04o}"


_VERBS = {"look": "read (look at)", "open": "open (read and write)", "remove": "remove"}


def access_error(name: str, need: str, err: int) -> PermissionError:
    """The PermissionError for a segment the system refused this process
    (EACCES, EPERM): who owns it, its mode, and how to get in."""
    path = segment_path(name)
    uid, gid, mode = _stat_facts(path)
    ours = uid == os.geteuid()
    shared = _group_name(gid) if uid >= 0 and mode & 0o060 == 0o060 else None
    me = _user(os.geteuid())
    if ours:
        fix = f"its mode gives its owner no access: chmod u+rw {path}"
    elif need == "look":
        fix = ("look as its owner or root, or have it created with mode=0o644 (any user "
               "may look then)")
    elif need == "remove":
        fix = "remove it as its owner, or as root"
    else:
        fix = "open it as its owner" + (
            f", or as a member of its group {shared!r}, with RWLock(name, mode=0o660, "
            f"group={shared!r})" if shared else "")
    e = PermissionError(err, f"{_facts(name, uid, gid, mode)}, and this process ({me}) may "
                             f"not {_VERBS.get(need, need)} it: {fix}", path)
    setattr(e, REFUSAL, Refusal(name, path, uid, gid, mode, need, ours, shared))
    return e


def untrusted_error(name: str, info: Any, mode: Optional[int], gid: int,
                    unlinking: bool = False) -> PermissionError:
    """The PermissionError for a segment this process refuses to trust
    (docs/DESIGN.md, "Trust model"): its owner, group and mode, and the
    opt-in that opens it, or whose it is."""
    path = segment_path(name)
    if info is None:   # unlink: describe the file as it is now
        uid, sgid, smode = _stat_facts(path)
    else:
        uid, sgid, smode = info.uid, info.gid, info.mode
    ours = uid == os.geteuid()
    facts = _facts(name, uid, sgid, smode)
    me = _user(os.geteuid())
    shared = _group_name(sgid) if uid >= 0 and smode & 0o020 else None
    asked = mode if mode is not None else 0o600
    open_to_all = bool(uid >= 0 and smode & 0o002 & ~asked)
    if unlinking:
        rule = ("unlink() looks inside only this user's locks: remove it as its owner "
                "(or, as root, without looking: force=True)")
        need = "remove"
    elif ours and open_to_all:
        rule = (f"it is this user's, but it lets every user write it, more than mode "
                f"{asked:04o}: open it with RWLock(name, mode=0o{smode & 0o777:o}) if that "
                "is meant, or remove it and let it be created again")
        need = "open"
    elif gid >= 0 and sgid != gid and smode & 0o020:
        rule = (f"its group is {_group(sgid)}, not the group asked for ({_group(gid)}): "
                f"open it with group={_group_name(sgid)!r}, or as its owner")
        need = "open"
    elif shared is not None and not ours:
        rule = (f"it is shared with group {shared!r}: its members (and root) open it with "
                f"RWLock(name, mode=0o{smode & 0o777:o}, group={shared!r}), or run as its "
                f"owner (this process is {me})")
        need = "open"
    else:
        rule = (f"a lock is opened only by its owner (or, with group=, members of its "
                f"group), and this process is {me}: run as its owner. If no user but this "
                "one should own it, another may have created it first to capture the lock: "
                "remove it (as root) and start the servers again. See 'Trust model' in "
                "docs/DESIGN.md")
        need = "open"
    e = PermissionError(_errno.EPERM, f"{facts}; {rule}", path)
    setattr(e, REFUSAL, Refusal(name, path, uid, sgid, smode, need, ours, shared,
                                open_to_all, mode))
    return e


#: Segment layout -> the releases that use it (CHANGELOG.md's table).
LAYOUT_RELEASES = {1: "0.1.x", 2: "0.2.x", 3: "0.3.x", 4: "0.4.x"}


def layout_error(name: str, info: Any) -> LayoutVersionError:
    """The LayoutVersionError of a segment of another layout, naming who
    still uses it and what to do."""
    mine = lib.SHL_LAYOUT_VERSION
    other = info.layout
    rel = LAYOUT_RELEASES.get(other, "another release")
    what = (f"lock {name!r} is a layout-{other} lock (pyshmlock {rel}); this pyshmlock "
            f"uses layout {mine}, and releases of different layouts cannot share a lock")
    if info.live == 0xFFFFFFFF:
        return LayoutVersionError(f"{what}; its users cannot be read. Stop every process of "
                                  f"the old release, then `pyshmlock rm --force {name}`")
    if info.live:
        return LayoutVersionError(
            f"{what}, and {info.live} process(es) of the old release still use it (pid "
            f"{info.live_pid}). Stop them (upgrade every process of the host together); "
            f"or `pyshmlock rm --force {name}` to replace it now (they keep the old lock). "
            "See 'Upgrading' in docs/OPERATIONS.md")
    return LayoutVersionError(f"{what}; no process uses it any more: opening it with "
                              f"create=True replaces it, as does `pyshmlock rm {name}`")


def slots_refusal(name: str, has: int, asked: int) -> "TooManyProcessesError":
    """An opener asked for more process slots than the lock it must keep has."""
    return TooManyProcessesError(
        f"lock {name!r} has max_processes={has} (fixed when it was created); this "
        f"process asked for max_processes={asked}. A lock is re-created at the size "
        "asked for only while no process has it open and it holds no pause, hold, "
        "update session, lease, fence or data-suspect mark: see who uses it "
        f"(`pyshmlock status {name}`), stop them, then `pyshmlock rm {name}` and "
        "start again")


def open_error(rc: int, name: str, info: Any, mode: int, gid: int,
               max_processes: int = 0) -> BaseException:
    """The exception for shl_open's return code rc (info: its shl_open_info)."""
    if rc == lib.SHL_EVERSION:
        return layout_error(name, info)
    if rc == lib.SHL_EFULL and info.max_processes and max_processes > info.max_processes:
        return slots_refusal(name, info.max_processes, max_processes)
    if rc == lib.SHL_EFULL and info.max_processes:
        return TooManyProcessesError(
            f"lock {name!r}: all {info.max_processes} process slots are taken by live "
            f"processes (max_processes={info.max_processes}, fixed when the lock was "
            "created)")
    if rc == lib.SHL_ESYS and ffi.errno == _errno.ENOSPC:
        size = lib.shl_segment_size(max_processes) if max_processes else 0
        need = f" for its {size}-byte segment (max_processes={max_processes})" if size else ""
        return OSError(_errno.ENOSPC,
                       f"lock {name!r}: no space left in /dev/shm{need}; nothing was "
                       "created. Free space there, or give it more (a container's "
                       "/dev/shm is 64 MB by default: docker run --shm-size, or a larger "
                       "tmpfs); `df -h /dev/shm` shows what is left",
                       segment_path(name))
    if rc == lib.SHL_ENOROBUST:
        return NoCrashRecoveryError(
            f"lock {name!r}: this platform has no robust futexes (set_robust_list is not "
            "available, as under qemu-user emulation), so a process that died holding the "
            "lock would never be reclaimed and every other process would wait for it for "
            "ever. Run on a real Linux kernel, or run without crash recovery by choice: "
            "RWLock(name, allow_no_robust=True), or PYSHMLOCK_ALLOW_NO_ROBUST=1 in the "
            "environment")
    if rc == lib.SHL_ESYS and ffi.errno == _errno.EMFILE:
        return OSError(_errno.EMFILE,
                       f"lock {name!r}: too many open files: every open lock keeps one file "
                       "descriptor (the liveness lock that tells other processes this one "
                       "runs); raise the limit (`ulimit -n`, "
                       "resource.setrlimit(resource.RLIMIT_NOFILE, ...)) or close locks no "
                       "longer used", segment_path(name))
    if rc == lib.SHL_EPERM:
        return untrusted_error(name, info, mode, gid)
    if rc == lib.SHL_ESIZE:
        return SegmentSizeError(
            f"lock {name!r}: the segment is {info.size} bytes, but its header describes "
            f"a {info.expected_size}-byte lock; something truncated or extended it")
    return error_for(rc, "open", name, info.corrupt)
