"""The demo server's processes: :class:`DemoServers` starts the uvicorn workers
and the scheduler on loopback, addresses them, and stops them (with the
signals that stop the demo, :class:`Stopped`)."""
import asyncio
import errno
import os
import signal
import socket
import time
import uuid
from typing import Any, Coroutine, List, Optional, TypeVar

from pyshmlock.lock import RWLock, unlink

from .state import CTX, engine_lock_name, new_state

BACKENDS = ("shared", "local")

#: The process slots of the demo's locks: its main process, the scheduler,
#: the workers and the spare worker each attach.
DEMO_MAX_PROCESSES = 256
#: The most workers the demo runs (the slots above, less main, scheduler, spare).
MAX_WORKERS = DEMO_MAX_PROCESSES - 3

T = TypeVar("T")

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(BaseException):
    """SIGTERM or SIGHUP reached the demo's main process: it stops every child,
    removes its locks and exits 128 + signum (Ctrl-C is KeyboardInterrupt)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


class _Run:
    """The asyncio.run in progress in the main thread (run_stoppable)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, task: "asyncio.Task[Any]") -> None:
        self.loop, self.task, self.signum = loop, task, 0


_running: Optional[_Run] = None


def _raise_stopped(signum: int, frame: Any) -> None:
    """The handler of SIGTERM and SIGHUP in the demo's main process.  Outside
    an event loop it raises Stopped where the main thread is.  Inside one
    (run_stoppable) it must not raise: the exception would land in whichever
    asyncio task runs at that moment, which stores it as its result, and the
    demo would run on.  It cancels the run's main task instead, and
    run_stoppable raises Stopped once the loop has unwound."""
    run = _running
    if run is None:
        raise Stopped(signum)
    if not run.signum:
        run.signum = signum
        run.loop.call_soon_threadsafe(_cancel_all, run.task)


def _cancel_all(main: "asyncio.Task[Any]") -> None:
    """Cancel every task of the loop, the tasks the main one started first:
    each then ends cancelled, before the main task's unwinding closes what
    they use (the HTTP client)."""
    for t in asyncio.all_tasks():
        if t is not main:
            t.cancel()
    main.cancel()


def run_stoppable(coro: Coroutine[Any, Any, T]) -> T:
    """asyncio.run(coro) in the demo's main thread, stopped by SIGTERM and
    SIGHUP as a whole: the signal cancels the main task (every task it
    awaits is cancelled with it, none can swallow it), and Stopped is raised
    here once the loop has closed."""
    global _running
    state: List[_Run] = []

    async def main() -> T:
        global _running
        task = asyncio.current_task()
        assert task is not None
        state.append(_Run(asyncio.get_running_loop(), task))
        _running = state[0]
        return await coro

    try:
        result = asyncio.run(main())
    except asyncio.CancelledError:
        if state and state[0].signum:
            raise Stopped(state[0].signum) from None
        raise
    finally:
        _running = None
    if state and state[0].signum:   # it arrived as the run was finishing
        raise Stopped(state[0].signum)
    return result


class DemoServers:
    """The demo server's processes and addresses."""

    def __init__(self, workers: int, backend: str) -> None:
        self.n = workers
        self.backend = backend
        self.name = f"demo-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.procs: List[Any] = []
        self.sock: Optional[socket.socket] = None
        self.lock = RWLock(self.name, max_processes=DEMO_MAX_PROCESSES)
        try:
            self.engine = RWLock(engine_lock_name(self.name), max_processes=DEMO_MAX_PROCESSES)
            self._setup(workers)
        except BaseException as e:
            # Out of file descriptors (a queue per worker), say: nothing of
            # this server may stay behind, the locks least of all.
            self.shutdown()
            if isinstance(e, OSError) and e.errno == errno.EMFILE:
                raise OSError(errno.EMFILE, f"too many open files for {workers} workers "
                              "(each takes a few in the demo's main process): fewer "
                              "--workers, or raise the limit (`ulimit -n`)") from None
            raise

    def _setup(self, workers: int) -> None:
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
        if hasattr(self, "stop"):
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
        if self.sock is not None:
            self.sock.close()
        for lk in (getattr(self, "lock", None), getattr(self, "engine", None)):
            try:
                if lk is not None:
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


