"""The demo's scheduler process: generates tokens at a fixed pace for every
running request, and obeys pauses in SGLang's three modes.

  abort     running requests are aborted (their workers get "aborted")
  in_place  running requests stay, frozen, and continue after the pause
  retract   running requests are taken off the batch and put back on resume

Where it learns about pauses depends on the backend: with "shared" it reads
the shared lock's gate; with "local" it gets forwarded pause/continue
messages, as SGLang's scheduler does today.

Each generation step runs under a read hold of the engine lock (see
state.py), so a weight update can wait out a step in progress.
"""
import queue
import signal
import time
from typing import Any, Dict, List

from pyshmlock.lock import RWLock

from .state import (
    MODES,
    ORPHAN_WAIT_S,
    SharedState,
    die_with_parent,
    engine_lock_name,
    remove_locks_if_orphaned,
)

TICK_S = 0.01     # one token per running request every 10 ms


def scheduler_main(name: str, backend: str, state: SharedState, inbox: Any,
                   outboxes: List[Any], stop: Any, parent_pid: int = 0) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)    # the demo's parent stops us
    terminated: List[int] = []
    # SIGTERM arrives when the main process died (die_with_parent): finish
    # the step, then remove the demo's locks, which the main would have done.
    on_term = lambda *_: terminated.append(1)    # noqa: E731
    if not parent_pid:
        signal.signal(signal.SIGTERM, on_term)
    elif not die_with_parent(parent_pid, on_term):
        terminated.append(1)
    try:
        _serve(name, backend, state, inbox, outboxes, stop, terminated)
    finally:
        # After a SIGTERM, wait for the main to be gone altogether (the
        # signal can come while its last threads are still exiting).
        remove_locks_if_orphaned(name, parent_pid,
                                 ORPHAN_WAIT_S if terminated and not stop.is_set() else 0.0)


def _serve(name: str, backend: str, state: SharedState, inbox: Any, outboxes: List[Any],
           stop: Any, terminated: List[int]) -> None:
    engine = RWLock(engine_lock_name(name), create=False)
    lock = RWLock(name, create=False) if backend == "shared" else None
    local_paused, local_mode = False, MODES["in_place"]
    running: Dict[str, List[Any]] = {}      # rid -> [worker, max_tokens, produced]
    retracted: Dict[str, List[Any]] = {}
    pause_applied = False
    next_tick = time.monotonic()
    while not stop.is_set() and not terminated:
        # Messages from workers, waiting at most until the next step.
        try:
            msg = inbox.get(timeout=max(0.0, next_tick - time.monotonic()))
            kind = msg[0]
            if kind == "submit":
                _, worker, rid, n = msg
                running[rid] = [worker, n, 0]
            elif kind == "cancel":
                running.pop(msg[1], None)
                retracted.pop(msg[1], None)
            elif kind == "pause":          # local backend only
                _, worker, mode, ack = msg
                local_paused, local_mode = True, mode
                outboxes[worker].put(("sched_ack", ack))
            elif kind == "continue":       # local backend only
                _, worker, ack = msg
                local_paused = False
                outboxes[worker].put(("sched_ack", ack))
            continue
        except queue.Empty:
            pass
        next_tick = time.monotonic() + TICK_S
        engine.acquire_read()
        try:
            paused = lock.paused if lock is not None else local_paused
            mode = state.pause_mode if lock is not None else local_mode
            if paused:
                if not pause_applied:
                    pause_applied = True
                    if mode == MODES["abort"]:
                        for rid, (worker, _, _) in running.items():
                            outboxes[worker].put(("aborted", rid))
                        state.add("aborted", len(running))
                        running.clear()
                    elif mode == MODES["retract"]:
                        retracted.update(running)
                        state.add("retracted", len(running))
                        running.clear()
                state.set("scheduler_paused", 1)
                continue
            if pause_applied:
                pause_applied = False
                running.update(retracted)
                retracted.clear()
            state.set("scheduler_paused", 0)
            _step(state, running, outboxes)
        finally:
            engine.release_read()
    engine.close()
    if lock is not None:
        lock.close()


def _step(state: SharedState, running: Dict[str, List[Any]], outboxes: List[Any]) -> None:
    """One token for every running request, checked against the weights."""
    finished = []
    for rid, entry in running.items():
        worker, n, produced = entry
        a, b = state.shard_a, state.shard_b
        if state.updating:
            state.add("violations_updating")
        elif a != b:
            state.add("violations_mixed")
        outboxes[worker].put(("token", rid, produced, a))
        entry[2] = produced + 1
        if entry[2] >= n:
            outboxes[worker].put(("done", rid))
            finished.append(rid)
    for rid in finished:
        del running[rid]
    if running or finished:
        state.add("tokens", len(running) + len(finished))
