"""Wiring of the C fast path (``pyshmlock._fast``, source ``csrc/fastpath/``).

The fast module does not contain the C core: it calls the core's entry
points through a table of addresses taken here from the cffi module, so a
process has exactly one copy of the core's code and static state.  It also
gets the two Python callables its slow path may need: the timeout rule for
the edge cases (``_deadline.deadline_ns``) and the error mapping.  Importing
this module does the setup, so the base types are ready before any class
that subclasses them exists.
"""
from typing import Any, Callable

from . import _fast
from ._deadline import deadline_ns
from ._shmlock import ffi, lib
from .errors import error_for

__all__ = ["Hold", "Lock", "address", "setup"]

# Every entry point the fast module calls.
ENTRY_POINTS = ("shl_try", "shl_wait", "shl_cancel", "shl_release_read",
                "shl_release_write", "shl_release_update", "shl_is_paused")

Lock = _fast.Lock
Hold = _fast.Hold


def address(handle: Any) -> int:
    """The integer address of a cffi ``shl_lock *`` (0 for NULL)."""
    return int(ffi.cast("uintptr_t", handle))


def _error(rc: int, what: str, name: Any, err: int) -> BaseException:
    # error_for reads a system error from ffi.errno, which only cffi calls
    # set: carry the errno the fast module saw over to it.
    if rc == lib.SHL_ESYS:
        ffi.errno = err
    return error_for(rc, what, name)


def setup(deadline_ns: Callable[[Any], int]) -> None:
    """Hand the core's entry points and the callbacks to the fast module."""
    table = {name: int(ffi.cast("uintptr_t", ffi.addressof(lib, name)))
             for name in ENTRY_POINTS}
    _fast.setup(table, deadline_ns, _error)


setup(deadline_ns)
