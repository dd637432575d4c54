"""The bench and demo tables fit the terminal width."""
import os
import re
import subprocess
import sys

import pytest

from pyshmlock_lab import bench
from pyshmlock_lab.demo import format_table

pytestmark = pytest.mark.timeout(150)


def _words(text):
    return set(re.findall(r"[A-Za-z0-9_.()]+", text))


@pytest.mark.parametrize("width", [80, 100])
def test_bench_table_fits(width):
    res = {"pause_to_wake": bench.pause_to_wake([2], 3),
           "kill_to_recovery": bench.kill_to_recovery(2)}
    wide = bench.format_report(res, width=1000)
    report = bench.format_report(res, width=width)
    assert max(len(ln) for ln in report.splitlines()) <= width, report
    assert _words(report) == _words(wide)          # nothing lost, only wrapped


def test_demo_table_fits_80_columns():
    rows = [("pause to A, update to B, both orders + jitter",
             "no deadlock; update runs under the pause within 1 s",
             "continue returned after 459 ms (after the update ended); 0 tokens generated "
             "during the update and a very long observation to wrap", True, 1.3),
            ("token-version violations", "zero, throughout", "0 tokens", False, 0.0)]
    table = format_table(rows, width=80)
    assert max(len(ln) for ln in table.splitlines()) <= 80, table
    assert _words(table) == _words(format_table(rows, width=1000))
    assert "FAIL" in table and "PASS" in table


def test_real_demo_at_80_columns():
    p = subprocess.run([sys.executable, "-m", "pyshmlock", "demo", "--workers", "2",
                        "--requests", "4", "--cycles", "20"], capture_output=True, text=True,
                       timeout=120, cwd="/", env=dict(os.environ, COLUMNS="80"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "8/8 scenarios passed" in p.stdout
    wide = [ln for ln in p.stdout.splitlines() if len(ln) > 80]
    assert not wide, wide
