"""`pyshmlock demo`: an SGLang-shaped multi-worker server on loopback, driven
through the pause/update races by a real HTTP client.

    pyshmlock demo [--workers N] [--backend shared|local] [--requests N]
                   [--cycles N] [--keep-running]

The server: N uvicorn worker processes accept on one port (plus one private
port each, so a client can address a given worker), and a scheduler process
generates tokens.  `--backend shared` uses one pyshmlock lock for the pause
gate and the model-update lock; `--backend local` runs the same server the way
SGLang does it today (per-worker flags kept in step by a broadcast), so the
same table shows where that breaks.
"""
import asyncio
import os
import random
import signal
import socket
import sys
import textwrap
import time
import uuid
from typing import Any, Callable, List, Optional, Tuple

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
                                  self.port_q, self.go[i], os.getpid()))
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


Row = Tuple[str, str, str, bool, float]

SCENARIOS: List[Tuple[str, str]] = [
    ("concurrent /generate while paused", "none completes while paused; all complete after continue"),
    ("pause to A, update to B, both orders + jitter", "no deadlock; update runs under the pause within 1 s"),
    ("continue to C while B updates", "generation resumes only after the update ends"),
    ("unpaused update, requests in flight everywhere", "waits for all of them; admits no new request meanwhile"),
    ("abort-mode pause", "returns only after every worker drained"),
    ("pause/continue cycles to random workers", "afterwards every worker serves"),
    ("worker started while paused", "sees the pause"),
    ("token-version violations", "zero, throughout"),
]


async def run_scenarios(cluster: Cluster, requests: int, cycles: int,
                        out: Callable[[str], None]) -> List[Row]:
    import httpx

    from . import scenarios as sc
    rng = random.Random(0)
    rows: List[Row] = []
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
    async with httpx.AsyncClient(limits=limits) as http:
        c = sc.Client(http, cluster.shared_url, cluster.worker_urls)
        runs: List[Callable[[], Any]] = [
            lambda: sc.concurrent_while_paused(c, requests),
            lambda: sc.pause_and_update_reordered(c, rng),
            lambda: sc.continue_during_update(c, cluster.state),
            lambda: sc.unpaused_update_waits_for_all(c, cluster.state),
            lambda: sc.abort_drains_every_worker(c),
            lambda: sc.many_pause_continue_cycles(c, cycles, rng),
            lambda: sc.worker_started_while_paused(c, cluster.start_spare),
            lambda: _sync(sc.no_violations(cluster.state)),
        ]
        for (title, expected), run in zip(SCENARIOS, runs):
            out(f"  ... {title}")
            t0 = time.monotonic()
            try:
                observed, ok = await asyncio.wait_for(run(), 90)
            except Exception as e:          # a hang or an error is a failure
                observed, ok = f"error: {type(e).__name__}: {e}", False
                await c.recover()
            took = time.monotonic() - t0
            rows.append((title, expected, observed, ok, took))
            out(f"  {'PASS' if ok else 'FAIL'}  {title}  ({took:.1f} s)")
    return rows


async def _sync(value: Any) -> Any:
    return value


def format_table(rows: List[Row], width: Optional[int] = None) -> str:
    """The final table, wrapped to fit width (default: the terminal, or 100)."""
    from .._table import format_table as fit
    head = ("scenario", "expected", "observed", "result", "time")
    body = [(r[0], r[1], r[2], "PASS" if r[3] else "FAIL", f"{r[4]:.1f} s") for r in rows]
    return fit(head, body, width)


def run_demo(workers: int = 4, backend: str = "shared", requests: int = 16, cycles: int = 1000,
             keep_running: bool = False, out: Callable[[str], None] = print) -> bool:
    """Start the server, run every scenario, print the table.  True if all passed."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}")
    if workers < 2:
        raise ValueError("the demo needs at least 2 workers")
    t0 = time.monotonic()
    old = {sig: signal.signal(sig, _raise_stopped) for sig in (signal.SIGTERM, signal.SIGHUP)}
    old[signal.SIGINT] = signal.getsignal(signal.SIGINT)
    try:
        return _run_demo(workers, backend, requests, cycles, keep_running, out, t0)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _run_demo(workers: int, backend: str, requests: int, cycles: int, keep_running: bool,
              out: Callable[[str], None], t0: float) -> bool:
    cluster = Cluster(workers, backend)
    try:
        cluster.start()
        asyncio.run(wait_healthy(cluster.worker_urls))
        from .._table import terminal_width
        out(textwrap.fill(f"pyshmlock demo: backend={backend}, {workers} workers on "
                          f"{cluster.shared_url} (lock {cluster.name!r}), scheduler at "
                          f"100 tokens/s per request", terminal_width(),
                          subsequent_indent="  ") + "\n")
        rows = asyncio.run(run_scenarios(cluster, requests, cycles, out))
        out("")
        out(format_table(rows))
        passed = sum(r[3] for r in rows)
        out(f"\n{passed}/{len(rows)} scenarios passed on the {backend} backend "
            f"in {time.monotonic() - t0:.0f} s")
        if keep_running:
            _serve_forever(cluster, out)
        return passed == len(rows)
    finally:
        cluster.shutdown()


def _serve_forever(cluster: Cluster, out: Callable[[str], None]) -> None:
    out(f"\nserver left running; Ctrl-C to stop.\n"
        f"  curl -s {cluster.shared_url}/health\n"
        f"  curl -s -XPOST {cluster.shared_url}/generate -d '{{\"max_tokens\": 5}}'\n"
        f"  pyshmlock status {cluster.name}\n"
        f"  pyshmlock pause {cluster.name}; pyshmlock resume {cluster.name}\n"
        f"  workers: {' '.join(cluster.worker_urls)}")
    sys.stdout.flush()
    # Ctrl-C (KeyboardInterrupt) and SIGTERM/SIGHUP (Stopped) end this wait;
    # the caller's cleanup then stops every child.
    while all(p.is_alive() for p in cluster.procs[:cluster.n + 1]):
        time.sleep(0.5)
