"""Figure "writer starvation": readers with overlapping holds against one
looping writer."""
import statistics
import time
from typing import Any, Dict

from ._common import CTX, _join_all, _make
from .adapters import RW_PEERS

# ========================================================= writer starvation

def _overlapping_reader(rw: Any, start: Any, stop: Any, hold: float) -> None:
    start.wait(30)
    while not stop.is_set():
        rw.read()
        time.sleep(hold)
        rw.unread()


def _looping_writer(rw: Any, start: Any, stop: Any, gap: float, out: Any) -> None:
    start.wait(30)
    waits = []
    while not stop.is_set():
        t0 = time.monotonic()
        rw.write()
        waits.append(time.monotonic() - t0)
        rw.unwrite()
        time.sleep(gap)
    out.put(waits)


def writer_starvation(seconds: float) -> Dict[str, Any]:
    """3 readers re-take overlapping 1 ms holds; a writer loops acquire,
    release, sleep 2 ms.  How often does the writer get in?"""
    rows: Dict[str, Any] = {}
    for factory in RW_PEERS:
        rw, why = _make(factory)
        if rw is None:
            rows[getattr(factory, "label", "?")] = {"error": why}
            continue
        start, stop, out = CTX.Event(), CTX.Event(), CTX.Queue()
        readers = [CTX.Process(target=_overlapping_reader, args=(rw, start, stop, 0.001),
                               daemon=True) for _ in range(3)]
        writer = CTX.Process(target=_looping_writer, args=(rw, start, stop, 0.002, out),
                             daemon=True)
        for p in readers + [writer]:
            p.start()
        time.sleep(0.2)
        start.set()
        time.sleep(seconds)
        stop.set()
        try:
            waits = out.get(timeout=30)
            rows[rw.label] = {
                "writer_acquisitions": len(waits),
                "median_wait_ms": statistics.median(waits) * 1e3 if waits else None,
                "max_wait_ms": max(waits) * 1e3 if waits else None,
            }
        except Exception:
            rows[rw.label] = {"writer_acquisitions": 0, "error": "writer never finished"}
        _join_all(readers + [writer], 10)
        rw.close()
    return rows
