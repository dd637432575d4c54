"""Stopping the real `pyshmlock demo --keep-running` by a
signal to its main process (or killing it outright) stops every child and
leaves nothing in /dev/shm."""
import os
import signal
import time

import pytest
from demo_process import running, start_kept_demo, stop_everything

pytestmark = pytest.mark.timeout(200)


def _children(pid):
    """Pids whose parent is pid (from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(entry))
    return out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL],
                         ids=lambda s: signal.Signals(s).name)
def test_a_signal_to_the_demo_stops_every_child(sig, tmp_path):
    err = open(tmp_path / "stderr", "w+")
    proc, _, name = start_kept_demo("--requests", "4", "--cycles", "10", stderr=err)
    kids = []
    try:
        kids = _children(proc.pid)
        assert len(kids) >= 3, kids           # scheduler + 2 workers + the spare
        proc.send_signal(sig)
        rc = proc.wait(30)
        assert rc == (-sig if sig == signal.SIGKILL else 128 + sig), rc
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            left = [k for k in kids if running(k)]
            shm = [f for f in os.listdir("/dev/shm") if name in f]
            if not left and not shm:
                break
            time.sleep(0.1)
        assert not left, f"children still running after {signal.Signals(sig).name}: {left}"
        err.seek(0)
        assert not shm, f"left in /dev/shm: {shm}; stderr: {err.read()}"
        if sig != signal.SIGKILL:
            err.seek(0)
            assert "Traceback" not in err.read()
    finally:
        stop_everything(proc, kids, name)
        err.close()


def _started(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def test_the_locks_go_with_a_killed_demo_even_if_its_scheduler_is_stopped(tmp_path):
    """The workers remove the locks too: cleanup after the main's death does
    not wait for the scheduler (stopped here, as a starved one would be)."""
    err = open(tmp_path / "stderr", "w+")
    proc, _, name = start_kept_demo("--requests", "4", "--cycles", "10", stderr=err)
    kids = []
    try:
        kids = sorted(_children(proc.pid), key=_started)
        assert len(kids) >= 3, kids
        sched = kids[0]                       # the demo starts it first
        os.kill(sched, signal.SIGSTOP)
        proc.kill()
        assert proc.wait(30) == -signal.SIGKILL
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            workers_left = [k for k in kids[1:] if running(k)]
            shm = [f for f in os.listdir("/dev/shm") if name in f]
            if not workers_left and not shm:
                break
            time.sleep(0.1)
        assert not workers_left, workers_left
        err.seek(0)
        assert not shm, f"left in /dev/shm: {shm}; stderr: {err.read()}"
        os.kill(sched, signal.SIGCONT)        # its SIGTERM is pending: it ends too
        deadline = time.monotonic() + 20
        while running(sched) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not running(sched)
    finally:
        stop_everything(proc, kids, name)
        err.close()
