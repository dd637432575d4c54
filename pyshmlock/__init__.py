"""pyshmlock: a cross-process reader/writer lock with a built-in pause gate.

Every process that opens a lock by name shares one state word in POSIX
shared memory, so all of them see one global "paused" and one reader/writer
lock, changed atomically.  See README.md for a tour and docs/DESIGN.md for
the protocol.
"""
import platform as _platform
import sys as _sys
from importlib import metadata as _metadata

if not _sys.platform.startswith("linux"):
    raise ImportError(
        f"pyshmlock needs Linux (shared futexes, POSIX shared memory and robust "
        f"process-shared mutexes); this platform is {_sys.platform!r}")
if _platform.machine() not in ("x86_64", "aarch64", "arm64"):
    raise ImportError(
        f"pyshmlock supports Linux on x86-64 and arm64; this machine is "
        f"{_platform.machine()!r}")

from . import _built  # noqa: F401  (first: a checkout never built says so)
from ._members import FencedUpdate
from .aio import AsyncHold, AsyncRWLock
from .errors import (
    CorruptSegmentError,
    DataSuspectError,
    FencingError,
    ForeignSegmentError,
    LayoutVersionError,
    LockClosingError,
    LockInUseError,
    ManagedLockError,
    NoCrashRecoveryError,
    NotHeldError,
    PyshmlockError,
    SegmentError,
    SegmentSizeError,
    SessionError,
    TooManyProcessesError,
    TooManyReadHoldsError,
    UninitializedSegmentError,
    WouldDeadlockError,
)
from .lock import (
    DEFAULT_SESSION_TTL,
    MAX_SESSION_TTL,
    AttachedProcess,
    LockInfo,
    Recovery,
    RWLock,
    SessionInfo,
    SyncHold,
    inspect,
    segment_size,
    unlink,
)

# One version, written once (pyproject.toml), read back from the installed
# metadata.  A checkout that was never installed says so.
try:
    __version__ = _metadata.version("pyshmlock")
except _metadata.PackageNotFoundError:  # pragma: no cover
    __version__ = "0+unknown"

__all__ = [
    "DEFAULT_SESSION_TTL",
    "MAX_SESSION_TTL",
    "AsyncHold",
    "AsyncRWLock",
    "AttachedProcess",
    "CorruptSegmentError",
    "DataSuspectError",
    "FencedUpdate",
    "FencingError",
    "ForeignSegmentError",
    "LayoutVersionError",
    "LockClosingError",
    "LockInUseError",
    "LockInfo",
    "ManagedLockError",
    "NoCrashRecoveryError",
    "NotHeldError",
    "PyshmlockError",
    "RWLock",
    "Recovery",
    "SegmentError",
    "SegmentSizeError",
    "SessionError",
    "SessionInfo",
    "SyncHold",
    "TooManyProcessesError",
    "TooManyReadHoldsError",
    "UninitializedSegmentError",
    "WouldDeadlockError",
    "inspect",
    "segment_size",
    "unlink",
]
