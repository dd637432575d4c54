"""SIGKILL a process at each interesting moment; the survivors carry on.

Bounds on kill-to-recovery time are deliberately generous (the machine is
shared); bench/ reports the real figures."""
import os
import random
import signal
import threading
import time

import pytest
from conftest import FORK, Child

import pyshmlock

# Every test here needs the kernel to mark a dead owner (robust futexes).
pytestmark = [pytest.mark.timeout(120), pytest.mark.needs_robust_futex]

RECOVERY_BOUND = 1.0   # seconds; typical recovery is well under a millisecond


def hold_and_hang(q, name, kind):
    lk = pyshmlock.RWLock(name)
    if kind == "read":
        assert lk.acquire_read(5)
    elif kind == "write":
        assert lk.acquire_write(5)
    elif kind == "update":
        lk.pause()
        assert lk.acquire_update(5)
    q.put("holding")
    time.sleep(600)


def wait_then_hang(q, name, kind):
    lk = pyshmlock.RWLock(name)
    q.put("waiting")
    if kind == "read":
        lk.acquire_read(600)
    else:
        lk.acquire_write(600)
    q.put("got it")
    time.sleep(600)


def kill_and_time(child, acquire):
    """Kill `child`, return seconds until `acquire()` (already blocked in a
    thread) succeeds."""
    done = {}

    def run():
        done["ok"] = acquire()
        done["t"] = time.monotonic()

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.2)
    assert "ok" not in done, "acquired before the holder died"
    t_kill = time.monotonic()
    os.kill(child.pid, signal.SIGKILL)
    t.join(10)
    assert done.get("ok") is True
    child.kill()
    return done["t"] - t_kill


def test_dead_reader_lets_a_waiting_writer_in(lock, lock_name, children):
    c = children(hold_and_hang, lock_name, "read")
    c.expect("holding")
    dt = kill_and_time(c, lambda: lock.acquire_write(10))
    assert dt < RECOVERY_BOUND
    info = lock.info()
    assert info.writer_pid == os.getpid()
    assert any(r.pid == c.pid and "reads" in r.lost for r in info.recoveries)
    assert not info.data_suspect, "a lost read hold does not make data suspect"
    lock.release_write()


def test_dead_writer_is_reclaimed_and_marks_data_suspect(lock, lock_name, children):
    c = children(hold_and_hang, lock_name, "write")
    c.expect("holding")
    dt = kill_and_time(c, lambda: lock.acquire_read(10))
    assert dt < RECOVERY_BOUND
    info = lock.info()
    assert info.data_suspect
    rec = [r for r in info.recoveries if r.pid == c.pid]
    assert rec and rec[0].lost == ("write",) and rec[0].when > time.time() - 60
    lock.release_read()
    assert lock.acquire_write(1)
    assert lock.info().data_suspect, "suspect until an exclusive release completes"
    lock.release_write()
    assert not lock.info().data_suspect


def test_dead_updater_under_pause_unpins_the_pause_and_fails_closed(lock, lock_name, children):
    """A waiting resume wakes when the dead updater's pin is reclaimed, and
    then refuses: the weights may be half-swapped.  A forced resume opens
    the gate and clears the mark."""
    c = children(hold_and_hang, lock_name, "update")
    c.expect("holding")
    assert lock.paused
    outcome = {}

    def resume():
        try:
            lock.resume(10)
            outcome["r"] = "resumed"
        except pyshmlock.DataSuspectError:
            outcome["r"] = "refused"
        outcome["t"] = time.monotonic()

    t = threading.Thread(target=resume)
    t.start()
    time.sleep(0.2)
    assert not outcome, "resume returned while the update held the pause"
    t_kill = time.monotonic()
    os.kill(c.pid, signal.SIGKILL)
    t.join(10)
    assert outcome.get("r") == "refused"
    assert outcome["t"] - t_kill < RECOVERY_BOUND
    assert lock.paused, "a lost update keeps the gate shut"
    info = lock.info()
    assert any(r.pid == c.pid and r.lost == ("update",) for r in info.recoveries)
    assert info.data_suspect
    assert lock.resume(1, force=True)
    assert not lock.paused and not lock.info().data_suspect


def test_pause_of_a_dead_process_stays_set(lock, lock_name, children):
    c = children(hold_and_hang, lock_name, "update")
    c.expect("holding")
    c.kill()
    info = lock.info()     # looking reclaims the dead update
    assert info.updater_pid is None
    assert lock.paused, "resuming is the operator's decision"
    with pytest.raises(pyshmlock.DataSuspectError):
        lock.resume(1)
    assert lock.resume(1, force=True)


@pytest.mark.parametrize("kind", ["read", "write"])
def test_dead_waiter_leaves_no_trace(lock, lock_name, children, kind):
    if kind == "read":
        assert lock.acquire_write(1)    # the child queues as an owed reader
    else:
        assert lock.acquire_read(1)     # the child claims and drains
    c = children(wait_then_hang, lock_name, kind)
    c.expect("waiting")
    deadline = time.monotonic() + 5
    while not lock.info().waiters.get(c.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert lock.info().waiters.get(c.pid) == 1
    t_kill = time.monotonic()
    c.kill()
    if kind == "read":
        lock.release_write()
        assert lock.acquire_write(1), "a dead owed reader must not hold a writer back"
        lock.release_write()
    else:
        # The dead writer's claim blocked new readers; they get in again.
        t = threading.Thread(target=lambda: (lock.acquire_read(5), lock.release_read()))
        t.start()
        t.join(5)
        assert time.monotonic() - t_kill < RECOVERY_BOUND + 1
        lock.release_read()
    info = lock.info()
    assert c.pid not in info.attached_pids
    assert c.pid not in info.waiters and c.pid not in info.queued_readers
    assert c.pid not in info.readers and info.writer_pid is None


def test_unlink_without_force_once_all_users_died(lock_name, children):
    cs = [children(hold_and_hang, lock_name, "read") for _ in range(3)]
    for c in cs:
        c.expect("holding")
    with pytest.raises(pyshmlock.LockInUseError):
        pyshmlock.unlink(lock_name)
    for c in cs:
        c.kill()
    pyshmlock.unlink(lock_name)


def attach_and_sleep(q, name):
    lk = pyshmlock.RWLock(name)
    assert lk.acquire_read(5)
    q.put("attached")
    time.sleep(600)


def test_slots_of_dead_processes_are_reused(lock_name):
    lk = pyshmlock.RWLock(lock_name, max_processes=8)
    for i in range(100):
        c = Child(attach_and_sleep, lock_name)
        c.expect("attached", timeout=10)
        c.kill()
    c = Child(attach_and_sleep, lock_name)
    c.expect("attached", timeout=10)
    c.kill()
    assert lk.acquire_write(2)
    lk.release_write()
    lk.close()


# ------------------------------------------------ kill at random moments

def chaos_worker(q, name, cells, index, seed):
    """Random holds; records (kind) in its own cell and checks the others.
    A cell of a process marked for a kill does not count (see `doomed`)."""
    rnd = random.Random(seed)
    lk = pyshmlock.RWLock(name)
    pid = os.getpid()
    while True:
        op = rnd.random()
        if op < 0.6:
            if lk.acquire_read(0.5):
                _enter(cells, index, pid, 1, lk, q)
                time.sleep(rnd.random() * 0.0005)
                cells[index * 2] = 0
                lk.release_read()
        elif op < 0.8:
            if lk.acquire_write(0.5):
                _enter(cells, index, pid, 2, lk, q)
                time.sleep(rnd.random() * 0.0005)
                cells[index * 2] = 0
                lk.release_write()
        elif op < 0.9:
            if lk.acquire_update(0.5):
                _enter(cells, index, pid, 3, lk, q)
                time.sleep(rnd.random() * 0.0005)
                cells[index * 2] = 0
                lk.release_update()
        elif op < 0.95:
            lk.pause()
        else:
            try:
                lk.resume(0.5)
            except pyshmlock.DataSuspectError:
                pass       # an updater was killed: shut until an update completes


# The cells array: two entries per holder cell (kind, pid), then the doomed
# list: how many pids the test has decided to kill, and those pids, each
# written before its SIGKILL is sent.
MAX_KILLS = 300
DOOMED = MAX_KILLS + 16     # the final kills of every worker too


def chaos_cells(ncells):
    return FORK.Array("q", ncells * 2 + 1 + DOOMED, lock=False)


def _ncells(cells):
    return (len(cells) - 1 - DOOMED) // 2


def doom(cells, pid):
    """Record that `pid` is about to be SIGKILLed (before the signal: a
    holder may enter beside its hold only once it is dead, so after this)."""
    base = _ncells(cells) * 2
    k = cells[base]
    cells[base + 1 + k] = pid
    cells[base] = k + 1


def _enter(cells, index, pid, kind, lk, q):
    cells[index * 2 + 1] = pid
    cells[index * 2] = kind
    for j in range(_ncells(cells)):
        if j == index:
            continue
        other = cells[j * 2]
        if not other:
            continue
        # A read and an update overlap only under a pause (readers admitted
        # before it are frozen, not drained), whichever looks first: a
        # reader admitted just before the pause may come here after the
        # update it overlaps set its cell.
        paused = lk.paused
        bad = ((kind == 2 and other) or (kind == 3 and other in (2, 3))
               or (kind == 1 and other == 2)
               or ({kind, other} == {1, 3} and not paused))
        if bad and not doomed(cells, cells[j * 2 + 1]):
            q.put(("violation", kind, other, paused))


def doomed(cells, pid):
    """A conflicting cell counts unless its process was already marked for a
    SIGKILL when we looked: a killed holder's cell stays set while its hold
    is reclaimed, and its death can take long (a sanitizer build's exit
    unmaps a vast shadow memory after the kernel has released its mutex).
    A process not yet marked is alive, so its set cell is a hold."""
    base = _ncells(cells) * 2
    return pid in cells[base + 1:base + 1 + cells[base]]


def kill_at_random(worker, lock_name, cells, nworkers, per_worker, seed, gap):
    """Run `nworkers` of `worker` and SIGKILL one at random every up to `gap`
    seconds, restarting it, for 8 s, or longer (up to 40 s) on a loaded
    machine or a sanitizer build until 100 kills have happened: the checks
    need that many to mean anything.  Each worker owns `per_worker` cells.
    Returns the number of kills and what every worker reported (violations,
    errors), the killed ones included."""
    rnd = random.Random(seed)
    workers = [Child(worker, lock_name, cells, i, i) for i in range(nworkers)]
    every = list(workers)
    kills = 0
    try:
        start = time.monotonic()
        while kills < MAX_KILLS:
            spent = time.monotonic() - start
            if spent > 40 or (spent > 8 and kills >= 100):
                break
            time.sleep(rnd.random() * gap)
            i = rnd.randrange(nworkers)
            doom(cells, workers[i].pid)
            workers[i].kill()
            kills += 1
            for c in range(i * per_worker, (i + 1) * per_worker):
                cells[c * 2] = 0
            workers[i] = Child(worker, lock_name, cells, i, 1000 + kills)
            every.append(workers[i])
    finally:
        for w in workers:
            doom(cells, w.pid)
        for w in workers:
            w.kill()
    reports = []
    for w in every:
        try:
            while not w.q.empty():
                reports.append(w.q.get(timeout=1))
        except Exception:
            pass        # a message cut by the kill
    return kills, reports


def test_random_kills_never_wedge_or_break_the_lock(lock, lock_name):
    kills, reports = kill_at_random(chaos_worker, lock_name, chaos_cells(6), 6, 1,
                                    seed=1, gap=0.01)
    assert kills >= 100
    assert reports == []
    assert lock.resume(2, force=True)   # killed updaters may have left the data suspect
    assert lock.acquire_write(1), "writer could not get in after the chaos"
    info = lock.info()
    live = {os.getpid()}
    assert set(info.readers) <= live and set(info.attached_pids) <= live
    assert info.writer_pid == os.getpid() and not info.waiters and not info.queued_readers
    lock.release_write()


# ----------------------------------- asyncio holds, killed at random moments

TASKS_PER_WORKER = 3


def async_chaos_worker(q, name, cells, index, seed):
    """chaos_worker's random holds as asyncio tasks (every path of the C
    attempt: granted at once, parked and woken, timed out, cancelled while
    parked), several tasks per process, each with its own cell."""
    import asyncio
    rnd = random.Random(seed)
    alock = pyshmlock.AsyncRWLock(name)
    lk = alock._lock
    pid = os.getpid()

    async def task(t):
        cell = index * TASKS_PER_WORKER + t
        while True:
            op = rnd.random()
            if op < 0.85:
                kind = 1 if op < 0.55 else 2 if op < 0.75 else 3
                hold = (alock.read, alock.write, alock.update)[kind - 1](rnd.random() * 0.3)
                try:
                    async with hold:
                        _enter(cells, cell, pid, kind, lk, q)
                        await asyncio.sleep(rnd.random() * 0.0005)
                        cells[cell * 2] = 0
                except TimeoutError:
                    pass
            elif op < 0.9:
                alock.pause()
            elif op < 0.95:
                try:
                    await alock.resume(0.3)
                except pyshmlock.DataSuspectError:
                    pass
            else:       # a waiter cancelled at a random moment
                w = asyncio.ensure_future(alock.acquire_write())
                await asyncio.sleep(rnd.random() * 0.005)
                w.cancel()
                try:
                    got = await w
                except asyncio.CancelledError:
                    got = False
                if got:
                    alock.release_write()
            await asyncio.sleep(0)

    async def main():
        await asyncio.gather(*(task(t) for t in range(TASKS_PER_WORKER)))
    asyncio.run(main())


def test_random_kills_of_asyncio_workers_never_wedge_or_break_the_lock(lock, lock_name):
    kills, reports = kill_at_random(async_chaos_worker, lock_name,
                                    chaos_cells(4 * TASKS_PER_WORKER), 4, TASKS_PER_WORKER,
                                    seed=2, gap=0.02)
    assert kills >= 100
    assert [r for r in reports if r[0] in ("violation", "error")] == [], reports
    assert lock.resume(2, force=True)   # killed updaters may have left the data suspect
    assert lock.acquire_write(1), "writer could not get in after the chaos"
    info = lock.info()
    live = {os.getpid()}
    assert set(info.readers) <= live and set(info.attached_pids) <= live
    assert info.writer_pid == os.getpid() and not info.waiters and not info.queued_readers
    lock.release_write()
