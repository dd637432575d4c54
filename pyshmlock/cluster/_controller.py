"""The orchestrator side: Cluster and AsyncCluster.

Every state change is one etcd transaction that compares the revisions it
read (the gate's mod revision, the update key's create revision), so
concurrent controllers serialize: a transaction that lost the race changes
nothing and its caller re-reads and retries.  Every wait is bounded by the
caller's timeout and ends in a result or ClusterTimeout; no call can hang.
"""
from __future__ import annotations

import asyncio
import functools
import json
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set

from ._keys import Keys, Snapshot, read
from ._store import EtcdError, Store

__all__ = [
    "AsyncCluster",
    "Cluster",
    "ClusterStatus",
    "ClusterTimeout",
    "EtcdError",
    "FencingError",
    "PauseResult",
]


class ClusterTimeout(TimeoutError):
    """The call's timeout passed; ``pending`` names what it still waited for."""

    def __init__(self, msg: str, pending: Sequence[str] = ()) -> None:
        super().__init__(msg)
        self.pending = list(pending)


class FencingError(RuntimeError):
    """The update lock was lost (its lease expired): its fencing token is refused."""


@dataclass
class PauseResult:
    revision: int                      # the gate revision every acknowledged host mirrored
    acknowledged: List[str] = field(default_factory=list)
    lost: List[str] = field(default_factory=list)      # registered at the pause, gone since
    drained: bool = False
    superseded: bool = False           # another controller resumed before every ack came
    seconds: float = 0.0


@dataclass
class ClusterStatus:
    revision: int
    paused: bool
    gate: Dict[str, Any]
    gate_revision: int
    update: Optional[Dict[str, Any]]
    update_token: int
    hosts: Dict[str, Dict[str, Any]]

    def to_dict(self) -> Dict[str, Any]:
        return {"revision": self.revision, "paused": self.paused, "gate": self.gate,
                "gate_revision": self.gate_revision, "update": self.update,
                "update_token": self.update_token, "hosts": self.hosts}


def _deadline(timeout: Optional[float]) -> Optional[float]:
    if timeout is None:
        return None
    if timeout != timeout or timeout < 0:
        raise ValueError("timeout must be None or >= 0")
    return time.monotonic() + timeout


def _left(deadline: Optional[float], cap: float) -> float:
    if deadline is None:
        return cap
    return max(0.0, min(cap, deadline - time.monotonic()))


class Cluster:
    """A controller of the cluster gate ``name`` in the etcd at ``endpoints``."""

    def __init__(self, endpoints: Sequence[str] | str, name: str, *, ttl: float = 2.0,
                 who: Optional[str] = None, op_timeout: float = 10.0) -> None:
        self.keys = Keys(name)
        self.name = name
        self.ttl = float(ttl)
        self.store = Store(endpoints, op_timeout=op_timeout)
        self.who = who or f"{socket.gethostname()}:{os.getpid()}"

    # ------------------------------------------------------------ reads
    def _snap(self) -> Snapshot:
        return read(self.store, self.keys)

    def status(self) -> ClusterStatus:
        s = self._snap()
        return ClusterStatus(s.revision, s.paused, s.gate, s.gate_rev, s.update,
                             s.update_token, s.hosts)

    def _gate_value(self, paused: bool, mode: str, drain: bool = False) -> str:
        return json.dumps({"paused": paused, "drain": drain, "mode": mode,
                           "by": self.who, "at": time.time()}, sort_keys=True)

    def _wait(self, after: int, deadline: Optional[float], what: str,
              pending: Sequence[str] = ()) -> None:
        if deadline is not None and time.monotonic() >= deadline:
            raise ClusterTimeout(f"cluster {self.name!r}: timed out waiting for {what}", pending)
        self.store.wait_change(self.keys.prefix, after, _left(deadline, 0.5))

    # ------------------------------------------------------------ pause
    def _set_paused(self, drain: bool, deadline: Optional[float]) -> Snapshot:
        while True:
            s = self._snap()
            drain_now = drain or s.drain
            mode = "update" if s.update is not None else "pause"
            st = self.store
            value = self._gate_value(True, mode, drain_now)
            ok, rev, _ = st.txn([st.cmp_mod(self.keys.gate, s.gate_rev)],
                                [st.op_put(self.keys.gate, value)])
            if ok:
                s.gate_rev = rev
                return s
            if deadline is not None and time.monotonic() >= deadline:
                raise ClusterTimeout(f"cluster {self.name!r}: could not write the pause")

    def _await_acks(self, rev: int, registered: Sequence[str], drain: bool,
                    deadline: Optional[float], t0: float) -> PauseResult:
        initial = set(registered)
        watch = self.store.open_watch(self.keys.prefix, rev)
        try:
            return self._await_acks_watched(rev, initial, drain, deadline, t0, watch)
        finally:
            watch.close()

    def _await_acks_watched(self, rev: int, initial: Set[str], drain: bool,
                            deadline: Optional[float], t0: float, watch: Any) -> PauseResult:
        while True:
            s = self._snap()
            if s.gate_rev > rev and not s.paused:
                return PauseResult(rev, [], sorted(initial - set(s.hosts)), False, True,
                                   time.monotonic() - t0)
            acked: List[str] = []
            pending: List[str] = []
            for hid, reg in s.hosts.items():
                ok = int(reg.get("mirrored", -1)) >= rev and bool(reg.get("paused")) and \
                    (not drain or bool(reg.get("drained")))
                (acked if ok else pending).append(hid)
            if not pending:
                return PauseResult(rev, sorted(acked), sorted(initial - set(s.hosts)),
                                   drain, False, time.monotonic() - t0)
            if deadline is not None and time.monotonic() >= deadline:
                raise ClusterTimeout(
                    f"cluster {self.name!r}: timed out waiting for "
                    f"{'drained ' if drain else ''}acknowledgements from {sorted(pending)}",
                    pending)
            watch.wait(_left(deadline, 0.5), s.revision)

    def pause(self, timeout: Optional[float] = None, drain: bool = False) -> PauseResult:
        """Close the gate everywhere; return once every live registered host
        mirrored it (and drained its reads, if ``drain``).  Hosts whose
        registration expired meanwhile are reported in ``lost``: they are
        paused by their own lease (fail closed)."""
        t0 = time.monotonic()
        deadline = _deadline(timeout)
        s = self._set_paused(drain, deadline)
        return self._await_acks(s.gate_rev, list(s.hosts), drain, deadline, t0)

    # ----------------------------------------------------------- resume
    def resume(self, timeout: Optional[float] = None) -> int:
        """Open the gate, waiting while a cluster update holds it.  Returns
        the gate revision.  Never opens while the update key exists: the
        transaction compares its create revision with 0."""
        deadline = _deadline(timeout)
        while True:
            s = self._snap()
            if s.update is not None:
                self._wait(s.revision, deadline, f"the update by {s.update.get('by')!r} "
                           f"(token {s.update_token}) to end", ["update"])
                continue
            if not s.paused:
                return s.gate_rev
            st = self.store
            ok, rev, _ = st.txn([st.cmp_create(self.keys.update, 0),
                                 st.cmp_mod(self.keys.gate, s.gate_rev)],
                                [st.op_put(self.keys.gate, self._gate_value(False, "resume"))])
            if ok:
                return rev
            if deadline is not None and time.monotonic() >= deadline:
                raise ClusterTimeout(f"cluster {self.name!r}: could not write the resume")

    # ----------------------------------------------------------- update
    def update(self, timeout: Optional[float] = None) -> ClusterUpdate:
        """``with cluster.update():`` hold the cluster update lock; the gate is
        paused and drained everywhere while it is held.  On exit the lock is
        released; the pause stays if the gate was paused before, as with a
        local update, and is lifted otherwise."""
        return ClusterUpdate(self, timeout)

    def wait_hosts(self, count: int, timeout: float = 10.0) -> Dict[str, Dict[str, Any]]:
        """Wait until ``count`` hosts are registered (for scripts and tests)."""
        deadline = _deadline(timeout)
        while True:
            s = self._snap()
            if len(s.hosts) >= count:
                return s.hosts
            self._wait(s.revision, deadline, f"{count} hosts to register")

    def close(self) -> None:
        pass

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class ClusterUpdate:
    def __init__(self, cluster: Cluster, timeout: Optional[float]) -> None:
        self.c = cluster
        self.timeout = timeout
        self.token = 0
        self.lease = 0
        self.result: Optional[PauseResult] = None
        self._lost = threading.Event()
        self._stop = threading.Event()
        self._ka: Optional[threading.Thread] = None

    def _keepalive(self) -> None:
        st = self.c.store
        while not self._stop.wait(self.c.ttl / 4):
            try:
                if st.lease_keepalive(self.lease, timeout=self.c.ttl / 4) <= 0:
                    self._lost.set()
                    return
            except EtcdError:
                pass

    @property
    def lost(self) -> bool:
        """True once the update's lease is known to have expired."""
        return self._lost.is_set()

    def check(self) -> None:
        """Raise FencingError unless this update still holds the lock (one etcd read)."""
        s = self.c._snap()
        if s.update_token != self.token:
            self._lost.set()
        if self._lost.is_set():
            raise FencingError(f"cluster {self.c.name!r}: update token {self.token} refused: "
                               f"the update lock was lost (current token {s.update_token})")

    def __enter__(self) -> ClusterUpdate:
        c, st = self.c, self.c.store
        t0 = time.monotonic()
        deadline = _deadline(self.timeout)
        self.lease = st.lease_grant(c.ttl)
        registered: List[str] = []
        try:
            while True:
                s = c._snap()
                if s.update is not None and s.update_lease == self.lease:
                    self.token = s.update_token          # our own retried txn
                    registered = list(s.hosts)
                    break
                if s.update is not None:
                    c._wait(s.revision, deadline, f"the update by {s.update.get('by')!r} "
                            f"(token {s.update_token}) to end", ["update"])
                    continue
                info = json.dumps({"by": c.who, "at": time.time(), "was_paused": s.paused})
                ok, rev, _ = st.txn(
                    [st.cmp_create(c.keys.update, 0), st.cmp_mod(c.keys.gate, s.gate_rev)],
                    [st.op_put(c.keys.update, info, self.lease),
                     st.op_put(c.keys.gate, c._gate_value(True, "update", True))])
                if ok:
                    self.token = rev             # = the update key's create revision
                    registered = list(s.hosts)
                    break
            self._ka = threading.Thread(target=self._keepalive, daemon=True,
                                        name="pyshmlock-cluster-update")
            self._ka.start()
            self.result = c._await_acks(self.token, registered, True, deadline, t0)
            if self.result.superseded:
                # cannot happen: resume waits
                raise FencingError("the update's pause was superseded")
            return self
        except BaseException:
            self._release(raise_fenced=False)
            raise

    def _release(self, raise_fenced: bool) -> None:
        c, st = self.c, self.c.store
        self._stop.set()
        if self._ka is not None:
            self._ka.join(5)
        ok = False
        if self.token:
            s = c._snap()
            was_paused = bool((s.update or {}).get("was_paused", True)) \
                if s.update_token == self.token else True
            if not was_paused:
                # Reopen only if the gate is still the one this update wrote
                # (gate.mod == token): a pause taken meanwhile stays, as locally.
                ok, _, _ = st.txn([st.cmp_create(c.keys.update, self.token),
                                   st.cmp_mod(c.keys.gate, self.token)],
                                  [st.op_delete(c.keys.update),
                                   st.op_put(c.keys.gate, c._gate_value(False, "resume"))])
            if not ok:
                ok, _, _ = st.txn([st.cmp_create(c.keys.update, self.token)],
                                  [st.op_delete(c.keys.update)])
        st.lease_revoke(self.lease)
        if self.token and not ok and raise_fenced:
            raise FencingError(f"cluster {c.name!r}: update token {self.token} refused at "
                               f"release: the update lock had been lost (lease expired)")

    def __exit__(self, *exc: Any) -> None:
        self._release(raise_fenced=exc[0] is None)


class AsyncCluster:
    """The asyncio face of Cluster: each call runs the blocking one in a
    worker thread, so the event loop never blocks on etcd."""

    def __init__(self, endpoints: Sequence[str] | str, name: str, **kw: Any) -> None:
        self.sync = Cluster(endpoints, name, **kw)

    async def _run(self, fn: Any, *a: Any, **kw: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(
            None, functools.partial(fn, *a, **kw))

    async def pause(self, timeout: Optional[float] = None, drain: bool = False) -> PauseResult:
        r: PauseResult = await self._run(self.sync.pause, timeout, drain)
        return r

    async def resume(self, timeout: Optional[float] = None) -> int:
        rev: int = await self._run(self.sync.resume, timeout)
        return rev

    async def status(self) -> ClusterStatus:
        st: ClusterStatus = await self._run(self.sync.status)
        return st

    def update(self, timeout: Optional[float] = None) -> AsyncClusterUpdate:
        return AsyncClusterUpdate(self, timeout)


class AsyncClusterUpdate:
    def __init__(self, ac: AsyncCluster, timeout: Optional[float]) -> None:
        self.ac = ac
        self.u = ClusterUpdate(ac.sync, timeout)

    @property
    def token(self) -> int:
        return self.u.token

    async def check(self) -> None:
        await self.ac._run(self.u.check)

    async def __aenter__(self) -> AsyncClusterUpdate:
        await self.ac._run(self.u.__enter__)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.ac._run(self.u.__exit__, *exc)
