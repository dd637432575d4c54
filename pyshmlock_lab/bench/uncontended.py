"""Figure "uncontended calls": one process, no contention; pyshmlock's hold
calls next to peer lock pairs and the measurement floors, and its asyncio
holds next to asyncio.Lock, on the default event loop and on uvloop."""
import asyncio
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from pyshmlock.aio import AsyncRWLock
from pyshmlock.lock import RWLock, unlink

from ._common import CTX, _name


#: The event loops the asyncio rows run on: label -> factory, or the reason
#: the rows are skipped.
def _loops() -> Dict[str, Any]:
    loops: Dict[str, Any] = {"asyncio": asyncio.new_event_loop}
    try:
        import uvloop
        loops["uvloop"] = uvloop.new_event_loop
    except ImportError:
        loops["uvloop"] = "skipped: uvloop is not installed (pip install 'pyshmlock[bench]')"
    return loops


#: The asyncio rows: body of `async def loop(n): for _ in range(n): BODY`.
ASYNC_CASES = {
    "pyshmlock async with reader_lock": "async with cm: pass",
    "pyshmlock await acquire_read() + release_read()": "await a(); r()",
    "asyncio.Lock async with": "async with al: pass",
}

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
    cases["multiprocessing.Lock pair, timeout=5"] = ("a(timeout=5.0); r()",
                                                     {"a": ml.acquire, "r": ml.release})
    cases["multiprocessing.Lock with"] = ("with ml: pass", {"ml": ml})
    try:
        import mmap

        from .floors import capi_floor, cffi_floor
        floor = cffi_floor()
        mem = mmap.mmap(-1, 4096)
        word = floor.ffi.cast("uint32_t *", floor.ffi.from_buffer(mem))
        cases["floor: two cffi calls"] = ("f(w, 1); f(w, 0xFFFFFFFF)",
                                          {"f": floor.lib.floor_fetch_add, "w": word,
                                           "keep": mem})
        cases["floor: two bare C-API calls"] = ("f(); f()", {"f": capi_floor().noop})
    except ImportError as e:
        cases[f"floors skipped: {e.name} unavailable"] = ("", {})
    alk = AsyncRWLock(name)
    cleanups.insert(0, alk.close)
    for loop_label, factory in _loops().items():
        for label, body in ASYNC_CASES.items():
            key = f"{label} ({loop_label})"
            if isinstance(factory, str):
                cases[key] = ("", {"error": factory})
                continue
            cases[key] = (body, {"cm": alk.reader_lock, "a": alk.acquire_read,
                                 "r": alk.release_read, "al": asyncio.Lock(),
                                 "__loop__": factory, "__base__": f"asyncio.Lock async with "
                                                                  f"({loop_label})"})
    return cases, cleanups


def _async_loop(body: str, env: Dict[str, Any], cleanups: List[Callable[[], None]]
                ) -> Callable[[int], None]:
    """A loop of `body` in a coroutine, run on a loop of its own."""
    code = f"async def aloop(n):\n    for _ in range(n):\n        {body}\n"
    ns: Dict[str, Any] = {k: v for k, v in env.items() if not k.startswith("__")}
    exec(code, ns)
    ev = env["__loop__"]()
    cleanups.append(ev.close)
    aloop = ns["aloop"]

    def loop(n: int) -> None:
        ev.run_until_complete(aloop(n))
    return loop


def uncontended(rounds: int, n: int) -> Dict[str, Any]:
    """Median ns per pair (or call) of each case, over interleaved rounds."""
    cases, cleanups = _uncontended_cases()
    rows: Dict[str, Any] = {}
    try:
        loops: Dict[str, Callable[[int], None]] = {}
        bases: Dict[str, Optional[str]] = {}
        for label, (body, env) in cases.items():
            if not body:
                rows[label] = {"error": env.get("error", "skipped")}
                continue
            if "__loop__" in env:    # an asyncio row: ratio to asyncio.Lock on its loop
                loops[label] = _async_loop(body, env, cleanups)
                bases[label] = env["__base__"]
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
        mp_base = statistics.median(times["multiprocessing.Lock pair"])
        for label, ts in times.items():
            med = statistics.median(ts)
            rows[label] = {"median_ns": med, "rounds": rounds, "n": n,
                           "vs_posix_ipc": med / base if base else None,
                           "vs_multiprocessing_lock": med / mp_base}
            peer = bases.get(label)
            if peer is not None:
                rows[label]["vs_asyncio_lock"] = med / statistics.median(times[peer])
    finally:
        for c in cleanups:
            c()
    return rows
