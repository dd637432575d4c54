"""A process's children must not keep it alive in the eyes of the lock.

Across PID namespaces only a process's liveness lock (an OFD lock on an
unmapped descriptor of the segment, docs/DESIGN.md §4) tells that it is
gone, and an OFD lock lives as long as any descriptor of its open file
description: a child that inherited that descriptor and never gave it up
would keep a dead parent's holds standing for as long as the child lives.
Each holder here runs in a PID namespace of its own (not its pid 1, so
that its children outlive it), and the waiter in ours: /proc cannot answer
for it, only the liveness lock can."""
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest
from debugger import Gdb

import pyshmlock

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0,
                       reason="needs unshare (util-linux) and root for PID namespaces"),
]

# The holder.  Answers one JSON line per event; its outer pid (NSpid) first.
HOLDER = textwrap.dedent(r'''
    import json, os, subprocess, sys, threading, time, pyshmlock
    name = sys.argv[1]
    def outer():
        return int([l for l in open("/proc/self/status") if l.startswith("NSpid:")][0].split()[1])
    def say(x):
        print(json.dumps(x), flush=True)
    def open_and_hold():
        global lk
        lk = pyshmlock.RWLock(name)
        say("holding" if lk.acquire_write(5) else "not admitted")
    say(outer())
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "open in a thread":
            threading.Thread(target=open_and_hold).start()
        elif cmd == "open":
            open_and_hold()
        elif cmd == "fork":
            pid = os.fork()
            if pid == 0:
                say(outer())
                time.sleep(600)
                os._exit(0)
        elif cmd == "subprocess":
            subprocess.Popen(["sleep", "600"])
            say("spawned")
        elif cmd == "posix_spawn":
            os.posix_spawn("/bin/sleep", ["sleep", "600"], os.environ)
            say("spawned")
''')

# pid 1 of the namespace: runs the holder, and stays when it dies (the
# namespace, and the holder's children, die with it: --kill-child).
INIT = ("import subprocess, sys, time; "
        "subprocess.call([sys.executable, '-c'] + sys.argv[1:]); time.sleep(600)")


class NsHolder:
    def __init__(self, name):
        self.p = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child",
                                   sys.executable, "-c", INIT, HOLDER, name],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            self.pid = self.answer()
        except BaseException:
            self.close()
            raise

    def answer(self, timeout=20.0):
        r, _, _ = select.select([self.p.stdout], [], [], timeout)
        assert r, "the holder did not answer in time"
        return json.loads(self.p.stdout.readline())

    def send(self, cmd):
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()

    def close(self):
        self.p.kill()
        self.p.wait(10)


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("child", ["fork", "subprocess", "posix_spawn"])
def test_children_that_never_use_the_lock_do_not_keep_a_dead_holder(lock_name, child):
    with pyshmlock.RWLock(lock_name).attached() as lk:
        h = NsHolder(lock_name)
        try:
            h.send("open")
            assert h.answer() == "holding"
            h.send(child)
            kid = h.answer()
            os.kill(h.pid, signal.SIGKILL)
            assert lk.acquire_write(10), "the dead holder's write was never reclaimed"
            lk.release_write()
            if child == "fork":
                assert alive(kid), "the child should still run"
        finally:
            h.close()


@pytest.mark.skipif(shutil.which("gdb") is None, reason="needs gdb")
def test_a_child_forked_while_another_thread_opens_the_lock_does_not_keep_its_parent(
        lock_name):
    """fork() while another thread is inside the open, after the liveness
    lock was taken and before the handle is published (gdb stops that
    thread in handle_publish): the child must not keep the descriptor the
    parent's liveness lock lives on."""
    with pyshmlock.RWLock(lock_name).attached() as lk:
        h = NsHolder(lock_name)
        try:
            g = Gdb(h.pid)
            try:
                g.send("break handle_publish")
                g.send("continue -a &")
                g.expect("Continuing.", 20)
                h.send("open in a thread")
                g.expect("hit Breakpoint", 20)
                h.send("fork")          # the main thread forks meanwhile
                kid = h.answer()
                g.send("delete")
                g.send("continue -a &")
            finally:
                g.close()
            assert h.answer() == "holding"
            os.kill(h.pid, signal.SIGKILL)
            assert lk.acquire_write(10), \
                "the dead holder's write was never reclaimed while its child lives"
            lk.release_write()
            assert alive(kid), "the child should still run"
        finally:
            h.close()
