"""A watched copy of one cluster's keys, shared by the agent and the controllers.

One linearizable range read, then one watch stream from the revision after
it; every event applies to the copy in revision order, so the copy is the
state at ``revision``.  The stream comes from one member (``member``).

A watch on a member that hung, or that lost its quorum, delivers nothing
and says nothing.  Two things catch it:

* ``follow(member)``: the agent calls it after every successful keep-alive
  with the member that answered (a hung member does not answer, the hedge
  moves on); a stream on another member is restarted there, read first.
* if nothing arrives for ``resync`` seconds, the copy is checked with one
  small read (``keys_only``: the keys and their revisions, no values); only
  if a key changed that the stream did not deliver is the copy read again
  and the stream restarted.  An idle host costs one small read per
  ``resync``, not a read and a new stream.

Watch events carry the values, so following changes costs no extra read.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Dict, List, Optional

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
        self.member = -1                 # the member the stream comes from
        self.fatal: Optional[BaseException] = None
        #: called (in the loop) at every change of the copy
        self.listeners: List[Callable[[], None]] = []
        self.reloads = 0                 # full reads after the first (for the tests)
        # Made in the loop, not here: on Python 3.9 an Event made outside a
        # running loop belongs to another one (an AsyncCluster made before
        # asyncio.run would not work).
        self._ev: Optional[asyncio.Event] = None
        self._restart: Optional[asyncio.Event] = None
        self._heard = 0.0                # when the stream last delivered (or was checked)
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
        for fn in self.listeners:
            fn()

    async def load(self, deadline: Optional[float] = None) -> None:
        """Read the copy again (linearizable).  It never goes back: a read
        that answers with an older revision than the copy has is dropped."""
        kvs, rev = await self.etcd.range(self.prefix, prefix=True, deadline=deadline)
        if rev < self.revision:
            return
        if self.loaded:
            self.reloads += 1
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

    def follow(self, member: int) -> None:
        """Move the stream to ``member`` (one that just answered) if it comes
        from another one: a member that stopped answering may also have
        stopped delivering events."""
        if self._task is not None and self.member >= 0 and member != self.member:
            if self._restart is None:
                self._restart = asyncio.Event()
            self._restart.set()

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

    async def _pump(self) -> None:
        self.member = self.etcd.preferred
        async for rev, events in self.etcd.watch(self.prefix, self.revision + 1, self.member):
            self._apply(rev, events)
            self._heard = time.monotonic()

    async def _current(self) -> bool:
        """Whether the copy still matches etcd (one keys-only read): no key
        changed, appeared or went since the copy's revision."""
        kvs, rev = await self.etcd.range(self.prefix, prefix=True, keys_only=True)
        if rev < self.revision:
            return True                     # an older member: nothing to learn
        keys = {kv["key"]: kv["mod_revision"] for kv in kvs}
        return keys.keys() == self.kvs.keys() and all(
            m <= self.revision and m == self.kvs[k]["mod_revision"] for k, m in keys.items())

    async def _run(self) -> None:
        while True:
            self._restart = asyncio.Event()
            restart = asyncio.ensure_future(self._restart.wait())
            pump = asyncio.ensure_future(self._pump())
            self._heard = time.monotonic()
            try:
                while not pump.done() and not restart.done():
                    # Wakes when the stream ends, a restart, or the copy has
                    # been quiet for resync (not at every event: that cost a
                    # task per event on every host's path to acknowledging).
                    quiet = self._heard + self.resync - time.monotonic()
                    if quiet > 0:
                        await asyncio.wait([pump, restart], timeout=quiet,
                                           return_when=asyncio.FIRST_COMPLETED)
                        continue
                    try:                    # quiet: check the copy with one small read
                        if await self._current():
                            self._heard = time.monotonic()
                            continue
                    except (ClusterError, OSError):
                        pass
                    break
            finally:
                restart.cancel()
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
            except Exception as e:   # unreachable for now: try again soon
                if isinstance(e, (AuthenticationError, CertificateError)):
                    self.fatal = e
                    self._bump()
                await asyncio.sleep(0.05)
