"""Snapshots of a lock: :class:`LockInfo` and its parts, built by one
function from what the C core reports, whether the looker is attached
(``RWLock.info``) or only observes the segment read-only (:func:`inspect`)."""
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ._args import check_name
from ._shmlock import ffi, lib
from .errors import error_for
from .stale import _pid_running

_OK = lib.SHL_OK

_LOST_NAMES = (
    (lib.SHL_LOST_WRITE, "write"),
    (lib.SHL_LOST_UPDATE, "update"),
    (lib.SHL_LOST_CLAIM, "exclusive claim"),
    (lib.SHL_LOST_READS, "reads"),
    (lib.SHL_LOST_WAITERS, "queued readers"),
    (lib.SHL_LOST_PAUSE, "pause"),
    (lib.SHL_LOST_SESSION, "update session"),
)


@dataclass(frozen=True)
class SessionInfo:
    """The current update session of a lock (see RWLock.begin_session)."""

    token: int
    pid: int             # the process that began it (it may have exited since)
    began_at: float      # time.time() seconds
    expires_in: float    # seconds until it expires (<= 0: due now)
    #: Whether the process that began it still runs (attached, or running in
    #: this PID namespace).  Its exit ends nothing: only the session's end
    #: or its expiry does (or an operator's `pyshmlock session end`).
    alive: bool = True


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
    #: Its keeper thread is gone but the process still runs (the rest of a
    #: dying process, or a keeper that exited on its own): its holds stand
    #: until the whole process is gone, then they are reclaimed.
    exiting: bool = False


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
    #: Stale: no live process is attached, and the segment holds state left
    #: by processes that are gone (a pause whose pauser is gone, holds,
    #: claims or queued readers of dead processes).  ``stale_left`` says
    #: what: "pause", "holds of dead processes".  The next opener reclaims
    #: the holds; with ``stale="reset"`` (the default) it also clears the
    #: pause, unless an update session or a host lease keeps it.
    stale: bool = False
    stale_left: List[str] = field(default_factory=list)
    #: The update session that pins the pause, if any.
    session: Optional[SessionInfo] = None
    #: Update sessions that expired before their end.
    session_expiries: int = 0
    #: Cluster fencing: the highest fleet update token this host has seen,
    #: and the token of the last update applied through fenced_update.
    fence: int = 0
    applied_update: int = 0
    #: Host lease (cluster agent): seconds until it passes (negative:
    #: passed; None: no lease) and the pid that armed it.
    lease_remaining: Optional[float] = None
    lease_pid: Optional[int] = None
    #: Whether dead processes are reclaimed here: False where the platform
    #: has no robust futexes and the lock runs without crash recovery by
    #: choice (``allow_no_robust``, ``PYSHMLOCK_ALLOW_NO_ROBUST=1``).
    crash_recovery: bool = True

    def to_dict(self) -> Dict[str, Any]:
        """The snapshot as plain JSON-serialisable data."""
        d = dict(self.__dict__)
        d["processes"] = [dict(p.__dict__) for p in self.processes]
        d["readers"] = {str(k): v for k, v in self.readers.items()}
        d["waiters"] = {str(k): v for k, v in self.waiters.items()}
        d["queued_readers"] = {str(k): v for k, v in self.queued_readers.items()}
        d["recoveries"] = [dict(r.__dict__, lost=list(r.lost)) for r in self.recoveries]
        d["session"] = dict(self.session.__dict__) if self.session else None
        return d



# ------------------------------------------------------------- the builder

# read_slot(i, out) / read_recovery(k, out): the C call that fills one slot
# or recovery record of the segment looked at; SHL_OK or an error code.
_Reader = Callable[[int, Any], int]


def _add(counts: Dict[int, int], pid: int, n: int) -> None:
    if n:
        counts[pid] = counts.get(pid, 0) + n


def build_info(name: str, snap: Any, read_slot: _Reader, read_recovery: _Reader, *,
               observer: bool, reread: Optional[Callable[[Any], int]] = None) -> LockInfo:
    """The LockInfo of header snapshot ``snap`` and the slots and recovery
    records the readers return.

    An attached looker (``observer`` false) reclaims dead holders while it
    scans its slots, so it sees live slots only, and ``reread`` refreshes the
    header afterwards.  An observer changes nothing: it also sees slots of
    dead processes (``dead_pids``; their holds still count) and judges
    whether the segment is stale."""
    readers: Dict[int, int] = {}
    waiters: Dict[int, int] = {}
    queued: Dict[int, int] = {}
    live: List[int] = []
    dead: List[int] = []
    procs: List[AttachedProcess] = []
    slot = ffi.new("shl_slot_snapshot *")
    for i in range(snap.max_processes):
        rc = read_slot(i, slot)
        if rc != _OK:         # corrupted, or shrunk, since the look began
            raise error_for(rc, "inspect" if observer else "info", name)
        if not (slot.alive if not observer else (slot.pid or slot.readers or slot.owed)):
            continue                                  # free (or, attached, dead)
        if slot.alive:
            live.append(slot.pid)
            procs.append(AttachedProcess(
                pid=slot.pid, pid_namespace=slot.pidns, slot=i, readers=slot.readers,
                queued_readers=slot.owed, waiting=slot.waiting,
                is_self=bool(slot.is_self) and not observer, exiting=bool(slot.exiting)))
            _add(waiters, slot.pid, slot.waiting)
        else:
            dead.append(slot.pid)
        _add(readers, slot.pid, slot.readers)
        _add(queued, slot.pid, slot.owed)
    if reread is not None:
        reread(snap)       # slot scanning may have reclaimed a dead holder
    count = snap.recovery_count
    recoveries = _recoveries(read_recovery, count)
    pauser_alive = None
    if snap.paused:
        pauser_alive = (snap.paused_by_pid in live or
                        _pid_running(snap.paused_by_pid, snap.paused_at_ns / 1e9))
    owner = snap.exclusive_pid or None
    kind = snap.exclusive_kind
    suspect = bool(snap.data_suspect)
    stale = False
    stale_left: List[str] = []
    if observer:
        owner_dead = owner is not None and owner not in live
        # A granted exclusive holder that died makes the data suspect already;
        # the flag itself is set when an attached process reclaims the hold.
        suspect = suspect or (owner_dead and bool(snap.exclusive_granted))
        stale_left = []
        if not live and snap.paused and not pauser_alive:
            stale_left.append("pause")
        if not live and (dead or owner_dead):
            stale_left.append("holds of dead processes")
        stale = bool(stale_left)
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
        stale_left=stale_left,
        session=session_of(snap, live),
        session_expiries=snap.session_expiries,
        fence=snap.fence,
        applied_update=snap.applied,
        lease_remaining=snap.lease_remaining_ns / 1e9 if snap.lease_armed else None,
        lease_pid=(snap.lease_pid or None) if snap.lease_armed else None,
        crash_recovery=bool(snap.crash_recovery),
    )


def session_of(snap: Any, attached: Sequence[int] = ()) -> Optional[SessionInfo]:
    """The SessionInfo of a header snapshot (None: no session); ``attached``:
    the pids attached now (one of them began it: it runs)."""
    if not snap.session_token:
        return None
    began = snap.session_began_ns / 1e9
    pid = snap.session_pid
    return SessionInfo(token=int(snap.session_token), pid=pid, began_at=began,
                       expires_in=snap.session_remaining_ns / 1e9,
                       alive=pid in attached or _pid_running(pid, began))


def _recoveries(read_recovery: _Reader, count: int) -> List[Recovery]:
    """The last ``count`` recovery records (at most the ring's size)."""
    rec = ffi.new("shl_recovery_record *")
    n = min(count, lib.SHL_RECOVERY_LOG)
    out = []
    for k in range(count - n, count):
        read_recovery(k % lib.SHL_RECOVERY_LOG, rec)
        lost = tuple(label for bit, label in _LOST_NAMES if rec.what & bit)
        out.append(Recovery(pid=rec.pid, lost=lost, reads=rec.reads,
                            queued_readers=rec.owed, when=rec.when_ns / 1e9))
    return out


def attached_info(h: Any, name: str) -> LockInfo:
    """The snapshot an attached process takes (``RWLock.info``); looking
    also reclaims holds of processes found dead."""
    snap = ffi.new("shl_snapshot *")
    rc = lib.shl_info(h, snap)
    if rc != _OK:
        raise error_for(rc, "info", name)
    return build_info(name, snap,
                      lambda i, out: lib.shl_slot_info(h, i, out),
                      lambda k, out: lib.shl_recovery_info(h, k, out),
                      observer=False, reread=lambda s: lib.shl_info(h, s))


# ------------------------------------------------------------- observation

def inspect(name: str) -> LockInfo:
    """A snapshot of the lock ``name`` without attaching to it.

    The segment is read, never mapped (a shrink by its owner cannot crash
    the caller: it raises SegmentSizeError), so this needs only read permission, takes
    no process slot (it works when all ``max_processes`` are taken), never
    lists the caller, and never changes the lock.  Processes that died
    attached are reported in ``dead_pids`` (their holds still count until an
    attached process reclaims them).  FileNotFoundError if there is no such
    lock; UninitializedSegmentError at once for an empty segment.
    """
    check_name(name)
    out = ffi.new("shl_observer **")
    why = ffi.new("shl_corruption *")
    rc = lib.shl_observe_open(name.encode(), out, why)
    if rc != _OK:
        raise error_for(rc, "inspect", name, why)
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
    return build_info(name, snap,
                      lambda i, out: lib.shl_observe_slot(o, i, out),
                      lambda k, out: lib.shl_observe_recovery(o, k, out),
                      observer=True)
