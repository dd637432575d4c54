"""Small helpers that several test modules share: a bounded wait for a
condition, a bounded wait for a forked child, and removing a lock that may
already be gone.  Every wait has a deadline; none can hang a test."""
import os
import signal
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


def reap(pid, timeout):
    """waitpid with a deadline: the child's wait status, or None when it had
    not exited in ``timeout`` seconds (it is SIGKILLed and reaped then)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.001)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def remove_lock(name):
    """Unlink lock ``name`` whoever is attached; nothing if it is gone."""
    try:
        pyshmlock.unlink(name, force=True)
    except FileNotFoundError:
        pass
