"""Many processes mixing every operation while a shared-memory checker
asserts the lock's invariants."""

import pytest
from checker import Checker, random_worker
from conftest import FORK

pytestmark = pytest.mark.timeout(120)


def test_stress_many_processes_all_operations(lock, lock_name, children):
    checker = Checker(FORK)
    workers = [children(random_worker, lock_name, checker, 3.0, seed) for seed in range(8)]
    total = sum(w.get(timeout=60) for w in workers)
    for w in workers:
        assert w.join(20) == 0
    notes = checker.drain_notes()
    assert checker.violations == 0, notes
    assert checker.grants > 100, (total, checker.grants)
    # Afterwards the lock is whole: nothing held, nobody waiting, writer gets in.
    assert lock.resume(2)
    assert lock.acquire_write(1)      # False after 1 s: a wedged lock fails here
    lock.release_write()
    info = lock.info()
    assert not info.readers and not info.waiters and not info.queued_readers
    assert info.recoveries == []
