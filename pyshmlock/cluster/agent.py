"""The host agent: mirrors the cluster gate in etcd into this host's locks.

One agent runs per host, for every lock of the host (``pyshmlock agent
--etcd URLS --cluster NAME --lock A --lock B ...``: one lock per engine).
It

1. opens each lock, pauses it and arms its host lease already expired, so
   the host admits nothing before it knows the cluster's state, and writes
   the host setting (``_hostconf``) that makes servers open the locks
   fail-closed;
2. takes one etcd lease of ``ttl`` seconds and keeps it alive with hedged
   keep-alives (a hung member costs 150 ms, not a timeout); every keep-alive
   sent at time t that succeeds pushes every lock's local lease deadline to
   t + LOCAL_FRACTION * ttl, always before etcd can expire the lease;
3. claims one registration ``hosts/<id>`` naming its locks (refusing an id
   another live agent holds), then follows one watched copy of ``ctl/``: on
   each change it raises each lock's fence to the fleet's update token,
   applies the gate (pause, drain if asked, or resume) to every lock, and
   reports what it did: one datagram to each controller that listens
   (``_acks``), and its registration in etcd only when a controller did not
   answer, when the gate's writer asked for it, or once things have been
   still for ``SETTLE`` seconds (for ``status``); an idle host writes
   nothing;
4. keeps a lock paused while it is behind the fleet's update generation,
   holds part of an update the fleet did not complete, or its data is
   suspect, and the whole host while it is evicted; and records in a lock
   that is current by the generation that it is (its ``applied_update``), so
   that a restarted agent finds it current.

If it dies, is stopped or loses etcd, the keep-alives stop and the local
leases run out: the C core's lease watchdog in every process attached to a
lock pauses it by itself (docs/DESIGN.md, "Beyond one host").  If etcd says
its lease has expired, it pauses at once, registers afresh and only then
mirrors the current state again.
"""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
import zlib
from typing import Any, Dict, Optional, Sequence

from ..lock import RWLock
from ._acks import AckSender
from ._errors import (
    AuthenticationError,
    CertificateError,
    ClusterError,
    DuplicateHostError,
)
from ._etcd import TLS, Etcd, LeaseNotFound
from ._hostlocks import HostLocks
from ._keys import CURRENT, Keys, State, dumps, loads, valid_host_id
from ._mirror import Mirror

__all__ = ["DEFAULT_TTL", "LOCAL_FRACTION", "SETTLE", "Agent"]

#: The local lease runs out this fraction of the etcd TTL after the last
#: keep-alive was *sent*; etcd cannot expire the lease before a full TTL
#: after it *received* it, so the host is paused before it can be lost.
LOCAL_FRACTION = 0.75
#: The default host lease: long enough that a leader election with etcd's
#: default timings (1 s election timeout; up to about 5 s without a leader
#: measured here on a loaded 2-CPU machine) closes no host (docs/OPERATIONS.md,
#: "Choosing the TTL"); a cut-off host stops admitting within 7.5 s.
DEFAULT_TTL = 10.0
#: An agent whose report was taken directly by every controller writes it
#: in etcd (for ``status``) once it has not changed for this long.
SETTLE = 1.0


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:   # pragma: no cover
        return ""


def _pid_start(pid: int) -> Optional[int]:
    """The start time of ``pid`` (clock ticks since boot), None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _settle(w: asyncio.Future[None]) -> None:
    if not w.done():
        w.set_result(None)


def keepalive_interval(ttl: float) -> float:
    """How often an agent renews its lease (the controllers' silence test
    counts missed renewals of it)."""
    return min(ttl / 10, 1.0)


class Agent:
    def __init__(self, endpoints: Sequence[str] | str, cluster: str,
                 locks: Sequence[str] | str, *, host_id: Optional[str] = None,
                 ttl: float = DEFAULT_TTL, log: Any = None, ca: Optional[str] = None,
                 cert: Optional[str] = None, key: Optional[str] = None,
                 user: Optional[str] = None, password: Optional[str] = None,
                 token: Optional[str] = None, duplicate_wait: Optional[float] = None,
                 direct_acks: bool = True) -> None:
        if not ttl >= 1:
            raise ValueError("ttl must be at least 1 second (etcd leases count whole seconds)")
        names = [locks] if isinstance(locks, str) else list(dict.fromkeys(locks))
        if not names:
            raise ValueError("an agent needs at least one lock")
        self.keys = Keys(cluster)
        self.cluster = cluster
        self.host_id = valid_host_id(host_id or socket.gethostname())
        self.ttl = float(ttl)
        self.endpoints = endpoints
        self.tls = TLS(ca, cert, key, user, password, token)
        self.lock_names = names
        self.log = log or (lambda msg: None)
        self.duplicate_wait = 2 * self.ttl + 1 if duplicate_wait is None else duplicate_wait
        self.direct_acks = direct_acks
        self.node = f"{socket.gethostname()}:{_boot_id()}"
        self.pid = os.getpid()
        self.pid_start = _pid_start(self.pid)
        # 1. fail closed from the start: every lock paused, its lease expired.
        self.locks = HostLocks(names, cluster, endpoints, self.host_id, self.pid, self.log)
        self.setting = self.locks.setting
        self._lease = 0
        self._create_rev = 0
        self._published: Optional[Dict[str, Any]] = None
        self._stop: Optional[asyncio.Event] = None
        self._woken = False                                 # a wake-up not yet slept through
        self._waiter: Optional[asyncio.Future[None]] = None
        self.mirrored = -1
        self._retry_soon = False
        self._report: Optional[Dict[str, Any]] = None       # what the last pass did
        self._changed_at = 0.0                              # when it last changed
        self._sent: Optional[Dict[str, Any]] = None         # the last report sent directly
        self._published_report: Optional[Dict[str, Any]] = None   # ...and written in etcd
        self._expiry_count = self.locks.expiries()          # local leases run out, so far
        self._published_expiries = -1
        self._publish_now = False
        self._ackreq_seen = 0                               # the last ackreq answered
        self.acks: Optional[AckSender] = None

    # -------------------------------------------------------- compatibility
    @property
    def lock(self) -> RWLock:
        """The first lock (an agent of one lock)."""
        lock: RWLock = self.locks.locals[0].lock
        return lock

    # ----------------------------------------------------------- lease
    def _lost(self, why: str) -> None:
        self.locks.pause_all()                     # at once, not at the deadline
        self.locks.arm(0)
        self._lease = 0
        self._create_rev = 0
        self._published = None
        self._wake()
        self.log(f"lease lost ({why}): paused, registering again")

    async def _renew(self, lease: int) -> bool:
        sent = time.monotonic()
        try:
            left = await self.etcd.lease_keepalive(
                lease, deadline=sent + LOCAL_FRACTION * self.ttl)
        except LeaseNotFound:
            left = 0
        if lease != self._lease:
            return False
        if left <= 0:
            self._lost("etcd says the lease expired")
            return False
        deadline = sent + LOCAL_FRACTION * min(self.ttl, float(left))
        self.locks.arm(deadline - time.monotonic())
        return True

    async def _keepalive_loop(self) -> None:
        interval = keepalive_interval(self.ttl)
        last_ok = time.monotonic()
        expiries = self.locks.expiries()
        while True:
            await asyncio.sleep(interval)
            lease = self._lease
            if not lease:
                continue
            try:
                if await self._renew(lease):
                    if time.monotonic() - last_ok > 2 * interval + 1.0:
                        self.log(f"keep-alive back after {time.monotonic() - last_ok:.2f} s")
                    last_ok = time.monotonic()
                    # A member that answers has the stream too: a member
                    # that stopped answering may have stopped its events.
                    if getattr(self, "mirror", None) is not None:
                        self.mirror.follow(self.etcd.preferred)
            except ClusterError as e:   # the local deadline runs out on its own
                self.log(f"keep-alive failing for {time.monotonic() - last_ok:.2f} s: {e}")
            except Exception as e:   # pragma: no cover
                self.log(f"keep-alive error: {e!r}")
            now_exp = self.locks.expiries()
            if now_exp != expiries:
                self.log(f"a local lease ran out ({now_exp - expiries} time(s)): "
                         "the watchdog paused this host")
                expiries = self._expiry_count = now_exp
                self._wake()                         # reported with the next status

    # ---------------------------------------------------- registration
    def _static(self) -> Dict[str, Any]:
        return {"host": self.host_id, "pid": self.pid, "pid_start": self.pid_start,
                "node": self.node, "cluster": self.cluster, "ttl": self.ttl}

    async def _claim(self) -> None:
        """Register ``hosts/<id>`` under our lease, unless another live
        agent holds the id (DuplicateHostError after ``duplicate_wait``)."""
        e, k = self.etcd, self.keys
        key = k.host(self.host_id)
        give_up = time.monotonic() + self.duplicate_wait
        while True:
            reg = self._registration()
            ok, rev, r = await e.txn(
                [e.cmp_create(key, 0), e.cmp_create(k.evicted_host(self.host_id), 0)],
                [e.op_put(key, dumps(reg), self._lease)],
                [e.op_range(key), e.op_range(k.evicted_host(self.host_id))])
            if ok:
                self._create_rev, self._published = rev, reg
                self.log(f"registered as {self.host_id!r} (lease {self._lease:x}) "
                         f"for {len(self.lock_names)} lock(s)")
                return
            cur = r[0] if r else []
            if len(r) > 1 and r[1]:
                self._create_rev = -1                     # evicted: stay out, paused
                return
            if not cur:
                continue
            kv = cur[0]
            other = loads(kv["value"])
            mine_before = kv["lease"] == self._lease or (
                other.get("pid") == self.pid and other.get("pid_start") == self.pid_start
                and other.get("node") == self.node)
            pid = other.get("pid")
            stale = (other.get("node") == self.node and
                     _pid_start(pid if isinstance(pid, int) else 0) != other.get("pid_start"))
            if mine_before:        # our own (a retried claim, or an old lease of ours)
                ok, rev, _ = await e.txn([e.cmp_mod(key, kv["mod_revision"])],
                                         [e.op_put(key, dumps(reg), self._lease)])
                if ok:                        # a put keeps the create revision
                    self._create_rev, self._published = kv["create_revision"], reg
                    return
                continue
            if stale:              # a dead agent of this host: a new registration,
                # so that a host restarted mid-update is not taken as present.
                await e.txn([e.cmp_mod(key, kv["mod_revision"])], [e.op_delete(key)])
                self.log(f"replacing the registration of a dead agent (pid {pid})")
                continue
            msg = (f"host id {self.host_id!r} is already registered by pid {pid} "
                   f"on {str(other.get('node', '?')).split(':')[0]} (locks "
                   f"{other.get('locks', other.get('lock'))!r}); every agent needs its own "
                   "--host-id")
            if time.monotonic() >= give_up:
                raise DuplicateHostError(msg)
            self.log(msg + "; waiting for it to go")
            await asyncio.sleep(0.5)

    def _registration(self) -> Dict[str, Any]:
        """What the agent writes in etcd: who it is, and its last report.
        (Not the locks' fences: they follow every revision, and writing them
        would write on every write.)"""
        reg = self._static()
        rep = self._report or {"mirrored": -1, "paused": True, "drained": False,
                               "locks": self.locks.initial()}
        locks = rep["locks"]         # its locks by name, and what each does
        reg.update(rep)
        reg.update(
            behind=any(v["standing"] != CURRENT for v in locks.values()),
            suspect=any(v["suspect"] for v in locks.values()),
            users=min((v["users"] for v in locks.values()), default=-1),
            applied_update=min((v["applied"] for v in locks.values()), default=0),
            lease_expiries=self._expiry_count)
        return reg

    def _unpublished(self) -> bool:
        """Whether etcd lacks the agent's last report (checked every pass:
        no registration is built for it)."""
        return self._report != self._published_report or \
            self._expiry_count != self._published_expiries

    async def _publish(self) -> None:
        if self._create_rev <= 0 or not self._lease:
            return                       # not registered (or the lease just went)
        if self._published is not None and not self._unpublished():
            return                                   # write only on change
        report, expiries = self._report, self._expiry_count
        reg = self._registration()
        e, key = self.etcd, self.keys.host(self.host_id)
        body = dict(reg, at=time.time())
        try:
            ok, _, _ = await e.txn([e.cmp_create(key, self._create_rev)],
                                   [e.op_put(key, dumps(body), self._lease)])
        except LeaseNotFound:
            self._lost("etcd no longer has the lease")
            return
        if not ok:                 # evicted, or the id was taken: claim it again
            self._create_rev = 0
            self._published = None
            return
        self._published = reg
        self._published_report, self._published_expiries = report, expiries
        self._publish_now = False
        self.mirrored = reg["mirrored"]

    # ----------------------------------------------------------- mirror
    async def _apply(self) -> None:
        st = self.mirror.state
        self.locks.raise_fences(st)
        if self.host_id in st.evicted:
            self._create_rev = -1                    # our registration went with it
        elif self._create_rev == -1:
            self._create_rev = 0                     # admitted again
        if self._create_rev == 0:
            await self._claim()
            if self._create_rev > 0:
                # Registered (again): apply only state read after it.  A pause
                # written before the registration counted it, or this read
                # sees it; the copy may be older (a watch hung across a cut,
                # a claim that waited for a duplicate to go).
                await self.mirror.load()
                st = self.mirror.state
                self.locks.raise_fences(st)
        evicted = self._create_rev == -1
        locks, all_paused, all_drained, retry = self.locks.apply(
            st, self.host_id, self._create_rev, evicted)
        self._retry_soon = retry
        if evicted:
            return
        report = {"mirrored": st.gate_rev, "paused": all_paused,
                  "drained": all_drained and st.drain, "locks": locks}
        if report != self._report:
            self._report = report
            self._changed_at = time.monotonic()
        await self._acknowledge(st)
        if self._create_rev == 0:
            self._retry_soon = True                  # claim it again at once

    async def _acknowledge(self, st: State) -> None:
        """Report to the controllers: a datagram to each that listens; in
        etcd at once when the gate's writer asked for it, when none listens,
        or when a controller asks this host (it did not hear it directly);
        otherwise in etcd once still (SETTLE), for ``status``."""
        assert self._report is not None
        acks = self.acks
        added = acks.set_ackers(st.ackers) if acks is not None else False
        if acks is not None and self._create_rev > 0 and (
                self._report != self._sent or acks.registration != self._create_rev):
            self._sent = self._report
            if not acks.send(self._create_rev, self._report):
                self._publish_now = True
        elif acks is not None and added:
            acks.resend_to_new()
        if acks is None or st.acks_in_etcd:
            self._publish_now = True
        if st.ackreq_rev > self._ackreq_seen and st.asked_for_report(self.host_id):
            self._ackreq_seen = st.ackreq_rev
            self._publish_now = True
            self._published_report = None        # write it even if etcd has it
        if self._publish_now or time.monotonic() - self._changed_at >= SETTLE:
            await self._publish()

    def _wake(self) -> None:
        """Wake the main loop (a change of the copy, a lost lease, a stop);
        one that is not asleep returns from its next sleep."""
        self._woken = True
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def _main(self) -> None:
        assert self._stop is not None
        self.mirror = Mirror(self.etcd, self.keys, resync=max(0.25, min(5.0, self.ttl / 2)),
                             prefix=self.keys.ctl)
        self.mirror.listeners.append(self._wake)
        while not self._stop.is_set():
            try:
                if not self._lease:
                    self.locks.pause_all()
                    self.locks.arm(0)
                    lease = await self.etcd.lease_grant(self.ttl)
                    self._lease = lease
                    if not await self._renew(lease):
                        continue
                    await self.mirror.start()
                seen = self.mirror.version
                await self._apply()
            except DuplicateHostError:
                raise
            except (AuthenticationError, CertificateError) as ex:
                self.log(f"etcd: {ex}")
                await self._sleep(1.0)
                continue
            except ClusterError as ex:
                self.log(f"etcd: {ex}")
                await self._sleep(0.1)
                continue
            except Exception as ex:      # never exit on one: the host stays paused meanwhile
                self.log(f"unexpected error, retrying in 1 s: {ex!r}")
                await self._sleep(1.0)
                continue
            if self._retry_soon:
                timeout = 0.01
            elif self._published is not None and self._unpublished():
                timeout = max(0.01, self._changed_at + SETTLE - time.monotonic())
            else:
                timeout = self.ttl / 4
            await self._sleep(timeout, seen)

    async def _sleep(self, timeout: float, seen: int = -1) -> None:
        """Until the copy changes (from version ``seen``: a change during the
        last pass, while it waited for etcd, wakes it at once), the lease is
        lost, a stop, or ``timeout``.  One future and one
        timer: this is on every host's path to acknowledging a pause."""
        if self._woken or (seen >= 0 and self.mirror.version != seen):
            self._woken = False
            return
        loop = asyncio.get_running_loop()
        w: asyncio.Future[None] = loop.create_future()
        self._waiter = w
        timer = loop.call_later(timeout, _settle, w)
        try:
            await w
        finally:
            timer.cancel()
            self._waiter = None
            self._woken = False

    async def run_async(self) -> None:
        self._stop = asyncio.Event()
        # Agents start on different members (by host id), so that no one
        # member's gateway does every host's JSON work.
        self.etcd = Etcd(self.endpoints, tls=self.tls,
                         request_timeout=min(1.0, self.ttl / 4),
                         hedge_after=min(0.15, self.ttl / 10),
                         prefer=zlib.crc32(self.host_id.encode()))
        if self.direct_acks:
            self.acks = AckSender(self.cluster, self.host_id)
            await self.acks.open()
        ka = asyncio.ensure_future(self._keepalive_loop())
        main = asyncio.ensure_future(self._main())
        stopper = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait([main, stopper], return_when=asyncio.FIRST_COMPLETED)
            if main.done():
                main.result()
        finally:
            for t in (ka, main, stopper):
                t.cancel()
            for t in (ka, main):
                try:
                    await t
                except BaseException:
                    pass
            await self._leave()

    def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._wake()

    async def _leave(self) -> None:
        """Leave the cluster: the host stays paused (fail closed) and its
        registration goes at once (the lease is revoked)."""
        try:
            self.locks.pause_all()
            self.locks.arm(0)
        except ValueError:
            return                      # already closed
        lease, self._lease = self._lease, 0
        try:
            if self.acks is not None:
                self.acks.close()
            if getattr(self, "mirror", None) is not None:
                await self.mirror.stop()
            if lease:
                await self.etcd.lease_revoke(lease, deadline=time.monotonic() + 1.5)
            await self.etcd.aclose()
        finally:
            self.locks.close()

    def run(self) -> None:
        asyncio.run(self.run_async())


def main(args: Any) -> int:
    """``pyshmlock agent``: run until SIGTERM/SIGINT/SIGHUP."""
    import sys

    locks = [n.strip() for v in args.lock for n in v.split(",") if n.strip()]

    def log(msg: str) -> None:
        print(f"pyshmlock agent [{args.host_id or '-'}]: {msg}", file=sys.stderr, flush=True)

    try:
        agent = Agent(args.etcd, args.cluster, locks, host_id=args.host_id, ttl=args.ttl,
                      log=log, ca=args.cacert, cert=args.cert, key=args.key, user=args.user,
                      password=_password(args), token=None)
    except (ClusterError, ValueError, OSError) as e:
        log(f"cannot start: {e}")
        return 1

    async def go() -> None:
        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            # Runs in the loop, not in the signal handler: no lock is at
            # stake.  If the clean exit stalls on etcd, SIGALRM's default
            # action ends the process: the locks are paused, their leases
            # expired.
            signal.alarm(3)
            agent.stop()

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(sig, on_signal)
        await agent.run_async()

    log(f"lock(s) {', '.join(locks)} paused; mirroring cluster {args.cluster!r}")
    try:
        asyncio.run(go())
    except DuplicateHostError as e:
        log(f"refusing to run: {e}")
        return 2
    log("stopped; the local gates stay paused")
    return 0


def _password(args: Any) -> Optional[str]:
    """--password-file, or $PYSHMLOCK_ETCD_PASSWORD (never on the command line)."""
    path = getattr(args, "password_file", None)
    if path:
        with open(path) as f:
            return f.read().strip()
    return os.environ.get("PYSHMLOCK_ETCD_PASSWORD")

