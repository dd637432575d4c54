"""Child-process bodies that several test modules share.  Each runs in a
forked child (conftest's ``children``), opens the lock by name, and reports
over the child's queue ``q``."""
import time

import pyshmlock

_ING = {"read": "reading", "write": "writing", "update": "updating"}


def hold_until_told(q, name, cmd, kind="read"):
    """Take a ``kind`` hold, say "reading" ("writing", "updating"), wait for
    any command on ``cmd``, release, say "released"."""
    lk = pyshmlock.RWLock(name)
    assert getattr(lk, f"acquire_{kind}")(5)
    q.put(_ING[kind])
    cmd.get(timeout=20)
    getattr(lk, f"release_{kind}")()
    q.put("released")
    lk.close()


def timed_acquire(q, name, kind, timeout):
    """Try a ``kind`` hold with ``timeout``; report (granted, seconds waited)
    and release at once."""
    lk = pyshmlock.RWLock(name)
    t0 = time.monotonic()
    ok = getattr(lk, f"acquire_{kind}")(timeout)
    q.put((ok, time.monotonic() - t0))
    if ok:
        getattr(lk, f"release_{kind}")()
    lk.close()
