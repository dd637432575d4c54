"""What a cluster host's lock carries for its agent: the fence (the newest
fleet update token seen, refusing older ones at the host), a segment born
paused and fail-closed, and a resume that belongs to the agent."""
import asyncio
import os
import subprocess
import sys

import pytest

import pyshmlock
from pyshmlock.cluster._lease import lease_arm

pytestmark = pytest.mark.timeout(60)


def test_the_fence_only_rises(lock):
    assert lock.fence == 0 and lock.applied_update == 0
    assert lock.raise_fence(10) == 10
    assert lock.raise_fence(4) == 10
    assert lock.fence == 10


def test_a_stale_token_applies_nothing(lock):
    lock.raise_fence(7)
    applied = []
    with pytest.raises(pyshmlock.FencingError, match="stale"):
        with lock.fenced_update(6):
            applied.append("chunk")
    assert applied == [] and lock.applied_update == 0
    assert lock.info().updater_pid is None, "the refused update left its hold"
    with lock.fenced_update(7):
        applied.append("chunk")
    assert applied == ["chunk"] and lock.applied_update == 7


def test_a_newer_token_raises_the_fence_and_a_failed_block_records_nothing(lock):
    with pytest.raises(RuntimeError):
        with lock.fenced_update(9):
            raise RuntimeError("the weights did not load")
    assert lock.fence == 9 and lock.applied_update == 0
    with lock.fenced_update(9):
        pass
    assert lock.applied_update == 9


def test_fenced_updates_from_asyncio(lock_name):
    async def main():
        a = pyshmlock.AsyncRWLock(lock_name)
        async with a.fenced_update(3):
            pass
        a.raise_fence(5)
        with pytest.raises(pyshmlock.FencingError):
            async with a.fenced_update(4):
                pass
        assert a.applied_update == 3 and a.info().updater_pid is None
        a.close()

    asyncio.run(asyncio.wait_for(main(), 20))


@pytest.fixture
def host_setting(lock_name, tmp_path, monkeypatch):
    """A cluster host's setting for lock_name (the real file its agent
    writes), in a directory of this test's."""
    from pyshmlock._hostconf import ENV, write_setting
    monkeypatch.setenv(ENV, str(tmp_path))
    write_setting(lock_name, "test-cluster", ["http://127.0.0.1:1"], "host-a")
    return tmp_path


def test_a_fail_closed_segment_is_born_paused_under_a_passed_lease(lock_name, host_setting):
    lk = pyshmlock.RWLock(lock_name)
    try:
        info = lk.info()
        assert info.paused and info.lease_remaining is not None and info.lease_remaining < 0
        assert lk.acquire_read(0) is False
        other = pyshmlock.RWLock(lock_name)          # a server opening it after
        assert other.paused
        with pytest.raises(pyshmlock.ManagedLockError):
            other.resume(0)
        other.close()
    finally:
        lk.close()


def test_fail_closed_does_not_touch_an_existing_segment(lock, lock_name, tmp_path,
                                                        monkeypatch):
    from pyshmlock._hostconf import ENV, write_setting
    monkeypatch.setenv(ENV, str(tmp_path))
    write_setting(lock_name, "test-cluster", ["http://127.0.0.1:1"], "host-a")
    again = pyshmlock.RWLock(lock_name)
    assert not again.paused
    again.close()


def test_a_stale_reset_never_opens_a_fail_closed_segment(lock_name, host_setting):
    code = "import pyshmlock, sys; lk = pyshmlock.RWLock(sys.argv[1]); import os; os._exit(0)"
    subprocess.run([sys.executable, "-c", code, lock_name], check=True, timeout=30)
    lk = pyshmlock.RWLock(lock_name)                  # stale="reset"
    try:
        assert lk.paused, "a restarted server opened a cluster host's gate"
    finally:
        lk.close()


def test_a_managed_lock_refuses_a_plain_resume(lock):
    lock.pause()
    lease_arm(lock, 30)
    with pytest.raises(pyshmlock.ManagedLockError, match=f"pid {os.getpid()}"):
        lock.resume(0)
    assert lock.paused
    assert lock._resume_as_manager(1)
    lock.pause()
    assert lock.resume(1, force=True)
    p = subprocess.run([sys.executable, "-m", "pyshmlock", "pause", lock.name],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    p = subprocess.run([sys.executable, "-m", "pyshmlock", "resume", lock.name],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 1 and "cluster" in p.stderr, p.stderr
    assert lock.paused
