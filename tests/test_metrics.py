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


# ------------------------------------------- a scrape never fails; alerting

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RULES = os.path.join(ROOT, "docs", "prometheus")


def _plant(name, data):
    path = f"/dev/shm/pyshmlock.{name}"
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600)


def test_a_collector_never_raises_and_says_what_it_could_not_read(lock, lock_name):
    import struct
    foreign, other, missing = lock_name + "-f", lock_name + "-v2", lock_name + "-none"
    _plant(foreign, b"not a lock at all" * 100)
    with open(f"/dev/shm/pyshmlock.{lock_name}", "rb") as f:
        seg = bytearray(f.read())
    struct.pack_into("<I", seg, 4, 2)              # the same lock, as layout 2 wrote it
    _plant(other, bytes(seg))
    try:
        reg = prometheus_client.CollectorRegistry(auto_describe=False)
        reg.register(LockCollector([foreign, other, missing, lock_name]))
        text = prometheus_client.generate_latest(reg).decode()
    finally:
        for n in (foreign, other):
            os.unlink(f"/dev/shm/pyshmlock.{n}")
    fams = {(s.name, s.labels.get("lock"), s.labels.get("error", "")): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert fams[("pyshmlock_lock_readable", foreign, "ForeignSegmentError")] == 0
    assert fams[("pyshmlock_lock_readable", other, "LayoutVersionError")] == 0
    assert fams[("pyshmlock_lock_present", missing, "")] == 0
    assert fams[("pyshmlock_lock_present", lock_name, "")] == 1
    assert fams[("pyshmlock_lock_readable", lock_name, "")] == 1
    assert fams[("pyshmlock_max_processes", lock_name, "")] == 256
    assert ("pyshmlock_paused", foreign, "") not in fams, "no lock metrics for what it cannot read"


def test_the_alert_rules_name_only_metrics_that_exist():
    import re
    with open(os.path.join(RULES, "alerts.yml")) as f:
        text = f.read()
    names = {m.name + ("_total" if m.kind == "counter" else "") for m in METRICS}
    used = set(re.findall(r"\bpyshmlock_[a-z_]+", text))
    assert used and used <= names, used - names


@pytest.mark.skipif(__import__("shutil").which("promtool") is None and
                    os.environ.get("PYSHMLOCK_REQUIRE_PROMTOOL") != "1",
                    reason="promtool is not installed (Debian: apt-get install prometheus)")
def test_the_documented_alert_rules_pass_promtool():
    p = subprocess.run(["promtool", "test", "rules", "alerts_test.yml"], cwd=RULES,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.parametrize("names,error", [
    ("model-weights", TypeError),          # a str would watch one lock per character
    (b"model-weights", TypeError),
    ([123], TypeError),                    # would make every scrape raise
    ([None], TypeError),
    (["bad/name"], ValueError),            # would report a lock that cannot exist as present
    ([""], ValueError),
    (["x" * 201], ValueError),
    (42, TypeError),                       # not iterable
])
def test_a_collector_refuses_bad_names_when_it_is_made(names, error):
    with pytest.raises(error):
        LockCollector(names)


def test_a_collector_takes_any_iterable_of_valid_names(lock):
    c = LockCollector(n for n in [lock.name])
    assert c.names == [lock.name]
    assert LockCollector(()).names == []
