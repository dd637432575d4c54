"""The benchmark harness runs and reports (speed itself is bench/'s job)."""
import json
import sys

import pytest

from pyshmlock import benchmark

pytestmark = pytest.mark.timeout(120)


def test_sections_produce_figures_for_pyshmlock():
    rt = benchmark.read_throughput([1, 2], 0.1)
    assert rt["pyshmlock x2"]["pairs_per_s"] > 0
    ws = benchmark.writer_starvation(0.3)
    assert ws["pyshmlock"]["writer_acquisitions"] > 0
    pw = benchmark.pause_to_wake([2], 3)
    labels = ["pyshmlock resume() x2", "pyshmlock asyncio task x2",
              "raw futex broadcast (floor) x2"]
    if sys.version_info >= (3, 10):         # os.eventfd
        labels.append("asyncio eventfd wake (floor) x2")
    for label in labels:
        assert pw[label]["rounds"] == 3 and pw[label]["median_us"] > 0, pw[label]
    kr = benchmark.kill_to_recovery(2)
    assert kr["pyshmlock dead writer"]["median_us"] > 0
    assert kr["pyshmlock dead reader"]["median_us"] > 0
    report = benchmark.format_report({"read_throughput": rt, "writer_starvation": ws,
                                      "pause_to_wake": pw, "kill_to_recovery": kr})
    assert "pyshmlock dead writer" in report and "raw futex broadcast" in report


def test_cli_bench_quick_writes_json(tmp_path):
    import subprocess
    path = tmp_path / "out.json"
    p = subprocess.run([sys.executable, "-m", "pyshmlock", "bench", "--quick", "--json",
                        str(path)], capture_output=True, text=True, timeout=110, cwd="/")
    assert p.returncode == 0, p.stderr
    data = json.loads(path.read_text())
    assert data["quick"] is True
    assert data["writer_starvation"]["pyshmlock"]["writer_acquisitions"] > 0
    assert data["kill_to_recovery"]["pyshmlock dead writer"]["median_us"] > 0
    assert "writer starvation" in p.stdout and "kill-to-recovery" in p.stdout


def test_uncontended_section_reports_pyshmlock_peers_and_floors():
    rows = benchmark.uncontended(rounds=3, n=200)
    for label in ("pyshmlock read pair", "pyshmlock with reader_lock", "pyshmlock write pair",
                  "pyshmlock paused", "multiprocessing.Lock pair"):
        assert rows[label]["median_ns"] > 0, label
    if "posix_ipc.Semaphore pair" in rows:
        assert rows["pyshmlock read pair"]["vs_posix_ipc"] > 0
    # Either both floors were built, or the report says why they were not.
    floors = [k for k in rows if k.startswith("floor")]
    assert len(floors) in (1, 2), floors
    report = benchmark.format_report({"uncontended": rows})
    assert "uncontended calls" in report and "pyshmlock read pair" in report
