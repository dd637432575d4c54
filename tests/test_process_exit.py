"""A slot is reclaimed only once its whole process is gone.

The keeper thread's robust mutex says when the *keeper* exits, not the
process: in a group exit the other threads run on for a while, and a keeper
that exits on its own (here: the raw exit syscall, made in the keeper
thread by gdb) leaves the process running.  Such a process keeps its holds
and its slot until it is gone; waiters are not admitted beside it; then a
SIGKILL ends it and it is reclaimed as any dead process."""
import os
import re
import shutil
import signal
import textwrap

import pytest
from debugger import Gdb, kill, spawn
from helpers import wait_for

import pyshmlock

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("gdb") is None, reason="needs gdb"),
]

# The holder: takes `kind` and keeps a thread running (it counts, and says
# how far on request), so the process is visibly alive after its keeper.
HOLDER = textwrap.dedent('''
    import sys, threading, time, pyshmlock
    lk = pyshmlock.RWLock(sys.argv[1])
    assert (lk.acquire_write if sys.argv[2] == "write" else lk.acquire_read)(5)
    n = 0
    def spin():
        global n
        while True:
            n += 1
            time.sleep(0.001)
    threading.Thread(target=spin, daemon=True).start()
    print("holding", flush=True)
    for line in sys.stdin:
        print("running", n, flush=True)
''')

# The waiter: blocks for the conflicting hold and says when it got it.
WAITER = textwrap.dedent('''
    import sys, pyshmlock
    lk = pyshmlock.RWLock(sys.argv[1])
    print("waiting", flush=True)
    got = (lk.acquire_read if sys.argv[2] == "read" else lk.acquire_write)(60)
    print("admitted" if got else "timed out", flush=True)
''')


def keeper_exits_alone(pid):
    """Make the keeper thread of process `pid` exit on its own (the raw
    exit syscall, called in that thread), leaving its other threads run."""
    before = set(os.listdir(f"/proc/{pid}/task"))
    g = Gdb(pid)
    try:
        g.expect("(gdb)", 20)
        g.send("interrupt -a")
        g.send("thread apply all bt 8")
        g.expect("k_cv", 20)          # the keeper waits on the keepers' condition
        g.expect("(gdb)", 5)
        num = None
        for block in re.split(r"\nThread ", g.out):
            if "<k_cv" in block:
                num = re.match(r"\s*(\d+)", block).group(1)
        assert num, g.out[-3000:]
        g.send(f"thread {num}")
        g.send("call (long)syscall(60, 0)")   # SYS_exit: this thread only
        wait_for(lambda: len(set(os.listdir(f"/proc/{pid}/task"))) < len(before), 20,
                 "the keeper thread to exit")
        g.send("continue -a &")
    finally:
        g.close()
    assert len(os.listdir(f"/proc/{pid}/task")) == len(before) - 1


def still_running(holder):
    holder.stdin.write("?\n")
    holder.stdin.flush()
    line = holder.stdout.readline().split()
    assert line and line[0] == "running", line
    return int(line[1])


@pytest.mark.parametrize("held, waits", [("write", "read"), ("read", "write")])
def test_a_process_whose_keeper_exits_alone_keeps_its_hold_until_it_is_gone(
        lock_name, held, waits):
    holder = spawn(HOLDER, lock_name, held)
    waiter = None
    try:
        assert holder.stdout.readline().strip() == "holding"
        waiter = spawn(WAITER, lock_name, waits)
        assert waiter.stdout.readline().strip() == "waiting"
        keeper_exits_alone(holder.pid)
        # The holder runs on (its other threads count) and keeps its hold:
        # nobody is admitted beside it, however often the waiter probes it.
        n = still_running(holder)
        lk = pyshmlock.RWLock(lock_name)
        try:
            try_conflict = lk.acquire_read if waits == "read" else lk.acquire_write
            assert try_conflict(0.5) is False, "admitted beside a live holder"
            wait_for(lambda: still_running(holder) > n, 10, "the holder's thread to run on")
            info = lk.info()
            assert holder.pid in info.attached_pids
            assert holder.pid not in info.dead_pids
            assert [p.exiting for p in info.processes if p.pid == holder.pid] == [True]
            assert info.recoveries == []
            os.set_blocking(waiter.stdout.fileno(), False)
            assert not waiter.stdout.readline(), "the waiter was admitted beside the holder"
            os.set_blocking(waiter.stdout.fileno(), True)
            # Gone for good: reclaimed, and the waiter gets in.
            os.kill(holder.pid, signal.SIGKILL)
            kill(holder)
            assert waiter.stdout.readline().strip() == "admitted"
            rec = lk.info().recoveries[-1]
            assert rec.pid == holder.pid
            assert ("write" if held == "write" else "reads") in rec.lost
        finally:
            kill(waiter)
            lk.close()
    finally:
        kill(holder)
        if waiter is not None:
            kill(waiter)


def test_the_slot_of_an_exiting_process_is_not_taken_by_a_new_one(lock_name):
    """The exiting process still uses its slot (its count of read holds):
    a process that attaches meanwhile takes another slot."""
    with pyshmlock.RWLock(lock_name, max_processes=3).attached() as lk:
        holder = spawn(HOLDER, lock_name, "read")
        try:
            assert holder.stdout.readline().strip() == "holding"
            keeper_exits_alone(holder.pid)
            slot = [p.slot for p in lk.info().processes if p.pid == holder.pid]
            assert slot, "the exiting holder is no longer listed"
            other = spawn(WAITER, lock_name, "read")
            try:
                assert other.stdout.readline().strip() == "waiting"
                assert other.stdout.readline().strip() == "admitted"
                mine = [p.slot for p in lk.info().processes if p.pid == other.pid]
                assert mine and mine != slot
            finally:
                kill(other)
            still_running(holder)
        finally:
            kill(holder)


def test_an_observer_shows_an_exiting_process_as_exiting_not_dead(lock_name):
    with pyshmlock.RWLock(lock_name).attached():
        holder = spawn(HOLDER, lock_name, "write")
        try:
            assert holder.stdout.readline().strip() == "holding"
            keeper_exits_alone(holder.pid)
            seen = pyshmlock.inspect(lock_name)
            assert holder.pid not in seen.dead_pids
            assert [p.exiting for p in seen.processes if p.pid == holder.pid] == [True]
            assert seen.writer_pid == holder.pid
        finally:
            kill(holder)
