"""A hold granted by an asyncio call whose result cannot be made (no memory
for the completed awaitable or for the StopIteration that carries the
result) is given back: the caller gets MemoryError and nothing is held.
Allocation failures are injected with _testcapi.set_nomemory."""
import pytest

import pyshmlock

_testcapi = pytest.importorskip("_testcapi")


def _without_memory(call):
    _testcapi.set_nomemory(0, 0)        # every allocation from here fails
    try:
        return call()
    finally:
        _testcapi.remove_mem_hooks()


def test_a_granted_async_with_that_cannot_make_its_awaitable_holds_nothing(lock_name):
    alock = pyshmlock.AsyncRWLock(lock_name)
    try:
        enter = alock.read().__aenter__     # a short-lived hold: keeps no awaitable
        with pytest.raises(MemoryError):
            _without_memory(enter)
        assert alock.info().readers == {}
    finally:
        alock.close()


@pytest.mark.parametrize("kind", ["read", "write", "update"])
def test_a_granted_send_that_cannot_make_its_stop_iteration_holds_nothing(lock_name, kind):
    alock = pyshmlock.AsyncRWLock(lock_name)
    try:
        send = getattr(alock, f"acquire_{kind}")().send
        with pytest.raises(MemoryError):
            _without_memory(lambda: send(None))
        info = alock.info()
        assert info.readers == {} and info.writer_pid is None and info.updater_pid is None
    finally:
        alock.close()
