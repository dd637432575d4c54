"""Figure "pause-to-wake": N processes blocked at a gate; time from the release
call to the last one running."""
import os
import statistics
import time
from functools import partial
from typing import Any, Callable, Dict, List, Optional

from pyshmlock.lock import RWLock, unlink

from ._common import CTX, NO_WAITV_ENV, _join_all, _make, _name, _pct, in_fresh_process

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


def _round_is(gate: "_Gate", r: int) -> bool:
    return bool(gate.round.value == r)


def _all_ready(g: "_Gate", r: int, n: int) -> bool:
    return all(g.ready[i] == r for i in range(n))


def _all_woke(g: "_Gate", n: int) -> bool:
    return all(g.woke[i] > 0 for i in range(n))


def _gate_waiter(i: int, gate: _Gate, rounds: int,
                 block: Callable[[], Optional[float]]) -> None:
    for r in range(rounds):
        if not _spin_until(partial(_round_is, gate, r), 30):
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

    def block(self) -> Optional[float]:
        self.lock.acquire_read()
        self.lock.release_read()
        return None     # the harness stamps the wake-up itself

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

        from pyshmlock.aio import AsyncRWLock
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

    def block(self) -> Optional[float]:
        self.ev.wait()
        return None     # the harness stamps the wake-up itself

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

    def block(self) -> Optional[float]:
        self.sem.acquire()
        return None     # the harness stamps the wake-up itself

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

        from .floors import cffi_floor  # built for benchmarking only
        floor = cffi_floor()
        ffi, self.lib = floor.ffi, floor.lib
        self.mem = mmap.mmap(-1, 4096)      # anonymous shared: inherited by fork
        self.word = ffi.cast("uint32_t *", ffi.from_buffer(self.mem))

    def arm(self) -> None:
        self.word[0] = 0

    def block(self) -> Optional[float]:
        while self.word[0] == 0:
            self.lib.floor_futex_wait(self.word, 0, -1)
        return None     # the harness stamps the wake-up itself

    def release(self, n: int) -> None:
        self.lib.floor_futex_store_wake_all(self.word, 1)

    def close(self) -> None:
        pass


class _AsyncioEventfdGate:
    """The asyncio floor: no lock and no helper thread.  The controller
    writes one eventfd that every waiter's loop watches (one write wakes
    every epoll, as one FUTEX_WAKE wakes every sleeper); the loop's reader
    callback completes a future and the awaiting task runs.  Each waiter runs
    its task exactly as _PyshmlockAsyncGate does (one loop per process,
    run_until_complete per round), so the difference between the two rows is
    pyshmlock's own part of an asyncio wake-up: the futex, the watcher
    thread's hand-off and the retry."""
    label = "asyncio eventfd wake (floor)"

    def __init__(self) -> None:
        if not hasattr(os, "eventfd"):
            raise ImportError("os.eventfd needs Python 3.10", name="os.eventfd")
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)    # inherited by fork

    def arm(self) -> None:
        try:
            os.eventfd_read(self.fd)    # not readable until the next release
        except BlockingIOError:
            pass

    def block(self) -> float:
        import asyncio
        if getattr(self, "loop", None) is None:      # one loop per waiter process
            self.loop = asyncio.new_event_loop()
        loop = self.loop

        async def request() -> float:
            fut = loop.create_future()

            def on_readable() -> None:
                loop.remove_reader(self.fd)     # level-triggered: watch no more
                if not fut.done():
                    fut.set_result(None)
            loop.add_reader(self.fd, on_readable)
            try:
                await fut
            finally:
                loop.remove_reader(self.fd)
            return time.monotonic()     # the task runs: that is the wake-up
        return float(loop.run_until_complete(request()))

    def release(self, n: int) -> None:
        os.eventfd_write(self.fd, 1)

    def close(self) -> None:
        os.close(self.fd)


GATE_PEERS: List[Callable[[], Any]] = [_PyshmlockGate, _PyshmlockAsyncGate, _FutexGate,
                                        _EventGate, _PosixSemGate, _AsyncioEventfdGate]


def pause_to_wake(counts: List[int], rounds: int, only: str = "") -> Dict[str, Any]:
    """Time from the release call to the last of N blocked processes running.
    pyshmlock's resume() is also measured on the wait path of kernels before
    5.16 (no futex_waitv), in a fresh process.  ``only``: the peers whose
    label starts with it."""
    rows: Dict[str, Any] = {}
    for n in counts:
        for factory in GATE_PEERS:
            label = getattr(factory, "label", "?")
            if not label.startswith(only):
                continue          # (before _make: a gate made is a gate to close)
            gate_impl, why = _make(factory)
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
                if not _spin_until(partial(_all_ready, g, r, n), 30):
                    break
                time.sleep(0.02 + 0.0005 * n)    # let every waiter reach its block
                t0 = time.monotonic()
                gate_impl.release(n)
                if not _spin_until(partial(_all_woke, g, n), 30):
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
    if not only:
        slow = in_fresh_process("wake", "pause_to_wake", counts, rounds, "pyshmlock resume",
                                env={NO_WAITV_ENV: "1"})
        for label, row in slow.items():
            rows[f"{label}, no futex_waitv"] = row
    return rows
