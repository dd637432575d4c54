"""State the demo server's processes share, besides the lock itself.

* The simulated model: two weight shards, each with a version.  A weight
  update writes shard A, works for a while, then writes shard B, with
  `updating` set in between.  The scheduler records a violation whenever it
  generates a token while `updating` is set or the shards disagree.
* Counters for the scenario table.
* The engine lock: a second pyshmlock lock.  The scheduler holds a read of it
  for each generation step; `quiesce()` takes and drops its write hold, which
  waits out a step in progress.  After a pause, that is the scheduler's
  acknowledgement that no token is being generated (SGLang's scheduler
  answers a pause request the same way).
"""
import multiprocessing as mp
import os
import signal
import time
from typing import Any

from pyshmlock.lock import RWLock, unlink

CTX = mp.get_context("fork")

# Pause modes, as SGLang's /pause_generation takes them.
MODES = {"abort": 1, "in_place": 2, "retract": 3}
MODE_NAMES = {v: k for k, v in MODES.items()}

_FIELDS = ("shard_a", "shard_b", "updating", "violations_updating", "violations_mixed",
           "tokens", "aborted", "retracted", "pause_mode", "scheduler_paused", "updates")


class SharedState:
    """Counters in one shared array (inherited by forked processes)."""

    def __init__(self) -> None:
        self._a = CTX.RawArray("q", len(_FIELDS))
        self._mu = CTX.Lock()     # guards read-modify-write of counters

    def __getattr__(self, key: str) -> int:
        if key in _FIELDS:
            return int(self._a[_FIELDS.index(key)])
        raise AttributeError(key)

    def set(self, key: str, value: int) -> None:
        self._a[_FIELDS.index(key)] = value

    def add(self, key: str, delta: int = 1) -> int:
        with self._mu:
            i = _FIELDS.index(key)
            self._a[i] += delta
            return int(self._a[i])

    @property
    def violations(self) -> int:
        return self.violations_updating + self.violations_mixed

    def snapshot(self) -> dict:
        return {k: int(self._a[i]) for i, k in enumerate(_FIELDS)}


def engine_lock_name(name: str) -> str:
    return name + ".engine"


def quiesce(engine: RWLock, timeout: float = 10.0) -> bool:
    """Wait until the scheduler is between generation steps (see module doc)."""
    if not engine.acquire_write(timeout):
        return False
    engine.release_write()
    return True


def swap_weights(state: SharedState, seconds: float) -> int:
    """The simulated weight update: shard A, work, shard B."""
    version = state.shard_a + 1
    state.set("updating", 1)
    state.set("shard_a", version)
    time.sleep(seconds)
    state.set("shard_b", version)
    state.set("updating", 0)
    state.add("updates")
    return version


def new_state() -> Any:
    return SharedState()


PR_SET_PDEATHSIG = 1   # linux/prctl.h


def die_with_parent(parent_pid: int, on_term: Any = signal.SIG_DFL) -> bool:
    """In a demo child: have the kernel send SIGTERM to this process when the
    demo's main process dies, however it dies (SIGKILL, a crash).  SIGHUP gets
    its default action back and SIGTERM gets on_term (the child inherited the
    main's handlers); on_term is installed before the death signal is asked
    for, so that a SIGTERM for a main that dies right now finds it.  False if
    the main already died: the caller stops now.

    The kernel sends the signal when the *thread* that forked the child exits
    (the demo forks from its main thread), and again each time the child is
    handed to another thread of the same process.  The main has other threads
    (the C core's lease watchdog, executor threads) that may outlive its main
    thread for a moment: the first SIGTERM can come while getppid() still
    names the main.  :func:`orphaned` waits that moment out."""
    import ctypes
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, on_term)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    return os.getppid() == parent_pid   # else it died before prctl took effect


def orphaned(parent_pid: int, wait: float) -> bool:
    """True once the demo's main process is gone: this process was handed to
    a reaper outside it.  Waits up to `wait` seconds for that (the main's last
    threads may still be exiting, see :func:`die_with_parent`)."""
    deadline = time.monotonic() + wait
    while os.getppid() == parent_pid:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


ORPHAN_WAIT_S = 10.0   # how long a child that got SIGTERM waits for the main to be gone


def remove_locks_if_orphaned(name: str, parent_pid: int, wait: float) -> None:
    """In a demo child that is ending: if the main process died without
    cleaning up, remove the demo's locks, which the main would have done.
    Every child that dies with the main does this (whichever ends first; the
    names are unique to this demo run, so a later unlink finds nothing).
    Processes still attached keep working on the old segments until they exit."""
    if not parent_pid or not orphaned(parent_pid, wait):
        return
    for n in (name, engine_lock_name(name)):
        try:
            unlink(n, force=True)
        except FileNotFoundError:
            pass
