"""A stale segment after every process died (reset on the next open, or
kept by policy; never while a live process pins the pause), and
observation that attaches nothing.  Real processes, real segments."""
import os
import time

import pytest
from conftest import unique_name
from helpers import remove_lock, run_python

import pyshmlock

pytestmark = pytest.mark.timeout(60)


def _py(code, *args, timeout=20, user=None):
    """Run code in a fresh interpreter (a process that never opened the lock)."""
    return run_python("-c", code, *args, timeout=timeout, user=user)


PAUSE_AND_EXIT = """
import sys, pyshmlock
lk = pyshmlock.RWLock(sys.argv[1])
assert lk.pause()
print(__import__('os').getpid())
"""   # exits with the pause still on (and its slot released on exit)

PAUSE_AND_CRASH = """
import os, sys, pyshmlock
lk = pyshmlock.RWLock(sys.argv[1])
assert lk.pause()
print(os.getpid(), flush=True)
os.kill(os.getpid(), 9)
"""


@pytest.fixture
def stale_name():
    name = unique_name("stale")
    yield name
    remove_lock(name)


@pytest.mark.parametrize("script", [PAUSE_AND_EXIT, PAUSE_AND_CRASH], ids=["exit", "kill"])
def test_restarted_server_is_not_paused_by_a_dead_process(stale_name, script):
    p = _py(script, stale_name)
    assert p.stdout.strip(), p.stderr
    dead = int(p.stdout.split()[0])
    # What a restarted server does: open by the same name, serve a request.
    lk = pyshmlock.RWLock(stale_name)
    try:
        assert not lk.paused
        assert lk.acquire_read(timeout=1), "a stale pause hangs the restarted server"
        lk.release_read()
        info = lk.info()
        assert any(r.pid == dead and "pause" in r.lost for r in info.recoveries), info
    finally:
        lk.close()


def test_keep_policy_keeps_a_stale_pause(stale_name):
    p = _py(PAUSE_AND_EXIT, stale_name)
    assert p.returncode == 0, p.stderr
    lk = pyshmlock.RWLock(stale_name, stale="keep")
    try:
        assert lk.paused
        assert not lk.acquire_read(timeout=0)
        info = lk.info()
        assert info.paused_by_pid == int(p.stdout) and info.paused_by_alive is False
    finally:
        lk.close()
    # The default then resets it (nobody else is attached).
    lk = pyshmlock.RWLock(stale_name)
    try:
        assert not lk.paused
    finally:
        lk.close()


def test_live_pauser_is_never_reset(lock_name, children):
    def pauser(q, name):
        lk = pyshmlock.RWLock(name)
        lk.pause()
        q.put("paused")
        time.sleep(30)

    c = children(pauser, lock_name)
    c.expect("paused")
    # A fresh process with the default policy: someone is alive, nothing reset.
    p = _py("import sys, pyshmlock; print(pyshmlock.RWLock(sys.argv[1]).paused)", lock_name)
    assert p.stdout.strip() == "True", p.stderr
    info = pyshmlock.inspect(lock_name)
    assert info.paused and info.paused_by_pid == c.pid and info.paused_by_alive is True


def test_bad_stale_policy(lock_name):
    with pytest.raises(ValueError, match="stale"):
        pyshmlock.RWLock(lock_name, stale="maybe")
    with pytest.raises(TypeError, match="stale"):
        pyshmlock.AsyncRWLock(lock_name, stale=None)



def _pause_and_exit(q, name):
    lk = pyshmlock.RWLock(name, stale="keep")
    lk.pause()
    q.put(os.getpid())


def test_stale_reset_keeps_a_pause_pinned_by_this_process_update(lock_name, children):
    # Invariant 4 (docs/DESIGN.md): an update claim pins the pause.  The stale
    # reset probes every slot but its own, so an update of this very process
    # (another thread's, or this thread's) must stop it too.
    from pyshmlock._shmlock import lib
    lock = pyshmlock.RWLock(lock_name)
    c = children(_pause_and_exit, lock_name)
    pauser = c.get()
    assert c.join() == 0
    assert lock.paused
    assert lock.acquire_update(timeout=5)     # granted at once: the pause froze readers
    try:
        rc = lib.shl_reset_stale(lock._h, pauser)
        assert rc == 0, "the reset cleared a pause that this process's update pins"
        assert lock.paused
    finally:
        lock.release_update()
    assert lib.shl_reset_stale(lock._h, pauser) == 1   # now it is stale: cleared
    assert not lock.paused
    lock.close()


# ------------------------------------------------------------ observation

def test_inspect_attaches_nothing(lock, lock_name):
    assert lock.acquire_read(1)
    try:
        info = pyshmlock.inspect(lock_name)
        assert isinstance(info, pyshmlock.LockInfo)
        assert info.readers == {os.getpid(): 1}
        assert info.attached_pids == [os.getpid()]
        # From a process of its own: it must not list itself.
        p = _py("import sys, os, pyshmlock\ni = pyshmlock.inspect(sys.argv[1])\n"
                "print(os.getpid() in i.attached_pids, i.attached_pids)", lock_name)
        assert p.stdout.startswith("False"), p.stdout + p.stderr
        assert RWLockObserve(lock_name).readers == {os.getpid(): 1}
    finally:
        lock.release_read()


def RWLockObserve(name):
    return pyshmlock.RWLock.observe(name)


def test_inspect_works_when_every_slot_is_taken(lock_name):
    lk = pyshmlock.RWLock(lock_name, max_processes=1)
    try:
        lk.pause()
        p = _py("import sys, pyshmlock\ni = pyshmlock.inspect(sys.argv[1])\n"
                "print(i.paused, i.attached_pids)", lock_name)
        assert p.returncode == 0, p.stderr
        assert p.stdout.split()[0] == "True"
    finally:
        lk.close()


def test_inspect_needs_only_read_permission(lock_name):
    if os.geteuid() != 0:
        pytest.skip("needs root to run a process as another user")
    lk = pyshmlock.RWLock(lock_name, mode=0o644)
    try:
        lk.pause()
        p = _py("import sys, pyshmlock\ni = pyshmlock.inspect(sys.argv[1])\nprint(i.paused)",
                lock_name, user=65534)
        assert p.returncode == 0 and p.stdout.strip() == "True", p.stderr
        # And with no read permission at all, a clear PermissionError.
        os.chmod(os.path.join("/dev/shm", "pyshmlock." + lock_name), 0o600)
        p = _py("import sys, pyshmlock\ntry:\n pyshmlock.inspect(sys.argv[1])\n"
                "except PermissionError: print('denied')", lock_name, user=65534)
        assert p.stdout.strip() == "denied", p.stderr
    finally:
        lk.close()


def test_inspect_reports_a_dead_holder_without_reclaiming(stale_name):
    code = ("import os, sys, pyshmlock\nlk = pyshmlock.RWLock(sys.argv[1])\n"
            "lk.acquire_read()\nprint(os.getpid(), flush=True)\nos.kill(os.getpid(), 9)")
    p = _py(code, stale_name)
    dead = int(p.stdout.split()[0])
    info = pyshmlock.inspect(stale_name)
    assert info.attached_pids == [] and info.dead_pids == [dead]
    assert info.readers == {dead: 1}          # still counted until an attached process reclaims
    assert info.stale
    lk = pyshmlock.RWLock(stale_name)           # an opener reclaims it
    try:
        assert lk.info().readers == {}
        assert not pyshmlock.inspect(stale_name).stale
    finally:
        lk.close()


def test_inspect_missing_and_foreign(lock_name):
    with pytest.raises(FileNotFoundError):
        pyshmlock.inspect(lock_name)
    path = os.path.join("/dev/shm", "pyshmlock." + lock_name)
    with open(path, "wb"):
        pass                                    # zero length: a creator that never finished
    t0 = time.monotonic()
    with pytest.raises(pyshmlock.UninitializedSegmentError):
        pyshmlock.inspect(lock_name)
    assert time.monotonic() - t0 < 2.0      # a stall: the 2 s wait for a creator
    with open(path, "wb") as f:
        f.write(b"x" * 4096)
    with pytest.raises(pyshmlock.ForeignSegmentError):
        pyshmlock.inspect(lock_name)


def _pause_and_die(q, name):
    lk = pyshmlock.RWLock(name)
    lk.pause()
    q.put("paused")
    q.close()
    q.join_thread()                  # flushed before the abrupt exit
    os._exit(0)                      # no close: a death, as far as the lock can tell


def _reset_opener(q, name, go):
    go.wait(10)
    lk = pyshmlock.RWLock(name)      # stale="reset"
    q.put("opened")
    time.sleep(0.5)                  # stay attached while the others race
    lk.close()


def _keep_pauser(q, name, go):
    go.wait(10)
    lk = pyshmlock.RWLock(name, stale="keep")
    mine = lk.pause()
    q.put(("pause", mine))
    time.sleep(0.5)
    q.put(("paused", lk.paused))
    lk.close()


def test_reset_never_wipes_a_fresh_pause_of_a_concurrent_opener(stale_name, children):
    """Openers that reset race an opener that pauses: a pause() that returned
    True in a live process is never cleared."""
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    fresh = 0
    for _ in range(15):
        c = children(_pause_and_die, stale_name)
        c.expect("paused")
        c.join()
        go = ctx.Event()
        racers = [children(_reset_opener, stale_name, go) for _ in range(3)]
        keeper = children(_keep_pauser, stale_name, go)
        go.set()
        for r in racers:
            r.expect("opened")
        kind, mine = keeper.get()
        assert kind == "pause"
        kind, still = keeper.get()
        if mine:
            fresh += 1
            assert still, "a fresh pause of a live process was wiped by a stale reset"
        for p in racers + [keeper]:
            p.join()
        pyshmlock.unlink(stale_name, force=True)
    print(f"{fresh}/15 rounds had the keeper's pause fresh")


def test_dead_pauser_with_a_live_process_attached_is_not_stale(stale_name, children):
    def attached(q, name):
        lk = pyshmlock.RWLock(name)
        q.put("attached")
        time.sleep(30)

    a = children(attached, stale_name)
    a.expect("attached")
    p = _py(PAUSE_AND_EXIT, stale_name)          # the pauser exits; `a` still uses the lock
    assert p.returncode == 0, p.stderr
    p = _py("import sys, pyshmlock; print(pyshmlock.RWLock(sys.argv[1]).paused)", stale_name)
    assert p.stdout.strip() == "True", p.stderr
    info = pyshmlock.inspect(stale_name)
    assert info.paused and info.paused_by_alive is False and not info.stale
    a.kill()
    # Now every process that used it is gone: the next opener resets.
    lk = pyshmlock.RWLock(stale_name)
    try:
        assert not lk.paused
    finally:
        lk.close()


SHRINK_UNDER_OBSERVER = """
import os, sys
from pyshmlock._shmlock import ffi, lib
name, to = sys.argv[1], int(sys.argv[2])
out = ffi.new("shl_observer **")
assert lib.shl_observe_open(name.encode(), out, ffi.NULL) == lib.SHL_OK
o = out[0]
# The segment's owner shrinks it while the observer has it open.
os.truncate("/dev/shm/pyshmlock." + name, to)
print(lib.shl_observe_info(o, ffi.new("shl_snapshot *")),
      lib.shl_observe_slot(o, 63, ffi.new("shl_slot_snapshot *")),
      lib.shl_observe_recovery(o, 0, ffi.new("shl_recovery_record *")))
lib.shl_observe_close(o)
"""


@pytest.mark.parametrize("to", [0, 64, 4096])
def test_an_observer_survives_the_segment_shrinking_under_it(lock_name, to):
    """An observer looks at segments of owners it need not trust (another
    user's 0644 lock): a shrink after it opened makes what is gone read as
    SegmentSizeError's code, never SIGBUS."""
    lk = pyshmlock.RWLock(lock_name, max_processes=64)
    lk.close()
    p = _py(SHRINK_UNDER_OBSERVER, lock_name, str(to))
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    info, slot63, recovery = (int(c) for c in p.stdout.split())
    esize = pyshmlock._shmlock.lib.SHL_ESIZE
    assert slot63 == esize                            # past the new end
    if to < 1024:                                     # the header is gone too
        assert info == esize and recovery == esize
    else:
        assert info == 0 and recovery == 0            # what is still there reads
    with pytest.raises(pyshmlock.errors.SegmentError):
        pyshmlock.inspect(lock_name)                  # a new look: refused, clearly
