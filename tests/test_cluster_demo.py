"""`pyshmlock cluster-demo` runs the real commands: a 3-member etcd, 3 hosts
driven through pyshmlock.cluster and through the HTTP fan-out; it must pass,
fit 100 columns and leave no process, etcd data dir or segment behind."""
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from pyshmlock_lab.cluster.localetcd import etcd_binary

if etcd_binary() is None and os.environ.get("PYSHMLOCK_REQUIRE_ETCD") != "1":
    pytest.skip("etcd is not installed (Debian: apt-get install etcd-server)",
                allow_module_level=True)


def _leftovers(pid):
    segs = [f for f in os.listdir("/dev/shm") if f.startswith(f"pyshmlock.cdemo-{pid}-")]
    kids = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return segs, kids


def _env(tmp_path):
    """The demo's temp dirs (its own, and etcd's data) go under tmp_path."""
    return dict(os.environ, TMPDIR=str(tmp_path))


def _tmp_left(tmp_path):
    return [f for f in os.listdir(tmp_path) if f.startswith("pyshmlock-")]


def _etcd_of(tmp_path):
    """Running etcd processes whose data dir is under tmp_path: this test's
    own (another test run's etcds on the machine are none of its business)."""
    out = subprocess.run(["pgrep", "-f", f"data-dir {tmp_path}/.*pyshmlock-etcd-"],
                         capture_output=True, text=True).stdout
    return out.split()


@pytest.mark.timeout(150)
def test_cluster_demo_passes_and_cleans_up(tmp_path):
    p = subprocess.Popen([sys.executable, "-m", "pyshmlock", "cluster-demo"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=_env(tmp_path))
    try:
        stdout, stderr = p.communicate(timeout=140)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(5)
    assert p.returncode == 0, stdout[-3000:] + stderr[-3000:]
    table = stdout[stdout.index("scenario"):]
    assert all(len(ln) <= 100 for ln in table.splitlines())
    assert table.count("PASS") >= 6 and "pyshmlock.cluster passed 5/5" in table
    assert "FAIL" in table        # the fan-out column shows the races it has
    assert "x one etcd write round-trip" in table
    segs, _ = _leftovers(p.pid)
    assert segs == []
    assert _etcd_of(tmp_path) == []
    assert _tmp_left(tmp_path) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_cluster_demo_signal_leaves_nothing(sig, tmp_path):
    p = subprocess.Popen([sys.executable, "-m", "pyshmlock", "cluster-demo"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         env=_env(tmp_path))
    try:
        line = ""
        give_up = time.monotonic() + 40
        while "hosts x" not in line:          # etcd and the first hosts are up
            line = p.stdout.readline()
            assert line and time.monotonic() < give_up, "the demo did not start"
        p.send_signal(sig)
        p.wait(30)
        give_up = time.monotonic() + 10
        while True:
            out = subprocess.run(["pgrep", "-af", "pyshmlock_lab.cluster.simhost|pyshmlock agent"],
                                 capture_output=True, text=True).stdout
            mine = [ln for ln in out.splitlines() if f"cdemo-{p.pid}-" in ln]
            etcds = _etcd_of(tmp_path)
            if not mine and not etcds:
                break
            assert time.monotonic() < give_up, f"left running: {mine} {etcds}"
            time.sleep(0.1)
        if sig != signal.SIGKILL:
            assert _leftovers(p.pid)[0] == []
            assert _tmp_left(tmp_path) == []
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(5)
        # SIGKILL runs no code: its children die with it (PDEATHSIG), but its
        # segments and temp dirs stay; and a failed check above must not
        # leave them either.
        for f in _leftovers(p.pid)[0]:
            os.unlink(os.path.join("/dev/shm", f))
        for f in _tmp_left(tmp_path):
            shutil.rmtree(os.path.join(tmp_path, f), ignore_errors=True)
