"""A forked child never touches its parent's asyncio watcher: the parent's
watcher thread may hold the watcher's mutex at the fork, and a task parked
before the fork that the child cancels, times out or wakes must not wait for
it.  The window is held open with gdb (tests/debugger.py)."""
import os
import shutil
import signal
import subprocess
import textwrap
import time

import pytest
from debugger import Gdb, kill, spawn

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("gdb") is None, reason="needs gdb (.ci/run installs it)"),
]

PARENT = textwrap.dedent('''
    import asyncio, os, sys, pyshmlock
    lock = pyshmlock.AsyncRWLock(sys.argv[1])
    lock.pause()                        # a reader parks until the resume
    async def main():
        loop = asyncio.get_running_loop()
        print("ready", flush=True)
        await loop.run_in_executor(None, sys.stdin.readline)
        t = asyncio.create_task(lock.acquire_read())
        await asyncio.sleep(0.2)
        print("parked", flush=True)
        await loop.run_in_executor(None, sys.stdin.readline)
        pid = os.fork()
        if pid == 0:
            t.cancel()                  # its finally: unpark on the parent's helper
            try:
                await t
            except asyncio.CancelledError:
                pass
            print("child unparked", flush=True)
            os._exit(0)
        print("forked", pid, flush=True)
        os.waitpid(pid, 0)
    asyncio.run(main())
''')


def run(name, stall):
    p = spawn(PARENT, name)
    g = None
    child = None
    try:
        assert p.stdout.readline().strip() == "ready"
        if stall:
            g = Gdb(p.pid)
            g.send("break arm_sleepers")     # the watcher thread calls it holding wt->mu
            g.send("continue -a &")
            g.expect("Continuing.", 10)
        p.stdin.write("go\n")
        p.stdin.flush()
        if stall:
            g.expect("hit Breakpoint", 10)   # the watcher thread now holds wt->mu
        assert p.stdout.readline().strip() == "parked"
        p.stdin.write("fork\n")
        p.stdin.flush()
        # The child's line and the parent's come in either order.
        end = time.monotonic() + 10
        out = ""
        os.set_blocking(p.stdout.fileno(), False)
        while time.monotonic() < end and not ("child unparked" in out and "forked" in out):
            try:
                out += p.stdout.read() or ""
            except TypeError:        # a non-blocking text read with nothing there
                pass
            time.sleep(0.05)
        forked = [ln.split() for ln in out.splitlines() if ln.startswith("forked")]
        child = int(forked[0][1]) if forked else None
        if "child unparked" in out:
            return "ok", ""
        if child is None:
            return "no fork", out
        bt = subprocess.run(["gdb", "-q", "-nx", "-batch", "-p", str(child), "-ex", "bt"],
                            capture_output=True, text=True, timeout=30).stdout
        return "hung", bt
    finally:
        if child is not None:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if g is not None:
            g.close()
        kill(p)


@pytest.fixture
def name(lock_name):
    """conftest's lock_name (unique, removed afterwards) under a short name."""
    return lock_name


def test_a_child_withdraws_a_task_parked_before_the_fork(name):
    assert run(name, stall=False)[0] == "ok"


def test_a_child_never_waits_for_its_parents_watcher_mutex(name):
    state, bt = run(name, stall=True)
    assert state == "ok", ("the child hangs in its unpark:\n" +
                           "\n".join([ln for ln in bt.splitlines() if ln.startswith("#")][:5]))
