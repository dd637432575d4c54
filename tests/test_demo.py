"""`pyshmlock demo`: the SGLang-shaped server over real HTTP, both backends,
and the CLI against a running demo."""
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request

import pytest
from demo_process import start_kept_demo

pytestmark = pytest.mark.timeout(150)


def demo(*args, timeout=120):
    p = subprocess.run([sys.executable, "-m", "pyshmlock", "demo", *args],
                       capture_output=True, text=True, timeout=timeout, cwd="/")
    assert "Traceback" not in p.stderr, p.stderr
    return p


def rows(stdout):
    """scenario title -> PASS/FAIL, from the printed table."""
    out = {}
    for line in stdout.splitlines():
        m = re.match(r"\s+(PASS|FAIL)\s+(.+?)\s+\(\d", line)
        if m:
            out[m.group(2)] = m.group(1)
    return out


@pytest.mark.parametrize("workers", [2, 4])
def test_shared_backend_passes_every_scenario(workers):
    p = demo("--workers", str(workers), "--cycles", "200")
    assert p.returncode == 0, p.stdout + p.stderr
    r = rows(p.stdout)
    assert len(r) == 8 and set(r.values()) == {"PASS"}, r
    assert "8/8 scenarios passed on the shared backend" in p.stdout


@pytest.mark.parametrize("workers", [2, 4])
def test_local_backend_shows_the_cross_worker_failures(workers):
    p = demo("--workers", str(workers), "--backend", "local", "--cycles", "200")
    assert p.returncode == 1, p.stdout + p.stderr
    r = rows(p.stdout)
    assert len(r) == 8, r
    # Deterministic with per-worker flags: a late worker never hears of the
    # pause, and a continue on another worker does not wait for the update.
    assert r["worker started while paused"] == "FAIL"
    assert r["continue to C while B updates"] == "FAIL"
    assert r["token-version violations"] == "FAIL"


def get(url):
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def _scraped(base, lock):
    """GET base/metrics, parsed by prometheus_client's own parser: the
    samples of lock `lock` (without the kind-labelled ones), by name."""
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    return {s.name: s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.labels.get("lock") == lock and "kind" not in s.labels}


def cli(*args):
    p = subprocess.run([sys.executable, "-m", "pyshmlock", *args], capture_output=True,
                       text=True, timeout=30, cwd="/")
    assert "Traceback" not in p.stderr, p.stderr
    return p


def test_cli_against_a_running_demo():
    proc, text, name = start_kept_demo("--cycles", "40", timeout=100)
    try:
        assert "server left running" in text, text
        shared = re.search(r"curl -s (http://\S+)/health", text).group(1)
        assert name in cli("ls").stdout
        assert _scraped(shared, name)["pyshmlock_paused"] == 0.0
        assert cli("pause", name).returncode == 0
        assert get(shared + "/health")["paused"] is True      # the server sees the CLI's pause
        scraped = _scraped(shared, name)                      # a worker's /metrics follows it
        assert scraped["pyshmlock_paused"] == 1.0 and scraped["pyshmlock_pauses_total"] >= 1
        assert scraped["pyshmlock_attached_processes"] >= 3
        status = json.loads(cli("status", name, "--json").stdout)
        assert status["paused"] is True and len(status["attached_pids"]) >= 3
        watch = cli("watch", name, "--count", "1")
        assert watch.returncode == 0 and "paused        yes" in watch.stdout
        assert cli("resume", name, "--timeout", "5").returncode == 0
        assert get(shared + "/health")["paused"] is False
        req = urllib.request.Request(shared + "/generate", data=b'{"max_tokens": 3}',
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert json.loads(resp.read())["tokens"] == 3
        rm = cli("rm", name)
        assert rm.returncode == 1 and "live process(es) attached" in rm.stderr
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    assert not [f for f in os.listdir("/dev/shm") if name in f], "demo left its lock behind"
