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
        # The keeper thread is named (pthread_setname_np): its stop notice
        # says which gdb thread it is.
        g.expect('"pyshmlock-keep" stopped', 20)
        num = re.search(r'Thread (\d+) "pyshmlock-keep" stopped', g.out).group(1)
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


# A process that goes on using pyshmlock after its keeper exited: each
# command runs in a thread given 10 s, and the answer says whether it
# finished ("hung" otherwise; the thread is a daemon, the test kills us).
USER = textwrap.dedent('''
    import sys, threading, pyshmlock
    locks = {"a": pyshmlock.RWLock(sys.argv[1])}
    print("ready", flush=True)
    def run(cmd, name):
        if cmd == "open":
            locks[name] = pyshmlock.RWLock(sys.argv[2] if name == "b" else sys.argv[1])
            return "opened"
        if cmd == "write":
            ok = locks[name].acquire_write(5)
            locks[name].release_write()
            return "wrote" if ok else "timed out"
        if cmd == "close":
            locks.pop(name).close()
            return "closed"
    for line in sys.stdin:
        cmd, name = line.split()
        out = []
        t = threading.Thread(target=lambda: out.append(run(cmd, name)), daemon=True)
        t.start()
        t.join(10)
        print(out[0] if out else "hung", flush=True)
''')


def ask(p, cmd):
    p.stdin.write(cmd + "\n")
    p.stdin.flush()
    return p.stdout.readline().strip()


@pytest.mark.parametrize("first", ["close", "open"])
def test_a_process_whose_keeper_exited_alone_can_still_close_and_open_locks(
        lock_name, first):
    """Its keeper is gone, but the process runs on and may open and close
    locks as any other: neither waits for ever for the dead keeper (a close
    also holds the registry lock that every open takes), and the slot it
    gave up is free for the next process."""
    other = lock_name + "-b"
    user = spawn(USER, lock_name, other)
    try:
        assert user.stdout.readline().strip() == "ready"
        keeper_exits_alone(user.pid)
        if first == "close":
            assert ask(user, "close a") == "closed"
            with pyshmlock.RWLock(lock_name).attached() as lk:
                assert user.pid not in lk.info().attached_pids
            assert ask(user, "open a") == "opened"
        else:
            assert ask(user, "open b") == "opened"
            assert ask(user, "write b") == "wrote"
            assert ask(user, "close b") == "closed"
        assert ask(user, "write a") == "wrote"
    finally:
        kill(user)
        try:
            pyshmlock.unlink(other, force=True)
        except FileNotFoundError:
            pass


# A writer that releases on request, and an asyncio task parked behind it.
RELEASER = textwrap.dedent('''
    import sys, pyshmlock
    lk = pyshmlock.RWLock(sys.argv[1])
    assert lk.acquire_write(5)
    print("holding", flush=True)
    sys.stdin.readline()
    lk.release_write()
    print("released", flush=True)
    sys.stdin.readline()
''')
PARKED = textwrap.dedent('''
    import asyncio, sys, pyshmlock
    async def main():
        alock = pyshmlock.AsyncRWLock(sys.argv[1])
        task = asyncio.ensure_future(alock.acquire_read(60))
        await asyncio.sleep(0)
        # Every thread started before "parked" (the test counts them).
        line = asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        print("parked", flush=True)
        await line
        try:
            alock.close()
            print("closed while parked", flush=True)
        except pyshmlock.LockInUseError:
            print("close refused", flush=True)
        print("admitted" if await task else "timed out", flush=True)
        alock.release_read()
    asyncio.run(main())
''')


@pytest.mark.parametrize("whose", ["writer", "waiter"])
def test_a_parked_task_and_an_exiting_process(lock_name, whose):
    """A task parked behind a writer, when the writer's keeper (or the
    task's own process's) exited alone: close() during the park refuses,
    and the writer's release admits the task (no poll, no lost wake-up)."""
    writer = spawn(RELEASER, lock_name)
    waiter = None
    try:
        assert writer.stdout.readline().strip() == "holding"
        waiter = spawn(PARKED, lock_name)
        assert waiter.stdout.readline().strip() == "parked"
        keeper_exits_alone(writer.pid if whose == "writer" else waiter.pid)
        waiter.stdin.write("close\n")
        waiter.stdin.flush()
        assert waiter.stdout.readline().strip() == "close refused"
        writer.stdin.write("release\n")
        writer.stdin.flush()
        assert writer.stdout.readline().strip() == "released"
        assert waiter.stdout.readline().strip() == "admitted"
    finally:
        kill(writer)
        if waiter is not None:
            kill(waiter)
