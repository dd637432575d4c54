"""The scenarios `pyshmlock demo` drives through real HTTP, one per race the
SGLang discussions describe.  Each returns (expected, observed, passed); a
hang is bounded by a timeout and reported as a failure."""
import asyncio
import random
import time
from typing import Any, Awaitable, Callable, Coroutine, Dict, List, Tuple

import httpx

Result = Tuple[str, bool]       # observed, passed
HANG = 5.0                      # seconds after which a control call counts as hung


class Client:
    """HTTP access to the demo servers: the shared port and each worker's own port."""

    def __init__(self, http: httpx.AsyncClient, shared_url: str, worker_urls: List[str]) -> None:
        self.http = http
        self.shared = shared_url
        self.workers = worker_urls

    async def post(self, url: str, path: str, timeout: float = 30.0, **body: Any) -> Dict[str, Any]:
        r = await self.http.post(url + path, json=body or None, timeout=timeout)
        r.raise_for_status()
        return r.json()

    async def get(self, url: str, path: str) -> Dict[str, Any]:
        r = await self.http.get(url + path, timeout=10)
        r.raise_for_status()
        return r.json()

    async def generate(self, url: str, n: int, timeout: float = 30.0) -> Dict[str, Any]:
        return await self.post(url, "/generate", timeout=timeout, max_tokens=n)

    def pause(self, url: str, mode: str = "in_place",
              timeout: float = 30.0) -> Coroutine[Any, Any, Any]:
        return self.post(url, "/pause_generation", timeout=timeout, mode=mode)

    def resume(self, url: str, timeout: float = 30.0) -> Awaitable[Any]:
        return self.post(url, "/continue_generation", timeout=timeout)

    def update(self, url: str, seconds: float,
               timeout: float = 30.0) -> Coroutine[Any, Any, Any]:
        return self.post(url, "/update_weights", timeout=timeout, seconds=seconds)

    async def recover(self) -> None:
        """After a failed scenario: continue everywhere, let requests end."""
        for url in self.workers:
            try:
                await self.resume(url, timeout=HANG)
            except Exception:
                pass


async def _timed(coro: Awaitable[Any]) -> Tuple[Any, float]:
    """(result, seconds it took)."""
    t0 = time.monotonic()
    r = await coro
    return r, time.monotonic() - t0


async def _ended(coro: Awaitable[Any]) -> Tuple[Any, float]:
    """(result, monotonic time it finished)."""
    r = await coro
    return r, time.monotonic()


async def _settle(tasks: List["asyncio.Task[Any]"], timeout: float = 20.0) -> List[Any]:
    done, pending = await asyncio.wait(tasks, timeout=timeout) if tasks else (set(), set())
    for t in pending:
        t.cancel()
    return [t.result() for t in tasks if t in done and not t.cancelled() and not t.exception()]


def _inflight(c: Client, n_tokens: int) -> List["asyncio.Task[Any]"]:
    """One long request in flight on every worker."""
    return [asyncio.create_task(c.generate(url, n_tokens)) for url in c.workers]


async def _until_in_flight(c: Client, limit: float = 10.0) -> None:
    """Wait until every worker reports a request in flight (a loaded machine
    may take longer than any fixed sleep to admit them)."""
    deadline = time.monotonic() + limit
    for url in c.workers:
        while (await c.get(url, "/health"))["inflight"] == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)


# ------------------------------------------------------------- scenarios

async def concurrent_while_paused(c: Client, requests: int) -> Result:
    await c.pause(c.workers[0])
    tasks = [asyncio.create_task(c.generate(c.shared, 5)) for _ in range(requests)]
    await asyncio.sleep(0.5)
    early = sum(t.done() for t in tasks)
    await c.resume(c.workers[-1])
    results = await _settle(tasks, 15)
    ok = [r for r in results if not r["aborted"] and r["tokens"] == 5]
    return (f"{early} completed while paused; {len(ok)}/{requests} after continue",
            early == 0 and len(ok) == requests)


async def pause_and_update_reordered(c: Client, rng: random.Random) -> Result:
    a, b = c.workers[0], c.workers[1 % len(c.workers)]
    worst, notes, passed = 0.0, [], True
    for order in ("pause first", "update first", "jitter", "jitter"):
        flight = _inflight(c, 60)
        await asyncio.sleep(0.1)
        delay = rng.uniform(-0.02, 0.02) if order == "jitter" else \
            (0.005 if order == "pause first" else -0.005)
        upd: asyncio.Task[Any]
        if delay >= 0:
            p = asyncio.create_task(c.pause(a))
            await asyncio.sleep(delay)
            upd = asyncio.create_task(_timed(c.update(b, 0.05)))
        else:
            upd = asyncio.create_task(_timed(c.update(b, 0.05)))
            await asyncio.sleep(-delay)
            p = asyncio.create_task(c.pause(a))
        done, _ = await asyncio.wait([upd], timeout=HANG)
        if upd in done and not upd.exception():
            took = upd.result()[1]
            worst = max(worst, took)
            passed = passed and took < 1.0
        else:
            notes.append(f"{order}: update hung > {HANG:.0f} s")
            passed = False
        await asyncio.wait([p], timeout=HANG)
        await c.recover()
        await _settle(flight + [upd, p], 20)
    observed = f"worst update {worst * 1000:.0f} ms" + ("; " + "; ".join(notes) if notes else "")
    return observed, passed


async def continue_during_update(c: Client, state: Any) -> Result:
    a, b, cc = c.workers[0], c.workers[1 % len(c.workers)], c.workers[2 % len(c.workers)]
    flight = _inflight(c, 60)
    await asyncio.sleep(0.1)
    before, updates_before = state.violations, state.updates
    await c.pause(a)
    upd = asyncio.create_task(_ended(c.update(b, 0.6)))
    await asyncio.sleep(0.15)
    t_cont = time.monotonic()
    cont = asyncio.create_task(_ended(c.resume(cc)))
    await asyncio.wait([cont, upd], timeout=HANG)
    ok_calls = all(t.done() and not t.exception() for t in (cont, upd))
    await c.recover()
    await _settle(flight, 20)
    made = state.violations - before
    if not ok_calls:
        return "continue or update did not return", False
    # Whether the continue waited is read from the shared state as it
    # returned (the update had finished its swap), not from which of two
    # HTTP replies reached this client first: on a loaded machine either can.
    reply, cont_end = cont.result()
    waited = reply["updates_done"] > updates_before and reply["updating"] == 0
    return (f"continue returned after {(cont_end - t_cont) * 1000:.0f} ms "
            f"({'after' if waited else 'before'} the update ended); "
            f"{made} tokens generated during the update", waited and made == 0)


async def unpaused_update_waits_for_all(c: Client, state: Any) -> Result:
    b = c.workers[1 % len(c.workers)]
    before = state.violations
    flight = [asyncio.create_task(c.generate(url, 30)) for url in c.workers]
    await asyncio.sleep(0.1)
    upd = asyncio.create_task(c.update(b, 0.1))
    await asyncio.sleep(0.05)
    late = [asyncio.create_task(c.generate(url, 2)) for url in c.workers]
    res = await _settle(flight + [upd] + late, 20)
    if len(res) != len(flight) + 1 + len(late):
        await c.recover()
        return "some requests or the update did not finish", False
    # Server-side CLOCK_MONOTONIC stamps: holds had/given back, swap start/end.
    last_release = max(r["released_at"] for r in res[:len(flight)])
    u = res[len(flight)]
    admitted_during = sum(1 for r in res[len(flight) + 1:] if r["admitted_at"] < u["ended_at"])
    made = state.violations - before
    gap_ms = (u["started_at"] - last_release) * 1000
    ok = u["started_at"] >= last_release and admitted_during == 0 and made == 0
    return (f"update started {gap_ms:+.1f} ms after the last in-flight request let go; "
            f"{admitted_during} new requests admitted during it; "
            f"{made} tokens generated during it", ok)


async def abort_drains_every_worker(c: Client) -> Result:
    flight = _inflight(c, 500)
    await _until_in_flight(c)
    await c.pause(c.workers[0], mode="abort")
    counts = [(await c.get(url, "/health"))["inflight"] for url in c.workers]
    results = await _settle(flight, 10)
    await c.resume(c.workers[-1])
    aborted = sum(1 for r in results if r["aborted"])
    return (f"in flight per worker when pause returned: {counts}; {aborted} aborted",
            sum(counts) == 0 and aborted == len(c.workers))


async def many_pause_continue_cycles(c: Client, cycles: int, rng: random.Random) -> Result:
    async def client(k: int) -> None:
        for _ in range(k):
            await c.pause(rng.choice(c.workers), timeout=HANG)
            await c.resume(rng.choice(c.workers), timeout=HANG)
    t0 = time.monotonic()
    per = max(1, cycles // 8)
    tasks = [asyncio.create_task(client(per)) for _ in range(8)]
    done, pending = await asyncio.wait(tasks, timeout=60)
    hung = len(pending) + sum(1 for t in done if t.exception())
    for t in pending:
        t.cancel()
    took = time.monotonic() - t0
    serving = 0
    for url in c.workers:
        try:
            r = await c.generate(url, 2, timeout=3)
            serving += not r["aborted"]
        except Exception:
            pass
    if serving < len(c.workers):
        await c.recover()
    return (f"{per * 8} cycles in {took:.1f} s ({hung} clients hung); "
            f"{serving}/{len(c.workers)} workers serve afterwards",
            hung == 0 and serving == len(c.workers))


async def worker_started_while_paused(c: Client,
                                      start_worker: Callable[[], Awaitable[str]]) -> Result:
    await c.pause(c.workers[0])
    url = await start_worker()
    health = await c.get(url, "/health")
    probe = asyncio.create_task(c.generate(url, 2, timeout=10))
    await asyncio.sleep(0.4)
    admitted = probe.done()
    await c.resume(c.workers[-1])
    res = await _settle([probe], 10)
    served = bool(res) and not res[0]["aborted"]
    return (f"new worker reports paused={health['paused']}; "
            f"{'a request completed' if admitted else 'no request completed'} while paused; "
            f"serves after continue: {served}",
            health["paused"] and not admitted and served)


def no_violations(state: Any) -> Result:
    s = state.snapshot()
    return (f"{s['violations_updating']} tokens during an update, {s['violations_mixed']} with "
            f"mixed weights, of {s['tokens']} tokens; {s['updates']} updates",
            state.violations == 0 and s["tokens"] > 0)
