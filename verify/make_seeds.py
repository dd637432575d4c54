"""Write the fuzzers' seed segments (verify/fuzz-seeds/) from real locks.

Each seed is a byte-for-byte copy of a segment that the library itself made
and left in a known state, so the seeds follow every layout change:

    fresh-1           a new lock, max_processes=1, this process attached
    lease-expired-2   max_processes=2, a host lease that has already passed
    paused-reading-3  max_processes=3, paused while this process holds a read
    session-fenced-2  max_processes=2, an update session pins the pause, a
                      fence raised and a fenced update applied

    python verify/make_seeds.py     # after a layout change; then commit them
"""
import os
import sys
import uuid

import pyshmlock
from pyshmlock._args import segment_path
from pyshmlock.cluster._lease import lease_arm

SEEDS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz-seeds")


def _snapshot(lock: pyshmlock.RWLock, seed: str) -> None:
    with open(segment_path(lock.name), "rb") as f:
        data = f.read()
    with open(os.path.join(SEEDS, seed), "wb") as f:
        f.write(data)
    print(f"{seed}: {len(data)} bytes")


def main() -> int:
    tag = f"seed-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    made = []
    try:
        lk = pyshmlock.RWLock(f"{tag}-1", max_processes=1)
        made.append(lk)
        _snapshot(lk, "fresh-1")

        lk = pyshmlock.RWLock(f"{tag}-2", max_processes=2)
        made.append(lk)
        lease_arm(lk, -1.0)          # already passed
        _snapshot(lk, "lease-expired-2")

        lk = pyshmlock.RWLock(f"{tag}-3", max_processes=3)
        made.append(lk)
        assert lk.acquire_read(1)
        assert lk.pause()
        _snapshot(lk, "paused-reading-3")
        lk.release_read()

        lk = pyshmlock.RWLock(f"{tag}-4", max_processes=2)
        made.append(lk)
        lk.raise_fence(41)
        with lk.fenced_update(42):
            pass
        token = lk.begin_session(ttl=60)
        _snapshot(lk, "session-fenced-2")
        lk.end_session(token)
    finally:
        for lk in made:
            name = lk.name
            lk.close()
            pyshmlock.unlink(name, force=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
