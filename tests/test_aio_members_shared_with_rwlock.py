"""The members of a lock that never wait (pause, the session and fence
members, info, attached, the refusal of `with lock:`, pickling) are one
implementation for RWLock and AsyncRWLock, not a second copy that forwards
by hand: the asyncio view behaves as the blocking one on the same segment."""
import asyncio
import pickle

import pytest

import pyshmlock
from pyshmlock._members import _NonWaitingMembers

pytestmark = pytest.mark.timeout(60)

SHARED = ("pause", "end_session", "session", "fence", "applied_update", "raise_fence",
          "fenced_update", "info", "attached", "__enter__", "__exit__", "__reduce__")


@pytest.mark.parametrize("member", SHARED)
def test_a_member_that_never_waits_is_written_once_for_both_apis(member):
    assert member in vars(_NonWaitingMembers)
    assert member not in vars(pyshmlock.RWLock) and member not in vars(pyshmlock.AsyncRWLock)
    assert (getattr(pyshmlock.RWLock, member) is getattr(pyshmlock.AsyncRWLock, member)
            is vars(_NonWaitingMembers)[member])


def test_the_asyncio_view_and_the_blocking_one_see_one_gate_sessions_and_fence(lock_name):
    async def main():
        lk = pyshmlock.RWLock(lock_name)
        a = pyshmlock.AsyncRWLock(lock_name)
        assert a.pause() is True and lk.pause() is False and lk.paused and a.paused
        token = await a.begin_session(ttl=30, timeout=5)
        assert lk.session.token == token == a.session.token
        lk.end_session(token)
        assert a.session is None
        assert a.raise_fence(7) == 7 and lk.fence == 7
        async with a.fenced_update(7):
            pass
        assert lk.applied_update == 7 == a.applied_update
        with pytest.raises(pyshmlock.FencingError):
            async with a.fenced_update(6):
                pass
        assert a.info().paused and lk.info().session is None
        with pytest.raises(TypeError, match="AsyncRWLock"):
            with a:
                pass
        with pytest.raises(TypeError, match="RWLock"):
            with lk:
                pass
        again = pickle.loads(pickle.dumps(a))
        assert type(again) is pyshmlock.AsyncRWLock and again.name == lock_name
        again.close()
        assert await a.resume(5) and not lk.paused
        async with pyshmlock.AsyncRWLock(lock_name).attached() as b:
            assert b.info().name == lock_name
        a.close()
        with pytest.raises(ValueError, match="closed"):
            a.info()
        lk.close()

    asyncio.run(asyncio.wait_for(main(), 30))
