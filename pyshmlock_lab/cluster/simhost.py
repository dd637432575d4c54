"""A simulated host's worker: a process that keeps taking read holds on the
host's lock and logs each admission (used by the cluster tests and demo).

``python -m pyshmlock_lab.cluster.simhost LOCK LOGFILE HOLD_S [create]``

Each admitted read appends ``<t_before> <t_admitted> <t_released>`` in
CLOCK_MONOTONIC seconds (all simulated hosts share one machine, so their
clocks compare).  ``t_before`` is taken before the acquire starts, so a line
whose ``t_before`` is after some instant proves a read admitted after it.
The worker opens the lock with create=False, so it never makes a fresh,
unpaused segment behind its agent's back; with ``create`` it opens as a real
server does (``RWLock(name)``: create if missing, stale="reset"), which is
how the tests show that a host declared a cluster member fails closed
whatever starts first.  It exits on SIGTERM.
"""
from __future__ import annotations

import signal
import sys
import time
from typing import List

from pyshmlock.lock import RWLock


def main(argv: List[str]) -> int:
    lock_name, log_path, hold = argv[0], argv[1], float(argv[2])
    create = len(argv) > 3 and argv[3] == "create"
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    deadline = time.monotonic() + 30
    while True:
        try:
            lk = RWLock(lock_name) if create else RWLock(lock_name, create=False)
            break
        except FileNotFoundError:
            if time.monotonic() > deadline:
                return 2
            time.sleep(0.02)
    with open(log_path, "a", buffering=1) as log:
        while not stop:
            t0 = time.monotonic()
            if not lk.acquire_read(timeout=0.05):
                continue
            t1 = time.monotonic()
            if hold:
                time.sleep(hold)
            else:
                time.sleep(0.002)
            t2 = time.monotonic()
            lk.release_read()
            log.write(f"{t0:.6f} {t1:.6f} {t2:.6f}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
