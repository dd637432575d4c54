"""Limits of the liveness test: a process with thousands of locks open, and
processes of different PID namespaces that share /dev/shm (and pids)."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import Child, unique_name
from helpers import remove_lock

import pyshmlock

pytestmark = pytest.mark.timeout(120)


# -------------------------------------------- more locks than a robust list

MANY = 2100    # the kernel walks at most 2048 robust-list entries per thread


def open_many(q, names):
    locks = [pyshmlock.RWLock(n, max_processes=1) for n in names]
    assert locks[0].acquire_write(0) and locks[-1].acquire_read(0)
    q.put("open")
    time.sleep(600)


@pytest.mark.needs_robust_futex
def test_process_dying_with_thousands_of_locks_is_reclaimed_everywhere():
    base = unique_name("many")
    names = [f"{base}-{i}" for i in range(MANY)]
    c = Child(open_many, names)
    try:
        c.expect("open", timeout=60)
        os.kill(c.pid, signal.SIGKILL)
        c.p.join(10)
        # max_processes=1: each lock opens only once its one slot is reclaimed.
        # The oldest locks are the ones a single robust list would lose.
        for i in (0, 1, MANY // 2, MANY - 1):
            lk = pyshmlock.RWLock(names[i], create=False)
            assert lk.acquire_write(2), f"lock {i} still held by the dead process"
            lk.release_write()
            lk.close()
    finally:
        c.kill()
        for n in names:
            remove_lock(n)


# ----------------------------------------------------------- PID namespaces

UNSHARE = shutil.which("unshare")
needs_unshare = pytest.mark.skipif(
    UNSHARE is None or os.geteuid() != 0,
    reason="needs unshare (util-linux) and root for PID namespaces")

# Runs as pid 1 of a fresh PID namespace.  Reports its pids, then obeys
# commands from stdin, one per line, answering with one JSON line each.
NS_CHILD = r"""
import json, os, sys
import pyshmlock
name = sys.argv[1]
outer = int([l for l in open("/proc/self/status") if l.startswith("NSpid:")][0].split()[1])
lk = pyshmlock.RWLock(name)
def say(x):
    print(json.dumps(x), flush=True)
say({"pid": os.getpid(), "outer": outer})
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "read":
        say(lk.acquire_read(5))
    elif cmd == "unlink":
        try:
            pyshmlock.unlink(name)
            say("removed")
        except pyshmlock.LockInUseError as e:
            say("busy: " + str(e))
    elif cmd == "info":
        i = lk.info()
        say({"attached": i.attached_pids,
             "processes": [[p.pid, p.pid_namespace, p.readers, p.is_self]
                           for p in i.processes]})
"""


class NsChild:
    def __init__(self, name):
        # --kill-child: the namespace dies with unshare, however this ends.
        self.p = subprocess.Popen([UNSHARE, "--pid", "--fork", "--kill-child",
                                   sys.executable, "-c", NS_CHILD, name],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.hello = None
        try:
            self.hello = self.answer()
        except BaseException:
            self.close()
            raise

    def answer(self, timeout=20.0):
        import select
        r, _, _ = select.select([self.p.stdout], [], [], timeout)
        assert r, "namespace child did not answer in time"
        return json.loads(self.p.stdout.readline())

    def ask(self, cmd):
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        return self.answer()

    def close(self):
        self.p.kill()            # and with it (--kill-child) the namespace's pid 1
        self.p.wait(10)


@needs_unshare
@pytest.mark.needs_robust_futex
def test_processes_with_the_same_pid_in_two_namespaces(lock_name):
    a = b = None
    try:
        a = NsChild(lock_name)
        b = NsChild(lock_name)
        assert a.hello["pid"] == b.hello["pid"] == 1     # the same pid, twice
        assert b.ask("read") is True
        # b holds a read and is attached: a must not take b for itself.
        assert "1 other live process" in a.ask("unlink")
        assert os.path.exists(f"/dev/shm/pyshmlock.{lock_name}")
        info = a.ask("info")
        assert info["attached"] == [1, 1]
        procs = info["processes"]
        assert len(procs) == 2 and {p[0] for p in procs} == {1}
        assert procs[0][1] != procs[1][1] and all(p[1] for p in procs)   # namespaces
        assert sorted((p[2], p[3]) for p in procs) == [(0, True), (1, False)]
        # A SIGKILL in b's namespace is reclaimed from the root namespace.
        lk = pyshmlock.RWLock(lock_name, create=False)
        os.kill(b.hello["outer"], signal.SIGKILL)
        assert lk.acquire_write(5)
        lk.release_write()
        assert any(r.pid == 1 and "reads" in r.lost for r in lk.info().recoveries)
        lk.close()
    finally:
        for c in (a, b):
            if c is not None:
                c.close()


def unlink_from_child(q, name):
    try:
        pyshmlock.unlink(name)
        q.put("removed")
    except pyshmlock.LockInUseError as e:
        q.put(str(e))


def test_forked_child_does_not_take_its_parents_attachment_for_its_own(lock, lock_name,
                                                                       children):
    # The child inherits the parent's handle (and keeper table) but not its
    # slot: the parent's attachment is another process's.
    c = children(unlink_from_child, lock_name)
    assert "1 other live process" in c.get()
    assert os.path.exists(f"/dev/shm/pyshmlock.{lock_name}")
    pyshmlock.unlink(lock_name)      # the parent's own attachment does not count
    assert not os.path.exists(f"/dev/shm/pyshmlock.{lock_name}")
