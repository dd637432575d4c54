"""Waiting for the hosts: what a controller's call does between its write
and its return (docs/DESIGN.md §11, "Acknowledgements" and "Waiting").

Each host's newest report for its registration comes by datagram
(``_acks.AckReceiver``) or from its registration in the controller's watched
copy, whichever mirrored later; a call re-checks, at each report, only the
host that sent it.  A host that does not answer is lost once its etcd lease
shows its agent silent, with the bound its own lease keeps; hosts not heard
directly after ``PATIENCE`` are asked (``ctl/ackreq``) to write their
reports in etcd.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Set

from ._acks import PATIENCE, AckReceiver, Report
from ._calls import PauseResult, Registered, left
from ._errors import ClusterError
from ._keys import CURRENT, State, as_bool, as_dict, as_int, dumps

if TYPE_CHECKING:
    from ._controller import AsyncCluster

__all__ = ["PROBE_AFTER", "PROBE_EVERY", "SILENT_INTERVALS", "HostWaits", "Outcome",
           "report_locks"]

#: A call asks etcd about the leases of hosts it still waits for once it has
#: waited this long, and again this often.
PROBE_AFTER, PROBE_EVERY = 0.5, 0.5
#: A host whose etcd lease was last renewed this many keep-alive intervals
#: (plus a second, etcd counts whole seconds) ago counts as silent.
SILENT_INTERVALS = 3


def report_locks(rep: Report) -> Dict[str, Dict[str, Any]]:
    return {k: v for k, v in as_dict(rep.get("locks")).items() if isinstance(v, dict)}


def _done(rep: Report, rev: int, want: str) -> bool:
    """Whether a host's report answers a call at gate revision ``rev``:
    paused (and drained) at or after it, or, for a resume, reopened (every
    lock open, or kept paused for a reason of its own)."""
    if as_int(rep.get("mirrored"), -1) < rev:
        return False
    if want == "open":
        locks = report_locks(rep)
        if not locks:
            return not as_bool(rep.get("paused"))
        return all(not as_bool(v.get("paused")) or v.get("standing", CURRENT) != CURRENT
                   or as_bool(v.get("suspect")) for v in locks.values())
    return as_bool(rep.get("paused")) and (want != "drained" or as_bool(rep.get("drained")))


@dataclass
class Outcome:
    acked: List[str]
    lost: Dict[str, float]         # host -> monotonic time by which it is closed
    reports: Dict[str, Report]


def _settle(w: asyncio.Future[None]) -> None:
    if not w.done():
        w.set_result(None)


class HostWaits:
    """The waiting side of one controller (``AsyncCluster.waits``)."""

    def __init__(self, c: AsyncCluster) -> None:
        self.c = c
        self.receiver: Optional[AckReceiver] = None
        self._waiters: Set[asyncio.Future[None]] = set()

    def notify(self) -> None:
        """A change: wake every waiting call (in the loop)."""
        waiters, self._waiters = self._waiters, set()
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def wait_change(self, timeout: float) -> None:
        """Until the watched copy changes, a host reports, or ``timeout``.
        One future and one timer (a wait at each of N reports); awaiting a
        future never swallows a cancellation."""
        if timeout <= 0:
            return
        loop = asyncio.get_running_loop()
        w: asyncio.Future[None] = loop.create_future()
        self._waiters.add(w)
        timer = loop.call_later(timeout, _settle, w)
        try:
            await w
        finally:
            timer.cancel()
            self._waiters.discard(w)

    def report(self, st: State, host: str, registration: int) -> Optional[Report]:
        """The newest report of ``host``'s agent for this registration: its
        datagram or its registration in etcd, whichever mirrored later."""
        best: Optional[Report] = None
        if st.host_create.get(host) == registration:
            best = st.hosts[host]
        if self.receiver is not None:
            direct = self.receiver.report(host, registration)
            if direct is not None and (best is None or as_int(direct.get("mirrored"), -1)
                                       >= as_int(best.get("mirrored"), -1)):
                best = direct
        return best

    async def closing(self, lease: int, gone: bool, ttl_hint: float) -> Optional[float]:
        """How long the host holding ``lease`` may still admit, by its own
        lease (it renews the local one only while etcd renews this one):
        for a host whose registration is ``gone``, always an answer; for a
        host still registered, only if its agent stopped renewing (several
        keep-alives missed, per etcd), else None (it looks alive)."""
        from .agent import LOCAL_FRACTION, keepalive_interval
        try:
            ttl, granted = await self.c.etcd.lease_ttl(lease,
                                                     deadline=time.monotonic() + PROBE_EVERY)
        except ClusterError:
            return LOCAL_FRACTION * ttl_hint + 1.0 if gone else None
        if ttl < 0:
            return 0.0                   # expired (-1): the local lease ran out before
        # (0 means under a second left, not gone: etcd truncates to seconds)
        if granted <= 0:
            return LOCAL_FRACTION * ttl_hint + 1.0 if gone else None
        silent_for = granted - ttl       # etcd counts whole seconds: up to 1 s more
        if not gone and silent_for < SILENT_INTERVALS * keepalive_interval(granted) + 1:
            return None
        return max(0.0, LOCAL_FRACTION * granted - silent_for + 1.0)

    async def await_hosts(self, rev: int, registered: Registered, want: str,
                           deadline: Optional[float], t0: float) -> Optional[Outcome]:
        """Wait until every host in ``registered`` reported ``want`` ("paused",
        "drained" or "open") at gate revision ``rev`` or later, or is lost
        (its registration gone, or its agent silent).  None: the gate was
        reopened (paused, for "open") by someone else first."""
        m = self.c.mirror
        lost: Dict[str, float] = {}
        probes: Dict[str, asyncio.Task[Optional[float]]] = {}
        probed: Dict[str, float] = {}
        gone: Set[str] = set()
        ttls: Dict[str, float] = {}

        def probe(hid: str) -> None:
            t = asyncio.ensure_future(self.closing(registered[hid][1], hid in gone,
                                                    ttls.get(hid, 10.0)))
            t.add_done_callback(lambda _t: self.notify())
            probes[hid] = t
            probed[hid] = time.monotonic()

        # What each host last showed: re-checked all at a change of the
        # watched copy, else only the hosts that sent a report since (a pause
        # of N hosts is N reports: checking all N at each was N^2).
        done: Dict[str, Report] = {}
        seen_version, pos = -1, 0
        asked = -1e9
        try:
            while True:
                if m.fatal is not None:
                    raise m.fatal
                st = m.state
                now = time.monotonic()
                if st.revision >= rev and st.gate_rev > rev and st.paused == (want == "open"):
                    return None
                for hid, t in list(probes.items()):
                    if t.done():
                        del probes[hid]
                        closing = None if t.cancelled() or t.exception() else t.result()
                        if closing is not None:
                            lost[hid] = now + closing
                        elif hid in gone:
                            lost[hid] = now
                rcv = self.receiver
                changed = rcv.changed_since(pos) if rcv is not None else []
                if rcv is not None:
                    pos = rcv.position
                if m.version != seen_version or changed is None:
                    seen_version = m.version
                    check: Any = registered
                else:
                    check = set(changed)
                for hid in check:
                    if hid not in registered or hid in lost or hid in gone:
                        continue
                    cr, lease = registered[hid]
                    reg = st.hosts.get(hid)
                    if reg is not None:
                        ttls[hid] = float(as_int(reg.get("ttl"), 10))
                    if st.revision >= rev and st.host_create.get(hid) != cr:
                        # Gone (expired, evicted, replaced): closed by its own
                        # lease; how soon, its lease in etcd says.
                        gone.add(hid)
                        done.pop(hid, None)
                        if lease:
                            silent = probes.pop(hid, None)
                            if silent is not None:
                                silent.cancel()
                            probe(hid)
                        else:
                            lost[hid] = now
                        continue
                    rep = self.report(st, hid, cr)
                    if rep is not None and _done(rep, rev, want):
                        done[hid] = rep
                    else:
                        done.pop(hid, None)
                pending = [h for h in registered if h not in done and h not in lost
                           and h not in gone]
                if not pending and not (gone - set(lost)):
                    acked = sorted(h for h in done if h not in lost)
                    return Outcome(acked, lost, {h: done[h] for h in acked})
                if now - t0 >= PROBE_AFTER:
                    for hid in pending:
                        if registered[hid][1] and hid not in probes and \
                                now - probed.get(hid, -1e9) >= PROBE_EVERY:
                            probe(hid)
                if pending and now - t0 >= PATIENCE and now - asked >= 2 * PATIENCE:
                    # Not heard directly (a datagram lost, a firewall): ask
                    # these hosts to write their reports in etcd.
                    asked = now
                    self.c._background(self.ask_for_reports(pending, rev, deadline))
                if deadline is not None and now >= deadline:
                    pending += sorted(gone - set(lost))
                    what = {"paused": "acknowledgements", "drained": "drained "
                            "acknowledgements", "open": "hosts to reopen"}[want]
                    raise self.c._timeout(
                        f"timed out waiting for {what} from {sorted(pending)}"
                        + (" (the gate is paused)" if want != "open" else ""),
                        sorted(pending), took_effect=True)
                await self.wait_change(left(deadline, PROBE_EVERY))
        finally:
            for t in probes.values():
                t.cancel()

    async def ask_for_reports(self, hosts: List[str], rev: int,
                               deadline: Optional[float]) -> None:
        e = self.c.etcd
        end = time.monotonic() + 2 * PATIENCE
        try:
            await e.txn([], [e.op_put(self.c.keys.ackreq, dumps(
                {"hosts": sorted(hosts), "rev": rev, "by": self.c.who, "at": time.time()}))],
                deadline=end if deadline is None else min(end, deadline))
        except ClusterError:
            pass                    # the next round of the wait asks again

    def result(self, rev: int, out: Outcome, drain: bool, t0: float) -> PauseResult:
        now = time.monotonic()
        unused, behind = [], []
        for hid, rep in out.reports.items():
            locks = report_locks(rep)
            if any(as_int(v.get("users"), 1) == 0 for v in locks.values()) or \
                    (not locks and as_int(rep.get("users"), 1) == 0):
                unused.append(hid)
            if any(v.get("standing", CURRENT) != CURRENT for v in locks.values()) or \
                    (not locks and as_bool(rep.get("behind"))):
                behind.append(hid)
        return PauseResult(rev, out.acked, sorted(out.lost), drain, False, now - t0,
                           sorted(unused), sorted(behind),
                           {h: round(max(0.0, t - now), 3) for h, t in sorted(out.lost.items())})

