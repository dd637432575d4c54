"""`pyshmlock demo`: the races from the SGLang pull requests, replayed across
real processes against one shared lock, with a table of what happened.

Each scenario starts "worker" processes (think tokenizer workers) that talk to
one lock by name.  Requests hold a read for their whole life; control
operations (pause, continue, weight update) are sent to *different* workers,
which is where per-process flags kept in step by broadcasts went wrong.
"""
import multiprocessing as mp
import os
import threading
import time
import uuid
from typing import Any, Callable, List, Tuple

from .lock import RWLock, unlink

CTX = mp.get_context("fork")
TIMEOUT = 10.0


def _worker(name: str, inbox: Any, outbox: Any) -> None:
    """A worker process: executes commands against the shared lock."""
    lk = RWLock(name, create=False)
    while True:
        cmd, arg = inbox.get(timeout=60)
        t0 = time.monotonic()
        if cmd == "stop":
            break
        if cmd == "request":            # admit a request: read hold for its life
            outbox.put(("admitted", lk.acquire_read(arg), time.monotonic() - t0))
        elif cmd == "finish":
            lk.release_read()
            outbox.put(("finished", True, 0.0))
        elif cmd == "pause":
            lk.pause()
            outbox.put(("paused", True, time.monotonic() - t0))
        elif cmd == "continue":
            outbox.put(("continued", lk.resume(arg), time.monotonic() - t0))
        elif cmd == "update":           # a weight swap taking `arg` seconds,
            # run beside the worker's requests as a server runs it in its own task
            threading.Thread(target=_update, args=(lk, arg, t0, outbox), daemon=True).start()
        elif cmd == "sample":           # does this worker see the lock paused?
            outbox.put(("sample", lk.paused, 0.0))
    lk.close()


def _update(lk: RWLock, seconds: float, t0: float, outbox: Any) -> None:
    ok = lk.acquire_update(TIMEOUT)
    waited = time.monotonic() - t0
    if not ok:
        outbox.put(("updated", None, waited))
        return
    was_paused = lk.paused
    time.sleep(seconds)
    still_paused = lk.paused
    lk.release_update()
    outbox.put(("updated", (was_paused, still_paused), waited))


class _Worker:
    def __init__(self, name: str) -> None:
        self.inbox = CTX.Queue()
        self.outbox = CTX.Queue()
        self.proc = CTX.Process(target=_worker, args=(name, self.inbox, self.outbox), daemon=True)
        self.proc.start()
        self.stash: List[Tuple[str, Any, float]] = []

    def send(self, cmd: str, arg: Any = None) -> None:
        self.inbox.put((cmd, arg))

    def reply(self, tag: str, timeout: float = TIMEOUT) -> Tuple[str, Any, float]:
        """The next reply tagged `tag`; others are kept for their own callers."""
        for i, r in enumerate(self.stash):
            if r[0] == tag:
                return self.stash.pop(i)
        end = time.monotonic() + timeout
        while True:
            r = self.outbox.get(timeout=max(0.0, end - time.monotonic()))
            if r[0] == tag:
                return r
            self.stash.append(r)

    def call(self, cmd: str, arg: Any = None, timeout: float = TIMEOUT) -> Tuple[str, Any, float]:
        self.send(cmd, arg)
        return self.reply(_REPLY_TAG[cmd], timeout)

    def stop(self) -> None:
        self.send("stop")
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


_REPLY_TAG = {"request": "admitted", "finish": "finished", "pause": "paused",
              "continue": "continued", "update": "updated", "sample": "sample"}

Row = Tuple[str, str, str, bool, float]


def _pause_continue_different_workers(ws: List[_Worker]) -> Row:
    ws[0].call("pause")
    seen_paused = [w.call("sample")[1] for w in ws]
    ws[-1].call("continue", TIMEOUT)
    seen_running = [not w.call("sample")[1] for w in ws]
    admitted = [w.call("request", 1.0)[1] for w in ws]
    for w in ws:
        w.call("finish")
    ok = all(seen_paused) and all(seen_running) and all(admitted)
    return ("pause on worker 0, continue on the last",
            "every worker paused, then every worker serves",
            f"paused {sum(seen_paused)}/{len(ws)}, serving {sum(admitted)}/{len(ws)}", ok, 0.0)


def _update_under_pause_with_frozen_requests(ws: List[_Worker]) -> Row:
    for w in ws:
        w.call("request", 1.0)              # in-flight requests, one per worker
    ws[0].call("pause")                     # generation frozen: requests never finish
    _, res, waited = ws[1].call("update", 0.2)
    for w in ws:
        w.call("finish")
    ws[2 % len(ws)].call("continue", TIMEOUT)
    ok = res is not None and waited < 1.0
    return ("update under pause, requests in flight everywhere",
            "update proceeds at once (no deadlock)",
            f"update started after {waited * 1000:.1f} ms", ok, waited)


def _pause_and_update_reordered(ws: List[_Worker]) -> Row:
    worst = 0.0
    ok = True
    for order in ("update-first", "pause-first"):
        for w in ws:
            w.call("request", 1.0)
        if order == "update-first":
            ws[1].send("update", 0.05)
            time.sleep(0.05)
            ws[0].call("pause")
        else:
            ws[0].call("pause")
            ws[1].send("update", 0.05)
        _, res, waited = ws[1].reply("updated")
        worst = max(worst, waited)
        ok = ok and res is not None and waited < 1.0
        for w in ws:
            w.call("finish")
        ws[-1].call("continue", TIMEOUT)
    return ("pause to worker 0 and update to worker 1, both orders",
            "no deadlock; update runs under the pause within 1 s",
            f"worst update wait {worst * 1000:.1f} ms", ok, worst)


def _continue_during_update(ws: List[_Worker]) -> Row:
    ws[0].call("pause")
    ws[1].send("update", 0.5)
    time.sleep(0.1)
    t0 = time.monotonic()
    _, resumed, _ = ws[2 % len(ws)].call("continue", TIMEOUT)
    resumed_after = time.monotonic() - t0
    _, flags, _ = ws[1].reply("updated")
    ok = bool(resumed) and flags == (True, True) and resumed_after >= 0.3
    return ("continue to worker 2 while worker 1 updates",
            "generation resumes only after the update ends",
            f"continue returned after {resumed_after * 1000:.0f} ms; "
            f"paused throughout the update: {flags == (True, True)}", ok, resumed_after)


def _unpaused_update_waits_for_requests(ws: List[_Worker]) -> Row:
    for w in ws:
        w.call("request", 1.0)
    ws[1].send("update", 0.05)
    time.sleep(0.2)
    blocked = [not w.call("request", 0.05)[1] for w in ws]   # new requests refused
    for w in ws:
        w.call("finish")
    _, res, waited = ws[1].reply("updated")
    ok = res is not None and all(blocked) and waited >= 0.15
    return ("update without pause, requests in flight on every worker",
            "waits for all of them, admits no new request meanwhile",
            f"waited {waited * 1000:.0f} ms; new requests refused on "
            f"{sum(blocked)}/{len(ws)} workers", ok, waited)


SCENARIOS: List[Callable[[List[_Worker]], Row]] = [
    _pause_continue_different_workers,
    _update_under_pause_with_frozen_requests,
    _pause_and_update_reordered,
    _continue_during_update,
    _unpaused_update_waits_for_requests,
]


def run_demo(workers: int = 4, out: Callable[[str], None] = print) -> bool:
    """Run every scenario with `workers` processes; print a table; return
    True if all passed."""
    workers = max(3, workers)
    name = f"demo-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    lock = RWLock(name)
    ws = [_Worker(name) for _ in range(workers)]
    rows: List[Row] = []
    try:
        out(f"pyshmlock demo: {workers} worker processes share the lock {name!r}\n")
        for scenario in SCENARIOS:
            t0 = time.monotonic()
            try:
                title, expected, observed, ok, _ = scenario(ws)
            except Exception as e:   # a hang shows up as a queue timeout
                title, expected, observed, ok = scenario.__name__, "-", f"error: {e!r}", False
            rows.append((title, expected, observed, ok, time.monotonic() - t0))
            out(f"  {'PASS' if ok else 'FAIL'}  {title}  ({time.monotonic() - t0:.2f} s)")
    finally:
        for w in ws:
            w.stop()
        lock.close()
        unlink(name, force=True)
    out("")
    out(format_table(rows))
    passed = sum(r[3] for r in rows)
    out(f"\n{passed}/{len(rows)} scenarios passed")
    return passed == len(rows)


def format_table(rows: List[Row]) -> str:
    head = ("scenario", "expected", "observed", "result", "time")
    body = [(r[0], r[1], r[2], "PASS" if r[3] else "FAIL", f"{r[4]:.2f} s") for r in rows]
    widths = [max(len(str(x[i])) for x in [head] + body) for i in range(5)]
    line = "  ".join("{:<%d}" % w for w in widths)
    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line.format(*head), sep] + [line.format(*b) for b in body])
