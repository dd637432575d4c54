"""The demo server's processes: :class:`Cluster` starts the uvicorn workers
and the scheduler on loopback, addresses them, and stops them (with the
signals that stop the demo, :class:`Stopped`)."""
import asyncio
import os
import signal
import socket
import time
import uuid
from typing import Any, List

from ..lock import RWLock, unlink
from .state import CTX, engine_lock_name, new_state

BACKENDS = ("shared", "local")

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(BaseException):
    """SIGTERM or SIGHUP reached the demo's main process: it stops every child,
    removes its locks and exits 128 + signum (Ctrl-C is KeyboardInterrupt)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


def _raise_stopped(signum: int, frame: Any) -> None:
    raise Stopped(signum)


class Cluster:
    """The demo server's processes and addresses."""

    def __init__(self, workers: int, backend: str) -> None:
        self.n = workers
        self.backend = backend
        self.name = f"demo-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.lock = RWLock(self.name)
        self.engine = RWLock(engine_lock_name(self.name))
        self.state = new_state()
        self.state.set("shard_a", 1)
        self.state.set("shard_b", 1)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1024)
        self.shared_url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        slots = workers + 1                       # one spare, started later
        self.sched_inbox = CTX.Queue()
        self.outboxes = [CTX.Queue() for _ in range(slots)]
        self.controls = [CTX.Queue() for _ in range(slots)]
        self.registered = CTX.RawArray("b", slots)
        self.port_q = CTX.Queue()
        self.stop = CTX.Event()
        self.go = [CTX.Event() for _ in range(slots)]
        self.worker_urls: List[str] = []
        self.procs: List[Any] = []

    def start(self) -> None:
        from .scheduler import scheduler_main
        from .worker import worker_main
        sched = CTX.Process(target=scheduler_main, name="demo-scheduler", daemon=True,
                            args=(self.name, self.backend, self.state, self.sched_inbox,
                                  self.outboxes, self.stop, os.getpid()))
        sched.start()
        self.procs.append(sched)
        # Fork every worker now (the spare too): forking later, from a process
        # running an event loop and an HTTP client, is not safe.
        for i in range(self.n + 1):
            p = CTX.Process(target=worker_main, name=f"demo-worker-{i}", daemon=True,
                            args=(i, self.name, self.backend, self.state, self.sched_inbox,
                                  self.outboxes, self.controls, self.registered, self.sock,
                                  self.port_q, self.go[i], os.getpid(), self.stop))
            p.start()
            self.procs.append(p)
        self.worker_urls = [self._go(i) for i in range(self.n)]

    def _go(self, i: int) -> str:
        self.go[i].set()
        idx, port = self.port_q.get(timeout=30)
        assert idx == i
        return f"http://127.0.0.1:{port}"

    async def start_spare(self) -> str:
        """Start the spare worker (for "a worker started while paused")."""
        url = await asyncio.get_running_loop().run_in_executor(None, self._go, self.n)
        await wait_healthy([url])
        return url

    def shutdown(self) -> None:
        # A second Ctrl-C or SIGTERM must not interrupt the cleanup.
        for sig in _STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        self.stop.set()
        for p in self.procs[1:]:
            if p.is_alive():
                p.terminate()          # uvicorn shuts down on SIGTERM
        deadline = time.monotonic() + 5
        for p in self.procs:
            p.join(max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(5)
        self.sock.close()
        for lk in (self.lock, self.engine):
            try:
                lk.close()
            except Exception:
                pass
        for name in (self.name, engine_lock_name(self.name)):
            try:
                unlink(name, force=True)
            except FileNotFoundError:
                pass


async def wait_healthy(urls: List[str], timeout: float = 30.0) -> None:
    import httpx
    end = time.monotonic() + timeout
    async with httpx.AsyncClient() as http:
        for url in urls:
            while True:
                try:
                    r = await http.get(url + "/health", timeout=2)
                    if r.status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > end:
                    raise TimeoutError(f"worker at {url} did not come up")
                await asyncio.sleep(0.05)


