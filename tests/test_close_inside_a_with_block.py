"""A lock object closed by another thread while a `with` block of one of its
holds runs: the block's end still gives the hold back, through the
attachment the process keeps for its other objects of the segment (holds are
the process's), so nothing stays held that nobody will release.  The last
object of the segment cannot be closed meanwhile at all."""
import asyncio
import gc
import os
import sys
import threading
import warnings

import pytest
from conftest import FORK, unique_name
from helpers import remove_lock

import pyshmlock

pytestmark = pytest.mark.timeout(60)

KINDS = ["reader_lock", "writer_lock", "update_lock"]


def _nothing_held(lk):
    info = lk.info()
    return info.writer_pid is None and info.updater_pid is None and not info.readers


@pytest.mark.parametrize("kind", KINDS)
def test_a_with_block_whose_object_another_thread_closed_gives_its_hold_back(lock_name, kind):
    inside, leave, outcome = threading.Event(), threading.Event(), []
    x, y = pyshmlock.RWLock(lock_name), pyshmlock.RWLock(lock_name)

    def block():
        try:
            with getattr(x, kind):
                inside.set()
                leave.wait(30)
            outcome.append("given back")
        except BaseException as e:
            outcome.append(repr(e))

    t = threading.Thread(target=block)
    t.start()
    assert inside.wait(30)
    x.close()                      # not the segment's last object: y keeps it
    leave.set()
    t.join(30)
    assert outcome == ["given back"]
    assert _nothing_held(y), y.info()
    assert y.acquire_write(0)      # nobody is left waiting behind a lost hold
    y.release_write()
    with pytest.raises(ValueError, match="closed"):
        x.release_write()          # an explicit call on a closed object still refuses
    y.close()


@pytest.mark.parametrize("kind", KINDS)
def test_an_async_with_block_whose_lock_was_closed_inside_gives_its_hold_back(lock_name, kind):
    async def main():
        a = pyshmlock.AsyncRWLock(lock_name)
        other = pyshmlock.RWLock(lock_name)
        async with getattr(a, kind):
            a.close()
        assert _nothing_held(other), other.info()
        other.close()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_the_last_object_cannot_be_closed_inside_a_with_block(lock_name):
    x = pyshmlock.RWLock(lock_name)
    with x.update_lock:
        with pytest.raises(pyshmlock.LockInUseError):
            x.close()
    assert x.info().updater_pid is None
    x.close()


def test_a_hold_released_by_another_object_meanwhile_is_not_released_twice(lock_name):
    x, y = pyshmlock.RWLock(lock_name), pyshmlock.RWLock(lock_name)
    with pytest.raises(pyshmlock.NotHeldError):
        with x.update_lock:
            y.release_update()     # holds are the process's: any object releases
            x.close()
    assert y.acquire_update(0)
    y.release_update()
    y.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_block_ending_while_close_unbinds_its_object_gives_its_hold_back(lock_name, kind):
    # The closing thread stops right after close() made the object forget
    # its handle (a profile hook on the return of _fast_bind, in that thread
    # only) until the block has ended: the switch the GIL may make there.
    inside, unbound, ended, outcome = (threading.Event(), threading.Event(),
                                       threading.Event(), [])
    x, y = pyshmlock.RWLock(lock_name), pyshmlock.RWLock(lock_name)

    def block():
        try:
            with getattr(x, kind):
                inside.set()
                unbound.wait(30)
            outcome.append("given back")
        except BaseException as e:
            outcome.append(repr(e))
        ended.set()

    def after_unbinding(frame, event, arg):
        if event == "c_return" and getattr(arg, "__name__", None) == "_fast_bind":
            sys.setprofile(None)
            unbound.set()
            ended.wait(30)

    t = threading.Thread(target=block)
    t.start()
    assert inside.wait(30)
    sys.setprofile(after_unbinding)
    try:
        x.close()
    finally:
        sys.setprofile(None)
    t.join(30)
    assert unbound.is_set()
    assert outcome == ["given back"]
    assert _nothing_held(y), y.info()
    y.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_with_block_gives_its_hold_back_after_the_other_object_was_dropped_unclosed(
        lock_name, kind):
    # y, the object that kept the attachment open, is dropped without
    # close() while x's block runs, and its reference is settled (an open of
    # any lock in the process does that): the attachment stays open, kept
    # because the process holds the lock through it, and the block's end
    # must give the hold back through it.
    inside, leave, outcome = threading.Event(), threading.Event(), []
    x, y = pyshmlock.RWLock(lock_name), pyshmlock.RWLock(lock_name)

    def block():
        try:
            with getattr(x, kind):
                inside.set()
                leave.wait(30)
            outcome.append("given back")
        except BaseException as e:
            outcome.append(repr(e))

    t = threading.Thread(target=block)
    t.start()
    assert inside.wait(30)
    x.close()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        del y
        gc.collect()
    settler_name = unique_name()
    try:
        pyshmlock.RWLock(settler_name).close()    # settles y's reference
    finally:
        remove_lock(settler_name)
    leave.set()
    t.join(30)
    assert outcome == ["given back"]
    looker = pyshmlock.RWLock(lock_name)          # shares the attachment kept
    assert _nothing_held(looker), looker.info()
    looker.close()
    # Nothing held any more: the attachment is closed with looker.
    assert os.getpid() not in pyshmlock.inspect(lock_name).attached_pids
    assert _other_process_takes_write(lock_name)


def _other_process_takes_write(name):
    """Whether a child process takes the write lock ``name`` within 10 s."""
    def child(answer):
        lk = pyshmlock.RWLock(name, create=False)
        had = lk.acquire_write(10)
        if had:
            lk.release_write()
        lk.close()
        answer.put(had)

    answer = FORK.Queue()
    p = FORK.Process(target=child, args=(answer,))
    p.start()
    try:
        return answer.get(timeout=30)
    finally:
        p.join(30)
        if p.is_alive():
            p.kill()
            p.join()
