"""Who may have written the segment: owner and mode checks at open (segment
squatting), the group opt-in, a segment of the wrong size, and unlink
removing exactly the segment it looked at.

The squatting tests need root (to become user `nobody` in a child); CI runs
as root."""
import mmap
import os
import struct
import threading
import time

import pytest
from conftest import SHM_DIR, unique_name

import pyshmlock

pytestmark = pytest.mark.timeout(60)

NOBODY = 65534          # uid and gid of nobody / nogroup on Debian
READY_OFFSET = 32       # offsetof(struct shl_header, ready)
READY = 0x59444552

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become nobody")


def path_of(name):
    return os.path.join(SHM_DIR, "pyshmlock." + name)


def as_nobody(fn, *args):
    """Run fn(*args) in a forked child that has become nobody:nogroup."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            fn(*args)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child running as nobody failed"


def squat(name, mode, group=None):
    kw = {} if group is None else {"group": group}
    pyshmlock.RWLock(name, mode=mode, **kw).close()


# ------------------------------------------------------------ squatting

@needs_root
def test_segment_planted_by_another_user_is_refused(lock_name):
    as_nobody(squat, lock_name, 0o666)
    st = os.stat(path_of(lock_name))
    assert st.st_uid == NOBODY and st.st_mode & 0o777 == 0o666
    with pytest.raises(PermissionError) as e:
        pyshmlock.RWLock(lock_name)
    msg = str(e.value)
    assert "uid 65534 (nobody)" in msg and "0666" in msg, msg
    # Looking inside it (unlink without force probes its slots) is refused too;
    # force removes it without mapping it.
    with pytest.raises(PermissionError):
        pyshmlock.unlink(lock_name)
    pyshmlock.unlink(lock_name, force=True)
    assert not os.path.exists(path_of(lock_name))


def test_mode_is_honoured_on_create_and_checked_on_open(lock_name):
    lk = pyshmlock.RWLock(lock_name, mode=0o640)
    assert os.stat(path_of(lock_name)).st_mode & 0o777 == 0o640
    lk.close()
    os.chmod(path_of(lock_name), 0o646)        # other write: more than asked for
    with pytest.raises(PermissionError) as e:
        pyshmlock.RWLock(lock_name, mode=0o640)
    assert "0646" in str(e.value)
    os.chmod(path_of(lock_name), 0o660)        # group write beyond the default 0o600:
    pyshmlock.RWLock(lock_name).close()        # the owner's own grant (group=): accepted
    pyshmlock.RWLock(lock_name, mode=0o660).close()   # asked for: accepted
    os.chmod(path_of(lock_name), 0o662)        # other write beyond what was asked
    with pytest.raises(PermissionError):
        pyshmlock.RWLock(lock_name, mode=0o660)
    os.chmod(path_of(lock_name), 0o644)        # read beyond mode is not a write hole
    pyshmlock.RWLock(lock_name).close()


@needs_root
def test_group_opt_in_accepts_the_named_group_only(lock_name):
    as_nobody(squat, lock_name, 0o660, NOBODY)
    st = os.stat(path_of(lock_name))
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (NOBODY, NOBODY, 0o660)
    lk = pyshmlock.RWLock(lock_name, mode=0o660, group="nogroup")
    assert lk.acquire_write(2)
    lk.release_write()
    lk.close()
    with pytest.raises(PermissionError):           # another group
        pyshmlock.RWLock(lock_name, mode=0o660, group="users")
    with pytest.raises(PermissionError):           # no opt-in
        pyshmlock.RWLock(lock_name, mode=0o660)
    os.chmod(path_of(lock_name), 0o662)            # the group does not cover others
    with pytest.raises(PermissionError) as e:
        pyshmlock.RWLock(lock_name, mode=0o660, group=NOBODY)
    assert "0662" in str(e.value)


@needs_root
def test_group_on_create_sets_the_segment_group(lock_name):
    lk = pyshmlock.RWLock(lock_name, mode=0o660, group=os.getegid())
    st = os.stat(path_of(lock_name))
    assert st.st_gid == os.getegid() and st.st_mode & 0o777 == 0o660
    lk.close()
    # Ours, but group-writable by a group other than the one opted in.
    os.chown(path_of(lock_name), -1, 100)
    with pytest.raises(PermissionError):
        pyshmlock.RWLock(lock_name, mode=0o660, group=os.getegid())
    with pytest.raises(ValueError):
        pyshmlock.RWLock(unique_name("g"), group="no-such-group-here")


# ------------------------------------------------------------ wrong size

@pytest.mark.parametrize("delta", [4096, -64])
def test_segment_of_the_wrong_size_is_refused_at_open(lock_name, delta):
    pyshmlock.RWLock(lock_name, max_processes=4).close()
    size = os.stat(path_of(lock_name)).st_size
    os.truncate(path_of(lock_name), size + delta)
    with pytest.raises(pyshmlock.CorruptSegmentError) as e:
        pyshmlock.RWLock(lock_name)
    assert f"{size + delta} bytes" in str(e.value) and f"{size}" in str(e.value)


# ----------------------------------------------------- unlink is exact

def test_unlink_removes_only_the_segment_it_probed(lock_name, children):
    """unlink() looks at one segment; if the name is replaced before the
    removal, the replacement (with a live process attached) must stay."""
    pyshmlock.RWLock(lock_name).close()               # S1: nobody attached
    path = path_of(lock_name)
    with open(path, "r+b") as f:
        m = mmap.mmap(f.fileno(), 0)
    struct.pack_into("I", m, READY_OFFSET, 0)         # unlink now waits for "ready"
    result = {}

    def run():
        try:
            pyshmlock.unlink(lock_name)
            result["r"] = "removed"
        except BaseException as e:
            result["r"] = e

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.2)                                   # unlink holds S1's fd, polling
    moved = lock_name + "-s1"
    os.rename(path, path_of(moved))                   # S1 leaves the name...

    def attach(q, name):
        lk = pyshmlock.RWLock(name)                   # ...S2 takes it, with a user
        q.put("attached")
        time.sleep(600)

    c = children(attach, lock_name)
    c.expect("attached")
    struct.pack_into("I", m, READY_OFFSET, READY)     # S1 probed: nobody attached
    t.join(10)
    m.close()
    try:
        assert not t.is_alive()
        assert os.path.exists(path), "unlink removed a segment it never probed"
        assert isinstance(result["r"], pyshmlock.LockInUseError), result
    finally:
        c.kill()
        pyshmlock.unlink(moved, force=True)


# ------------------------------------------------ a FIFO under a lock's name

def test_a_fifo_under_a_locks_name_is_refused_at_once(lock_name):
    """Any local user can mkfifo /dev/shm/pyshmlock.X: looking at it (ls,
    status, inspect) or opening it must not block on the FIFO."""
    import stat
    import subprocess
    import sys
    path = f"/dev/shm/pyshmlock.{lock_name}"
    os.mkfifo(path, 0o644)
    try:
        assert stat.S_ISFIFO(os.stat(path).st_mode)
        code = ("import sys, pyshmlock\n"
                "for f in (pyshmlock.inspect, pyshmlock.RWLock):\n"
                "    try:\n"
                "        f(sys.argv[1])\n"
                "    except pyshmlock.errors.ForeignSegmentError:\n"
                "        print('refused')\n")
        p = subprocess.run([sys.executable, "-c", code, lock_name], capture_output=True,
                           text=True, timeout=30, cwd="/")
        assert p.stdout.split() == ["refused", "refused"], (p.stdout, p.stderr[-2000:])
        ls = subprocess.run([sys.executable, "-m", "pyshmlock", "ls"], capture_output=True,
                            text=True, timeout=30, cwd="/")
        assert "Traceback" not in ls.stderr, ls.stderr
    finally:
        os.unlink(path)
