"""The host lease (layout 2): a lock whose lease deadline passes pauses on its
own, through the lease watchdog of every attached process, without the help
of the process that armed it: a host fails closed on its own."""
import os
import signal
import time

import pytest

import pyshmlock
from pyshmlock.cluster._lease import lease_arm, lease_disarm, lease_info


def _agent(q, name, ttl, period):
    lk = pyshmlock.RWLock(name)
    lease_arm(lk, ttl)
    q.put("armed")
    while True:
        time.sleep(period)
        lease_arm(lk, ttl)


def _wait_paused(lk, limit):
    t0 = time.monotonic()
    while not lk.paused:
        assert time.monotonic() - t0 < limit, f"not paused {limit} s after the lease was lost"
        time.sleep(0.005)
    return time.monotonic() - t0


def test_renewed_lease_keeps_gate_open(lock, lock_name, children):
    # A ttl 20 renewal periods long: a loaded machine may not run the agent
    # for a few hundred ms, and that is a lost lease, not what is tested.
    a = children(_agent, lock_name, 1.0, 0.05)
    a.expect("armed")
    time.sleep(2.2)                              # more than two TTLs, renewed
    assert not lock.paused
    assert lock.acquire_read(timeout=1)
    lock.release_read()
    assert lease_info(lock)["expiries"] == 0


@pytest.mark.parametrize("how", ["kill", "stop", "starved"])
def test_agent_lost_pauses_within_ttl(lock, lock_name, children, how):
    ttl = 0.3
    a = children(_agent, lock_name, ttl, 0.05)
    a.expect("armed")
    time.sleep(0.1)
    if how == "starved":
        # What a loaded machine does: the agent does not run (no renewal)
        # for a while before it is lost.
        os.kill(a.pid, signal.SIGSTOP)
        time.sleep(0.15)
    os.kill(a.pid, signal.SIGSTOP if how == "stop" else signal.SIGKILL)
    try:
        # The deadline is final now (a renewal racing the signal only makes
        # it later): read it, rather than assume when the agent last ran.
        t0 = time.monotonic()
        left = lease_info(lock)["remaining"]
        # Paused by the watchdog, however late a loaded machine runs it; how
        # soon after the deadline is the benchmarks' business.
        _wait_paused(lock, ttl + 10)
        if left is not None and left > 0:
            assert time.monotonic() - t0 >= left   # not before the lease ran out
        assert not lock.acquire_read(timeout=0.1)
        assert lease_info(lock)["expiries"] == 1
    finally:
        if how == "stop":
            os.kill(a.pid, signal.SIGCONT)


def _arm_expired_and_exit(q, name):
    lk = pyshmlock.RWLock(name)
    lease_arm(lk, 0.05)
    lk.close()
    q.put("done")


def test_open_after_expiry_is_paused_at_once(lock_name, children):
    c = children(_arm_expired_and_exit, lock_name)
    c.expect("done")
    c.join()
    time.sleep(0.1)                              # lease passed, nobody attached
    lk = pyshmlock.RWLock(lock_name, create=False)
    try:
        assert lk.paused                         # before any watchdog poll could run
        assert not lk.acquire_read(timeout=0)
    finally:
        lk.close()


def test_disarmed_lease_never_pauses(lock):
    lease_arm(lock, 0.05)
    lease_disarm(lock)
    time.sleep(0.2)
    assert not lock.paused
    assert lease_info(lock)["armed"] is False


def test_unarmed_lock_unchanged(lock):
    assert lease_info(lock) == {"armed": False, "remaining": None, "pid": None, "expiries": 0}
    time.sleep(0.3)
    assert not lock.paused


def _pause_arm_and_die(q, name, seconds):
    lk = pyshmlock.RWLock(name, stale="keep")
    assert lk.pause()
    lease_arm(lk, seconds)
    q.put("armed")
    q.close()
    q.join_thread()                              # flushed before we die
    os.kill(os.getpid(), signal.SIGKILL)         # the whole host dies: no cleanup


@pytest.mark.parametrize("seconds", [60.0, 0.0], ids=["armed", "passed"])
def test_stale_reset_never_clears_a_leased_pause(lock_name, children, seconds):
    """A restarted host stays fail-closed until its agent mirrors the cluster:
    the stale-segment reset (the default stale="reset" of a worker that opens
    first) must not clear a pause while the segment's host lease is armed,
    whether or not the deadline has passed, though the pauser is dead and
    nobody else is attached."""
    c = children(_pause_arm_and_die, lock_name, seconds)
    c.expect("armed")
    c.join()
    lk = pyshmlock.RWLock(lock_name, create=False)   # stale="reset", the default
    try:
        assert lk.paused
        assert not lk.acquire_read(timeout=0)
        assert not any("pause" in r.lost for r in lk.info().recoveries)
        # Once the agent disarms the lease (leaving cluster mode), the
        # ordinary stale rule applies again to a later opener.
        lease_disarm(lk)
    finally:
        lk.close()
    lk = pyshmlock.RWLock(lock_name, create=False)
    try:
        assert not lk.paused
    finally:
        lk.close()
