"""Fixtures of the real-SGLang suite: the venv of the release under test
(PYSHMLOCK_SGLANG_VERSION, default the newest), and one server per backend
shared by the scenarios (pytest groups the tests by backend, so one server
runs at a time).  Skipped unless PYSHMLOCK_REAL_SGLANG=1."""

import os
import sys
import time
from typing import Any, Dict, Iterator, List

import pytest

TIMINGS: Dict[str, float] = {}
ENABLED = os.environ.get("PYSHMLOCK_REAL_SGLANG") == "1"


def pytest_collection_modifyitems(config: Any, items: Any) -> None:
    if ENABLED and sys.version_info[:2] == (3, 11):
        return
    reason = ("the real-SGLang suite runs with PYSHMLOCK_REAL_SGLANG=1 (about 8 minutes a "
              "release; the first run also builds its venv of torch 2.13 CPU and SGLang, "
              "about 1; PYSHMLOCK_SGLANG_VERSION chooses the release)"
              if not ENABLED else "SGLang's wheels are for CPython 3.11")
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def sglang_venv() -> Any:
    from . import sglang_venv as venv_module

    t0 = time.monotonic()
    venv = venv_module.ensure(hook=HOOK)
    TIMINGS[f"SGLang {venv_module.release()} venv ready (this run), s"] = time.monotonic() - t0
    TIMINGS["venv build from scratch (when built), s"] = venv_module.build_seconds(venv)
    return venv


def _backends() -> List[str]:
    """PYSHMLOCK_SGLANG_BACKENDS, default both: SGLang's own locks and the
    integration; with PYSHMLOCK_SGLANG_HOOK=1 (the venv's SGLang carries
    contrib/sglang/'s patch) "sglang,hook"."""
    default = "sglang,hook" if HOOK else "sglang,pyshmlock"
    return os.environ.get("PYSHMLOCK_SGLANG_BACKENDS", default).split(",")


HOOK = os.environ.get("PYSHMLOCK_SGLANG_HOOK") == "1"


@pytest.fixture(scope="session", params=_backends())
def server(request: Any, sglang_venv: Any) -> Iterator[Any]:
    from .servers import Server

    srv = Server(request.param, sglang_venv)
    try:
        t0 = time.monotonic()
        srv.start()
        TIMINGS[f"{srv.backend}: 4 workers started and served, s"] = time.monotonic() - t0
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def fresh(server: Any) -> Iterator[Any]:
    """The server as a scenario expects it: running, idle, stand-in reset."""
    from .client import settle

    settle(server)
    yield server
    settle(server)


@pytest.fixture(autouse=True)
def _time_scenario(request: Any) -> Iterator[None]:
    t0 = time.monotonic()
    yield
    if "server" in request.fixturenames:
        TIMINGS[f"scenario {request.node.name}, s"] = time.monotonic() - t0


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not TIMINGS:
        return
    terminalreporter.section("real-SGLang timings")
    for key, value in TIMINGS.items():
        terminalreporter.write_line(f"{value:8.1f}  {key}")
