"""Update sessions (an update pin owned by a token, not by a process) and
the data-suspect rule: a lost update or an expired session keeps the gate
shut until a completed update, or a forced resume, says the data is good.

Every test uses real processes on a real segment; every wait is bounded."""
import asyncio
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from helpers import wait_for, wait_until_waiting
from holders import hold_until_told

import pyshmlock

pytestmark = pytest.mark.timeout(60)

FORK = mp.get_context("fork")


def begin_and_report(q, name, ttl):
    lk = pyshmlock.RWLock(name)
    q.put(("begun", lk.begin_session(ttl=ttl, timeout=10)))
    time.sleep(600)          # stays alive (or is killed) holding nothing


def end_session_of(q, name, token):
    lk = pyshmlock.RWLock(name)
    lk.end_session(token)
    q.put("ended")
    lk.close()


def resume_and_report(q, name, timeout):
    lk = pyshmlock.RWLock(name)
    q.put("resuming")
    try:
        q.put(("resumed", lk.resume(timeout)))
    except pyshmlock.DataSuspectError:
        q.put(("refused", None))
    lk.close()


def update_once(q, name):
    lk = pyshmlock.RWLock(name)
    assert lk.acquire_update(5)
    q.put("updated")
    lk.release_update()
    lk.close()


def test_a_session_begun_in_one_process_is_ended_in_another(lock, lock_name, children):
    a = children(begin_and_report, lock_name, 30.0)
    what, token = a.get()
    assert what == "begun" and lock.paused
    assert lock.session is not None and lock.session.token == token
    assert lock.session.pid == a.pid
    r = children(resume_and_report, lock_name, 20.0)
    r.expect("resuming")
    wait_until_waiting(lock, r.pid)
    assert lock.paused, "resume opened the gate inside a session"
    children(end_session_of, lock_name, token).expect("ended")
    assert r.get() == ("resumed", True)
    assert not lock.paused and lock.session is None


def test_update_calls_inside_a_session_do_not_wait_for_frozen_readers(lock, lock_name,
                                                                     children):
    cmd = FORK.Queue()
    reader = children(hold_until_told, lock_name, cmd)
    reader.expect("reading")
    lock.pause()                          # the reader is frozen, as a paused server's
    token = lock.begin_session(ttl=30, timeout=5)
    # Three update calls, each in another process: each gets in while the
    # frozen reader holds (one that waited for it would fail in 5 s).
    for _ in range(3):
        assert children(update_once, lock_name).get(timeout=30) == "updated"
    assert lock.info().readers, "the frozen reader still holds its read"
    lock.end_session(token)
    cmd.put("go")
    reader.expect("released")
    assert lock.resume(1)


def test_begin_on_a_running_lock_drains_every_reader_first(lock, lock_name, children):
    cmd = FORK.Queue()
    reader = children(hold_until_told, lock_name, cmd)
    reader.expect("reading")
    began = {}
    t = threading.Thread(target=lambda: began.setdefault("token", lock.begin_session(30, 30)))
    t.start()
    wait_until_waiting(lock, os.getpid())
    assert "token" not in began, "a session began beside a running request"
    cmd.put("go")
    reader.expect("released")
    t.join(10)
    assert began.get("token") and lock.paused
    lock.end_session(began["token"])
    assert lock.resume(1)


def test_a_second_session_waits_for_the_first_or_times_out(lock):
    token = lock.begin_session(ttl=30)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        lock.begin_session(ttl=30, timeout=0.3)
    assert time.monotonic() - t0 >= 0.29
    got = {}
    t = threading.Thread(target=lambda: got.setdefault("t", lock.begin_session(30, 30)))
    t.start()
    wait_until_waiting(lock, os.getpid())
    assert "t" not in got
    lock.end_session(token)
    t.join(10)
    assert got["t"] and got["t"] != token
    lock.end_session(got["t"])
    assert lock.resume(1)


@pytest.mark.needs_robust_futex
def test_the_beginning_process_dying_does_not_end_the_session(lock, lock_name, children):
    a = children(begin_and_report, lock_name, 30.0)
    _, token = a.get()
    os.kill(a.pid, signal.SIGKILL)
    a.kill()
    lock.info()                                   # looking reclaims the dead slot
    assert lock.session is not None and lock.session.token == token
    assert lock.resume(0.3) is False, "the session ended with its process"
    lock.end_session(token)
    assert lock.resume(1)


def test_an_expired_session_keeps_the_gate_shut_and_marks_the_data_suspect(lock):
    lock.begin_session(ttl=0.3)
    with pytest.raises(pyshmlock.DataSuspectError, match="suspect"):
        lock.resume(40)       # woken by the expiry, then refused (not False at the timeout)
    info = lock.info()
    assert info.paused and info.data_suspect and info.session is None
    assert info.session_expiries == 1
    assert info.recoveries[-1].lost == ("update session",)
    assert lock.acquire_update(1)       # a completed update rewrites the data
    lock.release_update()
    assert not lock.info().data_suspect
    assert lock.resume(1)


def test_ending_an_expired_or_unknown_session_is_an_error(lock):
    token = lock.begin_session(ttl=0.2)
    time.sleep(0.6)
    with pytest.raises(pyshmlock.SessionError, match="expired"):
        lock.end_session(token)
    with pytest.raises(pyshmlock.SessionError):
        lock.end_session(12345)
    assert lock.resume(1, force=True)


def test_an_update_call_that_outlives_its_sessions_expiry_clears_nothing(lock):
    """The session, not the call, is the unit of an update: a call granted
    inside a session that expires while the call runs leaves the data
    suspect (the model check found the race in the first design)."""
    lock.begin_session(ttl=0.3)
    assert lock.acquire_update(1)            # an update call of the session
    wait_for(lambda: lock.info().session is None, 30,      # the lease watchdog expires it
             what="the session's expiry")
    lock.release_update()
    assert lock.info().data_suspect
    with pytest.raises(pyshmlock.DataSuspectError):
        lock.resume(1)


@pytest.mark.needs_robust_futex
def test_a_completed_session_clears_an_older_mark(lock, lock_name, children):
    c = children(hold_and_die_holding_update, lock_name)
    c.expect("updating")
    c.kill()
    assert lock.info().data_suspect
    token = lock.begin_session(ttl=30)
    lock.end_session(token)
    assert not lock.info().data_suspect
    assert lock.resume(1)


def hold_and_die_holding_update(q, name):
    lk = pyshmlock.RWLock(name)
    lk.pause()
    assert lk.acquire_update(5)
    q.put("updating")
    time.sleep(600)


@pytest.mark.needs_robust_futex
def test_a_lost_update_fails_closed_until_forced(lock, lock_name, children):
    c = children(hold_and_die_holding_update, lock_name)
    c.expect("updating")
    r = children(resume_and_report, lock_name, 20.0)
    r.expect("resuming")
    time.sleep(0.2)
    os.kill(c.pid, signal.SIGKILL)
    assert r.get() == ("refused", None)
    assert lock.paused and lock.info().data_suspect
    cli = [sys.executable, "-m", "pyshmlock", "resume", lock_name, "--timeout", "2"]
    p = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "suspect" in p.stderr and "--force" in p.stderr
    p = subprocess.run(cli + ["--force"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert not lock.paused and not lock.info().data_suspect


def test_sessions_from_asyncio(lock_name):
    async def main():
        a = pyshmlock.AsyncRWLock(lock_name)
        token = await a.begin_session(ttl=30, timeout=5)
        assert a.session.token == token
        r = asyncio.ensure_future(a.resume(timeout=5))
        await asyncio.sleep(0.2)
        assert not r.done()
        async with a.update_lock:          # an update call of the session
            pass
        a.end_session(token)
        assert await r is True
        # a cancelled begin leaves no update hold and no pin behind
        t2 = await a.begin_session(ttl=30)
        waiter = asyncio.ensure_future(a.begin_session(ttl=30))
        await asyncio.sleep(0.2)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        a.end_session(t2)
        info = a.info()
        assert info.session is None and info.updater_pid is None
        assert await a.resume(1)
        a.close()

    asyncio.run(asyncio.wait_for(main(), 30))


@pytest.mark.parametrize("ttl,exc", [(0, ValueError), (-1, ValueError),
                                     (float("nan"), ValueError), ("5", TypeError),
                                     (True, TypeError), (None, TypeError)])
def test_a_bad_ttl_is_refused(lock, ttl, exc):
    with pytest.raises(exc):
        lock.begin_session(ttl=ttl)
    assert not lock.paused


def test_tokens_are_ints(lock):
    with pytest.raises(TypeError):
        lock.end_session("1")
    with pytest.raises(ValueError):
        lock.end_session(-1)


def hold_and_die(q, name, kind, pause):
    lk = pyshmlock.RWLock(name)
    if pause:
        lk.pause()
    assert getattr(lk, f"acquire_{kind}")(5)
    q.put("holding")
    time.sleep(600)


@pytest.mark.needs_robust_futex
@pytest.mark.parametrize("kind", ["write", "update"])
def test_an_exclusive_holder_dead_under_a_pause_keeps_the_gate_shut(lock, lock_name,
                                                                   children, kind):
    """Nobody probed the dead holder before resume(): resume reclaims it
    first, and then refuses (a write hold does not pin the pause, but its
    loss must not open the gate on what it half-wrote)."""
    c = children(hold_and_die, lock_name, kind, True)
    c.expect("holding")
    os.kill(c.pid, signal.SIGKILL)
    c.kill()
    with pytest.raises(pyshmlock.DataSuspectError):
        lock.resume(5)
    assert lock.paused and lock.info().data_suspect
    assert lock.resume(1, force=True)


def claim_then_wait(q, name):
    lk = pyshmlock.RWLock(name)
    q.put("claiming")
    lk.acquire_write(60)                 # waits for the parent's read, killed meanwhile


@pytest.mark.needs_robust_futex
def test_a_writer_killed_while_it_waited_for_readers_marks_nothing(lock, lock_name, children):
    """It claimed the lock but never held it: nothing was written, the loss
    is recorded as a claim and the data stays trusted."""
    assert lock.acquire_read(2)
    c = children(claim_then_wait, lock_name)
    c.expect("claiming")
    wait_for(lambda: lock.info().writer_pid == c.pid, 30, what="the writer's claim")
    assert lock.info().writer_pid == c.pid and not lock.info().exclusive_granted
    os.kill(c.pid, signal.SIGKILL)
    c.kill()
    lock.release_read()
    assert lock.acquire_read(2)          # probes and reclaims the dead claim
    lock.release_read()
    info = lock.info()
    assert info.recoveries[-1].lost == ("exclusive claim",)
    assert not info.data_suspect
    lock.pause()
    assert lock.resume(1)


def test_sessions_begun_by_many_threads_and_tasks_at_once_come_one_at_a_time(lock_name):
    """Threads and asyncio tasks all begin a session on one lock at once.
    When a session ends every waiter wakes; one pins, and each of the others,
    its update had after that pin, goes back to waiting inside the one C
    attempt (never out to Python with nothing begun).  Each gets its own
    token, no two sessions overlap, and nothing is left behind."""
    lk = pyshmlock.RWLock(lock_name)
    first = lk.begin_session(ttl=30, timeout=5)       # all of them wait behind it
    tokens, overlaps, errors = [], [], []
    inside = threading.Lock()

    def one_session(token):
        if not inside.acquire(blocking=False):
            overlaps.append(token)
            return
        tokens.append(token)
        time.sleep(0.005)
        inside.release()

    def thread_main():
        try:
            t = lk.begin_session(ttl=30, timeout=30)
            one_session(t)
            lk.end_session(t)
        except BaseException as e:       # reported below, not lost in a thread
            errors.append(e)

    async def tasks_main():
        a = pyshmlock.AsyncRWLock(lock_name)

        async def task():
            t = await a.begin_session(ttl=30, timeout=30)
            one_session(t)
            a.end_session(t)

        await asyncio.gather(*(task() for _ in range(4)))
        a.close()

    threads = [threading.Thread(target=thread_main) for _ in range(4)]

    def loop_main():
        try:
            asyncio.run(tasks_main())
        except BaseException as e:
            errors.append(e)

    threads.append(threading.Thread(target=loop_main))
    for t in threads:
        t.start()
    wait_for(lambda: sum(lk.info().waiters.values()) >= 4, 10,
             "the threads wait for the session")
    lk.end_session(first)
    for t in threads:
        t.join(40)
    assert not any(t.is_alive() for t in threads)
    assert errors == [] and overlaps == []
    assert len(tokens) == 8 and len(set(tokens)) == 8 and first not in tokens
    info = lk.info()
    assert info.session is None and info.updater_pid is None and not info.waiters
    assert lk.resume(5)
    lk.close()
