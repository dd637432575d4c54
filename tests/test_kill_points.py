"""SIGKILL at each step of the core that owns a slot's mutex or its
liveness lock: taking a slot (after the keeper's trylock, before the
liveness lock; after the liveness lock, before the slot names its owner),
probing a dead or exiting process's slot (the prober holds that slot's
mutex) and closing (after the liveness lock is dropped, before the keeper
unlocks).  gdb stops the one thread at the step (tests/debugger.py), then
the process is killed there.  Afterwards every slot is usable again, a
dead holder's hold is reclaimed, and an exiting one's is not."""
import os
import shutil
import signal
import textwrap

import pytest
from debugger import Gdb, kill, spawn
from test_process_exit import HOLDER, keeper_exits_alone

import pyshmlock

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("gdb") is None, reason="needs gdb"),
]

MAX = 3

# A process that opens, waits for a read or closes on request; each command
# is run in a thread of its own, so that gdb can stop it while the main
# thread keeps reading commands.
USER = textwrap.dedent('''
    import sys, threading, pyshmlock
    lk = None
    def run(cmd):
        global lk
        if cmd == "open":
            lk = pyshmlock.RWLock(sys.argv[1])
            print("opened", flush=True)
        elif cmd == "read":
            print("read" if lk.acquire_read(60) else "timed out", flush=True)
        elif cmd == "close":
            lk.close()
            print("closed", flush=True)
    print("ready", flush=True)
    for line in sys.stdin:
        threading.Thread(target=run, args=(line.strip(),), daemon=True).start()
''')


def break_at(p, function):
    """gdb attached to p with a breakpoint at function: a thread of p that
    gets there stops (the others run on) until the caller kills p."""
    g = Gdb(p.pid)
    try:
        g.send(f"break {function}")
        g.send("continue -a &")
        g.expect("Continuing.", 20)
    except BaseException:
        g.close()
        raise
    return g


def ask(p, cmd):
    p.stdin.write(cmd + "\n")
    p.stdin.flush()


def sigkill(p, g):
    os.kill(p.pid, signal.SIGKILL)
    p.wait(10)
    g.close()


def all_slots_usable(name):
    """Every slot but ours can be taken by a new process."""
    others = [spawn(USER, name) for _ in range(MAX - 1)]
    try:
        for o in others:
            assert o.stdout.readline().strip() == "ready"
            o.stdin.write("open\n")
            o.stdin.flush()
            assert o.stdout.readline().strip() == "opened"
    finally:
        for o in others:
            kill(o)


@pytest.mark.parametrize("function", [
    "liveness_take",      # the keeper holds the slot's mutex; no liveness lock yet
    "liveness_pidns",     # the liveness lock taken; the slot names nobody yet
])
def test_killed_while_taking_a_slot(lock_name, function):
    with pyshmlock.RWLock(lock_name, max_processes=MAX).attached() as lk:
        p = spawn(USER, lock_name)
        try:
            assert p.stdout.readline().strip() == "ready"
            g = break_at(p, function)
            ask(p, "open")
            g.expect("hit Breakpoint", 20)
            sigkill(p, g)
        finally:
            kill(p)
        assert lk.acquire_write(10)
        lk.release_write()
        all_slots_usable(lock_name)
        assert lk.info().recoveries == []


def test_killed_while_closing(lock_name):
    """Between dropping its liveness lock and its keeper's unlock."""
    with pyshmlock.RWLock(lock_name, max_processes=MAX).attached() as lk:
        p = spawn(USER, lock_name)
        try:
            assert p.stdout.readline().strip() == "ready"
            ask(p, "open")
            assert p.stdout.readline().strip() == "opened"
            g = break_at(p, "keeper_call")      # shl_close's unlock, after liveness_drop
            ask(p, "close")
            g.expect("hit Breakpoint", 20)
            sigkill(p, g)
        finally:
            kill(p)
        assert lk.acquire_write(10)
        lk.release_write()
        all_slots_usable(lock_name)


def opened_user(name):
    p = spawn(USER, name)
    assert p.stdout.readline().strip() == "ready"
    ask(p, "open")
    assert p.stdout.readline().strip() == "opened"
    return p


@pytest.mark.parametrize("function", ["liveness_gone", "recover_slot"])
def test_a_prober_killed_holding_a_dead_holders_slot(lock_name, function):
    """A waiter wakes at the writer's death and probes its slot; it holds
    that slot's mutex (deciding, or reclaiming) when it is killed.  The next
    prober reclaims both processes."""
    with pyshmlock.RWLock(lock_name, max_processes=MAX).attached() as lk:
        holder = spawn(HOLDER, lock_name, "write")
        p = None
        try:
            assert holder.stdout.readline().strip() == "holding"
            p = opened_user(lock_name)
            g = break_at(p, function)
            ask(p, "read")                      # waits for the writer
            os.kill(holder.pid, signal.SIGKILL)
            g.expect("hit Breakpoint", 20)
            sigkill(p, g)
        finally:
            kill(holder)
            if p is not None:
                kill(p)
        assert lk.acquire_write(10)
        lk.release_write()
        assert holder.pid in [r.pid for r in lk.info().recoveries]
        all_slots_usable(lock_name)


def test_a_prober_killed_holding_an_exiting_holders_slot(lock_name):
    """The writer's keeper exited alone (the writer runs on); a waiter that
    probes it is killed while it holds the writer's slot mutex.  The writer
    keeps its hold, then is reclaimed once it is gone."""
    with pyshmlock.RWLock(lock_name, max_processes=MAX).attached() as lk:
        holder = spawn(HOLDER, lock_name, "write")
        p = None
        try:
            assert holder.stdout.readline().strip() == "holding"
            p = opened_user(lock_name)
            g = break_at(p, "liveness_gone")
            ask(p, "read")
            keeper_exits_alone(holder.pid)
            g.expect("hit Breakpoint", 20)
            sigkill(p, g)
            assert lk.acquire_write(1) is False, "admitted beside a running writer"
            assert holder.pid not in [r.pid for r in lk.info().recoveries]
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait(10)
            assert lk.acquire_write(10)
            lk.release_write()
        finally:
            kill(holder)
            if p is not None:
                kill(p)
        assert holder.pid in [r.pid for r in lk.info().recoveries]
        all_slots_usable(lock_name)
