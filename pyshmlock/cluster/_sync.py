"""The blocking face: Cluster and ClusterUpdate run AsyncCluster's coroutines
on one private event-loop thread per Cluster.

So both faces share one implementation (the timeouts, the fail-over, the
cancel-safe clean-ups).  A blocking call waits for its coroutine, which
enforces the call's timeout itself; an interrupt (KeyboardInterrupt) while
waiting cancels the coroutine, which cleans up as an asyncio cancellation
does.  The update lock's keep-alive runs in that thread too: a trainer that
holds the GIL keeps it from running, which is why the update lease defaults
to 30 s (``DEFAULT_UPDATE_TTL``) and why hosts fence stale updates.
"""
from __future__ import annotations

import asyncio
import sys
import threading
import weakref
from typing import Any, Dict, Optional, Sequence

from ..metrics import ClusterMetrics
from ._calls import ClusterStatus, PauseResult, add_note
from ._controller import AsyncCluster, AsyncClusterUpdate
from ._errors import ClusterTimeout

__all__ = ["Cluster", "ClusterUpdate", "PausedBlock"]

#: A blocking call waits this much past its own timeout for its coroutine,
#: which has raised ClusterTimeout by then (a backstop, never reached).
_BACKSTOP = 5.0


def _stop_loop(loop: asyncio.AbstractEventLoop) -> None:
    # No lock here (a finaliser's path): call_soon_threadsafe appends to a
    # deque and writes one byte to the loop's self-pipe.
    try:
        loop.call_soon_threadsafe(loop.stop)
    except RuntimeError:
        pass


class _Loop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._main, daemon=True,
                                       name="pyshmlock-cluster-loop")
        self.thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            try:
                pending = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
                for t in pending:
                    t.cancel()
                if pending:
                    self.loop.run_until_complete(asyncio.gather(*pending,
                                                                return_exceptions=True))
            finally:
                self.loop.close()

    def run(self, coro: Any, timeout: Optional[float]) -> Any:
        if threading.current_thread() is self.thread:
            raise RuntimeError("a blocking Cluster call from inside its own event loop")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(None if timeout is None else timeout + _BACKSTOP)
        except BaseException:
            if fut.done():
                raise                   # the call's own outcome (ClusterTimeout is one)
            fut.cancel()                # interrupted, or the backstop: cancel the call
            if timeout is not None and not isinstance(sys.exc_info()[1], KeyboardInterrupt):
                raise ClusterTimeout("the call did not finish in time",
                                     took_effect=None) from None
            raise


class Cluster:
    """A controller of the cluster gate ``name`` in the etcd at ``endpoints``
    (blocking calls; the same arguments and guarantees as AsyncCluster)."""

    def __init__(self, endpoints: Sequence[str] | str, name: str, **kw: Any) -> None:
        self._loop = _Loop()
        weakref.finalize(self, _stop_loop, self._loop.loop)

        async def make() -> AsyncCluster:
            return AsyncCluster(endpoints, name, **kw)

        try:
            self.a: AsyncCluster = self._loop.run(make(), 30.0)
        except BaseException:
            _stop_loop(self._loop.loop)
            raise
        self.name, self.keys, self.who, self.ttl = name, self.a.keys, self.a.who, self.a.ttl
        #: this controller's histograms (``pyshmlock.metrics.ClusterCollector``)
        self.metrics: ClusterMetrics = self.a.metrics

    def _run(self, coro: Any, timeout: Optional[float] = None) -> Any:
        return self._loop.run(coro, timeout)

    def status(self, timeout: Optional[float] = None) -> ClusterStatus:
        st: ClusterStatus = self._run(self.a.status(timeout), timeout)
        return st

    def pause(self, timeout: Optional[float] = None, drain: bool = False,
              expect: Optional[Sequence[str]] = None) -> PauseResult:
        r: PauseResult = self._run(self.a.pause(timeout, drain, expect), timeout)
        return r

    def paused(self, timeout: Optional[float] = None, drain: bool = False,
               expect: Optional[Sequence[str]] = None) -> PausedBlock:
        """``with cluster.paused(drain=True) as r:`` pause (``r`` is the
        PauseResult) and resume when the block completes; if it raises, the
        fleet stays paused and the exception says so (a note)."""
        return PausedBlock(self, timeout, drain, expect)

    def resume(self, timeout: Optional[float] = None, wait: bool = False) -> int:
        rev: int = self._run(self.a.resume(timeout, wait), timeout)
        return rev

    def evict(self, host_id: str, timeout: Optional[float] = None) -> None:
        self._run(self.a.evict(host_id, timeout), timeout)

    def admit(self, host_id: str, timeout: Optional[float] = None) -> None:
        self._run(self.a.admit(host_id, timeout), timeout)

    def break_update(self, token: Optional[int] = None,
                     timeout: Optional[float] = None) -> int:
        tok: int = self._run(self.a.break_update(token, timeout), timeout)
        return tok

    def wait_hosts(self, count: int, timeout: float = 10.0) -> Dict[str, Dict[str, Any]]:
        hosts: Dict[str, Dict[str, Any]] = self._run(self.a.wait_hosts(count, timeout), timeout)
        return hosts

    def update(self, timeout: Optional[float] = None,
               expect: Optional[Sequence[str]] = None) -> ClusterUpdate:
        """``with cluster.update():`` hold the cluster update lock (see
        AsyncCluster.update); ``u.token`` is the fencing token for the hosts."""
        return ClusterUpdate(self, timeout, expect)

    def close(self) -> None:
        if self._loop.loop.is_closed():
            return
        try:
            self._run(self.a.aclose(), 5.0)
        except Exception:
            pass
        _stop_loop(self._loop.loop)
        self._loop.thread.join(5)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class PausedBlock:
    """What ``Cluster.paused()`` returns."""

    def __init__(self, cluster: Cluster, timeout: Optional[float], drain: bool,
                 expect: Optional[Sequence[str]]) -> None:
        self.c, self.timeout, self.drain, self.expect = cluster, timeout, drain, expect
        self.result: Optional[PauseResult] = None

    def __enter__(self) -> PauseResult:
        self.result = self.c.pause(self.timeout, self.drain, self.expect)
        return self.result

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        if ev is not None:
            add_note(ev, f"pyshmlock.cluster: the fleet {self.c.name!r} stays paused: the "
                         "paused block raised (resume() reopens it)")
            return
        self.c.resume(self.timeout)


class ClusterUpdate:
    def __init__(self, cluster: Cluster, timeout: Optional[float],
                 expect: Optional[Sequence[str]] = None) -> None:
        self.c = cluster
        self.timeout = timeout
        self.u: AsyncClusterUpdate = cluster.a.update(timeout, expect)

    @property
    def token(self) -> int:
        return self.u.token

    @property
    def lease(self) -> int:
        return self.u.lease

    @property
    def result(self) -> Optional[PauseResult]:
        return self.u.result

    @property
    def lost(self) -> bool:
        return self.u.lost

    @property
    def applied(self) -> Dict[str, Dict[str, bool]]:
        """Per host, per lock: whether its lock recorded this update."""
        return self.u.applied

    def mark_failed(self, host: str, lock: Optional[str] = None) -> None:
        """Record that ``host`` (or its ``lock``) failed to apply this update."""
        self.u.mark_failed(host, lock)

    def mark_applied(self, host: str) -> None:
        """Record that ``host`` applied this update (counts if the block raises)."""
        self.u.mark_applied(host)

    def check(self) -> None:
        """Raise UpdateLostError (a FencingError) unless this update still
        holds the lock (one etcd read)."""
        self.c._run(self.u.check(), None)

    def __enter__(self) -> ClusterUpdate:
        self.c._run(self.u.__aenter__(), self.timeout)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.c._run(self.u.__aexit__(*exc), None)
