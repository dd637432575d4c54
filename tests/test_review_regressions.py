"""Regression tests for defects found by an outside review of the C core
(csrc/core/, csrc/fastpath/).  Each failed on the code before its fix."""
import os
import subprocess
import sys
import textwrap

from conftest import unique_name

import pyshmlock
from pyshmlock._shmlock import lib

# A hold object re-initialised (Hold.__init__) by another thread while its
# __enter__ waits with the GIL released: the old lock may be freed then, and
# the wait must not come back to it through a borrowed pointer.  Run with
# PYTHONMALLOC=debug, so a freed object's memory is overwritten at once and a
# use after free crashes instead of reading stale bytes.
_REINIT_DURING_ENTER = textwrap.dedent("""
    import gc, os, signal, sys, threading, time
    import pyshmlock
    from pyshmlock.lock import SyncHold
    from pyshmlock._shmlock import lib
    a, b = sys.argv[1], sys.argv[2]
    try:
        keep = pyshmlock.RWLock(a)         # keeps the attachment; holds the write
        lk = pyshmlock.RWLock(a)
        other = pyshmlock.RWLock(b)
        hold = SyncHold(lk, lib.SHL_KIND_READ, 20.0)
        signal.signal(signal.SIGUSR1, lambda *args: None)
        keep.acquire_write()

        def meddle():
            time.sleep(0.3)                # the main thread waits in __enter__
            hold.__init__(other, lib.SHL_KIND_READ, 20.0)
            global lk
            lk.reader_lock = lk.writer_lock = lk.update_lock = None
            del lk
            gc.collect()                   # frees lk, unless __enter__ owns a reference
            for _ in range(20):            # EINTR: the handler runs, then a new attempt
                time.sleep(0.05)
                os.kill(os.getpid(), signal.SIGUSR1)
            keep.release_write()

        t = threading.Thread(target=meddle)
        t.start()
        hold.__enter__()                   # the read hold of lock a
        t.join()
        keep.release_read()
        print("survived", flush=True)
    finally:
        pyshmlock.unlink(a, force=True)
        pyshmlock.unlink(b, force=True)
""")


def test_hold_reinitialised_while_enter_waits_does_not_use_the_freed_lock():
    a, b = unique_name("reinit-a"), unique_name("reinit-b")
    env = dict(os.environ, PYTHONMALLOC="debug")
    try:
        p = subprocess.run([sys.executable, "-c", _REINIT_DURING_ENTER, a, b], env=env,
                           capture_output=True, text=True, timeout=40)
    finally:
        for n in (a, b):
            try:
                pyshmlock.unlink(n, force=True)
            except FileNotFoundError:
                pass
    assert p.returncode == 0 and "survived" in p.stdout, (p.returncode, p.stdout, p.stderr)


def _pause_and_exit(q, name):
    lk = pyshmlock.RWLock(name, stale="keep")
    lk.pause()
    q.put(os.getpid())


def test_stale_reset_keeps_a_pause_pinned_by_this_process_update(lock_name, children):
    # Invariant 4 (docs/DESIGN.md): an update claim pins the pause.  The stale
    # reset probes every slot but its own, so an update of this very process
    # (another thread's, or this thread's) must stop it too.
    lock = pyshmlock.RWLock(lock_name)
    c = children(_pause_and_exit, lock_name)
    pauser = c.get()
    assert c.join() == 0
    assert lock.paused
    assert lock.acquire_update(timeout=5)     # granted at once: the pause froze readers
    try:
        rc = lib.shl_reset_stale(lock._h, pauser)
        assert rc == 0, "the reset cleared a pause that this process's update pins"
        assert lock.paused
    finally:
        lock.release_update()
    assert lib.shl_reset_stale(lock._h, pauser) == 1   # now it is stale: cleared
    assert not lock.paused
    lock.close()
