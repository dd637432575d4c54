"""Figure "uncontended calls": one process, no contention; pyshmlock's hold
calls next to peer lock pairs and the measurement floors."""
import statistics
import time
from typing import Any, Callable, Dict, List, Tuple

from ..lock import RWLock, unlink
from ._common import CTX, _name

# ========================================================= uncontended calls
# Each case is a loop body run n times in a function of its own, so that every
# case pays the same loop overhead; cases are interleaved round by round, so
# that the machine's noise spreads evenly, and the median round is reported.

def _uncontended_cases() -> Tuple[Dict[str, Tuple[str, Dict[str, Any]]], List[Callable[[], None]]]:
    cases: Dict[str, Tuple[str, Dict[str, Any]]] = {}
    cleanups: List[Callable[[], None]] = []
    name = _name("micro")
    lk = RWLock(name)

    def drop_lock() -> None:
        lk.close()
        unlink(name, force=True)
    cleanups.append(drop_lock)
    cases["pyshmlock read pair"] = ("a(); r()", {"a": lk.acquire_read, "r": lk.release_read})
    cases["pyshmlock read pair, timeout=5"] = ("a(5.0); r()", {"a": lk.acquire_read,
                                                               "r": lk.release_read})
    cases["pyshmlock with reader_lock"] = ("with cm: pass", {"cm": lk.reader_lock})
    cases["pyshmlock write pair"] = ("a(); r()", {"a": lk.acquire_write, "r": lk.release_write})
    cases["pyshmlock update pair"] = ("a(); r()", {"a": lk.acquire_update,
                                                   "r": lk.release_update})
    cases["pyshmlock paused"] = ("lk.paused", {"lk": lk})
    try:
        import posix_ipc
        sem = posix_ipc.Semaphore(f"/{_name('sem')}", posix_ipc.O_CREX, initial_value=1)

        def drop_sem() -> None:
            sem.unlink()
            sem.close()
        cleanups.append(drop_sem)
        cases["posix_ipc.Semaphore pair"] = ("a(); r()", {"a": sem.acquire, "r": sem.release})
    except ImportError:
        pass
    ml = CTX.Lock()
    cases["multiprocessing.Lock pair"] = ("a(); r()", {"a": ml.acquire, "r": ml.release})
    try:
        import mmap

        from .._floors import capi_floor, cffi_floor
        floor = cffi_floor()
        mem = mmap.mmap(-1, 4096)
        word = floor.ffi.cast("uint32_t *", floor.ffi.from_buffer(mem))
        cases["floor: two cffi calls"] = ("f(w, 1); f(w, 0xFFFFFFFF)",
                                          {"f": floor.lib.floor_fetch_add, "w": word,
                                           "keep": mem})
        cases["floor: two bare C-API calls"] = ("f(); f()", {"f": capi_floor().noop})
    except ImportError as e:
        cases[f"floors skipped: {e.name} unavailable"] = ("", {})
    return cases, cleanups


def uncontended(rounds: int, n: int) -> Dict[str, Any]:
    """Median ns per pair (or call) of each case, over interleaved rounds."""
    cases, cleanups = _uncontended_cases()
    rows: Dict[str, Any] = {}
    try:
        loops: Dict[str, Callable[[int], None]] = {}
        for label, (body, env) in cases.items():
            if not body:
                rows[label] = {"error": "skipped"}
                continue
            code = f"def loop(n):\n    for _ in range(n):\n        {body}\n"
            ns: Dict[str, Any] = dict(env)
            exec(code, ns)          # one plain loop per case: equal overhead
            loops[label] = ns["loop"]
        times: Dict[str, List[float]] = {k: [] for k in loops}
        for loop in loops.values():
            loop(n // 10)           # warm up
        for _ in range(rounds):
            for label, loop in loops.items():
                t0 = time.perf_counter_ns()
                loop(n)
                times[label].append((time.perf_counter_ns() - t0) / n)
        base = statistics.median(times["posix_ipc.Semaphore pair"]) \
            if "posix_ipc.Semaphore pair" in times else None
        for label, ts in times.items():
            med = statistics.median(ts)
            rows[label] = {"median_ns": med, "rounds": rounds, "n": n,
                           "vs_posix_ipc": med / base if base else None}
    finally:
        for c in cleanups:
            c()
    return rows
