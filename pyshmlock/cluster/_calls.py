"""What every controller call shares: its results (``PauseResult``,
``ClusterStatus``), its deadline, its clean-ups that outlive a cancelled
call, and the note an exception gets when it leaves the fleet paused."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

from ._errors import ClusterError
from ._keys import Keys

__all__ = ["ClusterStatus", "PauseResult", "Registered", "add_note", "deadline_of",
           "finish_cleanup", "left", "registered_of", "set_effect", "spawn"]

_live: Set[asyncio.Task[Any]] = set()     # clean-ups that must outlive a cancelled call


def spawn(coro: Any) -> asyncio.Task[Any]:
    t: asyncio.Task[Any] = asyncio.ensure_future(coro)
    _live.add(t)
    t.add_done_callback(_live.discard)
    return t


async def finish_cleanup(coro: Any) -> None:
    """Run a clean-up to its end even if the caller is cancelled again (the
    wait is shielded; the clean-up task keeps going on its own)."""
    t = spawn(coro)
    try:
        await asyncio.shield(t)
    except asyncio.CancelledError:
        pass
    except Exception:
        pass


def add_note(exc: BaseException, note: str) -> None:
    """PEP 678's add_note (Python 3.11+); before, the same ``__notes__``."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:   # pragma: no cover (Python < 3.11)
        notes = list(getattr(exc, "__notes__", []))
        notes.append(note)
        try:
            exc.__dict__["__notes__"] = notes
        except AttributeError:
            pass


@dataclass
class PauseResult:
    revision: int                      # the gate revision every acknowledged host mirrored
    acknowledged: List[str] = field(default_factory=list)
    lost: List[str] = field(default_factory=list)      # registered at the pause, gone or silent
    drained: bool = False
    superseded: bool = False           # never True: a returned pause() means paused
    seconds: float = 0.0
    unused: List[str] = field(default_factory=list)    # hosts with a lock no process uses
    behind: List[str] = field(default_factory=list)    # hosts with a lock behind the fleet
    #: a lost host admits no new read later than this many seconds after the
    #: result (its own lease closes it; 0: already closed)
    closing: Dict[str, float] = field(default_factory=dict)


@dataclass
class ClusterStatus:
    revision: int
    paused: bool
    gate: Dict[str, Any]
    gate_revision: int
    update: Optional[Dict[str, Any]]
    update_token: int
    hosts: Dict[str, Dict[str, Any]]
    paused_by: Optional[str] = None
    paused_at: Optional[float] = None          # wall-clock time of the pause
    paused_for: Optional[float] = None         # seconds since then
    paused_by_alive: Optional[bool] = None     # None: a one-shot command (no session)
    update_by_alive: Optional[bool] = None
    generation: Dict[str, Any] = field(default_factory=dict)
    evicted: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    controllers: Dict[str, Dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        return {"revision": self.revision, "paused": self.paused, "gate": self.gate,
                "gate_revision": self.gate_revision, "update": self.update,
                "update_token": self.update_token, "hosts": self.hosts,
                "paused_by": self.paused_by, "paused_at": self.paused_at,
                "paused_for": self.paused_for, "paused_by_alive": self.paused_by_alive,
                "update_by_alive": self.update_by_alive, "generation": self.generation,
                "evicted": self.evicted, "controllers": self.controllers}


def deadline_of(timeout: Optional[float]) -> Optional[float]:
    if timeout is None:
        return None
    if timeout != timeout or timeout < 0:
        raise ValueError("timeout must be None or >= 0")
    return time.monotonic() + timeout


def left(deadline: Optional[float], cap: float) -> float:
    if deadline is None:
        return cap
    return max(0.0, min(cap, deadline - time.monotonic()))


#: host id -> (its registration's create revision, its lease)
Registered = Dict[str, Tuple[int, int]]


def registered_of(keys: Keys, kvs: List[Dict[str, Any]]) -> Registered:
    return {kv["key"][len(keys.hosts):]: (kv["create_revision"], kv["lease"]) for kv in kvs
            if kv["key"].startswith(keys.hosts)}


def set_effect(e: ClusterError, wrote: Optional[bool]) -> None:
    """The call's own took_effect: False before its write was sent (a
    session grant in flight is not the call's effect), True once it is
    written, and while it was in flight what the request layer knows."""
    if wrote is not None:
        e.took_effect = wrote


