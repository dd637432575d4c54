"""An HTTP client for the scenarios: SGLang's endpoints on worker A, B, C,
D, the stand-in's evidence, and the verdict rule."""

import asyncio
import time
from typing import Any, Dict, List, Optional

import httpx

from .servers import NAMES, Proc, Server

CALL_TIMEOUT = 15.0


class Client:
    def __init__(self, server: Server) -> None:
        self.server = server
        # No kept-alive connections: after a handler raises (a refused
        # continue is SGLang's handler letting DataSuspectError through, a
        # 500), uvicorn closes that connection, and a reused one would fail.
        self.http = httpx.AsyncClient(timeout=CALL_TIMEOUT,
                                      limits=httpx.Limits(max_keepalive_connections=0))

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.http.aclose()

    def w(self, name: str) -> Proc:
        return self.server.workers[NAMES.index(name)]

    async def post(self, worker: str, path: str, body: Dict[str, Any],
                   timeout: float = CALL_TIMEOUT,
                   headers: Optional[Dict[str, str]] = None) -> httpx.Response:
        return await self.http.post(self.server.url(self.w(worker), path), json=body,
                                    timeout=timeout, headers=headers)

    async def generate(self, worker: str, tokens: int, timeout: float = CALL_TIMEOUT,
                       rid: Optional[str] = None) -> httpx.Response:
        body: Dict[str, Any] = {"text": "hello world", "sampling_params":
                                {"max_new_tokens": tokens, "ignore_eos": True}}
        if rid:
            body["rid"] = rid
        return await self.post(worker, "/generate", body, timeout)

    async def pause(self, worker: str, mode: str = "in_place",
                    timeout: float = CALL_TIMEOUT) -> httpx.Response:
        return await self.post(worker, "/pause_generation", {"mode": mode}, timeout)

    async def resume(self, worker: str, timeout: float = CALL_TIMEOUT) -> httpx.Response:
        return await self.post(worker, "/continue_generation", {}, timeout)

    async def update(self, worker: str, timeout: float = CALL_TIMEOUT,
                     fence: Optional[int] = None) -> httpx.Response:
        """/update_weights_from_disk; with `fence`, as a pyshmlock.cluster
        controller sends it: its update token in the X-Pyshmlock-Fence header."""
        headers = None if fence is None else {"X-Pyshmlock-Fence": str(fence)}
        return await self.post(worker, "/update_weights_from_disk",
                               {"model_path": str(self.server.dir / "model")}, timeout,
                               headers)

    async def state(self, worker: str) -> Dict[str, Any]:
        r = await self.http.get(self.server.url(self.w(worker), "/worker_state"), timeout=5)
        r.raise_for_status()
        out: Dict[str, Any] = r.json()
        return out

    async def stats(self) -> Dict[str, Any]:
        r = await self.http.get(f"http://127.0.0.1:{self.server.standin_port}/stats",
                                timeout=5)
        out: Dict[str, Any] = r.json()
        return out

    async def configure(self, **durations: float) -> None:
        await self.http.post(f"http://127.0.0.1:{self.server.standin_port}/config",
                             json=durations, timeout=5)

    async def wait_running(self, count: int, timeout: float = 10.0) -> None:
        """Until the stand-in generates for `count` requests (bounded)."""
        deadline = time.monotonic() + timeout
        while len((await self.stats())["running"]) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"fewer than {count} requests running after {timeout} s")
            await asyncio.sleep(0.02)

    async def admitted_since(self, t: float) -> List[Dict[str, Any]]:
        return [e for e in (await self.stats())["events"]
                if e["what"] == "admit" and e["t"] >= t]

    async def event_time(self, what: str, after: float = 0.0, timeout: float = 10.0,
                         **match: Any) -> float:
        deadline = time.monotonic() + timeout
        while True:
            for e in (await self.stats())["events"]:
                if e["what"] == what and e["t"] >= after and all(
                        e.get(k) == v for k, v in match.items()):
                    return float(e["t"])
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {what} event in {timeout} s")
            await asyncio.sleep(0.02)


def run(coro: Any, bound: float) -> Any:
    """Run a scenario body with an overall bound."""
    return asyncio.run(asyncio.wait_for(coro, bound))


def settle(server: Server, bound: float = 30.0) -> None:
    """Open the gate, let every request finish, reset the stand-in."""
    async def body() -> None:
        async with Client(server) as c:
            await c.configure(update_seconds=0.5, step_seconds=0.3)
            live = [n for n, w in zip("ABCD", server.workers) if w.popen.poll() is None]
            for name in live:               # a continue per worker: SGLang's flags too
                r = await c.resume(name, timeout=bound)
                if r.status_code != 200 and server.shared:
                    await force_resume(server)
                    await c.resume(name, timeout=bound)
            deadline = time.monotonic() + bound
            while (await c.stats())["running"] or (await c.stats())["loading"]:
                if time.monotonic() > deadline:
                    raise TimeoutError("the stand-in did not go idle")
                await asyncio.sleep(0.05)
            await c.http.post(f"http://127.0.0.1:{server.standin_port}/reset", timeout=5)
    run(body(), bound * 3)


async def force_resume(server: Server) -> None:
    """`pyshmlock resume --force NAME`, the operator's command."""
    proc = await asyncio.create_subprocess_exec(
        server.python, "-m", "pyshmlock", "resume", "--force", "--timeout", "10",
        server.lock_name)
    await asyncio.wait_for(proc.wait(), 30)


def verdict(server: Server, violations: List[str], sglang_fails: Optional[bool]) -> None:
    """With SGLang's own locks (also on an SGLang with the contrib/ hook,
    unused), a known failure must show (the harness catches it); with the
    integration (installed, or through the hook), and for the scenarios
    SGLang passes, nothing may be wrong.  sglang_fails=None: SGLang's own
    locks fail the scenario only when its broadcast loses a race, so with
    them either outcome is printed, never judged."""
    if server.backend == "sglang" and sglang_fails is None:
        print("SGLang's own locks:", "; ".join(violations) or "no violation this run")
        return
    if server.backend == "sglang" and sglang_fails:
        assert violations, ("SGLang's own locks were expected to fail this scenario and "
                            "did not: the harness would not catch the failure")
        print("SGLang's own locks, as expected:", "; ".join(violations))
    else:
        assert not violations, "; ".join(violations)
