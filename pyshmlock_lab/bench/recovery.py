"""Figure "kill-to-recovery": SIGKILL a holder; time until a blocked waiter
gets in."""
import fcntl
import os
import signal
import statistics
import time
from typing import Any, Callable, Dict, List, Tuple

from pyshmlock.lock import RWLock, unlink

from ._common import CTX, NO_WAITV_ENV, _join_all, _name, _TempFile, in_fresh_process

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
            assert h.pid is not None
            os.kill(h.pid, signal.SIGKILL)
            return float(wq.get(timeout=40)) - t_kill
        finally:
            _join_all([w], 5)
    finally:
        if h.is_alive():
            h.kill()
        _join_all([h], 5)


def kill_to_recovery(rounds: int, only: str = "") -> Dict[str, Any]:
    """Time from SIGKILL of a holder to a blocked waiter in another process
    getting the lock.  multiprocessing, posix_ipc and pthread rwlocks are not
    listed: their waiters never recover.  pyshmlock is also measured on the
    wait path of kernels before 5.16 (no futex_waitv), in a fresh process.
    ``only``: the peers whose label starts with it."""
    rows: Dict[str, Any] = {}
    for label, factory in RECOVERY_PEERS:
        if not label.startswith(only):
            continue
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
    if not only:
        slow = in_fresh_process("recovery", "kill_to_recovery", rounds, "pyshmlock",
                                env={NO_WAITV_ENV: "1"})
        for label, row in slow.items():
            rows[f"{label}, no futex_waitv"] = row
    return rows
