"""pyshmlock: a cross-process reader/writer lock with a built-in pause gate.

Every process that opens a lock by name shares one state word in POSIX
shared memory, so all of them see one global "paused" and one reader/writer
lock, changed atomically.  See README.md for a tour and docs/DESIGN.md for
the protocol.
"""
from importlib import metadata as _metadata
import platform as _platform
import sys as _sys

if not _sys.platform.startswith("linux"):
    raise ImportError(
        f"pyshmlock needs Linux (shared futexes, POSIX shared memory and robust "
        f"process-shared mutexes); this platform is {_sys.platform!r}")
if _platform.machine() not in ("x86_64", "aarch64", "arm64"):
    raise ImportError(
        f"pyshmlock supports Linux on x86-64 and arm64; this machine is "
        f"{_platform.machine()!r}")

from .errors import (  # noqa: E402
    CorruptSegmentError,
    ForeignSegmentError,
    LayoutVersionError,
    LockInUseError,
    NotHeldError,
    PyshmlockError,
    SegmentError,
    SegmentSizeError,
    TooManyProcessesError,
    TooManyReadHoldsError,
    UninitializedSegmentError,
    WouldDeadlockError,
)
from .lock import (AttachedProcess, LockInfo, Recovery, RWLock, SyncHold,  # noqa: E402
                   inspect, unlink)
from .aio import AsyncHold, AsyncRWLock  # noqa: E402

# One version, written once (pyproject.toml), read back from the installed
# metadata.  A checkout that was never installed says so.
try:
    __version__ = _metadata.version("pyshmlock")
except _metadata.PackageNotFoundError:  # pragma: no cover
    __version__ = "0+unknown"

__all__ = [
    "RWLock", "AsyncRWLock", "SyncHold", "AsyncHold", "LockInfo", "Recovery",
    "AttachedProcess", "unlink", "inspect",
    "PyshmlockError", "SegmentError", "ForeignSegmentError", "LayoutVersionError",
    "CorruptSegmentError", "SegmentSizeError", "UninitializedSegmentError",
    "TooManyProcessesError", "NotHeldError", "WouldDeadlockError", "LockInUseError",
    "TooManyReadHoldsError",
]
