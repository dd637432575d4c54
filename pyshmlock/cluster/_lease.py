"""The host lease of a local lock (layout 2): the agent's dead-man switch.

The agent arms a CLOCK_MONOTONIC deadline in the segment and keeps pushing
it forward while it is in contact with etcd.  The C core's lease watchdog
thread, in every process attached to the lock, pauses the gate once the
deadline has passed, a process that opens the lock after that pauses before
``open`` returns, and the stale-segment reset never clears a pause while a
lease is armed.  So a host whose agent died, was stopped or lost etcd stops
admitting new reads without the agent's help.  Read admission is untouched.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

from .._shmlock import ffi, lib
from ..errors import error_for

__all__ = ["KEEPER_POLL_S", "lease_arm", "lease_disarm", "lease_info", "lease_remaining"]

#: How often each attached process's watchdog checks an armed lease (C core;
#: every 0.25 s while no open lock has a lease, never while none is open).
KEEPER_POLL_S = 0.020


def _h(lock: Any) -> Any:
    return lock._handle()


def _check(rc: int, what: str, lock: Any) -> None:
    if rc < 0:
        raise error_for(rc, what, lock.name)


def lease_arm(lock: Any, seconds: float) -> None:
    """Set the lease deadline ``seconds`` from now (may be <= 0: expire now)."""
    info = ffi.new("shl_lease_info *")
    _check(lib.shl_lease_get(_h(lock), info), "lease", lock)
    deadline = int(info.now_ns + seconds * 1e9)
    _check(lib.shl_lease_set(_h(lock), deadline if deadline != 0 else 1), "lease", lock)


def lease_disarm(lock: Any) -> None:
    """No lease: the lock no longer pauses on its own (leaving cluster mode)."""
    _check(lib.shl_lease_set(_h(lock), 0), "lease", lock)


def lease_remaining(lock: Any) -> float:
    """Seconds until the lease runs out (<= 0: it has, or none is armed)."""
    info = ffi.new("shl_lease_info *")
    _check(lib.shl_lease_get(_h(lock), info), "lease", lock)
    return (info.deadline_ns - info.now_ns) / 1e9 if info.deadline_ns != 0 else 0.0


def lease_info(lock: Any) -> Dict[str, Optional[float]]:
    info = ffi.new("shl_lease_info *")
    _check(lib.shl_lease_get(_h(lock), info), "lease", lock)
    armed = info.deadline_ns != 0
    return {"armed": armed,
            "remaining": (info.deadline_ns - info.now_ns) / 1e9 if armed else None,
            "pid": info.pid or None,
            "expiries": info.expiries}
