"""A demo worker process: an SGLang-shaped tokenizer worker behind uvicorn.

Every worker serves the shared port (all workers accept on one listening
socket, as uvicorn workers do) and a private port, so that a client can
address "worker A" or "worker B" on purpose.

Two backends implement the same endpoints:

shared  one pyshmlock.AsyncRWLock for the pause gate and the model-update
        lock, seen by every process.
local   what SGLang does today (after its fix for multiple tokenizer workers):
        each worker keeps its own is_pause flag, asyncio.Condition and
        in-process reader/writer lock; pause/continue are applied locally,
        broadcast to the registered workers and forwarded to the scheduler;
        an update checks is_pause once and then either skips the writer lock
        (paused) or takes it (not paused).
"""
import asyncio
import itertools
import json
import queue
import signal
import threading
import time
from typing import Any, Dict, List, Optional

from pyshmlock.aio import AsyncRWLock
from pyshmlock.lock import RWLock

from .state import (
    MODES,
    ORPHAN_WAIT_S,
    SharedState,
    die_with_parent,
    engine_lock_name,
    quiesce,
    remove_locks_if_orphaned,
    swap_weights,
)

REQUEST_TIMEOUT = 60.0


class LocalRWLock:
    """An in-process asyncio reader/writer lock, like SGLang's aio_rwlock
    (writer-preferring: a waiting writer blocks new readers)."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._readers = 0
        self._writer = False
        self._waiting_writers = 0

    async def acquire_reader(self) -> None:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._writer and not self._waiting_writers)
            self._readers += 1

    async def release_reader(self) -> None:
        async with self._cond:
            self._readers -= 1
            if self._readers == 0:
                self._cond.notify_all()

    async def acquire_writer(self) -> None:
        async with self._cond:
            self._waiting_writers += 1
            try:
                await self._cond.wait_for(lambda: not self._writer and self._readers == 0)
            finally:
                self._waiting_writers -= 1
            self._writer = True

    async def release_writer(self) -> None:
        async with self._cond:
            self._writer = False
            self._cond.notify_all()

    def is_locked(self) -> bool:
        return self._writer or self._readers > 0


class _Section:
    def __init__(self, acquire: Any, release: Any) -> None:
        self._acquire, self._release = acquire, release

    async def __aenter__(self) -> None:
        await self._acquire()

    async def __aexit__(self, *exc: Any) -> None:
        await self._release()


class WorkerCore:
    """Request handling and control for one worker (either backend)."""

    def __init__(self, index: int, name: str, backend: str, state: SharedState,
                 sched_inbox: Any, outbox: Any, controls: List[Any], registered: Any) -> None:
        self.index = index
        self.backend = backend
        self.state = state
        self.sched_inbox = sched_inbox
        self.outbox = outbox
        self.controls = controls
        self.registered = registered
        self.engine = RWLock(engine_lock_name(name), create=False)
        self.alock: Optional[AsyncRWLock] = None
        #: the pyshmlock locks this worker's /metrics reports
        self.lock_names = [engine_lock_name(name)]
        if backend == "shared":
            self.alock = AsyncRWLock(name, create=False)
            self.lock_names.insert(0, name)
        self.is_pause = False
        self.pending: Dict[str, asyncio.Queue[Any]] = {}
        self.acks: Dict[int, asyncio.Future[None]] = {}
        self.ids = itertools.count()
        self.inflight = 0
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self.closing = threading.Event()
        self._flag_tasks: set[asyncio.Future[None]] = set()

    # -- plumbing --------------------------------------------------------

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        if self.backend == "local":
            self.is_pause_cond = asyncio.Condition()
            self.model_update_lock = LocalRWLock()
        threading.Thread(target=self._pump, args=(self.outbox, self._dispatch),
                         daemon=True).start()
        threading.Thread(target=self._pump, args=(self.controls[self.index], self._on_broadcast),
                         daemon=True).start()
        self.registered[self.index] = 1      # the router now broadcasts to us

    def _pump(self, q: Any, handler: Any) -> None:
        while not self.closing.is_set():
            try:
                msg = q.get(timeout=0.2)
            except queue.Empty:
                continue
            except (EOFError, OSError):
                return
            assert self.loop is not None
            self.loop.call_soon_threadsafe(handler, msg)

    def _dispatch(self, msg: Any) -> None:
        if msg[0] == "sched_ack":
            fut = self.acks.pop(msg[1], None)
            if fut is not None and not fut.done():
                fut.set_result(None)
            return
        q = self.pending.get(msg[1])
        if q is not None:
            q.put_nowait(msg)

    def _on_broadcast(self, msg: Any) -> None:
        task = asyncio.ensure_future(self._apply_pause_flag(msg == "pause"))
        self._flag_tasks.add(task)                    # keep it alive until it ran
        task.add_done_callback(self._flag_tasks.discard)

    async def _apply_pause_flag(self, paused: bool) -> None:
        async with self.is_pause_cond:
            self.is_pause = paused
            if not paused:
                self.is_pause_cond.notify_all()

    def _broadcast(self, msg: str) -> None:
        for i, q in enumerate(self.controls):
            if i != self.index and self.registered[i]:
                q.put(msg)

    async def _tell_scheduler(self, *msg: Any) -> None:
        assert self.loop is not None
        ack = next(self.ids)
        fut = self.loop.create_future()
        self.acks[ack] = fut
        self.sched_inbox.put((msg[0], self.index, *msg[1:], ack))
        await asyncio.wait_for(fut, 10)

    # -- requests --------------------------------------------------------

    async def generate(self, max_tokens: int) -> Dict[str, Any]:
        """One request: a read hold for its whole life.  The reply carries
        when the hold was had and given back (CLOCK_MONOTONIC, which every
        process on the host shares)."""
        # Both stamps are taken while the hold is held: "released" is the
        # last moment before it is given back, so an update that starts
        # after the release is never stamped as starting before it.
        if self.backend == "shared":
            assert self.alock is not None
            async with self.alock.reader_lock:
                admitted_at = time.monotonic()
                r = await self._run(max_tokens)
                released_at = time.monotonic()
        else:
            async with self.is_pause_cond:
                await self.is_pause_cond.wait_for(lambda: not self.is_pause)
            async with _Section(self.model_update_lock.acquire_reader,
                                self.model_update_lock.release_reader):
                admitted_at = time.monotonic()
                r = await self._run(max_tokens)
                released_at = time.monotonic()
        r.update(admitted_at=admitted_at, released_at=released_at)
        return r

    async def _run(self, max_tokens: int) -> Dict[str, Any]:
        rid = f"{self.index}-{next(self.ids)}"
        q: asyncio.Queue[Any] = asyncio.Queue()
        self.pending[rid] = q
        self.inflight += 1
        tokens: List[int] = []
        versions: List[int] = []
        aborted = False
        try:
            self.sched_inbox.put(("submit", self.index, rid, max_tokens))
            while True:
                msg = await asyncio.wait_for(q.get(), REQUEST_TIMEOUT)
                if msg[0] == "token":
                    tokens.append(msg[2])
                    versions.append(msg[3])
                elif msg[0] == "done":
                    break
                elif msg[0] == "aborted":
                    aborted = True
                    break
        except BaseException:
            self.sched_inbox.put(("cancel", rid))
            raise
        finally:
            self.inflight -= 1
            del self.pending[rid]
        return {"rid": rid, "worker": self.index, "tokens": len(tokens),
                "versions": sorted(set(versions)), "aborted": aborted}

    # -- control ---------------------------------------------------------

    async def pause(self, mode: str) -> Dict[str, Any]:
        code = MODES[mode]
        if self.backend == "shared":
            assert self.alock is not None
            self.state.set("pause_mode", code)
            self.alock.pause()
            # The scheduler's acknowledgement: no generation step in progress.
            await asyncio.to_thread(quiesce, self.engine)
            if mode == "abort":
                drained = await self.alock.wait_drained(30)
                return {"paused": True, "drained": drained}
            return {"paused": True}
        await self._apply_pause_flag(True)
        self._broadcast("pause")
        await self._tell_scheduler("pause", code)
        if mode == "abort":    # polls its own lock only, as SGLang does
            while self.model_update_lock.is_locked():
                await asyncio.sleep(0.005)
            return {"paused": True, "drained": True}
        return {"paused": True}

    async def resume(self) -> Dict[str, Any]:
        if self.backend == "shared":
            assert self.alock is not None
            running = await self.alock.resume(30)
            return {"running": running, **self._update_progress()}
        await self._apply_pause_flag(False)
        self._broadcast("continue")
        await self._tell_scheduler("continue")
        return {"running": True, **self._update_progress()}

    def _update_progress(self) -> Dict[str, int]:
        """What the shared state says of updates as this call returns: a
        caller learns whether an update had ended from the state itself, not
        from which HTTP reply reached it first."""
        return {"updates_done": self.state.updates, "updating": self.state.updating}

    async def _swap(self, seconds: float, t0: float, under_pause: bool) -> Dict[str, Any]:
        """Run the simulated swap; the reply says when it ran (CLOCK_MONOTONIC)."""
        started = time.monotonic()
        version = await asyncio.to_thread(swap_weights, self.state, seconds)
        return {"version": version, "waited_s": started - t0, "under_pause": under_pause,
                "started_at": started, "ended_at": time.monotonic()}

    async def update_weights(self, seconds: float) -> Dict[str, Any]:
        t0 = time.monotonic()
        if self.backend == "shared":
            assert self.alock is not None
            async with self.alock.update(30):
                under_pause = self.alock.paused
                if under_pause:
                    await asyncio.to_thread(quiesce, self.engine)
                return await self._swap(seconds, t0, under_pause)
        # SGLang today: one look at is_pause, then skip or take the writer lock.
        async with self.is_pause_cond:
            is_paused = self.is_pause
            if is_paused:
                return await self._swap(seconds, t0, True)
        async with _Section(self.model_update_lock.acquire_writer,
                            self.model_update_lock.release_writer):
            return await self._swap(seconds, t0, False)

    def health(self) -> Dict[str, Any]:
        paused = self.alock.paused if self.alock is not None else self.is_pause
        return {"worker": self.index, "paused": paused, "inflight": self.inflight,
                "backend": self.backend}

    def lock_status(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"worker": self.index, "backend": self.backend,
                               "state": self.state.snapshot()}
        if self.alock is not None:
            out["lock"] = self.alock.info().to_dict()
        else:
            out["local"] = {"is_pause": self.is_pause, "locked": self.model_update_lock.is_locked()}
        return out


MAX_BODY = 64 * 1024    # bytes; every endpoint takes a tiny JSON object


class JSONBodies:
    """ASGI middleware: every request body is a JSON object, whatever its
    content-type says.

    `curl -d '{"max_tokens": 5}'` (the demo's own hint) sends
    application/x-www-form-urlencoded, and FastAPI would ignore such a body
    and use the defaults.  Here a body that parses as a JSON object is passed
    on as application/json; one that does not is 400 (not JSON) or 422 (JSON,
    not an object); more than MAX_BODY bytes is 413.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        length = headers.get(b"content-length", b"0")
        if not length.isdigit() or int(length) > MAX_BODY:
            await _reply(send, 413, f"the body is limited to {MAX_BODY} bytes")
            return
        body = b""
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            body += msg.get("body", b"")
            if len(body) > MAX_BODY:
                await _reply(send, 413, f"the body is limited to {MAX_BODY} bytes")
                return
            if not msg.get("more_body", False):
                break
        ctype = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if body.strip() and ctype != b"application/json":
            try:
                parsed = json.loads(body)
            except ValueError:
                await _reply(send, 400, 'the body must be a JSON object, e.g. {"max_tokens": 5}')
                return
            if not isinstance(parsed, dict):
                await _reply(send, 422, "the body must be a JSON object")
                return
            scope = dict(scope)
            scope["headers"] = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            scope["headers"].append((b"content-type", b"application/json"))
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _reply(send: Any, status: int, detail: str) -> None:
    data = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


def build_app(core: WorkerCore) -> Any:
    """The FastAPI application of one worker."""
    from contextlib import asynccontextmanager

    from fastapi import Body, FastAPI, HTTPException

    @asynccontextmanager
    async def lifespan(app: Any) -> Any:
        await core.start()
        yield
        core.closing.set()

    app = FastAPI(title="pyshmlock demo worker", lifespan=lifespan)
    app.add_middleware(JSONBodies)

    @app.post("/generate")
    async def generate(max_tokens: int = Body(20, embed=True)) -> Dict[str, Any]:
        if not 1 <= max_tokens <= 10_000:
            raise HTTPException(422, "max_tokens must be 1..10000")
        return await core.generate(max_tokens)

    @app.post("/pause_generation")
    async def pause_generation(mode: str = Body("in_place", embed=True)) -> Dict[str, Any]:
        if mode not in MODES:
            raise HTTPException(422, f"mode must be one of {sorted(MODES)}")
        return await core.pause(mode)

    @app.post("/continue_generation")
    async def continue_generation() -> Dict[str, Any]:
        return await core.resume()

    @app.post("/update_weights")
    async def update_weights(seconds: float = Body(0.2, embed=True)) -> Dict[str, Any]:
        if not 0 <= seconds <= 60:
            raise HTTPException(422, "seconds must be 0..60")
        return await core.update_weights(seconds)

    @app.get("/health")
    async def health() -> Dict[str, Any]:
        return core.health()

    @app.get("/lock_status")
    async def lock_status() -> Dict[str, Any]:
        return core.lock_status()

    # Prometheus: the locks' metrics (pyshmlock.metrics), as a serving stack
    # registers them beside its own.
    from fastapi import Response
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    from pyshmlock.metrics import LockCollector
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LockCollector(core.lock_names))

    @app.get("/metrics")
    async def metrics() -> Any:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


def worker_main(index: int, name: str, backend: str, state: SharedState, sched_inbox: Any,
                outboxes: List[Any], controls: List[Any], registered: Any, shared_sock: Any,
                port_q: Any, go: Any, parent_pid: int = 0, stop: Any = None) -> None:
    """Process entry point: wait for `go`, then serve both sockets until SIGTERM."""
    import socket

    import uvicorn
    waited = time.monotonic()
    # SIGTERM if the demo dies (die_with_parent); uvicorn shuts down on it and
    # raises it again once it has, which this handler then only records.
    terminated: List[int] = []
    if parent_pid and not die_with_parent(parent_pid, lambda *_: terminated.append(1)):
        terminated.append(1)
    try:
        while not terminated and not go.wait(0.1):   # a spare never started
            if time.monotonic() > waited + 300:
                return
        if terminated:
            return
        own = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        own.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        own.bind(("127.0.0.1", 0))
        own.listen(256)
        core = WorkerCore(index, name, backend, state, sched_inbox, outboxes[index], controls,
                          registered)
        config = uvicorn.Config(build_app(core), log_level="error", access_log=False,
                                lifespan="on", timeout_graceful_shutdown=1)
        server = uvicorn.Server(config)
        port_q.put((index, own.getsockname()[1]))
        asyncio.run(server.serve(sockets=[shared_sock, own]))
    finally:
        # Like the scheduler: if the main died without cleaning up, remove
        # the demo's locks, so that they go even if the scheduler is slow to.
        # A SIGTERM from the main's own shutdown (stop set) waits for nothing.
        shutting_down = stop is not None and stop.is_set()
        remove_locks_if_orphaned(name, parent_pid,
                                 ORPHAN_WAIT_S if terminated and not shutting_down else 0.0)
        if terminated:      # then end as SIGTERM's default action would have
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.raise_signal(signal.SIGTERM)
