"""max_processes on a restart: workers restarted with a larger (or smaller)
max_processes than the lock they find get a lock of the size they ask for
when nobody has that lock open and it holds no pause, hold, session, lease,
fence or data-suspect mark: it is re-created at the asked size.  Otherwise
the first opener that asks for more than the lock has is refused at once,
its error naming both values, instead of the third worker failing later.
A plain RWLock(name) asks for nothing: it takes the lock as it is.
Concurrent openers asking for the new size all end up on one segment."""
import os
import time

import pytest

import pyshmlock

pytestmark = pytest.mark.timeout(120)


def segment(name):
    st = os.stat(f"/dev/shm/pyshmlock.{name}")
    return st.st_dev, st.st_ino


def test_an_unused_lock_is_recreated_at_the_size_a_restart_asks_for(lock_name, children):
    old = pyshmlock.RWLock(lock_name, max_processes=2)
    old.close()                      # every process of the old server is gone
    first = segment(lock_name)
    lk = pyshmlock.RWLock(lock_name, max_processes=8)
    kids = []
    try:
        assert lk.info().max_processes == 8
        assert segment(lock_name) != first
        # The two more workers of the restarted server attach: no third fails.
        kids = [children(open_and_hold, lock_name, 8) for _ in range(2)]
        for k in kids:
            assert k.get() == ("attached", 8)
        assert len(lk.info().attached_pids) == 3
    finally:
        for k in kids:
            k.kill()
        lk.close()


def open_and_hold(q, name, max_processes):
    lk = pyshmlock.RWLock(name, max_processes=max_processes)
    q.put(("attached", lk.info().max_processes))
    while True:                       # killed by the fixture
        time.sleep(60)


def test_a_smaller_ask_on_an_unused_lock_recreates_it_too(lock_name):
    pyshmlock.RWLock(lock_name, max_processes=64).close()
    with pyshmlock.RWLock(lock_name, max_processes=4).attached() as lk:
        assert lk.info().max_processes == 4


def test_a_plain_open_takes_the_lock_as_it_is(lock_name):
    pyshmlock.RWLock(lock_name, max_processes=3).close()
    first = segment(lock_name)
    with pyshmlock.RWLock(lock_name).attached() as lk:
        assert lk.info().max_processes == 3
    assert segment(lock_name) == first


def ask_for(q, name, max_processes):
    try:
        lk = pyshmlock.RWLock(name, max_processes=max_processes)
    except pyshmlock.TooManyProcessesError as e:
        q.put(("refused", str(e)))
        return
    q.put(("attached", lk.info().max_processes))
    lk.close()


def test_a_lock_in_use_refuses_the_first_larger_ask_naming_both_values(lock_name, children):
    lk = pyshmlock.RWLock(lock_name, max_processes=2)
    try:
        first = segment(lock_name)
        what, text = children(ask_for, lock_name, 8).get()
        assert what == "refused", text
        assert "max_processes=2" in text and "max_processes=8" in text, text
        assert "pyshmlock rm" in text, text
        assert segment(lock_name) == first
        assert lk.info().max_processes == 2 and lk.acquire_read(1)
        lk.release_read()
        # Asking for fewer than the lock has is no refusal: it has room.
        assert children(ask_for, lock_name, 1).get() == ("attached", 2)
    finally:
        lk.close()


def leave(name, mark):
    lk = pyshmlock.RWLock(name, max_processes=2, stale="keep")
    if mark == "pause":
        lk.pause()
    else:
        lk.begin_session(ttl=600)
    lk.close()


@pytest.mark.parametrize("mark", ["pause", "session"])
def test_an_unused_lock_with_a_mark_is_kept_and_the_opener_told(lock_name, mark):
    leave(lock_name, mark)
    first = segment(lock_name)
    with pytest.raises(pyshmlock.TooManyProcessesError) as e:
        pyshmlock.RWLock(lock_name, max_processes=8, stale="keep")
    assert "max_processes=2" in str(e.value) and "max_processes=8" in str(e.value)
    assert segment(lock_name) == first
    assert pyshmlock.inspect(lock_name).paused


def an_operator_holds_it(q, name, go):
    from pyshmlock._attachment import _attach_operator
    att = _attach_operator(name)
    q.put("open")
    go.get(timeout=60)
    q.put("done")                    # the handle goes with the process


def test_an_operators_open_handle_keeps_the_lock(lock_name, children):
    """A `pyshmlock pause` that has the lock open must pause the lock the
    workers use: nobody re-creates it under an operator's handle."""
    from conftest import FORK
    pyshmlock.RWLock(lock_name, max_processes=2).close()
    go = FORK.Queue()
    op = children(an_operator_holds_it, lock_name, go)
    op.expect("open")
    first = segment(lock_name)
    what, text = children(ask_for, lock_name, 8).get()
    assert what == "refused" and "max_processes=8" in text, text
    assert segment(lock_name) == first
    go.put("go")
    op.expect("done")


def race_to_open(q, name, start):
    start.wait(60)
    lk = pyshmlock.RWLock(name, max_processes=8)
    info = lk.info()
    q.put((info.max_processes, lk._att.key, os.getpid() in info.attached_pids))
    time.sleep(3600)                   # stays attached; killed by the fixture


def test_openers_racing_a_recreation_all_land_on_one_segment(lock_name, children):
    from conftest import FORK
    for _ in range(5):
        pyshmlock.RWLock(lock_name, max_processes=2).close()
        start = FORK.Event()
        kids = [children(race_to_open, lock_name, start) for _ in range(6)]
        start.set()
        got = [k.get() for k in kids]
        assert {g[0] for g in got} == {8}, got
        assert len({g[1] for g in got}) == 1, f"openers on different segments: {got}"
        assert all(g[2] for g in got), got
        info = pyshmlock.inspect(lock_name)
        assert sorted(info.attached_pids) == sorted(k.pid for k in kids), info
        for k in kids:
            k.kill()
        pyshmlock.unlink(lock_name, force=True)
