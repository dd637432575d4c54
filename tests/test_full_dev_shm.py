"""A full /dev/shm (a container's 64 MB one, filled by PyTorch) gives a
clear OSError naming /dev/shm and leaves no partial segment; the process
lives (writing through a mapping into an unbacked tmpfs page would kill it
with SIGBUS).  The test mounts a small tmpfs over /dev/shm in a private
mount namespace of its own (unshare -m, as root), so the host's /dev/shm
is never touched."""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import pyshmlock

pytestmark = pytest.mark.timeout(60)

CHILD = textwrap.dedent('''
    import errno, os, sys
    import pyshmlock
    size = pyshmlock.segment_size(256)
    fd = os.open("/dev/shm/filler", os.O_WRONLY | os.O_CREAT)   # fill it up
    try:
        while True:
            os.write(fd, b"x" * 4096)
    except OSError:
        pass
    os.close(fd)
    free = os.statvfs("/dev/shm").f_bavail * os.statvfs("/dev/shm").f_frsize
    assert free < size, (free, size)
    try:
        pyshmlock.RWLock("full-shm-test")
    except OSError as e:
        print("errno", errno.errorcode.get(e.errno), flush=True)
        print("message", e, flush=True)
    print("left", sorted(f for f in os.listdir("/dev/shm") if f != "filler"), flush=True)
    os.unlink("/dev/shm/filler")
    lk = pyshmlock.RWLock("full-shm-test")       # with room again, it opens
    print("opened", lk.paused is False, flush=True)
    lk.close()
    pyshmlock.unlink("full-shm-test")
''')


def _can_unshare():
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    p = subprocess.run(["unshare", "-m", "--propagation", "private", "true"],
                       capture_output=True, timeout=10)
    return p.returncode == 0


@pytest.mark.skipif(not _can_unshare(),
                    reason="needs root and unshare(1) for a private mount namespace "
                           "(CI runs as root)")
def test_a_full_dev_shm_is_a_clear_error_not_a_crash():
    script = ("mount -t tmpfs -o size=64k tmpfs /dev/shm && exec \"$0\" -c \"$1\"")
    p = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script,
                        sys.executable, CHILD], capture_output=True, text=True, timeout=50)
    assert p.returncode == 0, f"the child died ({p.returncode}): {p.stdout}{p.stderr}"
    assert "errno ENOSPC" in p.stdout, p.stdout + p.stderr
    assert "/dev/shm" in p.stdout and "--shm-size" in p.stdout, p.stdout
    assert "left []" in p.stdout, "a partial segment was left behind"
    assert "opened True" in p.stdout, p.stdout


def test_segment_size_follows_max_processes():
    sizes = [pyshmlock.segment_size(n) for n in (1, 256, 4095)]
    assert sizes == sorted(sizes) and sizes[1] < 64 * 1024
    assert pyshmlock.segment_size(256) == pyshmlock.segment_size()
    with pytest.raises(ValueError):
        pyshmlock.segment_size(0)
    with pytest.raises(TypeError):
        pyshmlock.segment_size("8")
