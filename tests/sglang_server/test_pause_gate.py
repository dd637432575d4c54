"""The pause gate across 4 real SGLang tokenizer workers: requests sent
while paused, right after a pause elsewhere, the abort-mode drain, many
pause/continue cycles, and a worker started while paused.  Each runs with
SGLang's own locks and with pyshmlock.integrations.sglang."""

import asyncio
import random
import time
from typing import List

import httpx
import pytest

from .client import Client, run, verdict
from .conftest import HOOK

pytestmark = pytest.mark.timeout(600)   # includes starting the server, once per backend


def test_requests_sent_while_paused_wait_for_continue(fresh):
    """16 concurrent /generate while paused: none admitted before continue,
    all complete after."""
    async def body() -> List[str]:
        async with Client(fresh) as c:
            assert (await c.pause("A")).status_code == 200
            paused_at = time.time()
            tasks = [asyncio.ensure_future(c.generate("ABCD"[i % 4], 5, timeout=20))
                     for i in range(16)]
            await asyncio.sleep(1.5)
            violations = []
            early = await c.admitted_since(paused_at)
            if early:
                violations.append(f"{len(early)} of 16 admitted while paused")
            assert (await c.resume("B")).status_code == 200
            done = await asyncio.gather(*tasks, return_exceptions=True)
            failed = [d for d in done if isinstance(d, BaseException) or d.status_code != 200]
            if failed:
                violations.append(f"{len(failed)} of 16 did not complete after continue")
            return violations
    verdict(fresh, run(body(), 60), sglang_fails=False)


@pytest.mark.parametrize("mode", ["in_place", "abort"])
def test_request_right_after_pause_elsewhere_is_not_admitted(fresh, mode):
    """/generate to worker B right after /pause_generation returned at A."""
    async def body() -> List[str]:
        async with Client(fresh) as c:
            violations = []
            for rep in range(3):
                assert (await c.pause("A", mode)).status_code == 200
                paused_at = time.time()
                task = asyncio.ensure_future(c.generate("B", 3, timeout=20))
                await asyncio.sleep(0.8)
                early = await c.admitted_since(paused_at)
                if early:
                    violations.append(f"round {rep}: B admitted a request after A's pause")
                assert (await c.resume("C")).status_code == 200
                r = await task
                if r.status_code != 200:
                    violations.append(f"round {rep}: the request failed after continue "
                                      f"({r.status_code})")
            return violations
    # SGLang's own locks pass this unless a broadcast loses a race (seen
    # once in CI on 0.5.23): judged only with pyshmlock's gate.
    verdict(fresh, run(body(), 90), sglang_fails=None)


def test_abort_pause_from_an_idle_worker_drains_every_worker(fresh):
    """Abort-mode pause at idle A, requests in flight on B, C, D: when the
    pause returns, no request is left anywhere and none is admitted."""
    async def body() -> List[str]:
        async with Client(fresh) as c:
            tasks = [asyncio.ensure_future(c.generate(w, 2000, timeout=30)) for w in "BCD"]
            await c.wait_running(3)
            assert (await c.pause("A", "abort", timeout=30)).status_code == 200
            paused_at = time.time()
            violations = []
            readers = {w: (await c.state(w))["readers"] for w in "ABCD"}
            running = (await c.stats())["running"]
            if running:
                violations.append(f"{len(running)} requests still generating after the pause")
            if fresh.shared and any(readers.values()):
                violations.append(f"read holds left when the pause returned: {readers}")
            done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
            hung = [d for d in done if isinstance(d, BaseException)]
            if hung:
                violations.append(f"{len(hung)} requests did not end after the abort")
            late = await c.admitted_since(paused_at)
            if late:
                violations.append(f"{len(late)} admitted after the abort-mode pause")
            print("read holds per worker when the pause returned:", readers)
            return violations
    verdict(fresh, run(body(), 60), sglang_fails=False)


def test_many_pause_continue_cycles_leave_no_worker_paused(fresh):
    """200 pause/continue cycles to random workers, then every worker runs."""
    async def body() -> List[str]:
        rng = random.Random(2024)
        async with Client(fresh) as c:
            for _ in range(200):
                mode = rng.choice(["in_place", "retract", "abort"])
                assert (await c.pause(rng.choice("ABCD"), mode)).status_code == 200
                assert (await c.resume(rng.choice("ABCD"))).status_code == 200
            violations = []
            for w in "ABCD":
                state = await c.state(w)
                if state["is_pause"]:
                    violations.append(f"worker {w} reports paused")
            stats = await c.stats()
            if stats["paused"]:
                violations.append(f"scheduler left paused ({stats['paused']})")
            results = await asyncio.gather(*(c.generate(w, 3, timeout=10) for w in "ABCD"),
                                           return_exceptions=True)
            stuck = [w for w, r in zip("ABCD", results)
                     if isinstance(r, BaseException) or r.status_code != 200]
            if stuck:
                violations.append(f"requests to {stuck} did not complete")
            return violations
    verdict(fresh, run(body(), 180), sglang_fails=False)


def test_worker_started_while_paused_reports_and_obeys_the_pause(fresh):
    """A fifth worker started while paused says it is paused (/ready 503,
    is_pause), answers a pause, and admits nothing until continue."""
    async def body(extra) -> List[str]:
        async with Client(fresh) as c:
            name = fresh.name_of(extra)
            violations = []
            state = await c.state(name)
            ready = await c.http.get(fresh.url(extra, "/ready"), timeout=5)
            if not state["is_pause"] or ready.status_code != 503:
                violations.append(f"the new worker reports is_pause={state['is_pause']}, "
                                  f"/ready {ready.status_code}")
            # It has served no request yet: SGLang 0.5.23 reads no router
            # broadcast there, so its own /pause_generation would never return.
            try:
                r = await c.pause(name, timeout=5)
                if r.status_code != 200:
                    violations.append(f"a pause at the new worker failed ({r.status_code})")
            except httpx.TimeoutException:
                violations.append("a pause at the new worker (no request served yet) hung")
            since = time.time()
            task = asyncio.ensure_future(c.generate(name, 3, timeout=20))
            await asyncio.sleep(1.0)
            if await c.admitted_since(since):
                violations.append("the new worker admitted a request while paused")
            assert (await c.resume("B")).status_code == 200
            r = await task
            if r.status_code != 200:
                violations.append(f"its request failed after continue ({r.status_code})")
            return violations

    async def pause() -> None:
        async with Client(fresh) as c:
            assert (await c.pause("A")).status_code == 200
    run(pause(), 30)
    extra = fresh.start_worker()
    try:
        violations = run(body(extra), 60)
    finally:
        fresh.stop_worker(extra)
    verdict(fresh, violations, sglang_fails=True)


def test_pause_and_continue_landing_together_on_one_worker_both_return(fresh):
    """/pause_generation and /continue_generation sent to worker A at the
    same moment (two controllers, or a client retrying after a timeout),
    7 rounds, either one first by up to 1 ms (even rounds) or 20 ms (odd):
    each call returns on its own (SGLang keeps one pending future per
    worker, which the second call overwrites, so the first is never
    resolved).  The collision is a race: with SGLang's own locks, which must
    show the hang, up to 21 rounds run, until the first one hangs (CI once
    saw no hang in 21 rounds lagging up to 20 ms, all but one over 2 ms)."""
    expect_hang = fresh.backend == "sglang" and not HOOK

    async def body() -> List[str]:
        rng = random.Random(33696)
        violations: List[str] = []
        async with Client(fresh) as c:
            for rnd in range(21 if expect_hang else 7):
                if expect_hang and violations:
                    break
                # Every other round within 1 ms: SGLang's window is below
                # about 1 ms (measured on 0.5.22: hung in 20 of 22 such
                # rounds, in none of 20 lagging 2.8 to 19 ms).
                first = rng.choice(["pause", "continue"])
                lag = rng.uniform(0.0, 0.02 if rnd % 2 else 0.001)

                async def call(what: str, delay: float) -> str:
                    await asyncio.sleep(delay)
                    try:
                        r = await (c.pause("A") if what == "pause" else c.resume("A", 5.0))
                        return f"{r.status_code}"
                    except httpx.TimeoutException:
                        return "hung"
                pause_lag, resume_lag = (0.0, lag) if first == "pause" else (lag, 0.0)
                got = await asyncio.gather(call("pause", pause_lag), call("continue", resume_lag))
                hung = [w for w, g in zip(("pause", "continue"), got) if g == "hung"]
                if hung:
                    violations.append(f"round {rnd} ({first} first by {lag * 1000:.0f} ms): "
                                      f"{' and '.join(hung)} did not return in 5 s")
                # Sequentially now: every worker and the scheduler running again.
                for w in "ABCD":
                    await c.resume(w, timeout=10)
            results = await asyncio.gather(*(c.generate(w, 3, timeout=10) for w in "ABCD"),
                                           return_exceptions=True)
            stuck = [w for w, r in zip("ABCD", results)
                     if isinstance(r, BaseException) or r.status_code != 200]
            if stuck:
                violations.append(f"afterwards requests to {stuck} did not complete")
        return violations
    # contrib/sglang/'s patch also fixes this in SGLang's own TokenizerWorker.
    verdict(fresh, run(body(), 300), sglang_fails=not HOOK)


def test_abort_pause_returns_when_the_last_request_ends(fresh):
    """Abort-mode pause at A with requests in flight on A, B and C, 3
    rounds: the pause returns within 100 ms (median) of the last of them
    ending, and within 100 ms (median) when nothing is in flight (SGLang's
    drain looks once a second)."""
    async def one(c: Client, inflight: bool) -> float:
        ends: List[float] = []

        async def request(w: str) -> None:
            try:
                await c.generate(w, 3000, timeout=30)
            finally:
                ends.append(time.monotonic())
        tasks = [asyncio.ensure_future(request(w)) for w in ("ABC" if inflight else "")]
        if inflight:
            await c.wait_running(3)
        started = time.monotonic()
        assert (await c.pause("A", "abort", timeout=30)).status_code == 200
        returned = time.monotonic()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
        assert (await c.resume("B")).status_code == 200
        return returned - (max(ends) if inflight else started)

    async def body() -> List[str]:
        violations: List[str] = []
        async with Client(fresh) as c:
            for inflight in (True, False):
                lags = sorted([await one(c, inflight) for _ in range(3)])
                what = ("after the last request ended" if inflight else
                        "with nothing in flight")
                print(f"abort pause returned {what}: {[round(x * 1000) for x in lags]} ms")
                if lags[1] > 0.1:
                    violations.append(f"the abort pause returned {lags[1] * 1000:.0f} ms "
                                      f"(median of 3) {what}")
        return violations
    verdict(fresh, run(body(), 120), sglang_fails=True)
