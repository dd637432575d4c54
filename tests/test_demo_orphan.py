"""The demo's children remove its locks when its main process dies without
cleaning up, whichever of the main's threads dies last.

PR_SET_PDEATHSIG fires when the thread that forked a child exits, and again
each time the child is handed to another thread of the same process.  A
multi-threaded main (the C core's lease watchdog is one of its threads) that
is SIGKILLed loses its main thread first: the children get SIGTERM while
getppid() still names the main.  Here the main's main thread exits
(pthread_exit) while another of its threads lives on for a while, which
makes that window wide and the test deterministic."""
import os
import subprocess
import sys
import time

import pytest
from conftest import unique_name

pytestmark = pytest.mark.timeout(90)

# The demo's main, reduced to the scheduler: create the locks, fork the
# scheduler from the main thread, end the main thread while a second thread
# keeps the process alive for LINGER seconds, then exit without cleaning up.
MAIN = r"""
import ctypes, os, sys, threading, time
from pyshmlock import RWLock
from pyshmlock_lab.demo.scheduler import scheduler_main
from pyshmlock_lab.demo.state import CTX, engine_lock_name, new_state

name, linger = sys.argv[1], float(sys.argv[2])
locks = [RWLock(name), RWLock(engine_lock_name(name))]
state = new_state()
state.set("scheduler_paused", 7)          # the scheduler writes 0 once it runs
p = CTX.Process(target=scheduler_main, daemon=True,
                args=(name, "shared", state, CTX.Queue(), [], CTX.Event(), os.getpid()))
p.start()
end = time.monotonic() + 30
while state.scheduler_paused == 7 and time.monotonic() < end:
    time.sleep(0.01)
print(p.pid, state.scheduler_paused, flush=True)
threading.Thread(target=lambda: (time.sleep(linger), os._exit(0))).start()
ctypes.CDLL(None).pthread_exit(None)     # ctypes drops the GIL for the call
"""


def _gone(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def test_the_scheduler_removes_the_locks_when_the_main_thread_dies_first():
    name = unique_name("demo")
    segs = [f"pyshmlock.{name}", f"pyshmlock.{name}.engine"]
    proc = subprocess.Popen([sys.executable, "-c", MAIN, name, "2.0"],
                            stdout=subprocess.PIPE, text=True)
    sched = None
    try:
        line = proc.stdout.readline().split()
        assert len(line) == 2 and line[1] == "0", line     # the scheduler ran
        sched = int(line[0])
        assert proc.wait(30) == 0
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            left = [s for s in segs if os.path.exists(f"/dev/shm/{s}")]
            if _gone(sched) and not left:
                break
            time.sleep(0.05)
        assert _gone(sched), "the scheduler outlived its main"
        assert not left, f"left in /dev/shm after the main died: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        if sched is not None and not _gone(sched):
            os.kill(sched, 9)
        for s in segs:
            if os.path.exists(f"/dev/shm/{s}"):
                os.unlink(f"/dev/shm/{s}")
        proc.stdout.close()
