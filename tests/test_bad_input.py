"""Bad input gets a clear error and changes nothing."""
import decimal
import fractions
import mmap
import os
import struct

import pytest
from conftest import SHM_DIR
from helpers import reap

import pyshmlock

pytestmark = pytest.mark.timeout(30)

MAGIC = 0x4C485350
READY = 0x59444552


def seg_path(name):
    return os.path.join(SHM_DIR, "pyshmlock." + name)


@pytest.mark.parametrize("bad", ["", "a/b", "x" * 201, "sp ace", "é", "..\x00"])
def test_invalid_names(bad):
    with pytest.raises(ValueError, match="invalid lock name"):
        pyshmlock.RWLock(bad)
    with pytest.raises(ValueError):
        pyshmlock.unlink(bad)


@pytest.mark.parametrize("bad", [None, 5, b"ab"])
def test_a_name_that_is_not_a_str_is_a_type_error(bad):
    with pytest.raises(TypeError, match="str"):
        pyshmlock.RWLock(bad)
    with pytest.raises(TypeError):
        pyshmlock.unlink(bad)


def test_longest_valid_name(lock_name):
    name = (lock_name + "x" * 200)[:200]
    lk = pyshmlock.RWLock(name)
    lk.close()
    pyshmlock.unlink(name)


@pytest.mark.parametrize("kw", [{"max_processes": 0}, {"max_processes": 5000},
                                {"mode": -1}, {"mode": 0o1000}, {"stale": "drop"}])
def test_invalid_options(lock_name, kw):
    with pytest.raises(ValueError):
        pyshmlock.RWLock(lock_name, **kw)
    assert not os.path.exists(seg_path(lock_name))


@pytest.mark.parametrize("mode", [0o000, 0o400, 0o200, 0o030, 0o066, 0o466])
def test_a_mode_that_would_lock_the_creator_out_is_refused(lock_name, mode):
    """The creator's own next open needs owner read and write."""
    for cls in (pyshmlock.RWLock, pyshmlock.AsyncRWLock):
        with pytest.raises(ValueError, match="owner read and write"):
            cls(lock_name, mode=mode)
    assert not os.path.exists(seg_path(lock_name)), "a refused open created the lock"


@pytest.mark.parametrize("kw", [{"max_processes": True}, {"max_processes": 2.5},
                                {"max_processes": "8"}, {"mode": True}, {"mode": "rw"},
                                {"mode": 0o600 * 1.0}, {"create": 1}, {"create": "yes"},
                                {"stale": None}, {"group": 1.5}, {"group": True}])
def test_options_of_the_wrong_type_are_type_errors(lock_name, kw):
    for cls in (pyshmlock.RWLock, pyshmlock.AsyncRWLock):
        with pytest.raises(TypeError):
            cls(lock_name, **kw)
    assert not os.path.exists(seg_path(lock_name)), "a refused open created the lock"


@pytest.mark.parametrize("timeout", ["1", b"1", True, [1], object(), fractions.Fraction(1, 2),
                                     decimal.Decimal("0.5"), 1j])
def test_a_timeout_of_the_wrong_type_is_a_type_error(lock, timeout):
    for call in (lock.acquire_read, lock.acquire_write, lock.acquire_update,
                 lock.resume, lock.wait_resumed, lock.wait_drained, lock.read,
                 lock.write, lock.update):
        with pytest.raises(TypeError, match="timeout"):
            call(timeout)
    with pytest.raises(TypeError):
        with lock.read(timeout):
            pass
    assert not lock.is_locked() and not lock.paused


def test_other_arguments_of_the_wrong_type_are_type_errors(lock):
    with pytest.raises(TypeError):
        pyshmlock.unlink(lock.name, force="yes")
    with pytest.raises(TypeError):
        lock.resume(force=1)
    with pytest.raises(TypeError):
        lock.end_session("1")
    with pytest.raises(TypeError):
        lock.raise_fence(2.0)
    with pytest.raises(TypeError):
        pyshmlock.segment_size("256")


def test_create_false_on_missing_lock(lock_name):
    with pytest.raises(FileNotFoundError):
        pyshmlock.RWLock(lock_name, create=False)
    with pytest.raises(FileNotFoundError):
        pyshmlock.unlink(lock_name)


@pytest.mark.parametrize("timeout", [-1, -0.001, float("nan")])
def test_negative_timeouts(lock, timeout):
    for call in (lock.acquire_read, lock.acquire_write, lock.acquire_update,
                 lock.resume, lock.wait_resumed, lock.wait_drained, lock.read):
        with pytest.raises(ValueError, match="timeout"):
            call(timeout)
    assert not lock.is_locked()


def test_foreign_segment(lock_name):
    with open(seg_path(lock_name), "wb") as f:
        f.write(b"not a lock " * 400)
    with pytest.raises(pyshmlock.ForeignSegmentError, match="not a pyshmlock lock"):
        pyshmlock.RWLock(lock_name)
    with pytest.raises(pyshmlock.ForeignSegmentError, match="not a pyshmlock lock"):
        pyshmlock.inspect(lock_name)   # the read-only observer checks the same
    with pytest.raises(pyshmlock.ForeignSegmentError):
        pyshmlock.unlink(lock_name)
    pyshmlock.unlink(lock_name, force=True)


def test_short_foreign_segment(lock_name):
    with open(seg_path(lock_name), "wb") as f:
        f.write(b"tiny")
    with pytest.raises(pyshmlock.ForeignSegmentError):
        pyshmlock.RWLock(lock_name)
    with pytest.raises(pyshmlock.ForeignSegmentError):
        pyshmlock.inspect(lock_name)   # the read-only observer checks the same


def test_empty_segment_is_an_unfinished_creation(lock_name):
    open(seg_path(lock_name), "wb").close()   # a creator that died before ftruncate
    with pytest.raises(pyshmlock.UninitializedSegmentError, match="never initialised"):
        pyshmlock.RWLock(lock_name)
    with pytest.raises(pyshmlock.UninitializedSegmentError, match="never initialised"):
        pyshmlock.inspect(lock_name)   # the read-only observer checks the same


def test_a_segment_of_another_layout_is_refused_by_observers_and_plain_openers(lock_name):
    header = struct.pack("<IIIIIIQI", MAGIC, 99, 640, 128, 4, 1, 640 + 4 * 128, READY)
    with open(seg_path(lock_name), "wb") as f:
        f.write(header.ljust(8192, b"\0"))
    with pytest.raises(pyshmlock.LayoutVersionError, match="layout"):
        pyshmlock.RWLock(lock_name, create=False)
    with pytest.raises(pyshmlock.LayoutVersionError, match="layout version"):
        pyshmlock.inspect(lock_name)   # the read-only observer checks the same


def _patch_header(name, fmt, offset, value):
    with open(seg_path(name), "r+b") as f:
        m = mmap.mmap(f.fileno(), 0)
        struct.pack_into(fmt, m, offset, value)
        m.close()


@pytest.mark.parametrize("offset,value", [
    (16, 0),            # max_processes = 0
    (16, 10 ** 6),      # max_processes far beyond the file
    (8, 7),             # header_size
    (24, 12345),        # total_size
])
def test_corrupt_header_fields(lock_name, offset, value):
    lk = pyshmlock.RWLock(lock_name, max_processes=4)
    lk.close()
    fmt = "<Q" if offset == 24 else "<I"
    _patch_header(lock_name, fmt, offset, value)
    with pytest.raises(pyshmlock.CorruptSegmentError):
        pyshmlock.RWLock(lock_name)
    with pytest.raises(pyshmlock.CorruptSegmentError):
        pyshmlock.inspect(lock_name)   # the read-only observer checks the same


def test_truncated_segment(lock_name):
    lk = pyshmlock.RWLock(lock_name, max_processes=4)
    lk.close()
    os.truncate(seg_path(lock_name), 700)
    with pytest.raises(pyshmlock.SegmentError):
        pyshmlock.RWLock(lock_name)
    with pytest.raises(pyshmlock.SegmentError):
        pyshmlock.inspect(lock_name)   # the read-only observer checks the same


def test_corrupt_state_word_while_open(lock, lock_name):
    # Bits 0-11 of the state word name the exclusive owner's slot; 4000 is out
    # of range for max_processes=256.  Every call must refuse, never index it.
    with open(seg_path(lock_name), "r+b") as f:
        m = mmap.mmap(f.fileno(), 0)
        struct.pack_into("<I", m, 64, 4000)
        for call in (lambda: lock.acquire_read(0), lambda: lock.acquire_write(0),
                     lambda: lock.acquire_update(0), lock.is_locked, lock.info,
                     lambda: pyshmlock.inspect(lock_name)):
            with pytest.raises(pyshmlock.CorruptSegmentError):
                call()
        struct.pack_into("<I", m, 64, 0)
        m.close()
    assert lock.acquire_write(0)
    lock.release_write()


def open_as_nobody(q, name):
    os.setgid(65534)
    os.setuid(65534)
    try:
        pyshmlock.RWLock(name, create=False)
        q.put("opened")
    except PermissionError as e:
        q.put(("PermissionError", str(e)))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to another user")
@pytest.mark.timeout(120)          # a spawned interpreter: slow to start under emulation
def test_permission_denied(lock, lock_name, children):
    # Spawned, not forked: a forked child inherits the parent's mapping.
    import multiprocessing as mp
    c = children(open_as_nobody, lock_name, ctx=mp.get_context("spawn"))
    got = c.get()
    assert got[0] == "PermissionError" and lock_name in got[1]


def attach_and_report(q, name):
    try:
        lk = pyshmlock.RWLock(name)
        q.put("attached")
        import time
        time.sleep(3)
        lk.close()
    except pyshmlock.TooManyProcessesError as e:
        q.put(("full", str(e)))


def test_too_many_processes(lock_name, children):
    lk = pyshmlock.RWLock(lock_name, max_processes=2)
    first = children(attach_and_report, lock_name)
    first.expect("attached")
    second = children(attach_and_report, lock_name)
    got = second.get()
    assert got[0] == "full" and "max_processes" in got[1]
    first.kill()
    lk.close()


# ------------------------------------------------------------ a null handle

def test_entry_points_refuse_a_null_handle_without_touching_it():
    """shl_wait, shl_info, shl_slot_info and the other entry points check
    the handle before they read through it: a NULL handle is SHL_ECLOSED,
    not a crash.  Run in a forked child, so a crash fails the test instead
    of killing pytest."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            from pyshmlock._shmlock import ffi, lib
            w = ffi.new("shl_waiter *")
            w.kind = lib.SHL_KIND_READ
            rcs = [lib.shl_wait(ffi.NULL, w, 0),
                   lib.shl_info(ffi.NULL, ffi.new("shl_snapshot *")),
                   lib.shl_slot_info(ffi.NULL, 0, ffi.new("shl_slot_snapshot *")),
                   lib.shl_try(ffi.NULL, w), lib.shl_attach(ffi.NULL),
                   lib.shl_recovery_info(ffi.NULL, 0, ffi.new("shl_recovery_record *"))]
            lib.shl_cancel(ffi.NULL, w)
            code = 0 if all(rc == lib.SHL_ECLOSED for rc in rcs) else 2
        finally:
            os._exit(code)
    status = reap(pid, 10)
    assert status is not None and os.WIFEXITED(status), f"child crashed: {status}"
    assert os.WEXITSTATUS(status) == 0
