"""The controllers' side, asyncio-native: AsyncCluster and its update lock.

Every state change is one etcd transaction.  ``pause`` and ``resume``
compare the update key's create revision with 0 (no update holds the gate);
an update's acquire also compares the gate's mod revision, and its release
compares its own token.  Waiting for acknowledgements reads the agents'
registrations from a watched copy of the cluster's keys (``_mirror``), so a
``pause()`` costs the controller's write, each agent's acknowledgement write
and the watch events that carry them.

Every call is bounded by its timeout (every etcd request included) and every
error is a ``ClusterError`` that says whether the call took effect.  Every
call is cancel-safe: a cancelled acquire of the update lock revokes its lease
(which deletes an update key bound to it, even one whose write is still in
flight: etcd refuses a put on a revoked lease) and reopens a gate it closed,
in a task of its own that a second cancellation does not stop.
"""
from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from ._errors import (
    ClusterError,
    ClusterTimeout,
    FencingError,
    MissingHostsError,
)
from ._etcd import TLS, Etcd, LeaseNotFound
from ._keys import Keys, State, dumps
from ._mirror import Mirror

__all__ = ["DEFAULT_UPDATE_TTL", "SESSION_TTL", "AsyncCluster", "AsyncClusterUpdate",
           "ClusterStatus", "PauseResult"]

#: The update lock's lease: long enough for a Python trainer's GIL-holding
#: calls (a multi-second pickle.dumps) and GC pauses.  Correctness does not
#: rest on it: a stale updater is refused at each host (fencing).
DEFAULT_UPDATE_TTL = 30.0
#: A controller's session lease: ``status`` calls a controller alive while
#: its session key exists (a killed controller shows as dead within this).
SESSION_TTL = 5.0

_live: Set[asyncio.Task[Any]] = set()     # clean-ups that must outlive a cancelled call


def _spawn(coro: Any) -> asyncio.Task[Any]:
    t: asyncio.Task[Any] = asyncio.ensure_future(coro)
    _live.add(t)
    t.add_done_callback(_live.discard)
    return t


async def _finish_cleanup(coro: Any) -> None:
    """Run a clean-up to its end even if the caller is cancelled again (the
    wait is shielded; the clean-up task keeps going on its own)."""
    t = _spawn(coro)
    try:
        await asyncio.shield(t)
    except asyncio.CancelledError:
        pass
    except Exception:
        pass


@dataclass
class PauseResult:
    revision: int                      # the gate revision every acknowledged host mirrored
    acknowledged: List[str] = field(default_factory=list)
    lost: List[str] = field(default_factory=list)      # registered at the pause, gone since
    drained: bool = False
    superseded: bool = False           # never True: a returned pause() means paused
    seconds: float = 0.0
    unused: List[str] = field(default_factory=list)    # hosts whose lock no process uses
    behind: List[str] = field(default_factory=list)    # hosts behind the update generation


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


def _registered(keys: Keys, kvs: List[Dict[str, Any]]) -> Dict[str, int]:
    return {kv["key"][len(keys.hosts):]: kv["create_revision"] for kv in kvs
            if kv["key"].startswith(keys.hosts)}


def _effect(e: ClusterError, wrote: Optional[bool]) -> None:
    """The call's own took_effect: False before its write was sent (a
    session grant in flight is not the call's effect), True once it is
    written, and while it was in flight what the request layer knows."""
    if wrote is not None:
        e.took_effect = wrote


def _ack_ok(reg: Dict[str, Any], rev: int, drain: bool) -> bool:
    return int(reg.get("mirrored", -1)) >= rev and bool(reg.get("paused")) and \
        (not drain or bool(reg.get("drained")))


class AsyncCluster:
    """A controller of the cluster gate ``name`` in the etcd at ``endpoints``.

    ``ttl``: the update lock's lease (default 30 s).  ``expect``: host ids
    that must be registered; ``pause`` and ``update`` raise
    ``MissingHostsError`` (having paused the others) when one is not.
    ``ca``/``cert``/``key``/``user``/``password``/``token``: TLS and etcd
    authentication.  ``session``: keep a session key so that ``status``
    can tell whether this controller is alive (the CLI's one-shot commands
    do without).  ``op_timeout`` bounds calls with ``timeout=None`` when
    etcd does not answer."""

    def __init__(self, endpoints: Sequence[str] | str, name: str, *,
                 ttl: float = DEFAULT_UPDATE_TTL, who: Optional[str] = None,
                 op_timeout: float = 10.0, expect: Optional[Sequence[str]] = None,
                 ca: Optional[str] = None, cert: Optional[str] = None,
                 key: Optional[str] = None, user: Optional[str] = None,
                 password: Optional[str] = None, token: Optional[str] = None,
                 session: bool = True, request_timeout: Optional[float] = None) -> None:
        if not ttl >= 1:
            raise ValueError("ttl must be at least 1 second (etcd leases count whole seconds)")
        self.keys = Keys(name)
        self.name = name
        self.ttl = float(ttl)
        self.who = who or f"{socket.gethostname()}:{os.getpid()}"
        self.expect = sorted(set(expect)) if expect else []
        kw: Dict[str, Any] = {"op_timeout": op_timeout}
        if request_timeout is not None:
            kw["request_timeout"] = request_timeout
        self.etcd = Etcd(endpoints, tls=TLS(ca, cert, key, user, password, token), **kw)
        self.mirror = Mirror(self.etcd, self.keys, resync=0.5)
        self._use_session = session
        self._session = 0
        self._session_task: Optional[asyncio.Task[None]] = None
        self._ready: Optional[asyncio.Future[None]] = None

    # ------------------------------------------------------------ set-up
    async def _ensure(self, deadline: Optional[float], session: bool = False) -> None:
        await self.mirror.start(deadline)
        if session and self._use_session and not self._session:
            await self._open_session(deadline)

    async def _open_session(self, deadline: Optional[float]) -> None:
        lease = await self.etcd.lease_grant(SESSION_TTL, deadline=deadline)
        info = {"who": self.who, "pid": os.getpid(), "node": socket.gethostname(),
                "since": time.time()}
        await self.etcd.txn([], [self.etcd.op_put(self.keys.sessions + f"{lease:x}",
                                                  dumps(info), lease)], deadline=deadline)
        self._session = lease
        self._session_task = _spawn(self._keep_session())

    async def _keep_session(self) -> None:
        while True:
            await asyncio.sleep(SESSION_TTL / 4)
            lease = self._session
            try:
                if lease and await self.etcd.lease_keepalive(
                        lease, deadline=time.monotonic() + SESSION_TTL / 2) <= 0:
                    self._session = 0          # the next write opens a new session
                    return
            except LeaseNotFound:
                self._session = 0
                return
            except ClusterError:
                pass

    async def aclose(self) -> None:
        t, self._session_task = self._session_task, None
        if t is not None:
            t.cancel()
        await self.mirror.stop()
        lease, self._session = self._session, 0
        if lease:
            await self.etcd.lease_revoke(lease)
        await self.etcd.aclose()

    async def __aenter__(self) -> AsyncCluster:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def _gate_value(self, paused: bool, mode: str, drain: bool = False,
                    op: Optional[str] = None) -> str:
        v: Dict[str, Any] = {"paused": paused, "drain": drain, "mode": mode, "by": self.who,
                             "at": time.time(), "op": op or uuid.uuid4().hex[:12]}
        if self._session:
            v["session"] = f"{self._session:x}"
        return dumps(v)

    def _timeout(self, msg: str, pending: Sequence[str] = (),
                 took_effect: Optional[bool] = False) -> ClusterTimeout:
        return ClusterTimeout(f"cluster {self.name!r}: {msg}", pending, took_effect=took_effect)

    # ------------------------------------------------------------ reads
    async def status(self, timeout: Optional[float] = None) -> ClusterStatus:
        """One linearizable read of the cluster's keys."""
        deadline = _deadline(timeout)
        kvs, rev = await self.etcd.range(self.keys.prefix, prefix=True, deadline=deadline)
        s = State(self.keys, {kv["key"]: kv for kv in kvs}, rev)

        def alive(v: Dict[str, Any]) -> Optional[bool]:
            sess = v.get("session")
            return int(str(sess), 16) in s.sessions if sess else None

        at = s.gate.get("at") if s.paused else None
        return ClusterStatus(
            s.revision, s.paused, s.gate, s.gate_rev, s.update, s.update_token, s.hosts,
            paused_by=s.gate.get("by") if s.paused else None, paused_at=at,
            paused_for=max(0.0, time.time() - float(at)) if at else None,
            paused_by_alive=alive(s.gate) if s.paused else None,
            update_by_alive=alive(s.update) if s.update is not None else None,
            generation=s.generation, evicted=s.evicted,
            controllers={f"{k:x}": v for k, v in s.sessions.items()})

    async def wait_hosts(self, count: int, timeout: float = 10.0) -> Dict[str, Dict[str, Any]]:
        """Wait until ``count`` hosts are registered (for scripts and tests)."""
        deadline = _deadline(timeout)
        await self._ensure(deadline)
        while True:
            st = self.mirror.state
            if len(st.hosts) >= count:
                return st.hosts
            if time.monotonic() >= (deadline or float("inf")):
                raise self._timeout(f"timed out waiting for {count} hosts to register")
            await self.mirror.wait(_left(deadline, 0.5))

    # ------------------------------------------------------------ pause
    async def _write_pause(self, drain: bool, deadline: Optional[float]
                           ) -> Tuple[int, Dict[str, int]]:
        e, k = self.etcd, self.keys
        while True:
            ok, rev, r = await e.txn(
                [e.cmp_create(k.update, 0)],
                [e.op_put(k.gate, self._gate_value(True, "pause", drain)),
                 e.op_range(k.hosts, prefix=True)],
                [e.op_range(k.update), e.op_range(k.gate)], deadline=deadline)
            resp = r
            if ok:
                return rev, _registered(k, resp[1])
            # An update holds the gate: pause it within the update (keeps its drain).
            upd = resp[0]
            gate = resp[1]
            if not upd:
                continue
            cmp = [e.cmp_create(k.update, upd[0]["create_revision"]),
                   e.cmp_mod(k.gate, gate[0]["mod_revision"] if gate else 0)]
            ok, rev, r = await e.txn(cmp, [e.op_put(k.gate, self._gate_value(True, "update", True)),
                                           e.op_range(k.hosts, prefix=True)],
                                     deadline=deadline)
            if ok:
                return rev, _registered(k, r[1])

    async def _await_acks(self, rev: int, registered: Dict[str, int], drain: bool,
                          deadline: Optional[float], t0: float) -> Optional[PauseResult]:
        """None: the gate was reopened before every host acknowledged."""
        m = self.mirror
        while True:
            if m.fatal is not None:
                raise m.fatal
            st = m.state
            if st.revision >= rev:
                if st.gate_rev > rev and not st.paused:
                    return None
                acked, pending, lost = [], [], []
                for hid in registered:
                    reg = st.hosts.get(hid)
                    if reg is None:
                        lost.append(hid)
                    elif _ack_ok(reg, rev, drain):
                        acked.append(hid)
                    else:
                        pending.append(hid)
                if not pending:
                    unused = [h for h in acked if st.hosts[h].get("users", 1) == 0]
                    return PauseResult(rev, sorted(acked), sorted(lost), drain, False,
                                       time.monotonic() - t0, sorted(unused), st.behind())
            else:
                pending = sorted(registered)
            if deadline is not None and time.monotonic() >= deadline:
                raise self._timeout(
                    f"timed out waiting for {'drained ' if drain else ''}acknowledgements "
                    f"from {sorted(pending)} (the gate is paused)", sorted(pending),
                    took_effect=True)
            await m.wait(_left(deadline, 0.5))

    def _check_expected(self, r: PauseResult, registered: Dict[str, int],
                        expect: Optional[Sequence[str]]) -> None:
        want = sorted(set(expect) if expect is not None else self.expect)
        missing = [h for h in want if h not in registered or h in r.lost]
        if missing:
            raise MissingHostsError(
                f"cluster {self.name!r}: expected hosts not registered: {missing} "
                f"(the others are paused: {r.acknowledged})", missing, r, took_effect=True)

    async def pause(self, timeout: Optional[float] = None, drain: bool = False,
                    expect: Optional[Sequence[str]] = None) -> PauseResult:
        """Close the gate everywhere; return once every registered host
        mirrored it (and drained its reads, if ``drain``).  Hosts whose
        registration expired meanwhile are reported in ``lost``: they are
        paused by their own lease (fail closed).  A returned pause() means
        paused: if another controller reopens the gate before every host
        acknowledged, the pause is written again."""
        t0 = time.monotonic()
        deadline = _deadline(timeout)
        wrote: Optional[bool] = False
        try:
            await self._ensure(deadline, session=True)
            while True:
                wrote = None
                rev, registered = await self._write_pause(drain, deadline)
                wrote = True
                r = await self._await_acks(rev, registered, drain, deadline, t0)
                if r is not None:
                    self._check_expected(r, registered, expect)
                    return r
        except ClusterError as e:
            _effect(e, wrote)
            raise

    # ----------------------------------------------------------- resume
    async def resume(self, timeout: Optional[float] = None) -> int:
        """Open the gate, waiting while a cluster update holds it.  Returns
        the gate revision.  Never opens while the update key exists: the
        transaction compares its create revision with 0.  (Hosts behind the
        update generation stay paused: see ``ClusterStatus.hosts[...]['behind']``.)"""
        deadline = _deadline(timeout)
        try:
            await self._ensure(deadline, session=True)
        except ClusterError as ex:
            _effect(ex, False)
            raise
        e, k = self.etcd, self.keys
        while True:
            try:
                ok, rev, r = await e.txn([e.cmp_create(k.update, 0)],
                                         [e.op_put(k.gate, self._gate_value(False, "resume"))],
                                         [e.op_range(k.update)], deadline=deadline)
            except ClusterError as ex:
                _effect(ex, None)
                raise
            if ok:
                return rev
            upd = r[0]
            token = upd[0]["create_revision"] if upd else 0
            while (token and self.mirror.state.update_token == token) or \
                    self.mirror.revision < rev:
                if deadline is not None and time.monotonic() >= deadline:
                    by = self.mirror.state.update or {}
                    raise self._timeout(f"timed out waiting for the update by "
                                        f"{by.get('by')!r} (token {token}) to end", ["update"])
                await self.mirror.wait(_left(deadline, 0.5))

    # ----------------------------------------------------------- membership
    async def evict(self, host_id: str, timeout: Optional[float] = None) -> None:
        """Drop ``host_id`` from the cluster now: its registration goes (a
        pause in progress stops waiting for it and reports it lost) and it
        stays out, paused, until ``admit(host_id)``."""
        deadline = _deadline(timeout)
        e, k = self.etcd, self.keys
        await e.txn([], [e.op_delete(k.host(host_id)),
                         e.op_put(k.evicted_host(host_id),
                                  dumps({"by": self.who, "at": time.time()}))],
                    deadline=deadline)

    async def admit(self, host_id: str, timeout: Optional[float] = None) -> None:
        """Let an evicted host back in, and count it as having the fleet's
        last update (an operator's word that its weights are current)."""
        deadline = _deadline(timeout)
        await self._ensure(deadline)
        e, k = self.etcd, self.keys
        while True:
            kvs, _ = await e.range(k.generation, deadline=deadline)
            ops = [e.op_delete(k.evicted_host(host_id))]
            cmp = []
            if kvs:
                from ._keys import loads
                gen = loads(kvs[0]["value"])
                present = dict(gen.get("hosts") or {})
                present[host_id] = "*"          # whatever its registration
                gen["hosts"] = present
                ops.append(e.op_put(k.generation, dumps(gen)))
                cmp = [e.cmp_mod(k.generation, kvs[0]["mod_revision"])]
            ok, _, _ = await e.txn(cmp, ops, deadline=deadline)
            if ok:
                return

    async def break_update(self, token: Optional[int] = None,
                           timeout: Optional[float] = None) -> int:
        """Take the update lock away from a dead controller: revoke its lease
        (its fencing token is refused from then on).  ``token``: only that
        update.  Returns the token broken (0: no update held).  The gate
        stays paused; ``resume`` opens it."""
        deadline = _deadline(timeout)
        kvs, _ = await self.etcd.range(self.keys.update, deadline=deadline)
        if not kvs or (token is not None and kvs[0]["create_revision"] != token):
            return 0
        if not await self.etcd.lease_revoke(kvs[0]["lease"], deadline=deadline):
            raise self._timeout("could not revoke the update's lease", ["update"],
                                took_effect=None)
        return int(kvs[0]["create_revision"])

    # ----------------------------------------------------------- update
    def update(self, timeout: Optional[float] = None,
               expect: Optional[Sequence[str]] = None) -> AsyncClusterUpdate:
        """``async with cluster.update():`` hold the cluster update lock; the
        gate is paused and drained everywhere while it is held.  On exit the
        lock is released; the pause stays if the gate was paused before, as
        with a local update, and is lifted otherwise."""
        return AsyncClusterUpdate(self, timeout, expect)


class AsyncClusterUpdate:
    """The cluster update lock.  ``token`` is its fencing token: pass it to
    ``lock.fenced_update(token)`` at each host (or in the
    ``X-Pyshmlock-Fence`` header of the host's update call), where an update
    whose lock was lost is refused."""

    def __init__(self, c: AsyncCluster, timeout: Optional[float],
                 expect: Optional[Sequence[str]] = None) -> None:
        self.c = c
        self.timeout = timeout
        self.expect = expect
        self.token = 0
        self.lease = 0
        self.result: Optional[PauseResult] = None
        self._op = uuid.uuid4().hex[:12]
        self._was_paused = True
        self._present: Dict[str, int] = {}
        self._lost = False
        self._ka: Optional[asyncio.Task[None]] = None
        self._released = False

    @property
    def lost(self) -> bool:
        """True once the update's lease is known to have expired."""
        return self._lost

    async def _keepalive(self) -> None:
        e = self.c.etcd
        while True:
            await asyncio.sleep(self.c.ttl / 6)
            try:
                left = await e.lease_keepalive(self.lease,
                                               deadline=time.monotonic() + self.c.ttl / 3)
            except LeaseNotFound:
                left = 0
            except ClusterError:
                continue
            if left <= 0:
                self._lost = True
                return

    async def check(self) -> None:
        """Raise FencingError unless this update still holds the lock (one etcd read)."""
        kvs, _ = await self.c.etcd.range(self.c.keys.update)
        cur = kvs[0]["create_revision"] if kvs else 0
        if cur != self.token:
            self._lost = True
        if self._lost:
            raise FencingError(f"cluster {self.c.name!r}: update token {self.token} refused: "
                               f"the update lock was lost (current token {cur})")

    async def _acquire(self) -> None:
        c, e, k = self.c, self.c.etcd, self.c.keys
        t0 = time.monotonic()
        deadline = _deadline(self.timeout)
        await c._ensure(deadline, session=True)
        self.lease = await e.lease_grant(c.ttl, deadline=deadline)
        self._ka = _spawn(self._keepalive())
        gate_rev, paused = c.mirror.state.gate_rev, c.mirror.state.paused
        while True:
            info = {"by": c.who, "at": time.time(), "was_paused": paused, "op": self._op}
            if c._session:
                info["session"] = f"{c._session:x}"
            ok, rev, r = await e.txn(
                [e.cmp_create(k.update, 0), e.cmp_mod(k.gate, gate_rev)],
                [e.op_put(k.update, dumps(info), self.lease),
                 e.op_put(k.gate, c._gate_value(True, "update", True, self._op)),
                 e.op_range(k.hosts, prefix=True)],
                [e.op_range(k.update), e.op_range(k.gate)], deadline=deadline)
            resp = r
            if ok:
                self.token = rev               # = the update key's create revision
                self._was_paused = paused
                registered = _registered(k, resp[2])
                break
            upd, gate = resp[0], resp[1]
            if upd and upd[0]["lease"] == self.lease:      # our own retried write
                self.token = upd[0]["create_revision"]
                self._was_paused = bool(info["was_paused"])
                registered = dict(c.mirror.state.host_create)
                break
            if upd:
                token = upd[0]["create_revision"]
                while c.mirror.state.update_token == token or c.mirror.revision < rev:
                    if deadline is not None and time.monotonic() >= deadline:
                        by = c.mirror.state.update or {}
                        raise c._timeout(f"timed out waiting for the update by "
                                         f"{by.get('by')!r} (token {token}) to end", ["update"])
                    await c.mirror.wait(_left(deadline, 0.5))
                gate_rev, paused = c.mirror.state.gate_rev, c.mirror.state.paused
            else:
                gate_rev = gate[0]["mod_revision"] if gate else 0
                paused = bool(State(k, {kv["key"]: kv for kv in gate}, rev).paused)
        try:
            r2 = await c._await_acks(self.token, registered, True, deadline, t0)
        except ClusterTimeout as ex:
            ex.took_effect = True
            raise
        if r2 is None:                         # cannot happen: resume waits for the update
            raise FencingError("the update's pause was reopened")
        self.result = r2
        st = c.mirror.state
        self._present = {h: st.host_create[h] for h in r2.acknowledged if h in st.host_create}
        c._check_expected(r2, registered, self.expect)

    async def __aenter__(self) -> AsyncClusterUpdate:
        try:
            await self._acquire()
        except BaseException:
            await _finish_cleanup(self._abort())
            raise
        return self

    async def _abort(self) -> None:
        """Undo a partial acquire: revoke the lease first (it deletes our
        update key, and makes a write of ours still in flight fail), then
        reopen the gate if it is still the one our acquire wrote."""
        if self._ka is not None:
            self._ka.cancel()
        self._released = True
        if not self.lease:
            return
        e, k = self.c.etcd, self.c.keys
        end = time.monotonic() + 5.0
        await e.lease_revoke(self.lease, deadline=end)
        kvs, _ = await e.range(k.gate, deadline=end)
        if kvs:
            from ._keys import loads
            gate = loads(kvs[0]["value"])
            if gate.get("op") == self._op and not self._was_paused:
                await e.txn([e.cmp_mod(k.gate, kvs[0]["mod_revision"]),
                             e.cmp_create(k.update, 0)],
                            [e.op_put(k.gate, self.c._gate_value(False, "resume"))],
                            deadline=end)

    async def _release(self, completed: bool) -> bool:
        c, e, k = self.c, self.c.etcd, self.c.keys
        if self._ka is not None:
            self._ka.cancel()
        self._released = True
        ok = False
        ops = [e.op_delete(k.update)]
        if completed and not self._lost:
            st = c.mirror.state
            present = {h: cr for h, cr in self._present.items() if st.host_create.get(h) == cr}
            ops.append(e.op_put(k.generation, dumps(
                {"token": self.token, "by": c.who, "at": time.time(), "hosts": present})))
        end = time.monotonic() + max(5.0, c.ttl / 2)
        try:
            if not self._was_paused:
                # Reopen only if the gate is still the one this update wrote
                # (gate.mod == token): a pause taken meanwhile stays, as locally.
                ok, _, _ = await e.txn([e.cmp_create(k.update, self.token),
                                        e.cmp_mod(k.gate, self.token)],
                                       ops + [e.op_put(k.gate, c._gate_value(False, "resume"))],
                                       deadline=end)
            if not ok:
                ok, _, _ = await e.txn([e.cmp_create(k.update, self.token)], ops, deadline=end)
        finally:
            await e.lease_revoke(self.lease, deadline=time.monotonic() + 2.0)
        return ok

    async def __aexit__(self, *exc: Any) -> None:
        t = _spawn(self._release(exc[0] is None))
        try:
            ok = await asyncio.shield(t)
        except asyncio.CancelledError:
            raise
        if not ok and exc[0] is None:
            raise FencingError(f"cluster {self.c.name!r}: update token {self.token} refused "
                               f"at release: the update lock had been lost (lease expired)")
