"""Shared helpers of the benchmark harness: the fork context, unique names,
percentiles, temporary files, and starting/joining peer processes."""
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple

CTX = mp.get_context("fork")


def _name(tag: str) -> str:
    return f"bench-{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _pct(values: List[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


class _TempFile:
    """A scratch lock file, removed at the end."""

    def __init__(self) -> None:
        fd, self.path = tempfile.mkstemp(prefix="pyshmlock-bench-")
        os.close(fd)

    def remove(self) -> None:
        for p in (self.path, self.path + ".lock"):
            if os.path.exists(p):
                os.unlink(p)


def _make(factory: Callable[[], Any]) -> Tuple[Optional[Any], str]:
    try:
        return factory(), ""
    except ImportError as e:
        return None, f"not installed ({e.name})"


def _join_all(procs: List[Any], timeout: float) -> None:
    end = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.1, end - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(5)


#: The environment switch that runs the wait path of kernels before 5.16
#: (no futex_waitv: a waiter re-probes every 5 ms, no death watch).  The core
#: reads it once per process, so a figure on that path runs in a fresh one.
NO_WAITV_ENV = "PYSHMLOCK_NO_FUTEX_WAITV"


def in_fresh_process(module: str, func: str, *args: Any,
                     env: Optional[Dict[str, str]] = None,
                     timeout: float = 900) -> Dict[str, Any]:
    """Run ``pyshmlock_lab.bench.<module>.<func>(*args)`` in a new interpreter
    with ``env`` added to the environment, and return its result (a dict
    of JSON values)."""
    code = ("import json, sys\n"
            f"from pyshmlock_lab.bench.{module} import {func}\n"
            f"print('RESULT ' + json.dumps({func}(*json.loads(sys.argv[1]))))\n")
    run = subprocess.run([sys.executable, "-c", code, json.dumps(list(args))],
                         capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, **(env or {})})
    for line in run.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[len("RESULT "):]))
    return {"error": f"failed: {(run.stderr or run.stdout)[-300:]}"}
