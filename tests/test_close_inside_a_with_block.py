"""A lock object closed by another thread while a `with` block of one of its
holds runs: the block's end still gives the hold back, through the
attachment the process keeps for its other objects of the segment (holds are
the process's), so nothing stays held that nobody will release.  The last
object of the segment cannot be closed meanwhile at all.  A hold whose
attachment is closed (or belongs to a forked parent) releases nothing: not a
new attachment's hold, not another process's."""
import asyncio
import gc
import os
import sys
import threading
import time
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


def _wait_until(predicate, what):
    """Poll the segment's state (not the clock's idea of a process's speed)
    until predicate() holds; fail after 30 s."""
    deadline = time.monotonic() + 30
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.001)


def test_fast_reads_and_reads_granted_after_waiting_all_end_after_their_object_closed(lock_name):
    # Reads granted at once (the fast calls' count) and reads granted after
    # waiting at a paused gate (the general count, taken through the token
    # the closed object began them on): every block gives its read back, and
    # the process's count ends at 0, not below.
    x, y = pyshmlock.RWLock(lock_name), pyshmlock.RWLock(lock_name)
    n_fast, n_waited = 6, 6
    fast_inside = threading.Barrier(n_fast + 1)
    leave, outcome, granted = threading.Event(), [], []

    def reader(waits):
        try:
            with x.reader_lock:
                if waits:
                    granted.append(1)
                else:
                    fast_inside.wait(30)
                leave.wait(30)
            outcome.append("given back")
        except BaseException as e:
            outcome.append(repr(e))

    fast = [threading.Thread(target=reader, args=(False,)) for _ in range(n_fast)]
    waited = [threading.Thread(target=reader, args=(True,)) for _ in range(n_waited)]
    for t in fast:
        t.start()
    fast_inside.wait(30)
    y.pause()
    for t in waited:
        t.start()
    me = os.getpid()
    _wait_until(lambda: y.info().waiters.get(me) == n_waited, "readers waiting")
    x.close()
    y.resume()
    _wait_until(lambda: len(granted) == n_waited, "waiting readers granted")
    assert y.info().readers == {me: n_fast + n_waited}
    leave.set()
    for t in fast + waited:
        t.join(30)
    assert outcome == ["given back"] * (n_fast + n_waited)
    assert _nothing_held(y), y.info()
    with pytest.raises(pyshmlock.NotHeldError):
        y.release_read()
    y.close()
    assert _other_process_takes_write(lock_name)


def test_the_other_object_refuses_to_close_until_the_block_of_the_closed_one_ends(lock_name):
    x, y = pyshmlock.RWLock(lock_name), pyshmlock.RWLock(lock_name)
    with x.writer_lock:
        x.close()
        with pytest.raises(pyshmlock.LockInUseError):
            y.close()
    assert _nothing_held(y), y.info()
    y.close()
    assert os.getpid() not in pyshmlock.inspect(lock_name).attached_pids
    assert _other_process_takes_write(lock_name)


def test_a_stale_hold_of_a_closed_segment_releases_nothing_of_a_new_attachment(lock_name):
    # x and y both closed (nothing held), then another process takes the
    # write and this one opens the lock again: the old hold's release and
    # __exit__ say "closed" and leave the other process's write alone.
    x, y = pyshmlock.RWLock(lock_name), pyshmlock.RWLock(lock_name)
    stale = x.writer_lock
    x.close()
    y.close()
    holding, stop = FORK.Event(), FORK.Event()

    def holder():
        lk = pyshmlock.RWLock(lock_name, create=False)
        lk.acquire_write()
        holding.set()
        stop.wait(30)
        lk.release_write()
        lk.close()

    p = FORK.Process(target=holder)
    p.start()
    try:
        assert holding.wait(30)
        z = pyshmlock.RWLock(lock_name)
        with pytest.raises(ValueError, match="closed"):
            stale.release()
        with pytest.raises(ValueError, match="closed"):
            stale.__exit__(None, None, None)
        assert z.info().writer_pid == p.pid
    finally:
        stop.set()
        p.join(30)
    assert p.exitcode == 0
    assert _nothing_held(z), z.info()
    z.close()


def test_a_hold_of_the_unlinked_segment_is_given_back_to_it_not_to_the_new_lock(lock_name):
    # x closed inside the block, the name unlinked and created anew: the
    # block's end releases the old segment's hold, through the old
    # attachment, and leaves the new lock's write alone.
    x, y = pyshmlock.RWLock(lock_name), pyshmlock.RWLock(lock_name)
    with x.writer_lock:
        x.close()
        pyshmlock.unlink(lock_name)
        z = pyshmlock.RWLock(lock_name)        # a new segment
        assert z.acquire_write(0)
    assert z.info().writer_pid == os.getpid()
    assert _nothing_held(y), y.info()
    z.release_write()
    y.close()
    z.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_forked_child_cannot_release_the_parents_hold_of_a_closed_object(lock_name, kind):
    x, y = pyshmlock.RWLock(lock_name), pyshmlock.RWLock(lock_name)
    hold = getattr(x, kind)
    hold.__enter__()
    x.close()
    answers = FORK.Queue()

    def child():
        for step in (hold.release, y.close):
            try:
                step()
                answers.put("done")
            except BaseException as e:
                answers.put(type(e).__name__)

    p = FORK.Process(target=child)
    p.start()
    got = [answers.get(timeout=30), answers.get(timeout=30)]
    p.join(30)
    assert p.exitcode == 0
    assert got == ["NotHeldError", "done"]
    info = y.info()
    me = os.getpid()
    assert me in (info.writer_pid, info.updater_pid) or info.readers.get(me) == 1, info
    hold.release()
    assert _nothing_held(y), y.info()
    y.close()
    assert _other_process_takes_write(lock_name)


def test_an_async_block_of_a_closed_and_collected_lock_lets_tasks_parked_on_another_in(lock_name):
    async def main():
        a = pyshmlock.AsyncRWLock(lock_name)
        b = pyshmlock.AsyncRWLock(lock_name)
        order = []

        async def writer(i):
            async with b.writer_lock:
                order.append(i)
                await asyncio.sleep(0)

        async with a.reader_lock:
            writers = [asyncio.ensure_future(writer(i)) for i in range(4)]
            me = os.getpid()
            while b.info().waiters.get(me) != 1:    # the first parked, the rest queued
                await asyncio.sleep(0.001)
            a.close()
            del a                      # the block's hold keeps what it needs
            gc.collect()
        await asyncio.gather(*writers)
        assert sorted(order) == [0, 1, 2, 3]
        assert _nothing_held(b), b.info()
        b.close()

    asyncio.run(asyncio.wait_for(main(), 30))
    assert _other_process_takes_write(lock_name)
