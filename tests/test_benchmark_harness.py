"""The benchmark harness runs and reports (speed itself is bench/'s job)."""
import json
import shutil
import sys

import pytest

from pyshmlock_lab import bench

pytestmark = pytest.mark.timeout(120)


def test_cli_bench_quick_writes_json(tmp_path):
    import subprocess
    path = tmp_path / "out.json"
    p = subprocess.run([sys.executable, "-m", "pyshmlock", "bench", "--quick", "--json",
                        str(path)], capture_output=True, text=True, timeout=110, cwd="/")
    assert p.returncode == 0, p.stderr
    data = json.loads(path.read_text())
    assert data["quick"] is True
    # Every section produced figures for pyshmlock and its floors.
    assert data["read_throughput"]["pyshmlock x2"]["pairs_per_s"] > 0
    assert data["writer_starvation"]["pyshmlock"]["writer_acquisitions"] > 0
    labels = ["pyshmlock resume() x4", "pyshmlock asyncio task x4",
              "raw futex broadcast (floor) x4"]
    if sys.version_info >= (3, 10):         # os.eventfd
        labels.append("asyncio eventfd wake (floor) x4")
    for label in labels:
        row = data["pause_to_wake"][label]
        assert row["rounds"] == 7 and row["median_us"] > 0, row
    assert data["kill_to_recovery"]["pyshmlock dead writer"]["median_us"] > 0
    assert data["kill_to_recovery"]["pyshmlock dead reader"]["median_us"] > 0
    for section in ("read throughput", "writer starvation", "pause-to-wake",
                    "kill-to-recovery", "pyshmlock dead writer", "raw futex broadcast"):
        assert section in p.stdout, section


def test_uncontended_section_reports_pyshmlock_peers_and_floors():
    rows = bench.uncontended(rounds=3, n=200)
    for label in ("pyshmlock read pair", "pyshmlock with reader_lock", "pyshmlock write pair",
                  "pyshmlock paused", "multiprocessing.Lock pair"):
        assert rows[label]["median_ns"] > 0, label
    if "posix_ipc.Semaphore pair" in rows:
        assert rows["pyshmlock read pair"]["vs_posix_ipc"] > 0
    # Either both floors were built, or the report says why they were not.
    floors = [k for k in rows if k.startswith("floor")]
    assert len(floors) in (1, 2), floors
    # the asyncio rows, each beside asyncio.Lock on the same loop;
    # uvloop's are measured, or skipped with the reason
    for loop in ("asyncio", "uvloop"):
        for label in ("pyshmlock async with reader_lock",
                      "pyshmlock await acquire_read() + release_read()",
                      "asyncio.Lock async with"):
            row = rows[f"{label} ({loop})"]
            if "error" in row:
                assert loop == "uvloop" and "uvloop is not installed" in row["error"], row
            else:
                assert row["median_ns"] > 0 and row["vs_asyncio_lock"] > 0, (label, row)
    report = bench.format_report({"uncontended": rows}, width=1000)  # content, not layout
    assert "uncontended calls" in report and "pyshmlock read pair" in report
    assert "x asyncio.Lock on its loop" in report


@pytest.mark.timeout(300)
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind (callgrind)")
def test_instruction_counts_cover_every_uncontended_case():
    """callgrind counts each case's body in one child process; the counts are
    per iteration, net of the loop, and the report prints them beside the
    ratio to multiprocessing.Lock's pair."""
    rows = bench.instructions(n=300)
    assert "error" not in rows, rows
    for label in ("pyshmlock read pair", "pyshmlock read pair, timeout=5",
                  "pyshmlock write pair", "pyshmlock with reader_lock",
                  "multiprocessing.Lock pair", "multiprocessing.Lock with"):
        assert rows[label]["instructions"] > 50, (label, rows[label])
    assert rows["pyshmlock read pair"]["vs_multiprocessing_lock"] > 0
    # The two floors differ by what cffi adds to a call: the harness tells
    # them apart, so it counts the bodies and not the loop around them.
    assert (rows["floor: two bare C-API calls"]["instructions"]
            < rows["floor: two cffi calls"]["instructions"])
    report = bench.format_report({"instructions": rows}, width=1000)
    assert "instructions per call" in report and "multiprocessing.Lock pair" in report


def test_a_wake_run_for_some_peers_leaves_no_segment_or_semaphore():
    """pause_to_wake(only=...) made every peer's gate, then skipped the ones
    not asked for without closing them: each run (the fresh-process run of
    the wait path before 5.16 is one) left a pyshmlock segment and a POSIX
    semaphore in /dev/shm."""
    import os

    from pyshmlock_lab.bench.wake import pause_to_wake
    mine = f"-{os.getpid()}-"

    def ours():
        return {f for f in os.listdir("/dev/shm") if mine in f and "bench-" in f}
    before = ours()
    pause_to_wake([1], 1, only="pyshmlock resume")
    assert ours() - before == set()


# The optional peers, hidden from a fresh interpreter as if the `bench` extra
# were not installed (an import of one raises ModuleNotFoundError).
_PEERS_NOT_INSTALLED = """
import json, sys
PEERS = {"prwlock", "fasteners", "filelock", "posix_ipc", "sysv_ipc"}
class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in PEERS:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, NotInstalled())
from pyshmlock_lab.bench import kill_to_recovery, pause_to_wake, writer_starvation
print(json.dumps({"starvation": writer_starvation(0.2), "wake": pause_to_wake([2], 3),
                  "recovery": kill_to_recovery(2)}))
"""


def test_a_peer_not_installed_is_reported_as_such_not_run():
    """Every peer of the multi-process sections is found missing in the
    parent, before any process forks: its row says "not installed", and no
    child dies on the import (filelock's writer-starvation adapter imported
    it only after fork, so its children died with tracebacks and the row
    read "0 writer entries")."""
    import subprocess
    p = subprocess.run([sys.executable, "-c", _PEERS_NOT_INSTALLED], capture_output=True,
                       text=True, timeout=100, cwd="/")
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    sections = json.loads(p.stdout)
    for section in ("wake", "recovery"):
        for label, row in sections[section].items():
            if any(peer in label for peer in ("posix_ipc", "sysv", "fasteners", "filelock")):
                assert str(row.get("error", "")).startswith("not installed"), (label, row)
    rows = sections["starvation"]
    assert rows["pyshmlock"]["writer_acquisitions"] > 0, rows
    missing = {label: row for label, row in rows.items()
               if label not in ("pyshmlock", "fcntl.flock")}
    assert missing and all(row == {"error": f"not installed ({label})"}
                           for label, row in missing.items()), rows
