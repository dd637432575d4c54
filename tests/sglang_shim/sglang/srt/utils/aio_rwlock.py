"""Stand-in for sglang.srt.utils.aio_rwlock: RWLock is pyshmlock.AsyncRWLock
through the adapter (tests/sglang_adapter.py)."""
from sglang_adapter import SGLangShapedRWLock as RWLock

__all__ = ["RWLock"]
