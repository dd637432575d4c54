"""Running the demo: the scenarios in order against a :class:`DemoServers`,
the final table, and serving on with ``--keep-running``."""
import asyncio
import random
import signal
import sys
import textwrap
import time
from typing import Any, Callable, List, Optional, Tuple

from .servers import (
    BACKENDS,
    MAX_WORKERS,
    DemoServers,
    _raise_stopped,
    run_stoppable,
    wait_healthy,
)

Row = Tuple[str, str, str, bool, float]

SCENARIOS: List[Tuple[str, str]] = [
    ("concurrent /generate while paused",
     "none completes while paused; all complete after continue"),
    ("pause to A, update to B, both orders + jitter",
     "no deadlock; update runs under the pause within 1 s"),
    ("continue to C while B updates", "generation resumes only after the update ends"),
    ("unpaused update, requests in flight everywhere",
     "waits for all of them; admits no new request meanwhile"),
    ("abort-mode pause", "returns only after every worker drained"),
    ("pause/continue cycles to random workers", "afterwards every worker serves"),
    ("worker started while paused", "sees the pause"),
    ("token-version violations", "zero, throughout"),
]


async def run_scenarios(servers: DemoServers, requests: int, cycles: int,
                        out: Callable[[str], None]) -> List[Row]:
    import httpx

    from . import scenarios as sc
    rng = random.Random(0)
    rows: List[Row] = []
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
    async with httpx.AsyncClient(limits=limits) as http:
        c = sc.Client(http, servers.shared_url, servers.worker_urls)
        runs: List[Callable[[], Any]] = [
            lambda: sc.concurrent_while_paused(c, requests),
            lambda: sc.pause_and_update_reordered(c, rng),
            lambda: sc.continue_during_update(c, servers.state),
            lambda: sc.unpaused_update_waits_for_all(c, servers.state),
            lambda: sc.abort_drains_every_worker(c),
            lambda: sc.many_pause_continue_cycles(c, cycles, rng),
            lambda: sc.worker_started_while_paused(c, servers.start_spare),
            lambda: _sync(sc.no_violations(servers.state)),
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
            # A failure says what was seen at once: a run stopped before the
            # table (a signal, a test's timeout) still shows why.
            out(f"  {'PASS' if ok else 'FAIL'}  {title}  ({took:.1f} s)"
                + ("" if ok else f": {observed}"))
    return rows


async def _sync(value: Any) -> Any:
    return value


def format_table(rows: List[Row], width: Optional[int] = None) -> str:
    """The final table, wrapped to fit width (default: the terminal, or 100)."""
    from pyshmlock._table import format_table as fit
    head = ("scenario", "expected", "observed", "result", "time")
    body = [(r[0], r[1], r[2], "PASS" if r[3] else "FAIL", f"{r[4]:.1f} s") for r in rows]
    return fit(head, body, width)


def run_demo(workers: int = 4, backend: str = "shared", requests: int = 16, cycles: int = 1000,
             keep_running: bool = False, out: Callable[[str], None] = print) -> bool:
    """Start the server, run every scenario, print the table.  True if all passed."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}")
    if not 2 <= workers <= MAX_WORKERS:
        raise ValueError(f"the demo runs 2 to {MAX_WORKERS} workers, not {workers}")
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
    servers = DemoServers(workers, backend)
    try:
        servers.start()
        run_stoppable(wait_healthy(servers.worker_urls))
        from pyshmlock._table import terminal_width
        out(textwrap.fill(f"pyshmlock demo: backend={backend}, {workers} workers on "
                          f"{servers.shared_url} (lock {servers.name!r}), scheduler at "
                          f"100 tokens/s per request", terminal_width(),
                          subsequent_indent="  ") + "\n")
        rows = run_stoppable(run_scenarios(servers, requests, cycles, out))
        out("")
        out(format_table(rows))
        passed = sum(r[3] for r in rows)
        out(f"\n{passed}/{len(rows)} scenarios passed on the {backend} backend "
            f"in {time.monotonic() - t0:.0f} s")
        if keep_running:
            _serve_forever(servers, out)
        return passed == len(rows)
    finally:
        servers.shutdown()


def _serve_forever(servers: DemoServers, out: Callable[[str], None]) -> None:
    out(f"\nserver left running; Ctrl-C to stop.\n"
        f"  curl -s {servers.shared_url}/health\n"
        f"  curl -s -XPOST {servers.shared_url}/generate -d '{{\"max_tokens\": 5}}'\n"
        f"  pyshmlock status {servers.name}\n"
        f"  pyshmlock pause {servers.name}; pyshmlock resume {servers.name}\n"
        f"  workers: {' '.join(servers.worker_urls)}")
    sys.stdout.flush()
    # Ctrl-C (KeyboardInterrupt) and SIGTERM/SIGHUP (Stopped) end this wait;
    # the caller's cleanup then stops every child.
    while all(p.is_alive() for p in servers.procs[:servers.n + 1]):
        time.sleep(0.5)
