"""Read/write adapters: pyshmlock and the peers a Python user picks today
(flock, prwlock, fasteners, filelock) behind one acquire/release interface."""
import fcntl
import os
from typing import Any, Callable, List

from pyshmlock.lock import RWLock, unlink

from ._common import _name, _TempFile

# ====================================================== read/write adapters
# Each adapter is built in the parent and used after fork in the children;
# methods take/give one hold.

class _PyshmlockRW:
    label = "pyshmlock"

    def __init__(self) -> None:
        self.name = _name("rw")
        self.lock = RWLock(self.name)

    def read(self) -> None:
        self.lock.acquire_read()

    def unread(self) -> None:
        self.lock.release_read()

    def write(self) -> None:
        self.lock.acquire_write()

    def unwrite(self) -> None:
        self.lock.release_write()

    def close(self) -> None:
        self.lock.close()
        unlink(self.name, force=True)


class _FlockRW:
    label = "fcntl.flock"

    def __init__(self) -> None:
        self.tmp = _TempFile()
        self.fd = -1

    def _fd(self) -> int:
        if self.fd < 0:     # one open file description per process
            self.fd = os.open(self.tmp.path, os.O_RDWR)
        return self.fd

    def read(self) -> None:
        fcntl.flock(self._fd(), fcntl.LOCK_SH)

    def unread(self) -> None:
        fcntl.flock(self._fd(), fcntl.LOCK_UN)

    def write(self) -> None:
        fcntl.flock(self._fd(), fcntl.LOCK_EX)

    unwrite = unread

    def close(self) -> None:
        self.tmp.remove()


class _PrwlockRW:
    label = "prwlock"

    def __init__(self) -> None:
        import prwlock
        self.lock = prwlock.RWLock()

    def read(self) -> None:
        self.lock.acquire_read()

    def write(self) -> None:
        self.lock.acquire_write()

    def unread(self) -> None:
        self.lock.release()

    unwrite = unread

    def close(self) -> None:
        pass


class _FastenersRW:
    label = "fasteners"

    def __init__(self) -> None:
        import fasteners
        self.tmp = _TempFile()
        self.lock = fasteners.InterProcessReaderWriterLock(self.tmp.path)

    def read(self) -> None:
        self.lock.acquire_read_lock()

    def unread(self) -> None:
        self.lock.release_read_lock()

    def write(self) -> None:
        self.lock.acquire_write_lock()

    def unwrite(self) -> None:
        self.lock.release_write_lock()

    def close(self) -> None:
        self.tmp.remove()


class _FilelockRW:
    label = "filelock"

    def __init__(self) -> None:
        # Imported here, in the parent, so that a missing filelock is
        # reported as such before any process forks; the lock itself is
        # made in each process (filelock's lock is per process).
        import filelock
        self.filelock = filelock
        self.tmp = _TempFile()
        self.lock: Any = None

    def _lock(self) -> Any:
        if self.lock is None:   # made after fork, in the process that uses it
            self.lock = self.filelock.ReadWriteLock(self.tmp.path + ".lock",
                                                    is_singleton=False)
        return self.lock

    def read(self) -> None:
        self._lock().acquire_read()

    def write(self) -> None:
        self._lock().acquire_write()

    def unread(self) -> None:
        self._lock().release()

    unwrite = unread

    def close(self) -> None:
        self.tmp.remove()


RW_PEERS: List[Callable[[], Any]] = [_PyshmlockRW, _FlockRW, _PrwlockRW, _FastenersRW,
                                      _FilelockRW]
