"""Every tool runs the validation that opening runs, slots included: a
segment with a valid header and a corrupt slot area is refused by an
opener, and reported as corrupt, with the reason, by the observers
(`inspect`, `pyshmlock status` and `ls`, the metrics), never shown as
billions of readers held by impossible pids; the command's pause refuses to
write into it.  (Shared memory is untrusted input: DESIGN §5.)"""
import os
import platform
import random
import struct
import subprocess
import sys

import pytest

import pyshmlock
from pyshmlock.metrics import exposition, look

pytestmark = pytest.mark.timeout(120)

HDR_SIZE, SLOT_SIZE = 768, 128
# A slot's pid follows its glibc mutex (40 bytes on x86-64, 48 on aarch64),
# its read count comes next (verify/glibc_layout.c prints them).
OFF_SLOT_PID = {"x86_64": 40, "aarch64": 48}.get(platform.machine(), 40)
OFF_SLOT_READERS = OFF_SLOT_PID + 4


def path(name):
    return f"/dev/shm/pyshmlock.{name}"


def fresh(name, slots=8):
    pyshmlock.RWLock(name, max_processes=slots).close()
    with open(path(name), "rb") as f:
        d = f.read()
    assert struct.unpack_from("<II", d, 8) == (HDR_SIZE, SLOT_SIZE), "layout moved"
    return d


def write_at(name, off, data):
    with open(path(name), "r+b") as f:
        f.seek(off)
        f.write(data)


def random_slots(name):
    d = fresh(name)
    rng = random.Random(4167930979)
    write_at(name, HDR_SIZE, bytes(rng.randrange(256) for _ in range(len(d) - HDR_SIZE)))


def slot_pid(name, value=4167930979, slot=3):
    fresh(name)
    write_at(name, HDR_SIZE + slot * SLOT_SIZE + OFF_SLOT_PID, struct.pack("<I", value))


def slot_readers(name, value=0xF000_0000, slot=5):
    fresh(name)
    base = HDR_SIZE + slot * SLOT_SIZE
    write_at(name, base + OFF_SLOT_PID, struct.pack("<II", 4242, value))


CORRUPTIONS = {"random slot bytes": (random_slots, "slot 0"),
               "a pid above the kernel's limit": (slot_pid, "slot 3"),
               "more read holds than a process can have": (slot_readers, "slot 5")}


@pytest.fixture(params=list(CORRUPTIONS))
def corrupt(request, lock_name):
    make, where = CORRUPTIONS[request.param]
    make(lock_name)
    return lock_name, where


def test_an_opener_refuses_it(corrupt):
    name, where = corrupt
    with pytest.raises(pyshmlock.CorruptSegmentError, match=where):
        pyshmlock.RWLock(name)


def test_inspect_reports_it_with_the_reason(corrupt):
    name, where = corrupt
    with pytest.raises(pyshmlock.CorruptSegmentError, match=where):
        pyshmlock.inspect(name)


def cli(*args):
    p = subprocess.run([sys.executable, "-m", "pyshmlock", *args], capture_output=True,
                       text=True, timeout=60, cwd="/")
    assert "Traceback" not in p.stderr, p.stderr
    return p


def test_status_and_ls_report_it(corrupt):
    name, where = corrupt
    p = cli("status", name)
    assert p.returncode == 1 and "corrupt" in p.stderr and where in p.stderr, (p.stdout,
                                                                               p.stderr)
    line = [ln for ln in cli("ls").stdout.splitlines() if ln.startswith(name)]
    assert line and "unreadable" in line[0] and "corrupt" in line[0], line
    assert where in line[0], line


def test_watch_and_json_status_report_it(corrupt):
    name, where = corrupt
    for cmd in (["watch", name, "--count", "1", "--interval", "0.01"],
                ["status", name, "--json"]):
        p = cli(*cmd)
        assert p.returncode == 1 and "corrupt" in p.stderr and where in p.stderr, (cmd, p)
        assert "readers" not in p.stdout, (cmd, p.stdout)


def test_the_textfile_exposition_reports_it_unreadable_with_the_reason(corrupt):
    """`status --format prometheus` prints what a scrape would: readable 0."""
    name, where = corrupt
    p = cli("status", name, "--format", "prometheus")
    readable = [ln for ln in p.stdout.splitlines()
                if ln.startswith("pyshmlock_lock_readable{")]
    assert readable and readable[0].endswith(" 0.0"), p
    assert 'error="CorruptSegmentError"' in readable[0] and where in readable[0], readable
    assert "pyshmlock_readers{" not in p.stdout, p.stdout
    assert "corrupt" in p.stderr and where in p.stderr, p.stderr


def test_a_lock_collector_scrape_reports_it_unreadable(corrupt):
    prometheus_client = pytest.importorskip("prometheus_client")
    from pyshmlock.metrics import LockCollector
    name, where = corrupt
    reg = prometheus_client.CollectorRegistry()
    reg.register(LockCollector([name]))
    text = prometheus_client.generate_latest(reg).decode()
    readable = [ln for ln in text.splitlines() if ln.startswith("pyshmlock_lock_readable{")]
    assert readable and readable[0].endswith(" 0.0"), text
    assert 'error="CorruptSegmentError"' in readable[0] and where in readable[0], readable
    assert "pyshmlock_readers{" not in text, text


def test_the_metrics_report_it_unreadable_with_the_reason(corrupt):
    name, where = corrupt
    looked = look(name)
    assert not isinstance(looked, pyshmlock.LockInfo), looked
    text = exposition([looked])
    readable = [ln for ln in text.splitlines() if ln.startswith("pyshmlock_lock_readable{")]
    assert readable and readable[0].endswith(" 0.0"), text
    assert 'error="CorruptSegmentError"' in readable[0] and where in readable[0], readable
    assert "pyshmlock_readers{" not in text, text


def test_the_commands_pause_writes_nothing_into_it(corrupt):
    name, where = corrupt
    with open(path(name), "rb") as f:
        before = f.read()
    for cmd in (["pause", name], ["resume", name], ["session", "end", name]):
        p = cli(*cmd)
        assert p.returncode == 1 and "corrupt" in p.stderr and where in p.stderr, p.stderr
    with open(path(name), "rb") as f:
        assert f.read() == before, "a command wrote into a corrupt segment"


def test_a_sound_lock_with_live_holders_still_validates(lock_name):
    """The slot checks are bounds no pyshmlock process exceeds."""
    lk = pyshmlock.RWLock(lock_name, max_processes=4)
    try:
        assert lk.acquire_read(1)
        info = pyshmlock.inspect(lock_name)
        assert info.readers == {os.getpid(): 1}
        assert cli("status", lock_name).returncode == 0
        assert cli("pause", lock_name).returncode == 0
        other = pyshmlock.RWLock(lock_name)
        other.close()
        lk.release_read()
    finally:
        lk.close()
