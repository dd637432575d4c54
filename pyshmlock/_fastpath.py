"""Wiring of the C fast path (``pyshmlock._fast``, source ``csrc/fastpath/``).

The fast module does not contain the C core: it calls the core's entry
points through a table of addresses taken here from the cffi module, so a
process has exactly one copy of the core's code and static state.  It also
gets the error mapping its slow path needs.  Importing this module does the
setup, so the base types are ready before any class that subclasses them
exists.  The timeout rule (:func:`deadline_ns`) and the names of the kinds
of attempt (:data:`KINDS`) are the fast module's, defined there once.
"""
import collections.abc
from typing import Any, Dict

from . import _fast
from ._shmlock import ffi, lib
from .errors import error_for

__all__ = ["CALL_NAMES", "KINDS", "AsyncLock", "Attempt", "Done", "Hold", "Lock",
           "address", "deadline_ns", "setup"]

# Every entry point the fast module calls.
ENTRY_POINTS = ("shl_try", "shl_fast_handle", "shl_fast_try", "shl_fast_read",
                "shl_fast_exclusive", "shl_fast_release_read", "shl_fast_release_exclusive",
                "shl_release_read", "shl_release_write", "shl_release_update",
                "shl_close_begin", "shl_close_finish", "shl_wait",
                "shl_cancel", "shl_is_paused", "shl_session_pin")

Lock = _fast.Lock
AsyncLock = _fast.AsyncLock
Hold = _fast.Hold
Attempt = _fast.Attempt
Done = _fast.Done

#: The timeout rule: seconds -> absolute CLOCK_MONOTONIC deadline in ns
#: (-1 forever, 0 try once).  See csrc/fastpath/calls.c.
deadline_ns = _fast.deadline_ns

#: Every kind of attempt -> (hold word or None, call name, hold name or None).
KINDS = _fast.KINDS
#: Every kind of attempt -> the name of the call that makes it, for messages.
CALL_NAMES: Dict[int, str] = {code: names[1] for code, names in KINDS.items()}

# The awaitables quack like coroutines (send, throw, close, __await__), so
# asyncio.create_task() and asyncio.run() take them; say so explicitly.
collections.abc.Coroutine.register(Attempt)
collections.abc.Coroutine.register(Done)


def address(handle: Any) -> int:
    """The integer address of a cffi ``shl_lock *`` (0 for NULL)."""
    return int(ffi.cast("uintptr_t", handle))


def close_handle(handle: Any, owner: Any = None) -> int:
    """shl_close of a cffi ``shl_lock *``, begun with the GIL held (every
    close goes through here: the fast calls, which hold the GIL from start
    to end, skip the core's in-flight count because no close can begin
    during them); once the close is decided, ``owner`` (the RWLock closing,
    if any) forgets the handle before another thread can run."""
    return int(_fast.close(address(handle), owner))


def _error(rc: int, what: str, name: Any, err: int) -> BaseException:
    # error_for reads a system error from ffi.errno, which only cffi calls
    # set: carry the errno the fast module saw over to it.
    if rc == lib.SHL_ESYS:
        ffi.errno = err
    return error_for(rc, what, name)


def setup() -> None:
    """Hand the core's entry points and the error mapping to the fast module."""
    table = {name: int(ffi.cast("uintptr_t", ffi.addressof(lib, name)))
             for name in ENTRY_POINTS}
    _fast.setup(table, _error)


setup()
