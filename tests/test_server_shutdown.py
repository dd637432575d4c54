"""A server stopped while paused stops: requests parked at the gate end with
a clear exception (notify_closing) when uvicorn gets SIGTERM or Ctrl-C, so
its graceful shutdown completes and the port is free for the restart.
A real uvicorn server in a child process, real HTTP requests."""
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

pytestmark = pytest.mark.timeout(90)
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")

SERVER = textwrap.dedent('''
    import contextlib, sys
    import fastapi, uvicorn
    import pyshmlock
    from fastapi.responses import JSONResponse

    name, port, hook, graceful = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "hook", sys.argv[4]
    lock = pyshmlock.AsyncRWLock(name)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        if hook:                      # after uvicorn has set its own handlers
            lock.notify_closing_on_signals()
        yield

    app = fastapi.FastAPI(lifespan=lifespan)

    @app.get("/generate")
    async def generate():
        try:
            async with lock.reader_lock:
                return {"ok": True}
        except pyshmlock.LockClosingError as e:
            return JSONResponse({"error": str(e)}, status_code=503)

    @app.get("/health")
    async def health():
        return {"ok": True}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning",
                timeout_graceful_shutdown=None if graceful == "none" else float(graceful))
''')


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(lock_name, hook, graceful):
    port = free_port()
    p = subprocess.Popen([sys.executable, "-c", SERVER, lock_name, str(port), hook, graceful],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return p, port
        except httpx.HTTPError:
            time.sleep(0.1)
    p.kill()
    raise AssertionError("the server did not start: " + (p.communicate()[0] or ""))


def park_requests(port, n):
    results = []

    def one():
        try:
            results.append(httpx.get(f"http://127.0.0.1:{port}/generate", timeout=30)
                           .status_code)
        except httpx.HTTPError as e:
            results.append(type(e).__name__)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    return threads, results



@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_parked_requests_end_with_503_and_the_server_exits(lock, lock_name, sig):
    lock.pause()
    p, port = start(lock_name, "hook", "none")     # no graceful timeout: waits for tasks
    try:
        threads, results = park_requests(port, 3)
        time.sleep(0.5)
        assert not results, "a request got in while paused"
        t0 = time.monotonic()
        p.send_signal(sig)
        p.wait(timeout=20)
        took = time.monotonic() - t0
        for t in threads:
            t.join(10)
        assert results == [503, 503, 503], results
        assert took < 10, took
        with socket.socket() as s:                  # the restart can bind
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
        info = lock.info()
        assert not info.queued_readers and set(info.attached_pids) == {os.getpid()}
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(5)


def test_without_the_hook_uvicorns_graceful_timeout_ends_the_waits(lock, lock_name):
    lock.pause()
    p, port = start(lock_name, "nohook", "1")
    try:
        threads, results = park_requests(port, 2)
        time.sleep(0.5)
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=20)                          # uvicorn cancels the tasks after 1 s
        for t in threads:
            t.join(10)
        assert len(results) == 2 and 200 not in results, results
        assert set(lock.info().attached_pids) == {os.getpid()}
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(5)
