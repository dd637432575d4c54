"""Kill-to-recovery: how long after SIGKILL of a holder does a blocked waiter
in another process get the lock?  pyshmlock next to the peers that recover
at all (multiprocessing, posix_ipc and pthread rwlocks never do).

    python bench/recovery.py [--rounds N] [--json PATH]

Each round: a holder process takes the lock and reports; a waiter process
blocks on it; the parent SIGKILLs the holder and the waiter reports when it
got in.  Both times are CLOCK_MONOTONIC, which every process shares.  The
table gives median and max over the rounds, and each peer's median as a
ratio to pyshmlock's dead-writer median.
"""
import argparse
import fcntl
import json
import multiprocessing as mp
import os
import signal
import statistics
import tempfile
import time
import uuid

CTX = mp.get_context("fork")


# ------------------------------------------------------------ primitives
# Each returns (hold, wait): hold() takes the lock in the holder process,
# wait() blocks in the waiter process until it has the lock.

def pyshmlock_case(held_kind):
    import pyshmlock
    name = f"bench-rec-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    pyshmlock.RWLock(name)    # keep the segment alive for the run

    def hold():
        lk = pyshmlock.RWLock(name)
        assert (lk.acquire_write if held_kind == "write" else lk.acquire_read)(5)
        return lk

    def wait():
        lk = pyshmlock.RWLock(name)
        assert (lk.acquire_read if held_kind == "write" else lk.acquire_write)(30)

    def cleanup():
        pyshmlock.unlink(name, force=True)
    return hold, wait, cleanup


def flock_case():
    path = tempfile.mktemp(prefix="bench-flock-")
    open(path, "w").close()

    def hold():
        fd = os.open(path, os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd

    def wait():
        fd = os.open(path, os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
    return hold, wait, lambda: os.unlink(path)


def sysv_undo_case():
    import sysv_ipc
    sem = sysv_ipc.Semaphore(None, sysv_ipc.IPC_CREX, initial_value=1)
    key = sem.key

    def hold():
        s = sysv_ipc.Semaphore(key)
        s.undo = True
        s.acquire()
        return s

    def wait():
        s = sysv_ipc.Semaphore(key)
        s.undo = True
        s.acquire(30)
    return hold, wait, sem.remove


def fasteners_case():
    import fasteners
    path = tempfile.mktemp(prefix="bench-fasteners-")

    def hold():
        lk = fasteners.InterProcessReaderWriterLock(path)
        assert lk.acquire_write_lock(timeout=5)
        return lk

    def wait():
        lk = fasteners.InterProcessReaderWriterLock(path)
        assert lk.acquire_read_lock(timeout=30)
    return hold, wait, lambda: os.path.exists(path) and os.unlink(path)


def filelock_case():
    import filelock
    path = tempfile.mktemp(prefix="bench-filelock-")

    def hold():
        lk = filelock.FileLock(path)
        lk.acquire(timeout=5)
        return lk

    def wait():
        filelock.FileLock(path).acquire(timeout=30)
    return hold, wait, lambda: os.path.exists(path) and os.unlink(path)


CASES = [
    ("pyshmlock dead writer", lambda: pyshmlock_case("write")),
    ("pyshmlock dead reader", lambda: pyshmlock_case("read")),
    ("fcntl.flock", flock_case),
    ("sysv semaphore + SEM_UNDO", sysv_undo_case),
    ("fasteners RW lock", fasteners_case),
    ("filelock.FileLock", filelock_case),
]


# ---------------------------------------------------------------- rounds

def _holder(hold, q):
    keep = hold()     # noqa: F841  (a dropped lock object would release itself)
    q.put("holding")
    time.sleep(600)


def _waiter(wait, q):
    q.put("waiting")
    wait()
    q.put(time.monotonic())


def one_round(hold, wait):
    q = CTX.Queue()
    h = CTX.Process(target=_holder, args=(hold, q), daemon=True)
    h.start()
    assert q.get(timeout=10) == "holding"
    wq = CTX.Queue()
    w = CTX.Process(target=_waiter, args=(wait, wq), daemon=True)
    w.start()
    assert wq.get(timeout=10) == "waiting"
    time.sleep(0.05)          # let the waiter block
    t_kill = time.monotonic()
    os.kill(h.pid, signal.SIGKILL)
    t_got = wq.get(timeout=40)
    h.join(5)
    w.join(5)
    return t_got - t_kill


def run(rounds):
    results = {}
    for label, make in CASES:
        try:
            hold, wait, cleanup = make()
        except ImportError as e:
            results[label] = {"error": f"not installed: {e.name}"}
            continue
        try:
            times = [one_round(hold, wait) for _ in range(rounds)]
            results[label] = {"median_us": statistics.median(times) * 1e6,
                              "max_us": max(times) * 1e6, "rounds": rounds}
        except Exception as e:   # a peer that never recovers shows as an error row
            results[label] = {"error": repr(e)}
        finally:
            cleanup()
    return results


def format_table(results):
    base = results.get("pyshmlock dead writer", {}).get("median_us")
    lines = [f"{'primitive':28} {'median':>10} {'max':>10}  {'vs pyshmlock writer':>20}"]
    for label, r in results.items():
        if "error" in r:
            lines.append(f"{label:28} {r['error']}")
            continue
        ratio = f"{r['median_us'] / base:.1f}x" if base else "-"
        lines.append(f"{label:28} {r['median_us']:>8.0f}us {r['max_us']:>8.0f}us  {ratio:>20}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json", default=os.path.join(os.path.dirname(__file__), "results",
                                                   "recovery.json"))
    args = ap.parse_args()
    results = run(args.rounds)
    print(f"kill-to-recovery, {args.rounds} rounds each, {os.cpu_count()} CPUs\n")
    print(format_table(results))
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
