"""Figure "read throughput": N processes loop acquire_read/release_read."""
import time
from typing import Any, Dict, List

from ._common import CTX, _join_all, _make
from .adapters import _FlockRW, _PyshmlockRW

# ============================================================ read throughput

def _read_loop(rw: Any, start: Any, seconds: float, out: Any) -> None:
    start.wait(30)
    n = 0
    end = time.monotonic() + seconds
    read, unread = rw.read, rw.unread
    while time.monotonic() < end:
        for _ in range(200):
            read()
            unread()
        n += 200
    out.put(n)


def read_throughput(procs: List[int], seconds: float) -> Dict[str, Any]:
    """Read pairs per second across N processes, pyshmlock and flock."""
    rows: Dict[str, Any] = {}
    for factory in (_PyshmlockRW, _FlockRW):
        rw, _why = _make(factory)
        if rw is None:
            continue
        for n in procs:
            start, out = CTX.Event(), CTX.Queue()
            ps = [CTX.Process(target=_read_loop, args=(rw, start, seconds, out), daemon=True)
                  for _ in range(n)]
            for p in ps:
                p.start()
            start.set()
            total = sum(out.get(timeout=seconds + 30) for _ in ps)
            _join_all(ps, 10)
            rows[f"{rw.label} x{n}"] = {"pairs_per_s": total / seconds, "processes": n,
                                       "primitive": rw.label}
        rw.close()
    return rows
