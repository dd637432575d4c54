"""The cross-process semantics of the lock, one numbered rule at a time.
Every case has its other side in another process."""
import os
import signal
import threading
import time

import pytest
from conftest import unique_name
from helpers import reap, wait_for, wait_until_waiting
from holders import hold_until_told, timed_acquire

import pyshmlock

pytestmark = pytest.mark.timeout(60)


# ------------------------------------------------------------ helpers







def take_write(q, name, timeout, hold):
    lk = pyshmlock.RWLock(name)
    q.put("trying")
    t0 = time.monotonic()
    ok = lk.acquire_write(timeout)
    q.put((ok, time.monotonic() - t0))
    if ok:
        time.sleep(hold)
        lk.release_write()
    lk.close()


def take_update(q, name, timeout, hold):
    lk = pyshmlock.RWLock(name)
    q.put("trying")
    t0 = time.monotonic()
    ok = lk.acquire_update(timeout)
    q.put((ok, time.monotonic() - t0))
    if ok:
        time.sleep(hold)
        q.put("releasing")
        lk.release_update()
    lk.close()


def do_resume(q, name, timeout):
    lk = pyshmlock.RWLock(name)
    t0 = time.monotonic()
    ok = lk.resume(timeout)
    q.put((ok, time.monotonic() - t0))
    lk.close()


# ---------------------------------------------- 1. atomic admission, pause

def test_pause_blocks_new_readers_in_every_process(lock, lock_name, children):
    assert lock.pause() is True
    c = children(timed_acquire, lock_name, "read", 0.3)
    ok, waited = c.get()
    assert ok is False and waited >= 0.25
    assert lock.resume(1)
    c2 = children(timed_acquire, lock_name, "read", 1)
    assert c2.get()[0] is True


def test_paused_reader_is_admitted_after_resume_elsewhere(lock, lock_name, children):
    lock.pause()
    c = children(timed_acquire, lock_name, "read", 30)
    wait_until_waiting(lock, c.pid)
    assert c.q.empty(), "a reader got in while paused"
    assert lock.resume(1)
    ok, _ = c.get(timeout=30)
    assert ok


def test_pause_does_not_revoke_existing_reads(lock, lock_name, children):
    cmd = pyshmlock_queue()
    c = children(hold_until_told, lock_name, cmd)
    c.expect("reading")
    lock.pause()
    assert lock.is_locked()
    assert lock.info().readers == {c.pid: 1}
    cmd.put("go")
    c.expect("released")
    assert lock.wait_drained(2)


def test_queued_writer_blocks_new_readers(lock, lock_name, children):
    cmd = pyshmlock_queue()
    r = children(hold_until_told, lock_name, cmd)
    r.expect("reading")
    w = children(take_write, lock_name, 30, 0.0)
    w.expect("trying")
    wait_for(lambda: lock.info().writer_pid == w.pid, what="the writer's claim")
    assert not lock.acquire_read(0.1), "reader overtook a queued writer"
    cmd.put("go")
    r.expect("released")
    ok, _ = w.get(timeout=30)
    assert ok


# ------------------------------------------------------------ 2. update

def test_update_under_pause_skips_frozen_readers_and_pins_the_pause(lock, lock_name, children):
    cmd = pyshmlock_queue()
    r = children(hold_until_told, lock_name, cmd)
    r.expect("reading")
    lock.pause()
    # The reader stays frozen until told: an update that waited for it
    # would never get in (its child fails after 5 s).
    ucmd = pyshmlock_queue()
    u = children(hold_until_told, lock_name, ucmd, "update")
    u.expect("updating", timeout=30)
    res = children(do_resume, lock_name, 30)
    wait_until_waiting(lock, res.pid)
    assert lock.paused and res.q.empty(), "resume landed in the middle of an update"
    ucmd.put("go")
    u.expect("released")
    ok, _ = res.get(timeout=30)
    assert ok
    assert not lock.paused
    cmd.put("go")
    r.expect("released")


def test_unpaused_update_waits_for_readers_then_pause_lets_it_through(lock, lock_name, children):
    cmd = pyshmlock_queue()
    r = children(hold_until_told, lock_name, cmd)
    r.expect("reading")
    u = children(take_update, lock_name, 30, 0.0)
    u.expect("trying")
    wait_until_waiting(lock, u.pid)
    assert u.q.empty(), "an unpaused update did not wait for readers"
    assert not lock.acquire_read(0.05), "new reader admitted while an update waits"
    lock.pause()
    ok, _ = u.get(timeout=30)
    assert ok
    u.expect("releasing")
    assert lock.resume(2)
    cmd.put("go")
    r.expect("released")


def test_update_waits_for_a_writer(lock, lock_name, children):
    assert lock.acquire_write(1)
    lock.pause()
    u = children(take_update, lock_name, 0.3, 0.0)
    u.expect("trying")
    ok, _ = u.get()
    assert ok is False
    lock.release_write()
    u2 = children(take_update, lock_name, 2, 0.0)
    u2.expect("trying")
    assert u2.get()[0] is True
    assert lock.resume(2)


def test_resume_timeout_while_update_held(lock, lock_name, children):
    lock.pause()
    cmd = pyshmlock_queue()
    u = children(hold_until_told, lock_name, cmd, "update")
    u.expect("updating", timeout=30)
    t0 = time.monotonic()
    assert lock.resume(0.2) is False
    assert time.monotonic() - t0 >= 0.15        # a timeout never ends early
    assert lock.paused
    cmd.put("go")
    u.expect("released")
    assert lock.resume(2)


# ------------------------------------------------------------ 3. fairness

# Counted in holds, not seconds: the others keep going until the one under
# test has had its holds, however slow the machine; each of its attempts
# has a timeout far beyond a phase (a starved one fails).

def looping(q, name, kind, hold, gap, stop=None, rounds=None):
    """Take ``kind`` holds of ``hold`` s, ``gap`` s apart, until ``stop`` is
    set or ``rounds`` were had; say "started" after the first, then report
    how many were had (every attempt waits at most 30 s)."""
    lk = pyshmlock.RWLock(name)
    n = 0
    while not (stop is not None and stop.is_set()) and n != rounds:
        assert getattr(lk, f"acquire_{kind}")(30), f"a {kind} attempt starved"
        time.sleep(hold)
        getattr(lk, f"release_{kind}")()
        n += 1
        if n == 1:
            q.put("started")
        time.sleep(gap)
    q.put(n)
    lk.close()


def test_writer_not_starved_by_overlapping_readers(lock, lock_name, children):
    from conftest import FORK
    stop = FORK.Event()
    readers = [children(looping, lock_name, "read", 0.001, 0.0, stop) for _ in range(3)]
    for r in readers:
        r.expect("started", timeout=30)
    w = children(looping, lock_name, "write", 0.0, 0.002, None, 50)
    w.expect("started", timeout=60)
    assert w.get(timeout=120) == 50      # the writer got in over and over
    stop.set()
    for r in readers:
        assert r.get(timeout=30) > 10    # while the readers kept overlapping


def test_reader_not_starved_by_a_stream_of_writers(lock, lock_name, children):
    from conftest import FORK
    stop = FORK.Event()
    writers = [children(looping, lock_name, "write", 0.003, 0.0, stop) for _ in range(2)]
    for w in writers:
        w.expect("started", timeout=30)
    for _ in range(30):
        assert lock.acquire_read(30), "reader starved by writers"
        lock.release_read()
        time.sleep(0.002)
    stop.set()
    for w in writers:
        assert w.get(timeout=30) > 10    # while the writers kept coming


# ------------------------------------------------ 4. idempotent pause/resume

def pause_resume_storm(q, name, rounds):
    lk = pyshmlock.RWLock(name)
    for i in range(rounds):
        lk.pause()             # another process may resume at any moment,
        assert lk.resume(10)   # so only "every call returns" is checked
    q.put("done")
    lk.close()


def test_pause_resume_are_idempotent(lock):
    assert lock.pause() is True
    assert lock.pause() is False
    assert lock.info().paused
    assert lock.resume(0) is True
    assert lock.resume(0) is True
    assert not lock.paused


def test_concurrent_pause_resume_from_many_processes_all_return(lock, lock_name, children):
    cs = [children(pause_resume_storm, lock_name, 300) for _ in range(4)]
    for c in cs:
        c.expect("done", timeout=30)
    assert lock.resume(1)
    assert lock.acquire_read(1)
    lock.release_read()


# --------------------------------------------------- 5. opened while paused

def report_paused(q, name):
    lk = pyshmlock.RWLock(name, create=False)
    q.put((lk.paused, lk.acquire_read(0)))
    lk.close()


def test_process_opening_a_paused_lock_sees_it_paused(lock, lock_name, children):
    lock.pause()
    c = children(report_paused, lock_name)
    assert c.get() == (True, False)


# ---------------------------------------------------- 6. hold ownership

def test_any_thread_of_the_process_may_release(lock):
    assert lock.acquire_write(1)
    t = threading.Thread(target=lock.release_write)
    t.start()
    t.join(5)
    assert not lock.is_locked()
    assert lock.acquire_read(1)
    t = threading.Thread(target=lock.release_read)
    t.start()
    t.join(5)
    assert not lock.is_locked()


def test_release_without_hold_raises_and_changes_nothing(lock):
    assert lock.acquire_read(1)
    before = lock.info()
    for release in (lock.release_write, lock.release_update):
        with pytest.raises(RuntimeError):
            release()
    lock.release_read()
    with pytest.raises(RuntimeError):
        lock.release_read()
    after = lock.info()
    assert before.readers and not after.readers
    assert after.writer_pid is None and after.updater_pid is None
    assert lock.acquire_write(0)
    lock.release_write()


def release_parents_read(q, lk):
    try:
        lk.release_read()
        q.put("released")
    except RuntimeError as e:
        q.put(("refused", str(e)))
    q.put(lk.acquire_read(1))
    lk.release_read()


def test_forked_child_holds_nothing_and_cannot_release_parents_hold(lock, children):
    assert lock.acquire_read(1)
    c = children(release_parents_read, lock)
    got = c.get()
    assert got[0] == "refused"
    assert c.get() is True
    assert c.join() == 0
    assert lock.info().readers == {__import__("os").getpid(): 1}
    lock.release_read()


def test_same_thread_self_deadlock_is_an_error(lock):
    assert lock.acquire_write(1)
    with pytest.raises(pyshmlock.WouldDeadlockError):
        lock.acquire_read()
    with pytest.raises(pyshmlock.WouldDeadlockError):
        lock.acquire_write()
    lock.release_write()
    lock.pause()
    assert lock.acquire_update(1)
    with pytest.raises(pyshmlock.WouldDeadlockError):
        lock.resume()
    lock.release_update()
    assert lock.resume(1)


@pytest.mark.timeout(90)
def test_would_deadlock_names_only_the_thread_that_holds(lock):
    """Thread A takes and releases the write hold, then thread B holds it:
    A's attempt must time out, never see B's hold as its own.  (A weakly
    ordered CPU could show relaxed stores of the holder out of order; x86
    cannot, so this checks the rule itself across many hand-overs.)"""
    a_holds, b_holds, stop = threading.Event(), threading.Event(), threading.Event()
    errors = []

    def b():
        try:
            while not stop.is_set():
                if a_holds.wait(0.01):
                    continue
                if lock.acquire_write(1):
                    b_holds.set()
                    time.sleep(0.0005)
                    b_holds.clear()
                    lock.release_write()
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=b)
    t.start()
    try:
        for _ in range(300):
            assert lock.acquire_write(2)
            a_holds.set()
            with pytest.raises(pyshmlock.WouldDeadlockError):
                lock.acquire_write()         # A itself holds it: waiting forever is an error
            a_holds.clear()
            lock.release_write()
            b_holds.wait(0.05)
            lock.acquire_write(0) and lock.release_write()   # never WouldDeadlockError
    finally:
        stop.set()
        t.join(10)
    assert not errors, errors


# ------------------------------------------- 7. max_processes and unlink

def open_and_report(q, name, max_processes):
    try:
        lk = pyshmlock.RWLock(name, max_processes=max_processes)
    except pyshmlock.TooManyProcessesError:
        q.put("refused")
        return
    q.put(lk.info().max_processes)
    lk.close()


def test_max_processes_is_fixed_by_the_creator_while_it_is_in_use(lock_name, children):
    lk = pyshmlock.RWLock(lock_name, max_processes=5)
    assert children(open_and_report, lock_name, None).get() == 5     # asks nothing
    assert children(open_and_report, lock_name, 3).get() == 5        # has room
    assert children(open_and_report, lock_name, 100).get() == "refused"
    lk.close()


def attach_and_wait(q, name, cmd):
    lk = pyshmlock.RWLock(name, create=False)
    q.put("attached")
    cmd.get(timeout=20)
    # The old segment keeps working after unlink.
    assert lk.acquire_write(1)
    lk.release_write()
    q.put("still works")
    lk.close()


def test_unlink_refuses_while_others_attached_unless_forced(lock_name, children):
    lk = pyshmlock.RWLock(lock_name)
    cmd = pyshmlock_queue()
    c = children(attach_and_wait, lock_name, cmd)
    c.expect("attached")
    with pytest.raises(pyshmlock.LockInUseError):
        pyshmlock.unlink(lock_name)
    lk.pause()
    pyshmlock.unlink(lock_name, force=True)
    fresh = pyshmlock.RWLock(lock_name)
    assert not fresh.paused, "a later open must create a fresh lock"
    cmd.put("go")
    c.expect("still works")
    assert lk.paused   # the old segment is unchanged for those still attached
    fresh.close()
    lk.close()


def test_unlink_ignores_own_attachment(lock_name):
    lk = pyshmlock.RWLock(lock_name)
    pyshmlock.unlink(lock_name)
    with pytest.raises(FileNotFoundError):
        pyshmlock.RWLock(lock_name, create=False)
    lk.close()


def test_two_objects_in_one_process_share_holds(lock, lock_name):
    other = pyshmlock.RWLock(lock_name)
    assert lock.acquire_read(1)
    other.release_read()            # holds belong to the process
    assert not lock.is_locked()
    other.close()
    assert lock.acquire_write(0)    # still usable after the other closed
    lock.release_write()


def test_close_while_holding_is_refused(lock_name):
    lk = pyshmlock.RWLock(lock_name)
    assert lk.acquire_read(1)
    with pytest.raises(pyshmlock.LockInUseError):
        lk.close()
    lk.release_read()
    lk.close()
    lk.close()   # idempotent
    with pytest.raises(ValueError):
        lk.acquire_read(0)


# ------------------------------------------------------- context managers

def test_context_managers(lock, lock_name, children):
    with lock.reader_lock:
        assert lock.info().readers
    with lock.writer_lock:
        assert lock.info().writer_pid is not None
    lock.pause()
    with lock.update_lock:
        assert lock.info().updater_pid is not None
    lock.resume(1)
    assert not lock.is_locked()
    cmd = pyshmlock_queue()
    c = children(hold_until_told, lock_name, cmd, "write")
    c.expect("writing")
    with pytest.raises(TimeoutError):
        with lock.read(timeout=0.05):
            pass
    cmd.put("go")
    c.expect("released")
    with lock.read(timeout=5):
        pass
    assert not lock.is_locked()


def pyshmlock_queue():
    from conftest import FORK
    return FORK.Queue()


def open_in_child(q, name):
    lk = pyshmlock.RWLock(name)
    q.put(lk.acquire_read(1))
    lk.release_read()
    lk.close()


def test_fork_while_another_thread_holds_the_registry_lock(lock, lock_name, children):
    # The child must not inherit the lock locked: it gets a fresh one.
    from pyshmlock import _attachment
    with _attachment._registry_lock:
        c = children(open_in_child, lock_name)
    assert c.get(timeout=10) is True

def _churn(stop, errors, tag):
    """Open fresh locks (each open attaches under the core's re-attach lock),
    use and close them, until told to stop."""
    try:
        while not stop.is_set():
            n = unique_name(tag)
            lk = pyshmlock.RWLock(n)
            try:
                assert lk.acquire_read(2)
                lk.release_read()
            finally:
                lk.close()
                pyshmlock.unlink(n, force=True)
    except BaseException as e:   # reported by the test
        errors.append(e)


@pytest.mark.timeout(90)
@pytest.mark.filterwarnings("ignore::DeprecationWarning")   # fork() with threads running
@pytest.mark.needs_native_execution(
    "qemu-user's fork() beside running threads can leave the child blocked on a lock "
    "of the emulator's own (seen in the aarch64 job: the child's main thread in a "
    "futex wait on qemu's memory, not the program's)")
def test_fork_in_a_loop_while_other_threads_open_and_use_locks(lock):
    """Every fork lands at a random point of the other threads' opens; the
    child's first call re-attaches the inherited lock and must never block
    on a process-private mutex that a vanished thread held at fork()."""
    stop = threading.Event()
    errors = []
    threads = [threading.Thread(target=_churn, args=(stop, errors, f"fork{k}"))
               for k in range(2)]
    for t in threads:
        t.start()
    hung = []
    start = time.monotonic()
    try:
        for i in range(150):
            # 150 forks, or at least 30 within 45 s on a slow machine: fewer
            # chances to land in an open, never a false failure.
            if i >= 30 and time.monotonic() - start > 45:
                break
            pid = os.fork()
            if pid == 0:   # child: only the C core and os._exit, no pytest
                ok = False
                try:
                    ok = lock.acquire_read(2)
                    lock.release_read()
                    n = f"{lock.name}-c{os.getpid()}"   # a fresh open in the child too
                    lk = pyshmlock.RWLock(n)
                    lk.close()
                    pyshmlock.unlink(n, force=True)
                finally:
                    os._exit(0 if ok else 1)
            status = reap(pid, 30.0, hung)   # a blocked child never ends; a slow one does
            if status is None:
                break
            assert os.waitstatus_to_exitcode(status) == 0
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert not errors, errors
    assert not hung, "a forked child blocked forever on its first call:\n" + hung[0]



def test_a_slow_open_does_not_hold_up_opens_of_other_names(lock_name):
    # An open of a segment whose creator has not finished waits
    # (up to 2 s) for it inside the C core; that wait must not hold the
    # process-wide registry lock, or every open of every name would queue
    # behind it.
    slow = lock_name + "-slow"      # unique like lock_name
    path = os.path.join(pyshmlock.lock.SHM_DIR, pyshmlock.lock.SHM_PREFIX + slow)
    open(path, "wb").close()          # a creator that has not initialised it yet
    finished = threading.Event()
    errors = []

    def open_slow():
        try:
            pyshmlock.RWLock(slow)
        except pyshmlock.UninitializedSegmentError as e:
            errors.append(e)
        finally:
            finished.set()

    t = threading.Thread(target=open_slow, daemon=True)
    try:
        t.start()
        time.sleep(0.3)               # let it get into its wait
        assert not finished.is_set()
        with pyshmlock.RWLock(lock_name).attached() as other:
            assert other.acquire_read(0)
            other.release_read()
        assert not finished.is_set(), "the other name's open waited for the slow one"
        t.join(10)
        assert finished.is_set() and len(errors) == 1
    finally:
        os.unlink(path)


# ------------------------- scans bounded by the slots' high-water mark

def _own_slot(lk):
    return next(p.slot for p in lk.info().processes if p.is_self)


def occupy_slot(q, name, cmd):
    lk = pyshmlock.RWLock(name)
    q.put(_own_slot(lk))
    cmd.get(timeout=30)
    lk.close()
    q.put("left")


def hold_read_reporting_slot(q, name, cmd):
    lk = pyshmlock.RWLock(name)
    q.put(_own_slot(lk))
    assert lk.acquire_read(5)
    q.put("reading")
    cmd.get(timeout=30)
    lk.release_read()
    q.put("released")
    lk.close()


def test_writer_waits_for_a_reader_in_a_high_slot_after_the_others_left(
        lock, lock_name, children):
    """Exclusive acquires scan only the slots ever attached (the high-water
    mark).  A reader that attached late, in a high slot, while every process
    below it has left since, is still waited for: by a writer that attached
    before it (this process, slot 0) and by one that attached after the
    others left (a low, reused slot)."""
    occupiers = 12
    cmds = [pyshmlock_queue() for _ in range(occupiers)]
    occ = [children(occupy_slot, lock_name, c) for c in cmds]
    slots = sorted(o.get(timeout=20) for o in occ)
    rcmd = pyshmlock_queue()
    r = children(hold_read_reporting_slot, lock_name, rcmd)
    high = r.get(timeout=20)
    assert high > max(slots), (high, slots)
    r.expect("reading")
    for c, o in zip(cmds, occ):
        c.put("leave")
    for o in occ:
        o.expect("left", timeout=20)
        assert o.join(20) == 0
    # The reader is now the only other process, far above every other slot.
    assert lock.is_locked()
    assert not lock.acquire_write(0.2)
    assert not lock.acquire_update(0.2)
    w = children(take_write, lock_name, 0.3, 0)
    w.expect("trying")
    ok, _ = w.get(timeout=20)
    assert not ok                    # a late writer in a low slot waits too
    assert w.join(20) == 0
    # Bounded wake: the writer gets in once the reader leaves.
    w2 = children(take_write, lock_name, 20, 0)
    w2.expect("trying")
    rcmd.put("release")
    r.expect("released")
    ok, waited = w2.get(timeout=25)
    assert ok
    assert r.join(20) == 0 and w2.join(20) == 0
    assert lock.acquire_write(5)
    lock.release_write()


# ------------------------------------------------ epoch wrap-around

EPOCHS = 1 << 14            # width of the epoch field of the state word (layout 3)


def _queued(lk, pid):
    return lk.info().queued_readers.get(pid, 0)


def read_once(q, name):
    lk = pyshmlock.RWLock(name)
    q.put("opened")
    ok = lk.acquire_read(60)
    if ok:
        lk.release_read()
    q.put(("read", ok))
    lk.close()


@pytest.mark.timeout(90)
def test_epoch_wrap_across_one_readers_wait_does_not_deadlock(lock, lock_name, children):
    """A reader queues at epoch E, requeues under a pause behind claim E+1,
    and 2^14 exclusive phases pass while paused.  The first claim after
    resume() has epoch E+1 again and waits for that reader: the reader must
    enter, not refuse because the epoch equals its own (that would hang
    both)."""
    assert lock.acquire_write(5)                          # claim E
    c = children(read_once, lock_name)
    c.expect("opened")
    wait_for(lambda: _queued(lock, c.pid) == 1, what="reader queued at E", interval=0.002)
    lock.pause()
    lock.release_write()
    assert lock.acquire_write(5)                          # claim E+1, granted under the pause
    # the reader sees the granted claim E+1 and requeues behind it too
    wait_for(lambda: _queued(lock, c.pid) == 2, what="reader requeued behind E+1",
             interval=0.002)
    e1 = lock.info().epoch
    os.kill(c.pid, signal.SIGSTOP)      # it must not slip in while the gate opens below
    try:
        for _ in range(EPOCHS - 1):     # phases E+2 .. E+2^14, all under the pause
            lock.release_write()
            assert lock.acquire_write(5)
        assert lock.info().epoch == (e1 - 1) % EPOCHS
        lock.resume()                   # a write hold does not pin the pause
        lock.release_write()
        # The next claim has the reader's epoch again.
    finally:
        os.kill(c.pid, signal.SIGCONT)
    got = lock.acquire_write(10)
    assert got, "the claim after wrap-around waited forever for the owed reader"
    assert lock.info().epoch == e1
    lock.release_write()
    assert c.get(20) == ("read", True)
    c.join(10)
