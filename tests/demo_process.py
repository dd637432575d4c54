"""The real `pyshmlock demo --keep-running`, started as a subprocess for the
tests that drive or signal it."""
import os
import re
import signal
import subprocess
import sys
import time


def start_kept_demo(*extra, stderr=subprocess.PIPE, timeout=120):
    """Start the demo with two workers and read its banner up to the workers
    line.  Returns (proc, banner text, lock name)."""
    proc = subprocess.Popen([sys.executable, "-m", "pyshmlock", "demo", "--workers", "2",
                             *extra, "--keep-running"],
                            stdout=subprocess.PIPE, stderr=stderr, text=True, cwd="/")
    lines = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("  workers:"):
            break
    text = "".join(lines)
    m = re.search(r"pyshmlock status (\S+)", text)
    assert m, text
    return proc, text, m.group(1)


def running(pid):
    """Is pid a process that has not exited (zombies count as gone)?"""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def stop_everything(proc, kids, name):
    """After a test, whatever it left: kill the demo and its children and
    remove the lock's segments."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(5)
    for k in kids:
        if running(k):
            os.kill(k, signal.SIGKILL)
    for f in os.listdir("/dev/shm"):
        if name in f:
            os.unlink(os.path.join("/dev/shm", f))
    proc.stdout.close()
