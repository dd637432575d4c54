"""Shared helpers of the benchmark harness: the fork context, unique names,
percentiles, temporary files, and starting/joining peer processes."""
import multiprocessing as mp
import os
import tempfile
import time
import uuid
from typing import Any, Callable, List, Optional, Tuple

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
