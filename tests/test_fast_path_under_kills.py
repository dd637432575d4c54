"""The fast calls (straight-line claim, grant and releases; DRAINERS armed
only to sleep) under real processes that are SIGKILLed at random points
while others hammer read, write and update with and without timeouts, from
two threads each.  Mutual exclusion is checked by the holders themselves in
shared memory that only a hold protects (no other lock that a killed
process could leave taken): a writer marks itself inside, increments a
counter in two steps and checks the mark; a reader checks that no live
writer's mark is up.  Afterwards the lock is whole."""
import os
import random
import signal
import time

import pytest
from conftest import FORK

import pyshmlock

pytestmark = pytest.mark.timeout(120)

INSIDE, COUNTER, VIOLATIONS, STOP, KILLED0 = range(5)
NKILLED = 64
NWORKERS = 4


def _hammer(q, name, shared, idx, seed):
    import threading
    lk = pyshmlock.RWLock(name)
    mine = [0, 0]
    me = os.getpid()

    def killed(pid):
        return any(shared[KILLED0 + i] == pid for i in range(NKILLED))

    def bad(what):
        shared[VIOLATIONS] += 1
        q.put(("violation", what))

    def run(t):
        rnd = random.Random(seed * 7 + t)
        tag = me * 4 + t           # per thread: two threads of a process exclude too
        while not shared[STOP]:
            op = rnd.choice(["read", "read", "write", "update"])
            timeout = rnd.choice([None, 0, 1, 0.05, 5, 0.0])
            if not getattr(lk, f"acquire_{op}")(timeout):
                continue
            try:
                if op == "read":
                    who = shared[INSIDE]
                    if who and not killed(who // 4):
                        bad(f"reader beside writer {who}")
                else:
                    who = shared[INSIDE]
                    if who and not killed(who // 4):
                        bad(f"{op} beside writer {who}")
                    shared[INSIDE] = tag
                    v = shared[COUNTER]
                    if rnd.random() < 0.1:
                        time.sleep(0.0005)
                    shared[COUNTER] = v + 1
                    if shared[INSIDE] != tag:
                        bad(f"{op}: mark overwritten by {shared[INSIDE]}")
                    shared[INSIDE] = 0
                    mine[t] += 1
            finally:
                getattr(lk, f"release_{op}")()

    ts = [threading.Thread(target=run, args=(t,)) for t in range(2)]
    for t in ts:
        t.start()
    q.put("started")
    for t in ts:
        t.join()
    lk.close()
    q.put(("done", sum(mine)))


@pytest.mark.needs_robust_futex
@pytest.mark.parametrize("plan", [1234, 99, 7])
def test_random_sigkills_keep_exclusion_and_recovery(lock, lock_name, children, plan):
    shared = FORK.Array("q", KILLED0 + NKILLED, lock=False)
    rnd = random.Random(plan)
    live = []
    seed = 0
    for _ in range(NWORKERS):
        c = children(_hammer, lock_name, shared, len(live), seed + plan)
        seed += 1
        c.expect("started")
        live.append(c)
    kills = 0
    end = time.monotonic() + 4.0
    while time.monotonic() < end and kills < NKILLED:
        time.sleep(rnd.random() * 0.2)
        victim = live.pop(rnd.randrange(len(live)))
        shared[KILLED0 + kills] = victim.pid      # recorded before the kill
        kills += 1
        os.kill(victim.pid, signal.SIGKILL)
        victim.p.join(30)
        c = children(_hammer, lock_name, shared, len(live), seed)
        seed += 1
        c.expect("started")
        live.append(c)
    shared[STOP] = 1
    done = 0
    for c in live:
        msg = c.get(60)
        if msg[0] == "violation":
            pytest.fail(f"violation: {msg[1]}")
        done += msg[1]
        assert c.join(30) == 0
    assert shared[VIOLATIONS] == 0
    # No increment lost or counted twice beyond what the kills can explain:
    # the survivors' own increments are all in the counter.
    assert shared[COUNTER] >= done
    # Recovery: the lock is whole afterwards.
    assert lock.acquire_write(10)
    lock.release_write()
    assert lock.acquire_read(10)
    lock.release_read()
    info = lock.info()
    assert not info.readers and not info.waiters and not info.queued_readers, info
