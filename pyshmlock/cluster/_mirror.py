"""A watched copy of one cluster's keys, shared by the agent and the controllers.

One linearizable range read, then one watch stream from the revision after
it; every event applies to the copy in revision order, so the copy is the
state at ``revision``.  The stream comes from one member; if nothing arrives
for ``resync`` seconds (a quiet cluster, or a member that hung) the copy is
read again (hedged, so from a member that answers) and the stream restarts
there.  Watch events carry the values, so waiting for acknowledgements costs
no extra read.
"""
from __future__ import annotations

import asyncio
from typing import Any, Dict, Optional

from ._errors import AuthenticationError, CertificateError, ClusterError
from ._etcd import Compacted, Etcd
from ._http import wait_for
from ._keys import Keys, State, loads

__all__ = ["Mirror"]


def _parse(kv: Dict[str, Any]) -> Dict[str, Any]:
    """Decode a value once, when it arrives: a State is built at every
    change, and parsing every registration each time was O(hosts^2) per
    pause in the controller."""
    kv["parsed"] = loads(kv["value"])
    return kv


class Mirror:
    def __init__(self, etcd: Etcd, keys: Keys, *, resync: float = 1.0,
                 prefix: Optional[str] = None) -> None:
        self.etcd, self.keys = etcd, keys
        self.prefix = prefix or keys.prefix
        self.resync = resync
        self.kvs: Dict[str, Dict[str, Any]] = {}
        self.revision = 0
        self.loaded = False
        self.version = 0                 # counts changes of the copy
        self.fatal: Optional[BaseException] = None
        # Made in the loop, not here: on Python 3.9 an Event made outside a
        # running loop belongs to another one (an AsyncCluster made before
        # asyncio.run would not work).
        self._ev: Optional[asyncio.Event] = None
        self._task: Optional[asyncio.Task[None]] = None
        self._state: Optional[State] = None

    @property
    def state(self) -> State:
        if self._state is None:
            self._state = State(self.keys, self.kvs, self.revision)
        return self._state

    def _bump(self) -> None:
        self._state = None
        self.version += 1
        ev, self._ev = self._ev, asyncio.Event()
        if ev is not None:
            ev.set()

    async def load(self, deadline: Optional[float] = None) -> None:
        """Read the copy again (linearizable).  It never goes back: a read
        that answers with an older revision than the copy has is dropped."""
        kvs, rev = await self.etcd.range(self.prefix, prefix=True, deadline=deadline)
        if rev < self.revision:
            return
        for kv in kvs:
            _parse(kv)
        self.kvs = {kv["key"]: kv for kv in kvs}
        self.revision = rev
        self.loaded = True
        self._bump()

    async def start(self, deadline: Optional[float] = None) -> None:
        if self._task is None or self._task.done():
            if not self.loaded:
                await self.load(deadline)
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        t, self._task = self._task, None
        if t is not None:
            t.cancel()
            try:
                await t
            except BaseException:
                pass

    def event(self) -> asyncio.Event:
        """An event set at the next change of the copy."""
        if self._ev is None:
            self._ev = asyncio.Event()
        return self._ev

    async def wait(self, timeout: float) -> bool:
        """Wait for the next change, at most ``timeout``; True if one came."""
        if timeout <= 0:
            return False
        ev = self.event()
        try:
            await wait_for(ev.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    def _apply(self, rev: int, events: Any) -> None:
        if rev <= self.revision:
            return
        for ev in events:
            if ev["mod_revision"] <= self.revision:
                continue
            if ev["type"] == "DELETE":
                self.kvs.pop(ev["key"], None)
            else:
                self.kvs[ev["key"]] = _parse(ev)
        self.revision = rev
        self._bump()

    async def _pump(self, got: asyncio.Event) -> None:
        async for rev, events in self.etcd.watch(self.prefix, self.revision + 1):
            self._apply(rev, events)
            got.set()

    async def _run(self) -> None:
        while True:
            got = asyncio.Event()
            pump = asyncio.ensure_future(self._pump(got))
            try:
                while not pump.done():
                    got.clear()
                    waiter = asyncio.ensure_future(got.wait())
                    done, _ = await asyncio.wait([pump, waiter], timeout=self.resync,
                                                 return_when=asyncio.FIRST_COMPLETED)
                    waiter.cancel()
                    if not done:          # quiet: read again, maybe from another member
                        break
            finally:
                pump.cancel()
                try:
                    await pump
                except BaseException:
                    pass
            try:
                if pump.done() and not pump.cancelled() and pump.exception() is not None:
                    exc = pump.exception()
                    if isinstance(exc, (AuthenticationError, CertificateError)):
                        self.fatal = exc
                        self._bump()
                    elif not isinstance(exc, Compacted):
                        await asyncio.sleep(0.02)
                await self.load()
                self.fatal = None
            except asyncio.CancelledError:
                raise
            except (ClusterError, Exception) as e:   # unreachable for now: try again soon
                if isinstance(e, (AuthenticationError, CertificateError)):
                    self.fatal = e
                    self._bump()
                await asyncio.sleep(0.05)
