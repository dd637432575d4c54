"""The fast calls across fork() and the DRAINERS bit armed only to sleep.

fork(): the child of a process whose other threads were mid-call (a blocked
exclusive attempt with its claim up, a thread hammering the fast read and
exclusive calls) uses the RWLock objects it inherited: it holds nothing of
its parent's, takes a slot of its own, and can hold and close.

DRAINERS: readers of many processes leave while writers (blocking, timed,
and updates with pause()) claim, scan, arm and sleep; every writer must
finish all its rounds, every exclusive hold must be alone (checked in
hold-protected shared memory), and afterwards the bit is clear and the lock
whole."""
import os
import threading
import time

import pytest
from conftest import FORK, unique_name
from helpers import remove_lock
from holders import hold_until_told

import pyshmlock

pytestmark = pytest.mark.timeout(120)

STATE_OFF = 64
DRAINERS = 0x10000


def _state(name):
    with open(f"/dev/shm/pyshmlock.{name}", "rb") as f:
        f.seek(STATE_OFF)
        return int.from_bytes(f.read(4), "little")


def _wait_child(pid, timeout=60):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError(f"forked child {pid} hung")


def test_fork_while_other_threads_are_mid_call(lock_name, children):
    other = unique_name("fork2")
    cmd = FORK.Queue()
    reader = children(hold_until_told, lock_name, cmd, "read")
    reader.expect("reading")
    x = pyshmlock.RWLock(lock_name)
    y = pyshmlock.RWLock(other)
    stop = threading.Event()
    errors = []
    got_write = []

    def blocked_writer():
        got_write.append(x.acquire_write(60))     # waits for the reader process
        x.release_write()

    def hammer():
        try:
            n = 0
            while not stop.is_set():
                kind = ("read", "write", "update")[n % 3]
                n += 1
                if getattr(y, f"acquire_{kind}")(None if n % 2 else 0):
                    getattr(y, f"release_{kind}")()
        except BaseException as e:
            errors.append(repr(e))

    tw = threading.Thread(target=blocked_writer)
    th = threading.Thread(target=hammer)
    tw.start()
    th.start()
    try:
        # The writer's claim is up and it sleeps: DRAINERS armed.
        end = time.monotonic() + 30
        while not _state(lock_name) & DRAINERS:
            assert time.monotonic() < end, "the writer never slept"
            time.sleep(0.005)
        for _ in range(8):
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    # The parent's claim on x is the parent's: not granted
                    # to us, and not ours to release.
                    assert x.acquire_read(0) is False
                    assert x.acquire_write(0) is False
                    with pytest.raises(RuntimeError):
                        x.release_write()
                    # y: the parent's hammering thread's holds are not ours.
                    for kind in ("write", "read", "update"):
                        assert getattr(y, f"acquire_{kind}")(30), kind
                        getattr(y, f"release_{kind}")()
                    y.close()
                    x.close()
                    code = 0
                finally:
                    os._exit(code)
            assert _wait_child(pid) == 0
    finally:
        stop.set()
        th.join(60)
        cmd.put("go")
        reader.expect("released")
        tw.join(60)
    assert got_write == [True]
    assert not errors, errors
    assert reader.join() == 0
    x.close()
    y.close()
    remove_lock(other)
    f = pyshmlock.RWLock(lock_name)
    assert f.acquire_write(5)
    f.release_write()
    f.close()


INSIDE, VIOL, STOP, READER_BESIDE = range(4)


def _flicker_reader(q, name, shared, seed):
    """Take and drop read holds as fast as possible (short, often
    overlapping holds of several threads), so a leaving reader meets a
    writer's scan and DRAINERS arm often."""
    lk = pyshmlock.RWLock(name)
    q.put("started")

    def run():
        n = 0
        while not shared[STOP]:
            if lk.acquire_read(0.2):
                if shared[INSIDE]:
                    shared[READER_BESIDE] += 1
                n += 1
                if n % 7 == 0:
                    time.sleep(0)   # a longer hold now and then: writers sleep
                lk.release_read()

    ts = [threading.Thread(target=run) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    lk.close()
    q.put("done")


def _drainer(q, name, shared, rounds, mode):
    lk = pyshmlock.RWLock(name)
    q.put("started")
    me = os.getpid()
    done = 0
    while done < rounds:
        if mode == "write":
            ok = lk.acquire_write()
            kind = "write"
        elif mode == "timed":
            ok = lk.acquire_write(int("2") if done % 2 else 0.5)
            kind = "write"
        else:   # an update under a pause: readers are frozen out by the gate
            lk.pause()
            ok = lk.acquire_update(None)
            kind = "update"
        if ok:
            if shared[INSIDE]:
                shared[VIOL] += 1
            shared[INSIDE] = me
            if shared[INSIDE] != me:
                shared[VIOL] += 1
            shared[INSIDE] = 0
            getattr(lk, f"release_{kind}")()
            done += 1
        if mode == "update":
            assert lk.resume(30)
    lk.close()
    q.put(("done", done))


@pytest.mark.parametrize("mode", ["write", "timed", "update"])
def test_readers_leaving_as_writers_arm_drainers(lock, lock_name, children, mode):
    shared = FORK.Array("q", 4, lock=False)
    readers = [children(_flicker_reader, lock_name, shared, i) for i in range(3)]
    for r in readers:
        r.expect("started")
    writers = [children(_drainer, lock_name, shared, 500, mode) for _ in range(2)]
    for w in writers:
        w.expect("started")
    try:
        for w in writers:
            # A lost wake-up with no safety net would hang here.
            assert w.get(90) == ("done", 500)
            assert w.join(30) == 0
    finally:
        shared[STOP] = 1
    for r in readers:
        r.expect("done")
        assert r.join(30) == 0
    assert shared[VIOL] == 0            # exclusive holds alone among themselves
    if mode != "update":
        # (an update under a pause runs beside readers admitted before it)
        assert shared[READER_BESIDE] == 0
    assert not _state(lock_name) & DRAINERS, hex(_state(lock_name))
    assert lock.acquire_write(5)
    lock.release_write()
    info = lock.info()
    assert not info.readers and not info.waiters and not info.queued_readers, info
