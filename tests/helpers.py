"""Small helpers that several test modules share: a bounded wait for a
condition (or for another process to be waiting on a lock), a bounded wait
for a forked child, removing a lock that may
already be gone, and a fresh interpreter run with a timeout (optionally as
another user).  Every wait has a deadline; none can hang a test."""
import os
import signal
import subprocess
import sys
import time

import pyshmlock


def wait_for(pred, timeout=10.0, what="condition", interval=0.02):
    """Poll ``pred()`` every ``interval`` seconds until it is true; fail
    (AssertionError naming ``what``) once ``timeout`` seconds have passed."""
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)


def wait_until_waiting(lock, pid, timeout=30.0):
    """Until process ``pid`` has a thread asleep in ``lock`` (its
    ``info().waiters``): the event a test means by "the other process is
    waiting now", however slowly that process started."""
    wait_for(lambda: lock.info().waiters.get(pid, 0) > 0, timeout,
             what=f"process {pid} to wait on lock {lock.name!r}")


def threads_of(pid):
    """Where each thread of ``pid`` is (state, kernel wait channel, system
    call and its arguments, from /proc, and the mapping its first argument
    points into): what a hung process was doing."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            maps = [line.split(maxsplit=5) for line in f]
    except OSError:
        maps = []

    def mapping(addr):
        for m in maps:
            lo, hi = (int(x, 16) for x in m[0].split("-"))
            if lo <= addr < hi:
                return m[5].strip() if len(m) > 5 else "anonymous"
        return "in no mapping the process shows"
    lines = []
    for tid in sorted(os.listdir(f"/proc/{pid}/task")):
        got = []
        for what in ("stat", "wchan", "syscall"):
            try:
                with open(f"/proc/{pid}/task/{tid}/{what}") as f:
                    text = f.read().strip()
                got.append(text.rsplit(")", 1)[-1].split()[0] if what == "stat" else text)
            except OSError as e:
                got.append(f"({e.strerror})")
        words = got[2].split()
        if len(words) > 1 and words[1].startswith("0x"):
            got.append(f"[arg 1 in: {mapping(int(words[1], 16))}]")
        lines.append(f"thread {tid}: " + " ".join(got))
    return "\n".join(lines)


def reap(pid, timeout, hung=None):
    """waitpid with a deadline: the child's wait status, or None when it had
    not exited in ``timeout`` seconds (it is SIGKILLed and reaped then,
    after its threads_of() is appended to the list ``hung`` if given)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.001)
    if hung is not None:
        try:
            hung.append(threads_of(pid))
        except OSError as e:
            hung.append(f"pid {pid}: {e}")
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def remove_lock(name):
    """Unlink lock ``name`` whoever is attached; nothing if it is gone."""
    try:
        pyshmlock.unlink(name, force=True)
    except FileNotFoundError:
        pass


# The package under test, for children of another user (whose environment
# would not find a package installed in root's virtual environment).
PACKAGE_PARENT = os.path.dirname(os.path.dirname(pyshmlock.__file__))


def run_python(*args, timeout, user=None, **kw):
    """``python *args`` in a fresh interpreter (a process that never opened
    the lock), started in / with the package under test on PYTHONPATH; as
    uid and gid ``user`` with no groups (setpriv) when given.  Output is
    captured as text; the run is bounded by ``timeout`` seconds."""
    cmd = [sys.executable, *args]
    if user is not None:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd="/",
                          env=dict(os.environ, PYTHONPATH=PACKAGE_PARENT), **kw)
