"""Hypothesis: the single-process state machine against a plain Python model.

Every attempt uses timeout=0 (try once), so the model decides exactly whether
it succeeds."""
import pytest
from conftest import unique_name
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import pyshmlock

pytestmark = pytest.mark.timeout(120)


class LockModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.name = unique_name("model")
        self.lock = pyshmlock.RWLock(self.name)
        self.reads = 0
        self.exclusive = None     # None, "write" or "update"
        self.paused = False

    def teardown(self):
        while self.reads:
            self.lock.release_read()
            self.reads -= 1
        if self.exclusive == "write":
            self.lock.release_write()
        elif self.exclusive == "update":
            self.lock.release_update()
        self.lock.close()
        pyshmlock.unlink(self.name)

    @rule()
    def acquire_read(self):
        if self.exclusive:
            # a try on this thread's own exclusive hold fails; only a wait
            # without end is refused as a deadlock
            assert self.lock.acquire_read(0) is False
            with pytest.raises(pyshmlock.WouldDeadlockError):
                self.lock.acquire_read(None)
            return
        expected = not self.paused
        assert self.lock.acquire_read(0) is expected
        self.reads += expected

    @rule()
    def release_read(self):
        if self.reads:
            self.lock.release_read()
            self.reads -= 1
        else:
            with pytest.raises(RuntimeError):
                self.lock.release_read()

    @rule()
    def acquire_write(self):
        if self.exclusive:
            # a try on this thread's own exclusive hold fails; only a wait
            # without end is refused as a deadlock
            assert self.lock.acquire_write(0) is False
            with pytest.raises(pyshmlock.WouldDeadlockError):
                self.lock.acquire_write(None)
            return
        expected = self.reads == 0
        assert self.lock.acquire_write(0) is expected
        if expected:
            self.exclusive = "write"

    @rule()
    def acquire_update(self):
        if self.exclusive:
            # a try on this thread's own exclusive hold fails; only a wait
            # without end is refused as a deadlock
            assert self.lock.acquire_update(0) is False
            with pytest.raises(pyshmlock.WouldDeadlockError):
                self.lock.acquire_update(None)
            return
        expected = self.paused or self.reads == 0
        assert self.lock.acquire_update(0) is expected
        if expected:
            self.exclusive = "update"

    @rule()
    def release_write(self):
        if self.exclusive == "write":
            self.lock.release_write()
            self.exclusive = None
        else:
            with pytest.raises(RuntimeError):
                self.lock.release_write()

    @rule()
    def release_update(self):
        if self.exclusive == "update":
            self.lock.release_update()
            self.exclusive = None
        else:
            with pytest.raises(RuntimeError):
                self.lock.release_update()

    @rule()
    def pause(self):
        assert self.lock.pause() is (not self.paused)
        self.paused = True

    @rule()
    def resume(self):
        if self.paused and self.exclusive == "update":
            # a try on this thread's own exclusive hold fails; only a wait
            # without end is refused as a deadlock
            assert self.lock.resume(0) is False
            with pytest.raises(pyshmlock.WouldDeadlockError):
                self.lock.resume(None)
            return
        assert self.lock.resume(0) is True
        self.paused = False

    @rule()
    def wait_drained(self):
        assert self.lock.wait_drained(0) is (self.reads == 0)

    @rule()
    def wait_resumed(self):
        assert self.lock.wait_resumed(0) is (not self.paused)

    @invariant()
    def observable_state_matches(self):
        assert self.lock.paused is self.paused
        assert self.lock.is_locked() is bool(self.reads or self.exclusive)
        info = self.lock.info()
        assert sum(info.readers.values()) == self.reads
        assert (info.writer_pid is not None) is (self.exclusive == "write")
        assert (info.updater_pid is not None) is (self.exclusive == "update")
        assert info.exclusive_granted is (self.exclusive is not None)
        assert not info.waiters and not info.queued_readers


TestLockModel = LockModel.TestCase
TestLockModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
