"""The cluster update lock (``AsyncCluster.update()``): its acquire (a
lease, one transaction, the fleet paused and drained, lost hosts closed),
its release (the generation: who applied it, who failed), and the abort of
an acquire that did not finish (docs/DESIGN.md §11, "Updates that fail stay
closed")."""
from __future__ import annotations

import asyncio
import time
import uuid
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Set, Tuple

from ._calls import PauseResult, add_note, deadline_of, finish_cleanup, left, registered_of, spawn
from ._errors import ClusterError, ClusterTimeout, UpdateLostError
from ._etcd import LeaseNotFound
from ._keys import State, as_dict, as_int, dumps, loads
from ._waiting import report_locks

if TYPE_CHECKING:
    from ._controller import AsyncCluster

__all__ = ["AsyncClusterUpdate"]


class AsyncClusterUpdate:
    """The cluster update lock.  ``token`` is its fencing token: pass it to
    ``lock.fenced_update(token)`` at each host (or in the
    ``X-Pyshmlock-Fence`` header of the host's update call), where an update
    whose lock was lost is refused.  ``applied`` says, per host and lock,
    whether the host's lock recorded this update (a fenced update with this
    token completed there); ``mark_failed(host)`` records that a host's
    apply failed (it stays behind), ``mark_applied(host)`` that it succeeded
    (what counts when the block raises)."""

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
        self._failed: Dict[str, Any] = {}       # host -> "*" or [locks]
        self._marked: Set[str] = set()
        self._lost = False
        self._ka: Optional[asyncio.Task[None]] = None
        self._released = False
        self._held_at = 0.0

    @property
    def lost(self) -> bool:
        """True once the update's lease is known to have expired."""
        return self._lost

    @property
    def applied(self) -> Dict[str, Dict[str, bool]]:
        """Per host acknowledged at the update's pause, per lock: whether
        its lock records this update as applied (the agents' latest
        reports; a lock reported a moment late shows False)."""
        st = self.c.mirror.state
        out: Dict[str, Dict[str, bool]] = {}
        for hid, cr in sorted(self._present.items()):
            rep = self.c.waits.report(st, hid, cr) or {}
            out[hid] = {lk: as_int(v.get("applied")) >= self.token
                        for lk, v in sorted(report_locks(rep).items())}
        return out

    def mark_failed(self, host: str, lock: Optional[str] = None) -> None:
        """Record that ``host`` (or only its ``lock``) failed to apply this
        update: it counts as behind (stays paused) until an update reaches
        it, whatever its lock recorded."""
        if lock is None:
            self._failed[host] = "*"
        elif self._failed.get(host) != "*":
            self._failed[host] = sorted(set(self._failed.get(host, [])) | {lock})

    def mark_applied(self, host: str) -> None:
        """Record that ``host`` applied this update completely (what counts
        for it if the block raises)."""
        self._marked.add(host)

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
        """Raise UpdateLostError (a FencingError) unless this update still
        holds the lock (one etcd read)."""
        kvs, _ = await self.c.etcd.range(self.c.keys.update)
        cur = kvs[0]["create_revision"] if kvs else 0
        if cur != self.token:
            self._lost = True
        if self._lost:
            raise UpdateLostError(f"cluster {self.c.name!r}: update token {self.token} "
                                  f"refused: the update lock was lost (current token {cur})")

    async def _acquire(self) -> None:
        c, e, k = self.c, self.c.etcd, self.c.keys
        t0 = time.monotonic()
        deadline = deadline_of(self.timeout)
        await c._ensure(deadline, session=True)
        self.lease = await c._update_lease(deadline)
        self._ka = spawn(self._keepalive())
        gate_rev, paused = c.mirror.state.gate_rev, c.mirror.state.paused
        while True:
            info = {"by": c.who, "at": time.time(), "was_paused": paused, "op": self._op}
            if c._session:
                info["session"] = f"{c._session:x}"
            try:
                ok, rev, r = await e.txn(
                    [e.cmp_create(k.update, 0), e.cmp_mod(k.gate, gate_rev)],
                    [e.op_put(k.update, dumps(info), self.lease),
                     e.op_put(k.gate, c._gate_value(True, "update", True, self._op)),
                     e.op_range(k.hosts, prefix=True, keys_only=True)],
                    [e.op_range(k.update), e.op_range(k.gate),
                     e.op_range(k.hosts, prefix=True, keys_only=True)],
                    deadline=deadline)
            except LeaseNotFound:          # a lease granted ahead that etcd lost: a new one
                self.lease = await e.lease_grant(c.ttl, deadline=deadline)
                continue
            if ok:
                self.token = rev               # = the update key's create revision
                self._was_paused = paused
                registered = registered_of(k, r[2])
                break
            upd, gate = r[0], r[1]
            if upd and upd[0]["lease"] == self.lease:      # our own retried write
                self.token = upd[0]["create_revision"]
                self._was_paused = bool(info["was_paused"])
                registered = registered_of(k, r[2])
                break
            if upd:
                token = upd[0]["create_revision"]
                while c.mirror.state.update_token == token or c.mirror.revision < rev:
                    if deadline is not None and time.monotonic() >= deadline:
                        by = c.mirror.state.update or {}
                        raise c._timeout(f"timed out waiting for the update by "
                                         f"{by.get('by')!r} (token {token}) to end", ["update"])
                    await c.mirror.wait(left(deadline, 0.5))
                gate_rev, paused = c.mirror.state.gate_rev, c.mirror.state.paused
            else:
                gate_rev = gate[0]["mod_revision"] if gate else 0
                paused = bool(State(k, {kv["key"]: kv for kv in gate}, rev).paused)
        try:
            out = await c.waits.await_hosts(self.token, registered, "drained", deadline, t0)
        except ClusterTimeout as ex:
            ex.took_effect = True
            raise
        if out is None:                        # cannot happen: resume waits for the update
            raise UpdateLostError("the update's pause was reopened")
        # No host serves while an update holds the fleet: a lost host is
        # closed by its own lease; wait for that (at most 3/4 of its TTL
        # after its agent went silent).
        while out.lost and max(out.lost.values()) > time.monotonic():
            if deadline is not None and time.monotonic() >= deadline:
                raise c._timeout(f"timed out waiting for lost hosts {sorted(out.lost)} to "
                                 "close by their own lease", sorted(out.lost), took_effect=True)
            await asyncio.sleep(min(left(deadline, 1.0),
                                    max(out.lost.values()) - time.monotonic()))
        r2 = c.waits.result(self.token, out, True, t0)
        self.result = r2
        self._present = {h: registered[h][0] for h in r2.acknowledged}
        c._check_expected(r2, registered, self.expect)
        c.metrics.update_acquire.observe(time.monotonic() - t0)
        self._held_at = time.monotonic()

    async def __aenter__(self) -> AsyncClusterUpdate:
        try:
            await self._acquire()
        except BaseException:
            await finish_cleanup(self._abort())
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
            gate = loads(kvs[0]["value"])
            if gate.get("op") == self._op and not self._was_paused:
                await e.txn([e.cmp_mod(k.gate, kvs[0]["mod_revision"]),
                             e.cmp_create(k.update, 0)],
                            [e.op_put(k.gate, self.c._gate_value(False, "resume"))],
                            deadline=end)

    def _generation(self, completed: bool) -> Dict[str, Any]:
        """The update as the fleet's generation: the hosts that count as
        having it (those registered throughout it, with the same
        registration; if the block raised, only those whose every lock
        recorded it or that were marked applied), and the failed ones."""
        st = self.c.mirror.state
        present = {h: cr for h, cr in self._present.items() if st.host_create.get(h) == cr}
        if not completed:
            applied = self.applied
            present = {h: cr for h, cr in present.items() if h in self._marked
                       or (applied.get(h) and all(applied[h].values()))}
        hosts = {h: cr for h, cr in present.items() if self._failed.get(h) != "*"}
        return {"token": self.token, "by": self.c.who, "at": time.time(), "hosts": hosts,
                "failed": dict(self._failed), "completed": completed}

    async def _release(self, completed: bool) -> Tuple[bool, Dict[str, Any]]:
        """Release the lock and write the generation; (released, the
        generation written).  The gate reopens only if the block completed
        and it was open before (and is still the gate this update wrote)."""
        c, e, k = self.c, self.c.etcd, self.c.keys
        if self._ka is not None:
            self._ka.cancel()
        self._released = True
        gen: Dict[str, Any] = {}
        ok = False
        ops = [e.op_delete(k.update)]
        if not self._lost:
            gen = self._generation(completed)
            ops.append(e.op_put(k.generation, dumps(gen)))
        end = time.monotonic() + max(5.0, c.ttl / 2)
        mine = [e.op_range(k.generation)]
        try:
            if completed and not self._was_paused:
                # Reopen only if the gate is still the one this update wrote
                # (gate.mod == token): a pause taken meanwhile stays, as locally.
                ok, _, r = await e.txn([e.cmp_create(k.update, self.token),
                                        e.cmp_mod(k.gate, self.token)],
                                       ops + [e.op_put(k.gate, c._gate_value(False, "resume"))],
                                       mine, deadline=end)
                ok = ok or self._was_mine(r)
            if not ok:
                ok, _, r = await e.txn([e.cmp_create(k.update, self.token)], ops, mine,
                                       deadline=end)
                ok = ok or self._was_mine(r)
        finally:
            # The update key is gone with the transaction: the lease only
            # needs to go, nobody waits for it (the next update's is granted).
            c._after_update(self.lease)
        return ok, gen

    def _was_mine(self, r: List[List[Dict[str, Any]]]) -> bool:
        """A release refused because an earlier copy of it already applied
        (a write sent to two members): the generation is this update's."""
        gen = loads(r[0][0]["value"]) if r and r[0] else {}
        return bool(gen) and as_int(gen.get("token")) == self.token and not self._lost

    async def __aexit__(self, et: Any, ev: Any, tb: Any) -> None:
        completed = et is None
        t = spawn(self._release(completed))
        try:
            ok, gen = await asyncio.shield(t)
        except asyncio.CancelledError:
            raise
        except ClusterError as x:
            if ev is not None:
                add_note(ev, f"pyshmlock.cluster: the update {self.token} could not be "
                             f"released ({x}): the fleet stays paused; its lock lapses with "
                             f"its lease")
            raise
        self.c.metrics.update_hold.observe(time.monotonic() - self._held_at,
                                           "completed" if completed else "failed")
        if ev is not None:
            behind = sorted(set(self._present) - set(as_dict(gen.get("hosts"))))
            add_note(ev, f"pyshmlock.cluster: the fleet {self.c.name!r} stays paused: the "
                         f"update {self.token} raised; the hosts that applied it count as "
                         f"current ({sorted(as_dict(gen.get('hosts')))}), the others stay "
                         f"paused as behind ({behind}) until an update reaches them; "
                         "resume() reopens the current ones")
            return
        if not ok:
            raise UpdateLostError(f"cluster {self.c.name!r}: update token {self.token} "
                                  f"refused at release: the update lock had been lost "
                                  f"(lease expired)")
