"""The host agent: mirrors the cluster gate in etcd into this host's lock.

One agent runs per host (``pyshmlock agent --etcd URLS --cluster NAME
--lock LOCAL_LOCK``).  It

1. opens the local lock, pauses it and arms the host lease already expired,
   so the host admits nothing before it knows the cluster's state;
2. takes an etcd lease of ``ttl`` seconds and keeps it alive; every
   successful keep-alive sent at time t pushes the local lease deadline to
   t + LOCAL_FRACTION * ttl, always before etcd can expire the lease;
3. reads the gate (linearizable), applies it locally (pause, drain if asked,
   or resume), then publishes its registration ``hosts/<id>`` (bound to its
   lease) with the gate revision it mirrored and whether it drained;
4. watches the gate and repeats.

If it dies, is stopped or loses etcd, the keep-alives stop and the local
lease runs out: the C core's lease watchdog in every process attached to the lock
pauses the gate by itself (docs/DESIGN.md, "Beyond one host").  If etcd
says its lease has expired, it pauses at once, registers afresh and only
then mirrors the current state again.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from typing import Any, List, Optional, Sequence

from ..lock import RWLock
from ._keys import Keys, read
from ._lease import KEEPER_POLL_S, lease_arm, lease_info
from ._store import EtcdError, LeaseNotFound, Store

__all__ = ["LOCAL_FRACTION", "Agent"]

#: The local lease runs out this fraction of the etcd TTL after the last
#: keep-alive was *sent*; etcd cannot expire the lease before a full TTL
#: after it *received* it, so the host is paused before it can be lost.
LOCAL_FRACTION = 0.75


class _Stop(BaseException):
    """Raised in the main thread by SIGTERM/SIGINT/SIGHUP."""


class Agent:
    def __init__(self, endpoints: Sequence[str] | str, cluster: str, lock: str, *,
                 host_id: Optional[str] = None, ttl: float = 2.0,
                 log: Any = None) -> None:
        if ttl < 1:
            raise ValueError("ttl must be at least 1 second (etcd leases count whole seconds)")
        self.keys = Keys(cluster)
        self.host_id = host_id or f"{socket.gethostname()}-{lock}"
        self.keys.host(self.host_id)          # validates the id
        self.ttl = float(ttl)
        self.store = Store(endpoints, op_timeout=max(1.0, ttl / 2),
                           request_timeout=max(0.5, ttl / 4))
        self.lock_name = lock
        self.log = log or (lambda msg: None)
        self._stop = threading.Event()
        self._relearn = threading.Event()      # the keep-alive saw the lease gone
        self._lease = 0
        self._lease_ttl = self.ttl
        self._lease_mu = threading.Lock()
        # 1. fail closed from the start: paused, lease already expired.
        # stale="keep": the agent decides when this host's gate opens; a
        # pause left by a dead process is never cleared behind its back.
        self.lock = RWLock(lock, stale="keep")
        self.lock.pause()
        lease_arm(self.lock, 0)
        self.mirrored = -1

    # ----------------------------------------------------------- lease
    def _grant(self) -> None:
        lease = self.store.lease_grant(self.ttl)
        with self._lease_mu:
            self._lease = lease
        self._relearn.clear()
        self.log(f"registered with lease {lease:x}")

    def _renew(self) -> bool:
        """One keep-alive; on success push the local deadline.  False: lost."""
        with self._lease_mu:
            lease = self._lease
        if not lease:
            return False
        sent = time.monotonic()
        left = self.store.lease_keepalive(lease, timeout=self.ttl / 4)
        if left <= 0:
            return False
        deadline = sent + LOCAL_FRACTION * min(self.ttl, float(left) if left else self.ttl)
        lease_arm(self.lock, deadline - time.monotonic())
        return True

    def _lost(self, why: str) -> None:
        self.lock.pause()                     # at once, not at the deadline
        lease_arm(self.lock, 0)
        with self._lease_mu:
            self._lease = 0
        self._relearn.set()
        self.log(f"lease lost ({why}): paused, registering again")

    def _keepalive_loop(self) -> None:
        while not self._stop.wait(self.ttl / 4):
            try:
                if self._lease and not self._renew():
                    self._lost("etcd says the lease expired")
            except EtcdError:
                pass       # the local deadline runs out on its own
            except Exception as e:
                self.log(f"keep-alive error: {e!r}")

    # ----------------------------------------------------------- mirror
    def _publish(self, rev: int, paused: bool, drained: bool) -> None:
        reg = {"host": self.host_id, "pid": os.getpid(), "lock": self.lock_name,
               "mirrored": rev, "paused": paused, "drained": drained, "at": time.time(),
               "lease_expiries": lease_info(self.lock)["expiries"]}
        with self._lease_mu:
            lease = self._lease
        if not lease:
            raise EtcdError("no lease")
        try:
            self.store.txn([], [self.store.op_put(self.keys.host(self.host_id),
                                                  json.dumps(reg), lease)])
        except LeaseNotFound:
            self._lost("etcd no longer has the lease")
            raise EtcdError("lease expired") from None
        self.mirrored = rev

    def _open_local(self) -> bool:
        """Resume the local gate: only right after a keep-alive sent after the
        gate was read succeeded, and only while the local lease runs."""
        if not self._renew():
            self._lost("expired before resume")
            return False
        while not self._stop.is_set():
            rem = lease_info(self.lock)["remaining"] or 0.0
            if rem <= 2 * KEEPER_POLL_S:
                return False
            if self.lock._resume_as_manager(timeout=min(0.1, rem / 2)):
                break
        # Stopped between the check and the resume for longer than the lease?
        # Close again at once (the watchdogs would within one poll anyway).
        if (lease_info(self.lock)["remaining"] or 0.0) <= 0:
            self.lock.pause()
            return False
        return True

    def step(self) -> int:
        """Read the gate once, apply it, publish; returns the revision read."""
        if self._relearn.is_set() or not self._lease:
            self.lock.pause()
            self._grant()
            if not self._renew():
                raise EtcdError("fresh lease expired at once")
        snap = read(self.store, self.keys)
        drained = False
        if snap.paused:
            self.lock.pause()
            if snap.drain:
                drained = self.lock.wait_drained(timeout=0)
            self._publish(snap.gate_rev, True, drained)
            if snap.drain and not drained:
                # Drain in short steps so a newer gate is noticed quickly.
                give_up = time.monotonic() + self.ttl / 4
                while not drained and time.monotonic() < give_up:
                    drained = self.lock.wait_drained(timeout=0.05)
                if drained:
                    self._publish(snap.gate_rev, True, True)
        else:
            if not self._open_local():
                return snap.revision
            self._publish(snap.gate_rev, False, False)
        self._pending_drain = snap.drain and not drained
        return snap.revision

    def run(self) -> None:
        ka = threading.Thread(target=self._keepalive_loop, name="pyshmlock-agent-keepalive",
                              daemon=True)
        ka.start()
        rev = 0
        watch = None
        try:
            while not self._stop.is_set():
                try:
                    rev = self.step()
                except EtcdError as e:
                    self.log(f"etcd: {e}")
                    self._stop.wait(0.1)
                    continue
                if getattr(self, "_pending_drain", False):
                    continue
                # One watch stream on the gate stays open across passes; a
                # quiet TTL/4 (or a dead member) reopens it from `rev`.
                if watch is None:
                    watch = self.store.open_watch(self.keys.gate, rev)
                watch.wait(self.ttl / 4, rev)
        finally:
            if watch is not None:
                watch.close()
            self._stop.set()
            self.close()

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        """Leave the cluster: the host stays paused (fail closed) and its
        registration goes at once (the lease is revoked)."""
        try:
            self.lock.pause()
            lease_arm(self.lock, 0)
        except ValueError:
            return                      # already closed
        with self._lease_mu:
            lease, self._lease = self._lease, 0
        if lease:
            self.store.lease_revoke(lease)
        try:
            self.lock.close()
        except Exception:
            pass


def main(args: Any) -> int:
    """``pyshmlock agent``: run until SIGTERM/SIGINT."""
    import sys

    def log(msg: str) -> None:
        print(f"pyshmlock agent [{agent.host_id}]: {msg}", file=sys.stderr, flush=True)

    agent = Agent(args.etcd, args.cluster, args.lock, host_id=args.host_id, ttl=args.ttl, log=log)
    fired: List[int] = []

    def on_signal(*_: Any) -> None:
        # No lock may be taken here (the main thread may hold it): unwind
        # the main thread instead; run()'s finally pauses, revokes, closes.
        # If that clean exit stalls on etcd, SIGALRM's default action ends
        # the process: the lock is paused and its lease stays expired.
        if fired:
            return
        fired.append(1)
        signal.alarm(3)
        raise _Stop()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    log(f"lock {args.lock!r} paused; mirroring cluster {args.cluster!r}")
    try:
        agent.run()
    except _Stop:
        pass
    log("stopped; the local gate stays paused")
    return 0
