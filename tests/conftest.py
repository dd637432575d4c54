"""Shared fixtures: unique lock names that are always unlinked, and bounded
child processes.  Every wait in a test has a timeout; a child that does not
finish in time is killed and the test fails.  The markers
``needs_robust_futex`` and ``needs_futex_waitv`` skip a test where the
kernel (or emulator) lacks the feature, naming what the probe found
(kernel_features.py); ``needs_native_execution("why")`` skips one that a
user-mode emulator cannot run, saying why."""
import multiprocessing as mp
import os
import traceback
import uuid

import pytest
from helpers import remove_lock
from kernel_features import emulated, futex_waitv_missing, robust_futexes_missing

import pyshmlock

FORK = mp.get_context("fork")

# Child interpreters (`python -m pyshmlock ...`, `python -c ...`) must import
# the package under test, not the checkout's source tree: with the default
# sys.path, the working directory (the checkout, where pytest runs) would come
# first, and its pyshmlock/ has no compiled core when the package is installed
# rather than editable (CI's fresh venv).  Python 3.11+ honours this.
os.environ.setdefault("PYTHONSAFEPATH", "1")

# The benchmark floors are compiled from the checkout's csrc/ even when the
# package under test is installed (not editable), as in CI's fresh venv.
os.environ.setdefault("PYSHMLOCK_CSRC", os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc"))

# Import-path stand-ins for SGLang's own tests (see test_sglang_compat.py),
# not tests: collecting them would put a fake ``sglang`` in sys.modules.
collect_ignore = ["sglang_shim"]

SHM_DIR = "/dev/shm"

# A marker, and the probe that says why this machine cannot run its tests.
KERNEL_FEATURES = {
    "needs_robust_futex": (robust_futexes_missing,
                           "needs the kernel to mark a dead owner's robust mutex "
                           "(crash recovery)"),
    "needs_futex_waitv": (futex_waitv_missing,
                          "needs futex_waitv (Linux 5.16+): a waiter's death watch"),
    "needs_native_execution": (emulated,
                               "needs the machine's own CPU: the emulator itself fails it "
                               "(the marker's reason says how)"),
}


def pytest_configure(config):
    for marker, (_, what) in KERNEL_FEATURES.items():
        config.addinivalue_line("markers", f"{marker}: {what}")


def pytest_runtest_setup(item):
    for marker, (missing, _) in KERNEL_FEATURES.items():
        mark = item.get_closest_marker(marker)
        if mark is not None:
            why = missing()
            if why:
                pytest.skip(f"{why}; {mark.args[0]}" if mark.args else why)


def unique_name(tag="t"):
    return f"test-{tag}-{os.getpid()}-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def lock_name():
    """A fresh lock name; the segment is removed after the test."""
    name = unique_name()
    yield name
    remove_lock(name)


@pytest.fixture
def lock(lock_name):
    lk = pyshmlock.RWLock(lock_name)
    yield lk
    try:
        lk.close()
    except pyshmlock.LockInUseError:
        pass


def _child_main(fn, q, args):
    try:
        fn(q, *args)
    except BaseException:
        q.put(("error", traceback.format_exc()))
        raise


# How long a test waits for a child's word or exit before it fails: a bound
# for a child that hangs, far beyond what a loaded or emulated machine takes
# to start one (a spawned interpreter under qemu-user can take over 10 s).
CHILD_WAIT = 60.0


class Child:
    """A forked process running fn(queue, *args); talks back over a queue."""

    def __init__(self, fn, *args, ctx=FORK):
        self.q = ctx.Queue()
        self.p = ctx.Process(target=_child_main, args=(fn, self.q, args), daemon=True)
        self.p.start()

    @property
    def pid(self):
        return self.p.pid

    def get(self, timeout=CHILD_WAIT):
        item = self.q.get(timeout=timeout)
        if isinstance(item, tuple) and item and item[0] == "error":
            raise AssertionError("child failed:\n" + item[1])
        return item

    def expect(self, value, timeout=CHILD_WAIT):
        got = self.get(timeout)
        assert got == value, f"expected {value!r} from child, got {got!r}"
        return got

    def join(self, timeout=CHILD_WAIT):
        self.p.join(timeout)
        if self.p.is_alive():
            self.p.kill()
            self.p.join(5)
            raise AssertionError(f"child {self.pid} did not finish within {timeout} s")
        return self.p.exitcode

    def kill(self):
        if self.p.is_alive():
            self.p.kill()
        self.p.join(5)


@pytest.fixture
def children():
    """Start children with children(fn, *args); all are reaped afterwards."""
    started = []

    def start(fn, *args, **kw):
        c = Child(fn, *args, **kw)
        started.append(c)
        return c

    yield start
    for c in started:
        c.kill()


def pytest_sessionfinish(session, exitstatus):
    """A run leaves nothing behind in /dev/shm."""
    mine = [f for f in os.listdir(SHM_DIR) if f.startswith("pyshmlock.test-")
            and f"-{os.getpid()}-" in f]
    for f in mine:
        os.unlink(os.path.join(SHM_DIR, f))
    if mine and exitstatus == 0:
        session.exitstatus = 1
        print(f"\nleft behind in {SHM_DIR}: {mine}")
