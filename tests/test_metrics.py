"""Prometheus metrics: `pyshmlock status --format prometheus` and the
prometheus_client collector, parsed by prometheus_client's own parser, follow
a pause, a resume and a SIGKILLed holder."""
import os
import signal
import subprocess
import sys

import pytest

import pyshmlock
from pyshmlock.metrics import METRICS, LockCollector

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def parse(text, lock):
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.labels.get("lock") != lock:
                continue
            key = s.name if "kind" not in s.labels else f"{s.name}:{s.labels['kind']}"
            out[key] = s.value
    return out


def status_metrics(name):
    p = subprocess.run([sys.executable, "-m", "pyshmlock", "status", name, "--format",
                        "prometheus"], capture_output=True, text=True, timeout=30, cwd="/")
    assert p.returncode == 0, p.stderr
    return parse(p.stdout, name)


def collector_metrics(name):
    reg = prometheus_client.CollectorRegistry(auto_describe=False)
    reg.register(LockCollector([name, "no-such-lock-" + name]))
    return parse(prometheus_client.generate_latest(reg).decode(), name)


def _hold_write(q, name):
    lk = pyshmlock.RWLock(name)
    assert lk.acquire_write(5)
    q.put("holding")
    signal.pause()


@pytest.mark.parametrize("scrape", [status_metrics, collector_metrics])
def test_metrics_follow_pause_resume_and_a_killed_holder(lock, children, scrape):
    m = scrape(lock.name)
    # every metric family of the table is there, with its lock label
    for metric in METRICS:
        name = metric.name + ("_total" if metric.kind == "counter" else "")
        assert any(k.split(":")[0] == name for k in m), (name, m)
    assert m["pyshmlock_paused"] == 0 and m["pyshmlock_paused_seconds"] == 0
    assert m["pyshmlock_attached_processes"] == 1 and m["pyshmlock_readers"] == 0

    assert lock.pause()
    assert lock.acquire_read(0) is False
    m = scrape(lock.name)
    assert m["pyshmlock_paused"] == 1 and m["pyshmlock_pauses_total"] == 1
    assert m["pyshmlock_paused_seconds"] >= 0
    assert lock.resume(5)
    assert lock.acquire_read(5)
    m = scrape(lock.name)
    assert m["pyshmlock_paused"] == 0 and m["pyshmlock_readers"] == 1
    lock.release_read()

    c = children(_hold_write, lock.name)
    c.expect("holding")
    m = scrape(lock.name)
    assert m["pyshmlock_exclusive_held:write"] == 1 and m["pyshmlock_exclusive_held:update"] == 0
    assert m["pyshmlock_attached_processes"] == 2
    os.kill(c.pid, signal.SIGKILL)
    c.join(10)
    assert lock.acquire_write(10)          # reclaims the dead writer's hold
    lock.release_write()
    assert lock.pause() and lock.acquire_update(5)
    m = scrape(lock.name)
    assert m["pyshmlock_recoveries_total"] == 1
    assert m["pyshmlock_exclusive_held:update"] == 1 and m["pyshmlock_exclusive_held:write"] == 0
    assert m["pyshmlock_attached_processes"] == 1
    lock.release_update()
    assert lock.resume(5)


def test_data_suspect_while_a_dead_writer_is_not_reclaimed(lock, children):
    c = children(_hold_write, lock.name)
    c.expect("holding")
    os.kill(c.pid, signal.SIGKILL)
    c.join(10)
    # An observer reclaims nothing, but reports the dead holder's data as suspect.
    assert status_metrics(lock.name)["pyshmlock_data_suspect"] == 1
    assert lock.acquire_write(10)
    lock.release_write()                   # a completed write clears it
    assert status_metrics(lock.name)["pyshmlock_data_suspect"] == 0


def test_exposition_escapes_and_types():
    from pyshmlock.metrics import exposition
    info = pyshmlock.LockInfo(
        name='we"ird', paused=True, paused_by_pid=1, paused_at=100.0, pause_count=3,
        writer_pid=None, updater_pid=None, exclusive_granted=False, readers={}, waiters={},
        queued_readers={}, attached_pids=[], epoch=0, max_processes=1, data_suspect=False)
    text = exposition([info], now=110.0)
    m = parse(text, 'we"ird')
    assert m["pyshmlock_paused_seconds"] == 10.0 and m["pyshmlock_pauses_total"] == 3
    assert "# TYPE pyshmlock_pauses_total counter" in text
