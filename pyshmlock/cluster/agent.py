"""The host agent: mirrors the cluster gate in etcd into this host's lock.

One agent runs per host (``pyshmlock agent --etcd URLS --cluster NAME
--lock LOCAL_LOCK``).  It

1. opens the local lock, pauses it and arms the host lease already expired,
   so the host admits nothing before it knows the cluster's state, and
   writes the host-level setting (``_hostconf``) that makes servers open
   the lock fail-closed;
2. takes an etcd lease of ``ttl`` seconds and keeps it alive with hedged
   keep-alives (a hung member costs 150 ms, not a timeout); every keep-alive
   sent at time t that succeeds pushes the local lease deadline to
   t + LOCAL_FRACTION * ttl, always before etcd can expire the lease;
3. claims its registration ``hosts/<id>`` (refusing an id another live agent
   holds), then follows a watched copy of the cluster's keys: on each change
   it raises the lock's fence to the fleet's update token, applies the gate
   (pause, drain if asked, or resume), and publishes its registration, only
   when what it reports changed (an idle host writes nothing);
4. keeps the host paused while it is behind the fleet's update generation,
   evicted, or its lock's data is suspect, and says so in its registration.

If it dies, is stopped or loses etcd, the keep-alives stop and the local
lease runs out: the C core's lease watchdog in every process attached to the
lock pauses the gate by itself (docs/DESIGN.md, "Beyond one host").  If etcd
says its lease has expired, it pauses at once, registers afresh and only
then mirrors the current state again.
"""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
import zlib
from typing import Any, Dict, Optional, Sequence

from .._hostconf import read_setting, write_setting
from ..errors import DataSuspectError
from ..lock import RWLock
from ._errors import (
    AuthenticationError,
    CertificateError,
    ClusterError,
    DuplicateHostError,
)
from ._etcd import TLS, Etcd, LeaseNotFound
from ._keys import Keys, State, dumps, loads, valid_host_id
from ._lease import KEEPER_POLL_S, lease_arm, lease_info
from ._mirror import Mirror

__all__ = ["DEFAULT_TTL", "LOCAL_FRACTION", "Agent"]

#: The local lease runs out this fraction of the etcd TTL after the last
#: keep-alive was *sent*; etcd cannot expire the lease before a full TTL
#: after it *received* it, so the host is paused before it can be lost.
LOCAL_FRACTION = 0.75
#: The default host lease: long enough that a leader election with etcd's
#: default timings (1 s election timeout; up to about 5 s without a leader
#: measured here on a loaded 2-CPU machine) closes no host (docs/OPERATIONS.md,
#: "Choosing the TTL"); a cut-off host stops admitting within 7.5 s.
DEFAULT_TTL = 10.0


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


class Agent:
    def __init__(self, endpoints: Sequence[str] | str, cluster: str, lock: str, *,
                 host_id: Optional[str] = None, ttl: float = DEFAULT_TTL,
                 log: Any = None, ca: Optional[str] = None, cert: Optional[str] = None,
                 key: Optional[str] = None, user: Optional[str] = None,
                 password: Optional[str] = None, token: Optional[str] = None,
                 duplicate_wait: Optional[float] = None) -> None:
        if not ttl >= 1:
            raise ValueError("ttl must be at least 1 second (etcd leases count whole seconds)")
        self.keys = Keys(cluster)
        self.cluster = cluster
        self.host_id = valid_host_id(host_id or f"{socket.gethostname()}-{lock}")
        self.ttl = float(ttl)
        self.endpoints = endpoints
        self.tls = TLS(ca, cert, key, user, password, token)
        self.lock_name = lock
        self.log = log or (lambda msg: None)
        self.duplicate_wait = 2 * self.ttl + 1 if duplicate_wait is None else duplicate_wait
        self.node = f"{socket.gethostname()}:{_boot_id()}"
        self.pid = os.getpid()
        self.pid_start = _pid_start(self.pid)
        prev = read_setting(lock)
        if prev is not None and prev.get("cluster") not in (None, cluster):
            raise ClusterError(f"lock {lock!r} belongs to cluster {prev.get('cluster')!r} "
                               f"(its host setting says so); refusing to join {cluster!r}")
        # 1. fail closed from the start: paused, lease already expired.
        # stale="keep": the agent decides when this host's gate opens; a
        # pause left by a dead process is never cleared behind its back.
        # The host setting first: from then on a server that creates the
        # segment creates it paused under an expired lease (fail closed).
        self.setting = write_setting(lock, cluster, endpoints, self.host_id, self.pid)
        self.lock = RWLock(lock, stale="keep")
        self.lock.pause()
        lease_arm(self.lock, 0)
        self._lease = 0
        self._create_rev = 0
        self._published: Optional[Dict[str, Any]] = None
        self._known_current = 0
        self._suspect = False
        self._stop: Optional[asyncio.Event] = None
        self._kick: Optional[asyncio.Event] = None
        self.mirrored = -1
        self._retry_soon = False
        self._users_at, self._users_n = -1e9, -1

    # ----------------------------------------------------------- lease
    def _lost(self, why: str) -> None:
        self.lock.pause()                     # at once, not at the deadline
        lease_arm(self.lock, 0)
        self._lease = 0
        self._create_rev = 0
        self._published = None
        if self._kick is not None:
            self._kick.set()
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
        lease_arm(self.lock, deadline - time.monotonic())
        return True

    async def _keepalive_loop(self) -> None:
        interval = min(self.ttl / 10, 1.0)
        last_ok = time.monotonic()
        expiries = int(lease_info(self.lock)["expiries"] or 0)
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
            except ClusterError as e:   # the local deadline runs out on its own
                self.log(f"keep-alive failing for {time.monotonic() - last_ok:.2f} s: {e}")
            except Exception as e:   # pragma: no cover
                self.log(f"keep-alive error: {e!r}")
            now_exp = int(lease_info(self.lock)["expiries"] or 0)
            if now_exp != expiries:
                self.log(f"the local lease ran out ({now_exp - expiries} time(s)): "
                         "the watchdog paused this host")
                expiries = now_exp

    # ---------------------------------------------------- registration
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
                self.log(f"registered as {self.host_id!r} (lease {self._lease:x})")
                return
            cur = r[0]
            if r[1]:
                self._create_rev = -1                     # evicted: stay out, paused
                return
            if not cur:
                continue
            kv = cur[0]
            other = loads(kv["value"])
            mine_before = kv["lease"] == self._lease or (
                other.get("pid") == self.pid and other.get("pid_start") == self.pid_start
                and other.get("node") == self.node)
            stale = (other.get("node") == self.node and
                     _pid_start(int(other.get("pid", 0) or 0)) != other.get("pid_start"))
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
                self.log(f"replacing the registration of a dead agent (pid {other.get('pid')})")
                continue
            msg = (f"host id {self.host_id!r} is already registered by pid {other.get('pid')} "
                   f"on {other.get('node', '?').split(':')[0]} (lock {other.get('lock')!r}); "
                   "every agent needs its own --host-id")
            if time.monotonic() >= give_up:
                raise DuplicateHostError(msg)
            self.log(msg + "; waiting for it to go")
            await asyncio.sleep(0.5)

    def _users(self) -> int:
        """Processes other than the agent attached to the lock (at most one
        scan of the slots a second: it is not on a pause's critical path)."""
        t = time.monotonic()
        if t - self._users_at >= 1.0:
            try:
                pids = self.lock.info().attached_pids
                self._users_n = len([p for p in pids if p != self.pid])
            except Exception:   # pragma: no cover
                self._users_n = -1
            self._users_at = t
        return self._users_n

    def _registration(self) -> Dict[str, Any]:
        """What the agent reports; written only when it changes.  (Not the
        lock's fence: it follows every revision, and writing it would write
        on every write.)"""
        return {"host": self.host_id, "pid": self.pid, "pid_start": self.pid_start,
                "node": self.node, "lock": self.lock_name, "cluster": self.cluster,
                "mirrored": -1, "paused": True, "drained": False,
                "users": self._users(), "behind": False, "suspect": self._suspect,
                "applied_update": self.lock.applied_update,
                "lease_expiries": lease_info(self.lock)["expiries"]}

    async def _publish(self, reg: Dict[str, Any]) -> None:
        if self._published is not None and reg == self._published:
            return                                   # write only on change
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
        self.mirrored = reg["mirrored"]

    # ----------------------------------------------------------- mirror
    def _open_local(self) -> bool:
        """Resume the local gate, only while the local lease runs."""
        rem = lease_info(self.lock)["remaining"] or 0.0
        if rem <= 2 * KEEPER_POLL_S:
            return False
        try:
            opened = self.lock._resume_as_manager(0)
        except DataSuspectError:          # never forced: an update died on this host
            if not self._suspect:
                self.log("the lock's data is suspect (an update died on this host): "
                         "staying paused until an update completes here")
            self._suspect = True
            return False
        self._suspect = False
        if not opened:
            return False        # a local update hold (a fenced update) pins the pause
        # Stopped between the check and the resume for longer than the lease?
        # Close again at once (the watchdogs would within one poll anyway).
        if (lease_info(self.lock)["remaining"] or 0.0) <= 0:
            self.lock.pause()
            return False
        return True

    def _raise_fence(self, st: State) -> None:
        # While an update holds the lock its token is current; otherwise
        # every token up to this revision is stale (a later update's token
        # is a later revision).
        self.lock.raise_fence(st.update_token if st.update is not None else st.revision + 1)

    async def _apply(self) -> None:
        st = self.mirror.state
        self._raise_fence(st)
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
                self._raise_fence(st)
        evicted = self._create_rev == -1
        applied = self.lock.applied_update
        tok = st.generation_token
        if tok == 0 or max(applied, self._known_current) >= tok:
            current = True
        else:
            current = self._create_rev > 0 and st.current(self.host_id,
                                                          registration=self._create_rev)
            if current:
                self._known_current = tok
        behind = not current
        want_open = not (st.paused or behind or evicted)
        drained = False
        paused = True
        if want_open:
            paused = not self._open_local()
        else:
            self.lock.pause()
            if st.drain:
                drained = self.lock.wait_drained(timeout=0)
        # Poll soon while a drain is under way, or while the gate should be
        # open but is not yet (a local update hold pins it, the lease is short).
        self._retry_soon = (st.drain and not drained) or \
            (want_open and paused and not self._suspect)
        if evicted:
            return
        reg = self._registration()
        reg.update(mirrored=st.gate_rev, paused=paused, drained=drained, behind=behind)
        await self._publish(reg)
        if self._create_rev == 0:
            self._retry_soon = True                  # claim it again at once

    async def _main(self) -> None:
        assert self._stop is not None and self._kick is not None
        self.mirror = Mirror(self.etcd, self.keys, resync=max(0.25, self.ttl / 4),
                             prefix=self.keys.ctl)
        while not self._stop.is_set():
            try:
                if not self._lease:
                    self.lock.pause()
                    lease_arm(self.lock, 0)
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
            await self._sleep(0.01 if self._retry_soon else self.ttl / 4, seen)

    async def _sleep(self, timeout: float, seen: int = -1) -> None:
        """Until the copy changes (from version ``seen``: a change during the
        last pass, while it waited for etcd, wakes it at once), the lease is
        lost, a stop, or ``timeout``."""
        assert self._kick is not None
        if seen >= 0 and self.mirror.version != seen:
            return
        waits = [asyncio.ensure_future(self._kick.wait())]
        if getattr(self, "mirror", None) is not None and self.mirror.loaded:
            waits.append(asyncio.ensure_future(self.mirror.event().wait()))
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        self._kick.clear()

    async def run_async(self) -> None:
        self._stop = asyncio.Event()
        self._kick = asyncio.Event()
        # Agents start on different members (by host id), so that no one
        # member's gateway does every host's JSON work.
        self.etcd = Etcd(self.endpoints, tls=self.tls,
                         request_timeout=min(1.0, self.ttl / 4),
                         hedge_after=min(0.15, self.ttl / 10),
                         prefer=zlib.crc32(self.host_id.encode()))
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

    async def _leave(self) -> None:
        """Leave the cluster: the host stays paused (fail closed) and its
        registration goes at once (the lease is revoked)."""
        try:
            self.lock.pause()
            lease_arm(self.lock, 0)
        except ValueError:
            return                      # already closed
        lease, self._lease = self._lease, 0
        try:
            if getattr(self, "mirror", None) is not None:
                await self.mirror.stop()
            if lease:
                await self.etcd.lease_revoke(lease, deadline=time.monotonic() + 1.5)
            await self.etcd.aclose()
        finally:
            try:
                self.lock.close()
            except Exception:
                pass

    def run(self) -> None:
        asyncio.run(self.run_async())


def main(args: Any) -> int:
    """``pyshmlock agent``: run until SIGTERM/SIGINT/SIGHUP."""
    import sys

    def log(msg: str) -> None:
        print(f"pyshmlock agent [{args.host_id or '-'}]: {msg}", file=sys.stderr, flush=True)

    try:
        agent = Agent(args.etcd, args.cluster, args.lock, host_id=args.host_id, ttl=args.ttl,
                      log=log, ca=args.ca, cert=args.cert, key=args.key, user=args.user,
                      password=_password(args), token=None)
    except (ClusterError, ValueError, OSError) as e:
        log(f"cannot start: {e}")
        return 1

    async def go() -> None:
        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            # Runs in the loop, not in the signal handler: no lock is at
            # stake.  If the clean exit stalls on etcd, SIGALRM's default
            # action ends the process: the lock is paused, its lease expired.
            signal.alarm(3)
            agent.stop()

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(sig, on_signal)
        await agent.run_async()

    log(f"lock {args.lock!r} paused; mirroring cluster {args.cluster!r}")
    try:
        asyncio.run(go())
    except DuplicateHostError as e:
        log(f"refusing to run: {e}")
        return 2
    log("stopped; the local gate stays paused")
    return 0


def _password(args: Any) -> Optional[str]:
    """--password-file, or $PYSHMLOCK_ETCD_PASSWORD (never on the command line)."""
    path = getattr(args, "password_file", None)
    if path:
        with open(path) as f:
            return f.read().strip()
    return os.environ.get("PYSHMLOCK_ETCD_PASSWORD")

