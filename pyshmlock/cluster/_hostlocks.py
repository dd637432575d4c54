"""The locks of one host, as its agent drives them: one per engine.

Opening them fail-closed (the host setting first, then paused under an
already expired host lease), arming their host leases together, raising
their fences, and applying one state of the cluster to each: pause, drain,
or reopen when the lock is current against the fleet's last update, with
what each one did reported back (``HostLocks.apply``).  The agent
(``agent.py``) owns everything that talks to etcd.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Sequence, Tuple

from .._hostconf import read_setting, write_setting
from .._shmlock import lib
from ..errors import DataSuspectError
from ..lock import RWLock
from ._errors import ClusterError
from ._keys import CURRENT, State
from ._lease import KEEPER_POLL_S, lease_arm, lease_info, lease_remaining

__all__ = ["HostLocks"]


class _Local:
    """One lock of the host."""

    __slots__ = ("judged", "lock", "name", "standing", "suspect", "users", "users_at")

    def __init__(self, name: str, lock: RWLock) -> None:
        self.name, self.lock = name, lock
        self.suspect = False
        self.standing = CURRENT
        self.judged: Any = None       # what the standing was judged on
        self.users = -1
        self.users_at = -1e9


class HostLocks:
    def __init__(self, names: Sequence[str], cluster: str, endpoints: Any, host_id: str,
                 pid: int, log: Callable[[str], None]) -> None:
        self.names = list(names)
        self.pid, self.log = pid, log
        for name in self.names:
            prev = read_setting(name)
            if prev is not None and prev.get("cluster") not in (None, cluster):
                raise ClusterError(f"lock {name!r} belongs to cluster {prev.get('cluster')!r} "
                                   f"(its host setting says so); refusing to join {cluster!r}")
        # Fail closed from the start: paused, lease already expired.
        # stale="keep": the agent decides when this host's gate opens; a
        # pause left by a dead process is never cleared behind its back.
        # The host setting first: from then on a server that creates the
        # segment creates it paused under an expired lease (fail closed).
        self.locals: List[_Local] = []
        try:
            for name in self.names:
                self.setting = write_setting(name, cluster, endpoints, host_id, pid)
                lk = RWLock(name, stale="keep")
                self.locals.append(_Local(name, lk))
                lk.pause()
                lease_arm(lk, 0)
        except BaseException:
            self.close()
            raise
        self._fence = 0                       # raised this far at every lock
        self._fenced_for: Any = None          # the update (or its absence) it was raised for

    # ----------------------------------------------------------- leases
    def arm(self, seconds: float) -> None:
        """Every lock's host lease runs out ``seconds`` from now (<= 0: now)."""
        for loc in self.locals:
            lease_arm(loc.lock, seconds)

    def pause_all(self) -> None:
        for loc in self.locals:
            loc.lock.pause()

    def expiries(self) -> int:
        """How many times a lock's host lease ran out (the watchdog paused it)."""
        return sum(int(lease_info(loc.lock)["expiries"] or 0) for loc in self.locals)

    def close(self) -> None:
        for loc in self.locals:
            try:
                loc.lock.close()
            except Exception:
                pass

    # ------------------------------------------------------------ fences
    def raise_fences(self, st: State) -> None:
        """While an update holds the lock its token is current; otherwise
        every token up to this revision is stale (a later update's token is
        a later revision).  Raised when an update begins or ends, and before
        any lock reopens; a plain pause changes no update, so it is not
        raised then (it was, at every lock, on every change: on the path of
        every acknowledgement).  A fence never falls."""
        fence = st.update_token if st.update is not None else st.revision + 1
        update = st.update_token if st.update is not None else 0
        if fence > self._fence and (update != self._fenced_for or not st.paused):
            for loc in self.locals:
                loc.lock.raise_fence(fence)
            self._fence, self._fenced_for = fence, update

    # ------------------------------------------------------------- state
    def users(self, loc: _Local) -> int:
        """Processes other than the agent attached to the lock (at most one
        scan of the slots a second: it is not on a pause's critical path)."""
        t = time.monotonic()
        if t - loc.users_at >= 1.0:
            try:
                pids = loc.lock.info().attached_pids
                loc.users = len([p for p in pids if p != self.pid])
            except Exception:   # pragma: no cover
                loc.users = -1
            loc.users_at = t
        return loc.users

    def initial(self) -> Dict[str, Dict[str, Any]]:
        """What each lock reports before the first pass: paused."""
        return {loc.name: {"paused": True, "drained": False, "suspect": False,
                           "standing": CURRENT, "applied": loc.lock.applied_update,
                           "users": self.users(loc)} for loc in self.locals}

    def _open(self, loc: _Local) -> bool:
        """Resume a local gate, only while the local lease runs."""
        lk = loc.lock
        if lease_remaining(lk) <= 2 * KEEPER_POLL_S:
            return False
        try:
            opened = lk._resume_as_manager(0)
        except DataSuspectError:          # never forced: an update died on this host
            if not loc.suspect:
                self.log(f"lock {loc.name!r}: its data is suspect (an update died on this "
                         "host): staying paused until an update completes here")
            loc.suspect = True
            return False
        loc.suspect = False
        if not opened:
            return False        # a local update hold (a fenced update) pins the pause
        # Stopped between the check and the resume for longer than the lease?
        # Close again at once (the watchdogs would within one poll anyway).
        if lease_remaining(lk) <= 0:
            lk.pause()
            return False
        return True

    @staticmethod
    def _record_current(loc: _Local, token: int) -> bool:
        """Record in the lock that it has update ``token`` (its
        applied_update), as a completed fenced update would: a restarted
        agent then finds it current.  Done under the update hold, taken only
        while the lock is paused (granted at once, draining nothing) and its
        data is not suspect (the hold's release would clear a mark made
        before its claim: docs/DESIGN.md §11); False if it cannot be done now."""
        lk = loc.lock
        if not lk.paused or lk.info().data_suspect:
            return False
        if not lk.acquire_update(0):
            return False                # a local update holds it: later
        try:
            if lk.applied_update < token and lib.shl_fence_applied(lk._handle(), token) < 0:
                return False
        finally:
            lk.release_update()
        return True

    def apply(self, st: State, host_id: str, registration: int, closed: bool
              ) -> Tuple[Dict[str, Dict[str, Any]], bool, bool, bool]:
        """Apply the cluster's state to every lock: paused while the gate
        is, while the host is ``closed`` (evicted) or the lock is not current
        against the generation; drained if the gate asks; else open.
        Returns (each lock's report, all paused, all drained, poll again
        soon: a drain under way, or a lock that should open has not yet)."""
        updating = st.update is not None
        all_paused, all_drained, retry = True, True, False
        locks: Dict[str, Dict[str, Any]] = {}
        for loc in self.locals:
            lk = loc.lock
            applied = lk.applied_update
            standing = loc.standing
            judge = (st.generation_rev, applied, registration)
            if not updating and judge != loc.judged:   # (an update pauses every host anyway)
                standing, record = st.lock_standing(host_id, loc.name, applied, registration)
                loc.judged = judge if not record else None
                if standing != loc.standing:
                    self.log(f"lock {loc.name!r}: {standing} against the fleet's update "
                             f"{st.generation_token} (its lock has {applied})")
                loc.standing = standing
                if record:
                    if self._record_current(loc, st.generation_token):
                        applied = lk.applied_update
                    else:
                        retry = True          # current, but not opened before recorded
                        standing = "recording"
            drained = False
            paused = True
            if not (st.paused or closed) and standing == CURRENT:
                paused = not self._open(loc)
                retry = retry or (paused and not loc.suspect)
            else:
                lk.pause()
                if st.drain:
                    drained = lk.wait_drained(timeout=0)
                    retry = retry or not drained
            all_paused &= paused
            all_drained &= drained
            locks[loc.name] = {"paused": paused, "drained": drained, "suspect": loc.suspect,
                               "standing": loc.standing, "applied": applied,
                               "users": self.users(loc)}
        return locks, all_paused, all_drained, retry
