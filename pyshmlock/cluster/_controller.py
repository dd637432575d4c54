"""The controllers' side, asyncio-native: AsyncCluster and its update lock.

Every state change is one etcd transaction.  ``pause`` and ``resume``
compare the update key's create revision with 0 (no update holds the gate);
an update's acquire also compares the gate's mod revision, and its release
compares its own token.

Waiting for the hosts: each agent reports what it mirrored, for its
registration, to every controller that listens (``_acks``: one datagram),
or in its registration in etcd (when no controller answered it in time, or
later, for ``status``); a controller takes whichever report is newer.  So a
``pause()`` costs the controller's one write, the watch events that carry it
and one datagram per host, not one etcd write per host.  The hosts a call
waits for are exactly those registered at its revision (read in its own
transaction).  A host that stops answering is reported ``lost`` as soon as
its etcd lease shows its agent silent (several keep-alives missed): its own
lease closes it within a bound the result gives (``closing``), so nobody
waits for its registration to expire.

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
from typing import Any, Dict, Optional, Sequence, Set, Tuple
from urllib.parse import urlparse

from ..metrics import ClusterMetrics
from ._acks import AckReceiver, local_address
from ._calls import (
    ClusterStatus,
    PauseResult,
    Registered,
    add_note,
    deadline_of,
    left,
    registered_of,
    set_effect,
    spawn,
)
from ._errors import ClusterError, ClusterTimeout, MissingHostsError
from ._etcd import TLS, Etcd, LeaseNotFound
from ._keys import Keys, State, as_dict, dumps, loads
from ._mirror import Mirror
from ._update import AsyncClusterUpdate
from ._waiting import HostWaits

__all__ = ["DEFAULT_UPDATE_TTL", "SESSION_TTL", "AsyncCluster", "AsyncClusterUpdate",
           "AsyncPausedBlock", "ClusterStatus", "PauseResult"]

#: The update lock's lease: long enough for a Python trainer's GIL-holding
#: calls (a multi-second pickle.dumps) and GC pauses.  Correctness does not
#: rest on it: a stale updater is refused at each host (fencing).
DEFAULT_UPDATE_TTL = 30.0
#: A controller's session lease: ``status`` calls a controller alive while
#: its session key exists (a killed controller shows as dead within this).
SESSION_TTL = 5.0

class AsyncCluster:
    """A controller of the cluster gate ``name`` in the etcd at ``endpoints``.

    ``ttl``: the update lock's lease (default 30 s).  ``expect``: host ids
    that must be registered; ``pause`` and ``update`` raise
    ``MissingHostsError`` (having paused the others) when one is not.
    ``ca``/``cert``/``key``/``user``/``password``/``token``: TLS and etcd
    authentication.  ``session``: keep a session key so that ``status``
    can tell whether this controller is alive, and take the hosts'
    acknowledgements directly (the CLI's one-shot commands do without).
    ``acks``: ``"direct"`` (the default, with a session: hosts send their
    acknowledgements to a UDP port of this process; ``ack_address``,
    ``"HOST"`` or ``"HOST:PORT"``, says where, by default the address this
    machine uses to reach etcd, any free port) or ``"etcd"`` (hosts write
    them in etcd: one write per host).  ``op_timeout`` bounds calls with
    ``timeout=None`` when etcd does not answer."""

    def __init__(self, endpoints: Sequence[str] | str, name: str, *,
                 ttl: float = DEFAULT_UPDATE_TTL, who: Optional[str] = None,
                 op_timeout: float = 10.0, expect: Optional[Sequence[str]] = None,
                 ca: Optional[str] = None, cert: Optional[str] = None,
                 key: Optional[str] = None, user: Optional[str] = None,
                 password: Optional[str] = None, token: Optional[str] = None,
                 session: bool = True, request_timeout: Optional[float] = None,
                 acks: str = "direct", ack_address: Optional[str] = None) -> None:
        if not ttl >= 1:
            raise ValueError("ttl must be at least 1 second (etcd leases count whole seconds)")
        if acks not in ("direct", "etcd"):
            raise ValueError("acks must be 'direct' or 'etcd'")
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
        #: waiting for the hosts: their reports, lost hosts (``_waiting``)
        self.waits = HostWaits(self)
        self.mirror.listeners.append(self.waits.notify)
        self.metrics = ClusterMetrics(name)
        self._use_session = session
        self._direct = acks == "direct" and session
        self._ack_address = ack_address
        self._session = 0
        self._session_task: Optional[asyncio.Task[None]] = None
        self._cleanups: Set[asyncio.Task[Any]] = set()
        self._spare: Optional[Tuple[int, float]] = None   # the next update's lease, granted
        self._closing = False

    # ------------------------------------------------------------ set-up
    async def _ensure(self, deadline: Optional[float], session: bool = False) -> None:
        await self.mirror.start(deadline)
        if session and self._use_session and not self._session:
            await self._open_session(deadline)

    async def _listen(self) -> None:
        """Open the UDP port the hosts acknowledge to (once)."""
        if self.waits.receiver is not None or not self._direct:
            return
        a = self._ack_address or ""
        host, port = a, 0
        if a.startswith("["):                          # [v6] or [v6]:port
            host, _, rest = a[1:].partition("]")
            if rest[:1] == ":" and rest[1:].isdigit():
                port = int(rest[1:])
        elif a.count(":") == 1:                        # host:port
            h, _, p = a.partition(":")
            if p.isdigit():
                host, port = h, int(p)
        if not host:
            u = urlparse(self.etcd.urls[0])
            try:
                host = local_address(u.hostname or "127.0.0.1", u.port or 2379)
            except OSError:
                host = "127.0.0.1"
        try:
            self.waits.receiver = await AckReceiver.start(self.name, self.waits.notify, host, port)
        except OSError:
            self._direct = False           # no port: the hosts write in etcd

    async def _open_session(self, deadline: Optional[float]) -> None:
        await self._listen()
        lease = await self.etcd.lease_grant(SESSION_TTL, deadline=deadline)
        info = {"who": self.who, "pid": os.getpid(), "node": socket.gethostname(),
                "since": time.time()}
        ops = [self.etcd.op_put(self.keys.sessions + f"{lease:x}", dumps(info), lease)]
        r = self.waits.receiver
        if r is not None:
            ops.append(self.etcd.op_put(self.keys.ackers + f"{lease:x}", dumps(
                {"addr": r.address[0], "port": r.address[1], "key": r.key_text,
                 "who": self.who}), lease))
        await self.etcd.txn([], ops, deadline=deadline)
        self._session = lease
        self._session_task = spawn(self._keep_session())

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
        self._closing = True
        t, self._session_task = self._session_task, None
        if t is not None:
            t.cancel()
        if self._cleanups:
            await asyncio.wait(list(self._cleanups), timeout=3.0)
        await self.mirror.stop()
        lease, self._session = self._session, 0
        if lease:
            await self.etcd.lease_revoke(lease)
        spare, self._spare = self._spare, None
        if spare is not None:
            await self.etcd.lease_revoke(spare[0])
        if self.waits.receiver is not None:
            self.waits.receiver.close()
            self.waits.receiver = None
        await self.etcd.aclose()

    async def __aenter__(self) -> AsyncCluster:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def _background(self, coro: Any) -> None:
        """A clean-up nobody waits for (aclose does, briefly)."""
        t = spawn(coro)
        self._cleanups.add(t)
        t.add_done_callback(self._cleanups.discard)

    async def _update_lease(self, deadline: Optional[float]) -> int:
        """A lease for an update: the one granted after the last update if
        it is young (an update's acquire is then one write, not two), else a
        new one."""
        spare, self._spare = self._spare, None
        if spare is not None:
            if time.monotonic() - spare[1] < self.ttl / 3:
                return spare[0]
            self._background(self.etcd.lease_revoke(spare[0]))
        return await self.etcd.lease_grant(self.ttl, deadline=deadline)

    def _after_update(self, lease: int) -> None:
        """Off the release's path (it has returned by then): revoke the
        released update's lease (its key is already gone), and grant the
        next update's."""
        async def later() -> None:
            await asyncio.sleep(0.2)
            await self.etcd.lease_revoke(lease, deadline=time.monotonic() + 2.0)
            if self._closing or self._spare is not None:
                return
            try:
                spare = await self.etcd.lease_grant(self.ttl,
                                                    deadline=time.monotonic() + 2.0)
            except ClusterError:
                return
            if not self._keep_spare(spare):      # closed, or one came meanwhile
                await self.etcd.lease_revoke(spare, deadline=time.monotonic() + 2.0)
        self._background(later())

    def _keep_spare(self, lease: int) -> bool:
        if self._closing or self._spare is not None:
            return False
        self._spare = (lease, time.monotonic())
        return True

    def _gate_value(self, paused: bool, mode: str, drain: bool = False,
                    op: Optional[str] = None) -> str:
        v: Dict[str, Any] = {"paused": paused, "drain": drain, "mode": mode, "by": self.who,
                             "at": time.time(), "op": op or uuid.uuid4().hex[:12]}
        if self._session:
            v["session"] = f"{self._session:x}"
        if self.waits.receiver is None or not self._session:
            v["acks"] = "etcd"        # nobody to acknowledge to directly: write it
        return dumps(v)

    def _timeout(self, msg: str, pending: Sequence[str] = (),
                 took_effect: Optional[bool] = False) -> ClusterTimeout:
        return ClusterTimeout(f"cluster {self.name!r}: {msg}", pending, took_effect=took_effect)

    # ------------------------------------------------------------ reads
    async def status(self, timeout: Optional[float] = None) -> ClusterStatus:
        """One linearizable read of the cluster's keys."""
        deadline = deadline_of(timeout)
        kvs, rev = await self.etcd.range(self.keys.prefix, prefix=True, deadline=deadline)
        s = State(self.keys, {kv["key"]: kv for kv in kvs}, rev)

        def alive(v: Dict[str, Any]) -> Optional[bool]:
            sess = v.get("session")
            try:
                return int(str(sess), 16) in s.sessions if sess else None
            except ValueError:
                return None

        at = s.gate.get("at") if s.paused else None
        at = at if isinstance(at, (int, float)) and not isinstance(at, bool) else None
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
        deadline = deadline_of(timeout)
        await self._ensure(deadline)
        while True:
            st = self.mirror.state
            if len(st.hosts) >= count:
                return st.hosts
            if time.monotonic() >= (deadline or float("inf")):
                raise self._timeout(f"timed out waiting for {count} hosts to register")
            await self.mirror.wait(left(deadline, 0.5))

    # ------------------------------------------------------------ pause
    async def _write_pause(self, drain: bool, deadline: Optional[float]
                           ) -> Tuple[int, Registered]:
        e, k = self.etcd, self.keys
        while True:
            ok, rev, r = await e.txn(
                [e.cmp_create(k.update, 0)],
                [e.op_put(k.gate, self._gate_value(True, "pause", drain)),
                 e.op_range(k.hosts, prefix=True, keys_only=True)],
                [e.op_range(k.update), e.op_range(k.gate)], deadline=deadline)
            if ok:
                return rev, registered_of(k, r[1])
            # An update holds the gate: pause it within the update (keeps its drain).
            upd, gate = r[0], r[1]
            if not upd:
                continue
            cmp = [e.cmp_create(k.update, upd[0]["create_revision"]),
                   e.cmp_mod(k.gate, gate[0]["mod_revision"] if gate else 0)]
            ok, rev, r = await e.txn(cmp, [e.op_put(k.gate, self._gate_value(True, "update", True)),
                                           e.op_range(k.hosts, prefix=True, keys_only=True)],
                                     deadline=deadline)
            if ok:
                return rev, registered_of(k, r[1])

    def _check_expected(self, r: PauseResult, registered: Registered,
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
        mirrored it (and drained its reads, if ``drain``).  Hosts that went
        or whose agent stopped renewing its lease meanwhile are reported in
        ``lost``: their own lease pauses them (fail closed), within
        ``closing[host]`` seconds of the result.  A returned pause() means
        paused: if another controller reopens the gate before every host
        acknowledged, the pause is written again."""
        t0 = time.monotonic()
        deadline = deadline_of(timeout)
        wrote: Optional[bool] = False
        try:
            await self._ensure(deadline, session=True)
            while True:
                wrote = None
                rev, registered = await self._write_pause(drain, deadline)
                wrote = True
                out = await self.waits.await_hosts(
                    rev, registered, "drained" if drain else "paused", deadline, t0)
                if out is not None:
                    r = self.waits.result(rev, out, drain, t0)
                    self.metrics.pause.observe(r.seconds, "true" if drain else "false")
                    self._check_expected(r, registered, expect)
                    return r
        except ClusterError as e:
            set_effect(e, wrote)
            raise

    def paused(self, timeout: Optional[float] = None, drain: bool = False,
               expect: Optional[Sequence[str]] = None) -> AsyncPausedBlock:
        """``async with cluster.paused(drain=True) as r:`` pause (``r`` is
        the PauseResult); resume when the block completes.  If it raises,
        the fleet stays paused and the exception says so (a note)."""
        return AsyncPausedBlock(self, timeout, drain, expect)

    # ----------------------------------------------------------- resume
    async def resume(self, timeout: Optional[float] = None, wait: bool = False) -> int:
        """Open the gate, waiting while a cluster update holds it.  Returns
        the gate revision.  Never opens while the update key exists: the
        transaction compares its create revision with 0.  ``wait``: return
        once every host registered then has reopened (or keeps a lock
        paused for a reason of its own: behind the update generation, data
        suspect), or is lost, or the gate was paused again."""
        t0 = time.monotonic()
        deadline = deadline_of(timeout)
        try:
            await self._ensure(deadline, session=True)
        except ClusterError as ex:
            set_effect(ex, False)
            raise
        e, k = self.etcd, self.keys
        while True:
            ops = [e.op_put(k.gate, self._gate_value(False, "resume"))]
            if wait:
                ops.append(e.op_range(k.hosts, prefix=True, keys_only=True))
            try:
                ok, rev, r = await e.txn([e.cmp_create(k.update, 0)], ops,
                                         [e.op_range(k.update)], deadline=deadline)
            except ClusterError as ex:
                set_effect(ex, None)
                raise
            if ok:
                break
            upd = r[0]
            token = upd[0]["create_revision"] if upd else 0
            while (token and self.mirror.state.update_token == token) or \
                    self.mirror.revision < rev:
                if deadline is not None and time.monotonic() >= deadline:
                    by = self.mirror.state.update or {}
                    raise self._timeout(f"timed out waiting for the update by "
                                        f"{by.get('by')!r} (token {token}) to end", ["update"])
                await self.mirror.wait(left(deadline, 0.5))
        if wait:
            try:
                await self.waits.await_hosts(rev, registered_of(k, r[1]), "open", deadline, t0)
            except ClusterError as ex:
                set_effect(ex, True)
                raise
            self.metrics.resume.observe(time.monotonic() - t0)
        return rev

    # ----------------------------------------------------------- membership
    async def evict(self, host_id: str, timeout: Optional[float] = None) -> None:
        """Drop ``host_id`` from the cluster now: its registration goes (a
        pause in progress stops waiting for it and reports it lost) and it
        stays out, paused, until ``admit(host_id)``."""
        deadline = deadline_of(timeout)
        e, k = self.etcd, self.keys
        await e.txn([], [e.op_delete(k.host(host_id)),
                         e.op_put(k.evicted_host(host_id),
                                  dumps({"by": self.who, "at": time.time()}))],
                    deadline=deadline)

    async def admit(self, host_id: str, timeout: Optional[float] = None) -> None:
        """Let an evicted host back in, and count it as having the fleet's
        last update (an operator's word that its weights are current: it is
        no longer behind, failed or holding part of an update)."""
        deadline = deadline_of(timeout)
        await self._ensure(deadline)
        e, k = self.etcd, self.keys
        while True:
            kvs, _ = await e.range(k.generation, deadline=deadline)
            ops = [e.op_delete(k.evicted_host(host_id))]
            gen = loads(kvs[0]["value"]) if kvs else {"token": 0, "by": self.who,
                                                      "at": time.time()}
            present = dict(as_dict(gen.get("hosts")))
            present[host_id] = "*"          # whatever its registration
            failed = dict(as_dict(gen.get("failed")))
            failed.pop(host_id, None)
            gen["hosts"], gen["failed"] = present, failed
            ops.append(e.op_put(k.generation, dumps(gen)))
            cmp = [e.cmp_mod(k.generation, kvs[0]["mod_revision"] if kvs else 0)]
            ok, _, _ = await e.txn(cmp, ops, deadline=deadline)
            if ok:
                return

    async def break_update(self, token: Optional[int] = None,
                           timeout: Optional[float] = None) -> int:
        """Take the update lock away from a dead controller: revoke its lease
        (its fencing token is refused from then on).  ``token``: only that
        update.  Returns the token broken (0: no update held).  The gate
        stays paused; ``resume`` opens it."""
        deadline = deadline_of(timeout)
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
        """``async with cluster.update() as u:`` hold the cluster update lock;
        the gate is paused and drained everywhere while it is held.  When the
        block completes, the update becomes the fleet's generation (every
        host registered throughout counts as current, but those marked with
        ``u.mark_failed``), the lock is released, and the gate reopens if it
        was open before (a pause stays, as with a local update).  When the
        block raises, the fleet stays paused: the generation lists only the
        hosts that applied the update (``u.applied``, ``u.mark_applied``),
        the others stay paused as behind until an update reaches them."""
        return AsyncClusterUpdate(self, timeout, expect)


class AsyncPausedBlock:
    """What ``AsyncCluster.paused()`` returns."""

    def __init__(self, c: AsyncCluster, timeout: Optional[float], drain: bool,
                 expect: Optional[Sequence[str]]) -> None:
        self.c, self.timeout, self.drain, self.expect = c, timeout, drain, expect
        self.result: Optional[PauseResult] = None

    async def __aenter__(self) -> PauseResult:
        self.result = await self.c.pause(self.timeout, self.drain, self.expect)
        return self.result

    async def __aexit__(self, et: Any, ev: Any, tb: Any) -> None:
        if ev is not None:
            add_note(ev, f"pyshmlock.cluster: the fleet {self.c.name!r} stays paused: the "
                         "paused block raised (resume() reopens it)")
            return
        await self.c.resume(self.timeout)


