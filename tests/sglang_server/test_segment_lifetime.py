"""The server's shared state lives as long as its workers: two workers on a
lock of their own (both serve, both pause and update through it); the
segment /dev/shm/pyshmlock.<name> and the served-weights record stay while
one runs and are gone once the last one stopped cleanly (SIGTERM, uvicorn's
shutdown)."""

import os
import uuid

import pytest

from .client import Client, run

pytestmark = pytest.mark.timeout(600)   # includes starting the server, once per backend


def _left(name: str) -> list:
    return sorted(e for e in os.listdir("/dev/shm") if name in e)


def test_the_last_worker_to_stop_removes_the_segment(fresh):
    if not fresh.shared:
        pytest.skip("SGLang's own locks keep nothing in /dev/shm")
    name = f"sglang-lifetime-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    first = fresh.start_worker(wait=False, lock_name=name)
    second = fresh.start_worker(wait=False, lock_name=name)
    try:
        fresh._wait_ready([first, second], 240)
        for w in (first, second):
            fresh.warm_up(w)

        async def use() -> None:
            async with Client(fresh) as c:
                r = await c.post(fresh.name_of(first), "/update_weight_version",
                                 {"new_version": "lifetime", "abort_all_requests": False})
                assert r.status_code == 200, r.text
        run(use(), 60)
        assert f"pyshmlock.{name}" in _left(name), _left(name)
        # SGLang's SIGTERM watchdog looks every 5 s, then exits the loop.
        fresh.stop_worker(first, timeout=60)
        assert first.popen.returncode == 0, first.log_tail()
        assert f"pyshmlock.{name}" in _left(name), \
            f"the segment went while a worker still ran: {_left(name)}"
        fresh.stop_worker(second, timeout=60)
        assert second.popen.returncode == 0, second.log_tail()
        assert _left(name) == [], f"left in /dev/shm after the last worker stopped: {_left(name)}"
    finally:
        for w in (first, second):
            fresh.stop_worker(w)
        for entry in _left(name):            # only when the test failed
            path = os.path.join("/dev/shm", entry)
            if os.path.isdir(path):
                import shutil

                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
