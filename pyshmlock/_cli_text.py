"""What the `pyshmlock` command says about a lock: the text of `status`
(format_status, with its session and STALE lines) and a refused segment
made into command lines that work (refusal_text: `sudo -u OWNER pyshmlock
...`, the --group/--mode opt-in), so that cli.py keeps the commands."""
import datetime
import grp
import os
import pwd
import shlex
import time
from typing import List, Optional

from ._args import segment_path
from .errors import Refusal
from .info import LockInfo


def _when(ts: Optional[float]) -> str:
    if not ts:
        return "-"
    dt = datetime.datetime.fromtimestamp(ts)
    return f"{dt:%Y-%m-%d %H:%M:%S} ({time.time() - ts:.1f} s ago)"


def pauser_text(info: LockInfo) -> str:
    pid = info.paused_by_pid
    if not pid:
        return "an unknown pid"
    if pid in info.attached_pids:
        return f"pid {pid} (attached)"
    if info.paused_by_alive:
        return f"pid {pid} (running, not attached)"
    return f"pid {pid} (exited)"


def _in(seconds: float) -> str:
    return f"{seconds:.0f} s" if abs(seconds) < 600 else f"{seconds / 60:.0f} min"


def session_text(info: LockInfo) -> str:
    """The update session that pins the pause, for status and refusals."""
    se = info.session
    assert se is not None
    owner = f"pid {se.pid} ({'running' if se.alive else 'exited'})"
    when = (f"expires in {_in(se.expires_in)}" if se.expires_in > 0 else
            f"expired {_in(-se.expires_in)} ago (ended, data suspect, by the next attached "
            f"process or `pyshmlock resume {info.name}`)")
    return f"token {se.token}, begun by {owner} at {_when(se.began_at)}; {when}"


def format_status(info: LockInfo) -> str:
    """The human-readable form of a LockInfo."""
    dead = set(info.dead_pids)

    def who(pid: int) -> str:
        return f"pid {pid}{' (dead)' if pid in dead else ''}"

    lines = [f"lock {info.name}"]
    if info.paused:
        lines.append(f"  paused        yes, by {pauser_text(info)} since {_when(info.paused_at)}")
    else:
        lines.append("  paused        no")
    if info.writer_pid or info.updater_pid:
        kind = "write" if info.writer_pid else "update"
        pid = info.writer_pid or info.updater_pid or 0
        n = sum(info.readers.values())
        state = ("held" if info.exclusive_granted else
                 f"claimed, waiting for {n} reader{'' if n == 1 else 's'}" if n else
                 "claimed, waiting for readers")
        lines.append(f"  exclusive     {kind} by {who(pid)} ({state})")
    else:
        lines.append("  exclusive     none")
    if info.session is not None:
        lines.append(f"  session       {session_text(info)}")
    reads = ", ".join(f"{who(p)}: {n}" for p, n in sorted(info.readers.items())) or "none"
    lines.append(f"  read holds    {reads}")
    waits = ", ".join(f"pid {p}: {n}" for p, n in sorted(info.waiters.items())) or "none"
    lines.append(f"  waiting       {waits}")
    if info.queued_readers:
        q = ", ".join(f"{who(p)}: {n}" for p, n in sorted(info.queued_readers.items()))
        lines.append(f"  queued reads  {q}")
    lines.append(f"  attached      {len(info.attached_pids)} of {info.max_processes} "
                 f"process slots ({', '.join(map(str, info.attached_pids))})")
    exiting = [p.pid for p in info.processes if p.exiting]
    if exiting:
        lines.append(f"  exiting       {', '.join(map(str, exiting))} (their keeper thread is "
                     "gone, the process still runs: their holds stand until it is gone)")
    if info.dead_pids:
        lines.append(f"  died attached {', '.join(map(str, info.dead_pids))} (their holds "
                     "count until an attached process reclaims them)")
    if info.stale:
        lines.append(f"  STALE         {stale_text(info)}")
    lines.append(f"  epoch         {info.epoch}   pauses so far: {info.pause_count}")
    if info.data_suspect:
        lines.append("  DATA SUSPECT  an exclusive holder died mid-update, or an update session "
                     "expired or was ended as lost; cleared by the next completed "
                     f"write/update, or `pyshmlock resume --force {info.name}`")
    if not info.crash_recovery:
        lines.append("  CRASH RECOVERY off: this platform has no robust futexes (as under "
                     "qemu-user); a process that dies holding the lock is never reclaimed")
    if info.recoveries:
        lines.append(f"  recoveries    {info.recovery_count} (latest shown)")
        for r in info.recoveries:
            if r.lost == ("update session",):
                lines.append(f"    update session of pid {r.pid} ended unfinished (expired, "
                             f"or ended as lost) at {_when(r.when)}")
                continue
            lines.append(f"    pid {r.pid} died holding {', '.join(r.lost)}"
                         f"{f' ({r.reads} reads)' if r.reads else ''} at {_when(r.when)}")
    return "\n".join(lines)


def stale_text(info: LockInfo) -> str:
    """What a stale lock left behind and what the next opener does about it
    (one definition for status, OPERATIONS and the metrics)."""
    left, will = [], []
    if "pause" in info.stale_left:
        left.append(f"a pause by {pauser_text(info)}")
        if info.session is not None:
            will.append("the pause stays: an update session pins it until its end or expiry")
        elif info.lease_remaining is not None:
            will.append("the pause stays: a host lease is armed (its cluster agent decides)")
        else:
            will.append("with stale='reset' (the default) it also clears the pause")
    if "holds of dead processes" in info.stale_left:
        pids = ", ".join(map(str, info.dead_pids)) or "?"
        left.append(f"holds or claims of dead pid {pids}")
    return (f"nobody is attached; left behind: {' and '.join(left)}. Dead processes' holds "
            "are reclaimed by the first attached process that waits on them or looks at "
            "the lock" + (f"; the next opener: {will[0]}" if will else ""))


def _sudo_user(uid: int) -> str:
    """How `sudo -u` names the user uid."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"#{uid}"


def owner_prefix(name: str) -> str:
    """The prefix that makes a command run by someone who may remove the
    lock's file: nothing for its owner and root, `sudo -u OWNER ` for anyone
    else (/dev/shm is sticky: only they may remove a file there)."""
    try:
        owner = os.stat(segment_path(name)).st_uid
    except OSError:
        return ""
    me = os.geteuid()
    return "" if me in (0, owner) else f"sudo -u {_sudo_user(owner)} "


#: The commands that take --group and --mode (they open the lock).
OPENING_COMMANDS = ("pause", "resume", "session")


def _with_opt_in(argv: List[str], group: Optional[str], mode: int) -> List[str]:
    """argv with --group/--mode set to the given opt-in (any given before
    are replaced), before a '--' if there is one."""
    out, k = [], 0
    while k < len(argv):
        a = argv[k]
        if a in ("--group", "--mode"):
            k += 2
            continue
        if a.startswith(("--group=", "--mode=")):
            k += 1
            continue
        out.append(a)
        k += 1
    extra = (["--group", group] if group else []) + ["--mode", f"{mode:04o}"]
    cut = out.index("--") if "--" in out else len(out)
    return out[:cut] + extra + out[cut:]


def unreadable_text(r: Refusal) -> str:
    """A lock `ls` may not look at, on its line: whose it is, its mode and
    the command that shows it (as its owner)."""
    return (f"not readable by uid {os.geteuid()}: owned by uid {r.uid} ({_sudo_user(r.uid)}), "
            f"mode {r.mode:04o}; `sudo -u {_sudo_user(r.uid)} pyshmlock status {r.name}`")


def refusal_text(r: Refusal, argv: List[str]) -> str:
    """What the command says when the lock's segment is refused: whose it
    is, its mode, and the command lines that work (the same command as its
    owner; with the opt-in that opens it, where this user may use it)."""
    me = os.geteuid()
    who = f"uid {me} ({_sudo_user(me)})"
    facts = (f"lock {r.name!r} is owned by uid {r.uid} ({_sudo_user(r.uid)}), group gid "
             f"{r.gid} ({_group_label(r.gid)}), mode {r.mode:04o}" if r.uid >= 0 else
             f"lock {r.name!r}")
    verb = {"look": "look at", "open": "open", "remove": "remove"}.get(r.need, r.need)
    fixes: List[str] = []
    opening = bool(argv) and argv[0] in OPENING_COMMANDS
    if r.ours and r.open_to_all and opening:
        why = "it lets every user write it; if that is meant"
        fixes.append("pyshmlock " + shlex.join(_with_opt_in(argv, None, r.mode & 0o777)))
    elif r.ours:
        why = "its mode gives its owner no access"
        fixes.append(f"chmod u+rw {r.path}")
    else:
        if r.need == "look":
            why = f"looking needs read permission, which mode {r.mode:04o} does not give it"
        elif r.need == "remove":
            why = ("only its owner and root may remove it, and `rm` looks inside only its "
                   "own user's locks")
        else:
            why = "a lock is opened only by its owner" + (
                f" or, with --group, by members of its group {r.shared_group!r}"
                if r.shared_group else "")
        member = me == 0 or r.gid in os.getgroups() or r.gid == os.getegid()
        if r.shared_group and r.need == "open" and opening and member:
            fixes.append("pyshmlock " + shlex.join(
                _with_opt_in(argv, r.shared_group, r.mode & 0o777)))
        fixes.append(f"sudo -u {_sudo_user(r.uid)} pyshmlock {shlex.join(argv)}")
        if r.need == "remove" and me == 0 and "--force" not in argv:
            fixes.append(f"pyshmlock rm --force {shlex.quote(r.name)}")
    run = " or ".join(f"`{f}`" for f in fixes)
    return f"{facts}, and this user ({who}) may not {verb} it ({why}): {run}"


def _group_label(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)
