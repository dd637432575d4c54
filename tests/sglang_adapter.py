"""The only adapter between SGLang's RWLock and pyshmlock.AsyncRWLock.

``SGLangShapedRWLock()`` is a pyshmlock.AsyncRWLock on a fresh unique name
(SGLang's lock takes no name; ours must have one).  The name is removed at
once: the attachment keeps working and nothing is left in /dev/shm.  The
three private fields SGLang's tests read are answered from the public
``info()`` of this process: its read holds, whether it holds the write, and
whether its write claim still waits.  Nothing else is mapped: every method
called on it is AsyncRWLock's own.

Used by tests/test_sglang_compat.py directly, and by SGLang's own unit
tests through tests/sglang_shim (``sglang.srt.utils.aio_rwlock.RWLock``).
"""
import os
import uuid

import pyshmlock

# Every lock made here, until close_made() (tests/test_sglang_compat.py's
# fixture) or the process's exit.  Not closed by a finaliser: a finaliser
# runs inside whatever call the collection interrupts, close() takes the
# registry lock, and a collection inside a close() (which holds it) would
# wait for good (tests/test_finalisers_take_no_lock.py).
_made = []


def close_made():
    """Close every lock made so far (one a test left held stays open: the
    process's exit detaches it)."""
    while _made:
        lock = _made.pop()
        try:
            lock.close()
        except pyshmlock.LockInUseError:
            pass


class SGLangShapedRWLock(pyshmlock.AsyncRWLock):
    def __init__(self):
        name = f"test-sglang-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        super().__init__(name)
        pyshmlock.unlink(name)
        _made.append(self)

    @property
    def _readers(self):
        return self.info().readers.get(os.getpid(), 0)

    @property
    def _writer_active(self):
        info = self.info()
        return info.writer_pid == os.getpid() and info.exclusive_granted

    @property
    def _waiting_writers(self):
        info = self.info()
        return int(info.writer_pid == os.getpid() and not info.exclusive_granted)
