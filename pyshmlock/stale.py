"""Stale segments: the opener's policy for a pause that no live process
stands behind, and the /proc check of whether a pid still runs."""
import os
from typing import Any, Optional

from ._shmlock import ffi, lib
from .errors import error_for

#: What an opener does with a stale segment (see RWLock, docs/OPERATIONS.md).
STALE_POLICIES = ("reset", "keep")


def check_stale(stale: Any) -> str:
    """Return ``stale`` if it is a stale-segment policy, else raise ValueError
    (TypeError if it is not a str)."""
    if not isinstance(stale, str):
        raise TypeError(f"stale must be one of {STALE_POLICIES}, not {type(stale).__name__}")
    if stale not in STALE_POLICIES:
        raise ValueError(f"stale must be one of {STALE_POLICIES}, not {stale!r}")
    return str(stale)


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
        # Not in our /proc: gone, or hidden from us (/proc mounted hidepid=2
        # hides other users' processes).  kill() with no signal tells.
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except OSError:
            pass                  # EPERM: it runs, as another user
        return True
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
    if rc != lib.SHL_OK:
        raise error_for(rc, "open", name)
    if not snap.paused or not snap.paused_by_pid:
        return
    if _pid_running(snap.paused_by_pid, snap.paused_at_ns / 1e9 or None):
        return
    rc = lib.shl_reset_stale(h, snap.paused_by_pid)
    if rc < 0:
        raise error_for(rc, "open", name)

