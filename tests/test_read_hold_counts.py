"""A process's read holds are counted twice over: those the fast call
granted (an uncontended acquire_read, with the GIL held: counted with a load
and a store) and those a waiting attempt was granted (with the GIL let go:
counted with an atomic add).  A release takes from either, in any order; one
more release than holds is refused; close() refuses while either count is
not zero; a forked child starts with neither."""
import os
import threading

import pytest
from conftest import FORK
from helpers import wait_until_waiting
from holders import hold_until_told

import pyshmlock

pytestmark = pytest.mark.timeout(60)


def _one_granted_while_waiting(lock, lock_name, children):
    """A read hold of this process granted to an attempt that waited (the
    other process's write hold in the way), taken by a thread."""
    cmd = FORK.Queue()
    w = children(hold_until_told, lock_name, cmd, "write")
    w.expect("writing")
    got = threading.Event()

    def reader():
        assert lock.acquire_read(30)
        got.set()

    t = threading.Thread(target=reader)
    t.start()
    wait_until_waiting(lock, os.getpid())
    cmd.put("go")
    w.expect("released")
    t.join(30)
    assert got.is_set()


def test_holds_of_both_counts_release_in_any_order(lock, lock_name, children):
    _one_granted_while_waiting(lock, lock_name, children)   # the waited-for count
    assert lock.acquire_read(0)                              # the fast count
    assert lock.acquire_read()
    for _ in range(3):
        lock.release_read()
    with pytest.raises(pyshmlock.NotHeldError):
        lock.release_read()
    assert not lock.is_locked()
    assert lock.acquire_write(0)                             # no reader left behind
    lock.release_write()


@pytest.mark.parametrize("granted", ["fast", "waited"])
def test_close_refuses_while_either_count_holds(lock_name, children, granted):
    lock = pyshmlock.RWLock(lock_name)
    if granted == "fast":
        assert lock.acquire_read(0)
    else:
        _one_granted_while_waiting(lock, lock_name, children)
    with pytest.raises(pyshmlock.LockInUseError):
        lock.close()
    assert lock.acquire_read(0)        # still open, still usable
    lock.release_read()
    lock.release_read()
    lock.close()


def test_a_forked_child_holds_none_of_its_parents_reads(lock):
    assert lock.acquire_read(0)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                       # the child: no hold to release
        code = 1
        try:
            try:
                lock.release_read()
            except pyshmlock.NotHeldError:
                code = 0
        finally:
            os._exit(code)
    os.close(r)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    lock.release_read()
