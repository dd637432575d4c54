"""`pyshmlock bench`: the multi-process benchmark harness.

Every figure is measured in one run next to the peers a Python user picks
today, and printed as one table with ratios; the same data goes to JSON (and
to a PNG chart when matplotlib is installed).

Sections:
  uncontended calls   one process, no contention: a pyshmlock read pair,
                      `with reader_lock`, write/update pairs, `paused`, next
                      to posix_ipc.Semaphore and multiprocessing.Lock pairs
                      and two floors (two cffi calls; two bare C-API calls)
  read throughput     N processes loop acquire_read/release_read
  writer starvation   3 readers with overlapping 1 ms holds, 1 writer looping
                      acquire / release / sleep 2 ms
  pause-to-wake       N processes blocked at the gate; time from the release
                      call to the last one running (median, p99 over rounds)
  kill-to-recovery    SIGKILL a holder; time until a blocked waiter gets in

Peers are optional: a peer whose package is missing is reported as such.
"""
import fcntl
import json
import multiprocessing as mp
import os
import platform
import signal
import statistics
import tempfile
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple

from .lock import RWLock, unlink

CTX = mp.get_context("fork")


def _name(tag: str) -> str:
    return f"bench-{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _pct(values: List[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


class _TempFile:
    """A scratch lock file, removed at the end."""

    def __init__(self) -> None:
        fd, self.path = tempfile.mkstemp(prefix="pyshmlock-bench-")
        os.close(fd)

    def remove(self) -> None:
        for p in (self.path, self.path + ".lock"):
            if os.path.exists(p):
                os.unlink(p)


# ====================================================== read/write adapters
# Each adapter is built in the parent and used after fork in the children;
# methods take/give one hold.

class _PyshmlockRW:
    label = "pyshmlock"

    def __init__(self) -> None:
        self.name = _name("rw")
        self.lock = RWLock(self.name)

    def read(self) -> None:
        self.lock.acquire_read()

    def unread(self) -> None:
        self.lock.release_read()

    def write(self) -> None:
        self.lock.acquire_write()

    def unwrite(self) -> None:
        self.lock.release_write()

    def close(self) -> None:
        self.lock.close()
        unlink(self.name, force=True)


class _FlockRW:
    label = "fcntl.flock"

    def __init__(self) -> None:
        self.tmp = _TempFile()
        self.fd = -1

    def _fd(self) -> int:
        if self.fd < 0:     # one open file description per process
            self.fd = os.open(self.tmp.path, os.O_RDWR)
        return self.fd

    def read(self) -> None:
        fcntl.flock(self._fd(), fcntl.LOCK_SH)

    def unread(self) -> None:
        fcntl.flock(self._fd(), fcntl.LOCK_UN)

    def write(self) -> None:
        fcntl.flock(self._fd(), fcntl.LOCK_EX)

    unwrite = unread

    def close(self) -> None:
        self.tmp.remove()


class _PrwlockRW:
    label = "prwlock"

    def __init__(self) -> None:
        import prwlock
        self.lock = prwlock.RWLock()

    def read(self) -> None:
        self.lock.acquire_read()

    def write(self) -> None:
        self.lock.acquire_write()

    def unread(self) -> None:
        self.lock.release()

    unwrite = unread

    def close(self) -> None:
        pass


class _FastenersRW:
    label = "fasteners"

    def __init__(self) -> None:
        import fasteners
        self.tmp = _TempFile()
        self.lock = fasteners.InterProcessReaderWriterLock(self.tmp.path)

    def read(self) -> None:
        self.lock.acquire_read_lock()

    def unread(self) -> None:
        self.lock.release_read_lock()

    def write(self) -> None:
        self.lock.acquire_write_lock()

    def unwrite(self) -> None:
        self.lock.release_write_lock()

    def close(self) -> None:
        self.tmp.remove()


class _FilelockRW:
    label = "filelock"

    def __init__(self) -> None:
        self.tmp = _TempFile()
        self.lock: Any = None

    def _lock(self) -> Any:
        if self.lock is None:   # filelock's lock is per process: make it after fork
            import filelock
            self.lock = filelock.ReadWriteLock(self.tmp.path + ".lock", is_singleton=False)
        return self.lock

    def read(self) -> None:
        self._lock().acquire_read()

    def write(self) -> None:
        self._lock().acquire_write()

    def unread(self) -> None:
        self._lock().release()

    unwrite = unread

    def close(self) -> None:
        self.tmp.remove()


RW_PEERS: List[Callable[[], Any]] = [_PyshmlockRW, _FlockRW, _PrwlockRW, _FastenersRW,
                                      _FilelockRW]


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
        from ._floors import capi_floor, cffi_floor
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
        rw, why = _make(factory)
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


# ============================================================= pause-to-wake
# Waiters loop: wait for the round to be armed, say "ready", block, record
# the time they woke.  The controller releases all at once and takes the
# last wake-up time.  Arming uses a polled round counter: that is set-up, not
# the measured path.

class _Gate:
    """Shared bookkeeping for one pause-to-wake run."""

    def __init__(self, n: int) -> None:
        self.round = CTX.RawValue("i", -1)
        self.ready = CTX.RawArray("i", n)
        self.woke = CTX.RawArray("d", n)
        for i in range(n):
            self.ready[i] = -1


def _spin_until(cond: Callable[[], bool], timeout: float) -> bool:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.0005)
    return True


def _gate_waiter(i: int, gate: _Gate, rounds: int, block: Callable[[], None]) -> None:
    for r in range(rounds):
        if not _spin_until(lambda: gate.round.value == r, 30):
            return
        gate.ready[i] = r
        woke = block()      # a waiter may report its own wake-up time
        gate.woke[i] = woke if woke else time.monotonic()


class _PyshmlockGate:
    label = "pyshmlock resume()"

    def __init__(self) -> None:
        self.name = _name("gate")
        self.lock = RWLock(self.name)

    def arm(self) -> None:
        self.lock.pause()

    def block(self) -> None:
        self.lock.acquire_read()
        self.lock.release_read()

    def release(self, n: int) -> None:
        self.lock.resume()

    def close(self) -> None:
        self.lock.close()
        unlink(self.name, force=True)


class _PyshmlockAsyncGate(_PyshmlockGate):
    """Blocked processes are asyncio tasks parked on AsyncRWLock."""
    label = "pyshmlock asyncio task"

    def block(self) -> float:
        import asyncio
        from .aio import AsyncRWLock
        if getattr(self, "loop", None) is None:      # one loop per waiter process
            self.loop = asyncio.new_event_loop()
            self.alock = AsyncRWLock(self.name)

        async def request() -> float:
            async with self.alock.reader_lock:
                return time.monotonic()     # the task runs: that is the wake-up
        return float(self.loop.run_until_complete(request()))


class _EventGate:
    label = "multiprocessing.Event"

    def __init__(self) -> None:
        self.ev = CTX.Event()

    def arm(self) -> None:
        self.ev.clear()

    def block(self) -> None:
        self.ev.wait()

    def release(self, n: int) -> None:
        self.ev.set()

    def close(self) -> None:
        pass


class _PosixSemGate:
    label = "posix_ipc semaphore posts"

    def __init__(self) -> None:
        import posix_ipc
        self.sem = posix_ipc.Semaphore(f"/{_name('sem')}", posix_ipc.O_CREX, initial_value=0)

    def arm(self) -> None:
        pass

    def block(self) -> None:
        self.sem.acquire()

    def release(self, n: int) -> None:
        for _ in range(n):
            self.sem.release()

    def close(self) -> None:
        self.sem.unlink()


class _FutexGate:
    """The floor: a raw shared futex, store + FUTEX_WAKE all, from C."""
    label = "raw futex broadcast (floor)"

    def __init__(self) -> None:
        import mmap
        from ._floors import cffi_floor     # built for benchmarking only
        floor = cffi_floor()
        ffi, self.lib = floor.ffi, floor.lib
        self.mem = mmap.mmap(-1, 4096)      # anonymous shared: inherited by fork
        self.word = ffi.cast("uint32_t *", ffi.from_buffer(self.mem))

    def arm(self) -> None:
        self.word[0] = 0

    def block(self) -> None:
        while self.word[0] == 0:
            self.lib.floor_futex_wait(self.word, 0, -1)

    def release(self, n: int) -> None:
        self.lib.floor_futex_store_wake_all(self.word, 1)

    def close(self) -> None:
        pass


GATE_PEERS: List[Callable[[], Any]] = [_PyshmlockGate, _PyshmlockAsyncGate, _FutexGate,
                                        _EventGate, _PosixSemGate]


def pause_to_wake(counts: List[int], rounds: int) -> Dict[str, Any]:
    """Time from the release call to the last of N blocked processes running."""
    rows: Dict[str, Any] = {}
    for n in counts:
        for factory in GATE_PEERS:
            gate_impl, why = _make(factory)
            label = getattr(factory, "label", "?")
            if gate_impl is None:
                rows[f"{label} x{n}"] = {"error": why}
                continue
            g = _Gate(n)
            gate_impl.arm()
            ps = [CTX.Process(target=_gate_waiter, args=(i, g, rounds, gate_impl.block),
                              daemon=True) for i in range(n)]
            for p in ps:
                p.start()
            lat = []
            for r in range(rounds):
                gate_impl.arm()
                for i in range(n):
                    g.woke[i] = 0.0
                g.round.value = r
                if not _spin_until(lambda: all(g.ready[i] == r for i in range(n)), 30):
                    break
                time.sleep(0.02 + 0.0005 * n)    # let every waiter reach its block
                t0 = time.monotonic()
                gate_impl.release(n)
                if not _spin_until(lambda: all(g.woke[i] > 0 for i in range(n)), 30):
                    break
                lat.append(max(g.woke[i] for i in range(n)) - t0)
            gate_impl.arm()
            g.round.value = rounds        # let stragglers exit
            gate_impl.release(n)
            _join_all(ps, 10)
            gate_impl.close()
            if lat:
                rows[f"{label} x{n}"] = {"median_us": statistics.median(lat) * 1e6,
                                        "p99_us": _pct(lat, 0.99) * 1e6, "processes": n,
                                        "primitive": label, "rounds": len(lat)}
            else:
                rows[f"{label} x{n}"] = {"error": "waiters never woke"}
    return rows


# ========================================================== kill-to-recovery

def _rec_pyshmlock(held: str) -> Tuple[Callable[[], Any], Callable[[], Any], Callable[[], None]]:
    name = _name("rec")
    keep = RWLock(name)

    def hold() -> Any:
        lk = RWLock(name)
        assert (lk.acquire_write if held == "write" else lk.acquire_read)(5)
        return lk

    def wait() -> Any:
        lk = RWLock(name)
        assert (lk.acquire_read if held == "write" else lk.acquire_write)(30)
        return lk

    def cleanup() -> None:
        keep.close()
        unlink(name, force=True)
    return hold, wait, cleanup


def _rec_flock() -> Tuple[Callable[[], Any], Callable[[], Any], Callable[[], None]]:
    tmp = _TempFile()

    def lock() -> Any:
        fd = os.open(tmp.path, os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd
    return lock, lock, tmp.remove


def _rec_sysv_undo() -> Tuple[Callable[[], Any], Callable[[], Any], Callable[[], None]]:
    import sysv_ipc
    sem = sysv_ipc.Semaphore(None, sysv_ipc.IPC_CREX, initial_value=1)
    key = sem.key

    def lock() -> Any:
        s = sysv_ipc.Semaphore(key)
        s.undo = True
        s.acquire(30)
        return s
    return lock, lock, sem.remove


def _rec_fasteners() -> Tuple[Callable[[], Any], Callable[[], Any], Callable[[], None]]:
    import fasteners
    tmp = _TempFile()

    def hold() -> Any:
        lk = fasteners.InterProcessReaderWriterLock(tmp.path)
        assert lk.acquire_write_lock(timeout=5)
        return lk

    def wait() -> Any:
        lk = fasteners.InterProcessReaderWriterLock(tmp.path)
        assert lk.acquire_read_lock(timeout=30)
        return lk
    return hold, wait, tmp.remove


def _rec_filelock() -> Tuple[Callable[[], Any], Callable[[], Any], Callable[[], None]]:
    import filelock
    tmp = _TempFile()

    def lock() -> Any:
        lk = filelock.FileLock(tmp.path + ".lock")
        lk.acquire(timeout=30)
        return lk
    return lock, lock, tmp.remove


RECOVERY_PEERS: List[Tuple[str, Callable[[], Any]]] = [
    ("pyshmlock dead writer", lambda: _rec_pyshmlock("write")),
    ("pyshmlock dead reader", lambda: _rec_pyshmlock("read")),
    ("fcntl.flock", _rec_flock),
    ("sysv semaphore + SEM_UNDO", _rec_sysv_undo),
    ("fasteners", _rec_fasteners),
    ("filelock", _rec_filelock),
]


def _rec_holder(hold: Callable[[], Any], q: Any) -> None:
    keep = hold()     # noqa: F841  (a dropped lock object would release itself)
    q.put("holding")
    time.sleep(600)


def _rec_waiter(wait: Callable[[], Any], q: Any) -> None:
    q.put("waiting")
    keep = wait()     # noqa: F841
    q.put(time.monotonic())


def _recovery_round(hold: Callable[[], Any], wait: Callable[[], Any]) -> float:
    hq, wq = CTX.Queue(), CTX.Queue()
    h = CTX.Process(target=_rec_holder, args=(hold, hq), daemon=True)
    h.start()
    try:
        if hq.get(timeout=10) != "holding":
            raise RuntimeError("holder failed")
        w = CTX.Process(target=_rec_waiter, args=(wait, wq), daemon=True)
        w.start()
        try:
            if wq.get(timeout=10) != "waiting":
                raise RuntimeError("waiter failed")
            time.sleep(0.05)          # let the waiter block
            t_kill = time.monotonic()
            os.kill(h.pid, signal.SIGKILL)
            return float(wq.get(timeout=40)) - t_kill
        finally:
            _join_all([w], 5)
    finally:
        if h.is_alive():
            h.kill()
        _join_all([h], 5)


def kill_to_recovery(rounds: int) -> Dict[str, Any]:
    """Time from SIGKILL of a holder to a blocked waiter in another process
    getting the lock.  multiprocessing, posix_ipc and pthread rwlocks are not
    listed: their waiters never recover."""
    rows: Dict[str, Any] = {}
    for label, factory in RECOVERY_PEERS:
        try:
            hold, wait, cleanup = factory()
        except ImportError as e:
            rows[label] = {"error": f"not installed ({e.name})"}
            continue
        try:
            times = [_recovery_round(hold, wait) for _ in range(rounds)]
            rows[label] = {"median_us": statistics.median(times) * 1e6,
                           "max_us": max(times) * 1e6, "rounds": rounds}
        except Exception as e:
            rows[label] = {"error": repr(e)}
        finally:
            cleanup()
    return rows


# ==================================================================== report

def machine() -> str:
    """One line naming the machine the figures were measured on."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (f"{platform.machine()} {model or platform.processor()}, {os.cpu_count()} CPUs, "
            f"Linux {platform.release()}, Python {platform.python_version()}")


def run(quick: bool = False, out: Callable[[str], None] = print) -> Dict[str, Any]:
    """Run every section; return the results (also printed as they come)."""
    if quick:
        procs, seconds, starve_s, counts, rounds, rec_rounds = [1, 2, 4], 0.3, 1.0, [1, 4, 16], 7, 5
    else:
        procs, seconds, starve_s, counts, rounds, rec_rounds = [1, 2, 4, 8], 1.0, 2.0, \
            [1, 4, 16, 64], 25, 15
    res: Dict[str, Any] = {"machine": machine(), "quick": quick,
                           "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    out(f"pyshmlock bench{' --quick' if quick else ''} on {res['machine']}")
    out("  uncontended calls ...")
    res["uncontended"] = uncontended(*((7, 20000) if quick else (25, 100000)))
    out("  read throughput ...")
    res["read_throughput"] = read_throughput(procs, seconds)
    out(f"  writer starvation ({starve_s:.0f} s per lock) ...")
    res["writer_starvation"] = writer_starvation(starve_s)
    out("  pause-to-wake ...")
    res["pause_to_wake"] = pause_to_wake(counts, rounds)
    out("  kill-to-recovery ...")
    res["kill_to_recovery"] = kill_to_recovery(rec_rounds)
    return res


def format_report(res: Dict[str, Any], width: Optional[int] = None) -> str:
    """The results as one table: section, case, figure, ratio to pyshmlock."""
    rows: List[Tuple[str, str, str, str]] = []
    for key, r in res.get("uncontended", {}).items():
        if "error" in r:
            rows.append(("uncontended calls", key, r["error"], ""))
            continue
        ratio = f"{r['vs_posix_ipc']:.2f}x posix_ipc pair" if r.get("vs_posix_ipc") else "-"
        rows.append(("uncontended calls", key, f"median {r['median_ns']:.0f} ns", ratio))
    rt = res.get("read_throughput", {})
    for key, r in rt.items():
        base = rt.get(f"pyshmlock x{r['processes']}", {}).get("pairs_per_s")
        ratio = f"{base / r['pairs_per_s']:.2f}x" if base else "-"
        rows.append(("read throughput", key, f"{r['pairs_per_s'] / 1e6:.2f} M pairs/s",
                     f"pyshmlock {ratio}"))
    ws = res.get("writer_starvation", {})
    for key, r in ws.items():
        if "error" in r and "writer_acquisitions" not in r:
            rows.append(("writer starvation", key, r["error"], ""))
            continue
        fig = (f"{r['writer_acquisitions']} writer entries, wait median "
               f"{(r.get('median_wait_ms') or 0):.2f} ms, max {(r.get('max_wait_ms') or 0):.1f} ms")
        rows.append(("writer starvation", key, fig, ""))
    pw = res.get("pause_to_wake", {})
    for key, r in pw.items():
        if "error" in r:
            rows.append(("pause-to-wake", key, r["error"], ""))
            continue
        base = pw.get(f"pyshmlock resume() x{r['processes']}", {}).get("median_us")
        ratio = f"{r['median_us'] / base:.2f}x pyshmlock" if base else "-"
        rows.append(("pause-to-wake", key, f"median {r['median_us']:.0f} us, "
                     f"p99 {r['p99_us']:.0f} us", ratio))
    kr = res.get("kill_to_recovery", {})
    base = kr.get("pyshmlock dead writer", {}).get("median_us")
    for key, r in kr.items():
        if "error" in r:
            rows.append(("kill-to-recovery", key, r["error"], ""))
            continue
        ratio = f"{r['median_us'] / base:.1f}x pyshmlock writer" if base else "-"
        rows.append(("kill-to-recovery", key, f"median {r['median_us']:.0f} us, "
                     f"max {r['max_us']:.0f} us", ratio))
    from ._table import format_table
    head = ("section", "case", "figure", "ratio")
    grouped, last = [], None
    for r in rows:
        grouped.append((r[0] if r[0] != last else "",) + tuple(r[1:]))
        last = r[0]
    return format_table(head, grouped, width)


def save_chart(res: Dict[str, Any], path: str) -> bool:
    """A PNG of the pause-to-wake and recovery figures (needs matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    pw = {k: v for k, v in res.get("pause_to_wake", {}).items() if "median_us" in v}
    labels = sorted({v["primitive"] for v in pw.values()})
    counts = sorted({v["processes"] for v in pw.values()})
    for lab in labels:
        ys = [pw.get(f"{lab} x{n}", {}).get("median_us") for n in counts]
        axes[0].plot(counts, ys, marker="o", label=lab)
    axes[0].set(title="pause-to-wake, last of N (median)", xlabel="blocked processes",
                ylabel="µs", xscale="log", yscale="log")
    axes[0].legend(fontsize=7)
    ws = {k: v for k, v in res.get("writer_starvation", {}).items()
          if "writer_acquisitions" in v}
    bars = axes[1].barh(list(ws), [v["writer_acquisitions"] for v in ws.values()])
    axes[1].bar_label(bars, fontsize=8)
    axes[1].set(title="writer entries beside overlapping readers", xlabel="acquisitions")
    kr = {k: v for k, v in res.get("kill_to_recovery", {}).items() if "median_us" in v}
    bars = axes[2].barh(list(kr), [v["median_us"] / 1000 for v in kr.values()])
    axes[2].bar_label(bars, fmt="%.2f", fontsize=8)
    axes[2].set(title="kill-to-recovery (median)", xlabel="ms", xscale="log")
    fig.suptitle(res.get("machine", ""), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def main(quick: bool, json_path: Optional[str], png_path: Optional[str],
         out: Callable[[str], None] = print) -> Dict[str, Any]:
    """Run, print the table, write JSON (and PNG when asked and possible)."""
    res = run(quick, out)
    out("")
    out(format_report(res))
    if json_path:
        os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
        with open(json_path, "w") as f:
            json.dump(res, f, indent=2)
        out(f"\nresults written to {json_path}")
    if png_path:
        if save_chart(res, png_path):
            out(f"chart written to {png_path}")
        else:
            out("chart skipped: matplotlib is not installed (pip install 'pyshmlock[bench]')")
    return res
