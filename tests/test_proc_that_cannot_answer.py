"""liveness.c asks /proc about a slot's owner only where /proc can answer
for it; where it cannot, only the owner's liveness lock tells.  Two /procs
that cannot, each with a holder whose keeper exited alone (gdb: the holder
runs on, holding the write lock) and a prober that must not be admitted:

* /proc of another PID namespace.  `unshare --pid --fork` without
  --mount-proc leaves the root namespace's /proc in place: there /proc/<pid>
  names whoever has that pid in the root namespace, not the process of that
  pid in ours.  A process whose pid is the same number in both namespaces
  (made so here with clone3's set_tid, as the pid allocator may do by
  chance) must still tell that the /proc it sees is not its namespace's.
* /proc mounted with hidepid=2 (systemd's ProtectProc=invisible): another
  user's process is not there, which is not the same as gone.  The stale
  policy's check of a pause's pauser (pyshmlock/stale.py) asks that /proc
  too.
"""
import json
import os
import random
import select
import shutil
import subprocess
import sys
import textwrap

import pytest
from debugger import kill, spawn
from helpers import PACKAGE_PARENT
from test_process_exit import HOLDER as PLAIN_HOLDER
from test_process_exit import keeper_exits_alone

import pyshmlock

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0,
                       reason="needs unshare (util-linux) and root for PID namespaces"),
    pytest.mark.skipif(shutil.which("gdb") is None, reason="needs gdb"),
]

# pid 1 of the namespace (whose /proc is still the root namespace's):
# starts a child on request, at a chosen pid if asked (the same number in
# this namespace and in the root one: clone3 with set_tid, then exec).
INIT = textwrap.dedent(r'''
    import ctypes, json, os, struct, subprocess, sys
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    SYS_clone3, SIGCHLD = 435, 17
    def say(x):
        print(json.dumps(x), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        argv = [sys.executable, "-c"] + cmd["argv"]
        if "pid" not in cmd:
            subprocess.Popen(argv)
            say({"started": True})
            continue
        tids = (ctypes.c_int * 2)(cmd["pid"], cmd["pid"])
        # struct clone_args (11 u64): flags, pidfd, child_tid, parent_tid,
        # exit_signal, stack, stack_size, tls, set_tid, set_tid_size, cgroup
        args = ctypes.create_string_buffer(struct.pack(
            "11Q", 0, 0, 0, 0, SIGCHLD, 0, 0, 0, ctypes.addressof(tids), 2, 0), 88)
        r = libc.syscall(SYS_clone3, args, ctypes.c_size_t(88))
        if r == 0:
            os.execv(sys.executable, argv)
        say({"started": r > 0, "errno": ctypes.get_errno()})
''')

HOLDER = textwrap.dedent(r'''
    import json, sys, time, pyshmlock
    outer = int([l for l in open("/proc/self/status") if l.startswith("NSpid:")][0].split()[1])
    lk = pyshmlock.RWLock(sys.argv[1])
    assert lk.acquire_write(5)
    print(json.dumps(outer), flush=True)
    time.sleep(600)
''')

PROBER = textwrap.dedent(r'''
    import json, os, sys, pyshmlock
    nspid = [l for l in open("/proc/self/status") if l.startswith("NSpid:")][0].split()[1:]
    lk = pyshmlock.RWLock(sys.argv[1])
    got = lk.acquire_write(1)
    print(json.dumps({"nspid": nspid, "admitted": got}), flush=True)
    if got:
        lk.release_write()
    lk.close()
''')


class Namespace:
    def __init__(self):
        self.p = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child",
                                   sys.executable, "-c", INIT],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def answer(self, timeout=20.0):
        r, _, _ = select.select([self.p.stdout], [], [], timeout)
        assert r, "the namespace did not answer in time"
        return json.loads(self.p.stdout.readline())

    def start(self, *argv, pid=None):
        cmd = {"argv": list(argv)}
        if pid is not None:
            cmd["pid"] = pid
        self.p.stdin.write(json.dumps(cmd) + "\n")
        self.p.stdin.flush()
        return self.answer()

    def close(self):
        self.p.kill()
        self.p.wait(10)


def start_at_same_pid(ns, *argv):
    """Start argv in ns at a pid that is the same number in the root
    namespace (one free in both); False if clone3 cannot choose pids."""
    with open("/proc/sys/kernel/pid_max") as f:
        pid_max = int(f.read())
    for _ in range(200):
        pid = random.randrange(pid_max // 2, pid_max)
        if os.path.exists(f"/proc/{pid}"):
            continue
        started = ns.start(*argv, pid=pid)
        if started["started"]:
            return True
        if started["errno"] != 17:      # EEXIST: taken meanwhile, try another
            return False
    return False


@pytest.mark.parametrize("same_pid", [False, True])
def test_a_prober_never_reads_another_namespaces_proc_for_its_own(lock_name, same_pid):
    pyshmlock.RWLock(lock_name).close()
    ns = Namespace()
    try:
        assert ns.start(HOLDER, lock_name)["started"]
        holder = ns.answer()
        keeper_exits_alone(holder)      # the holder runs on, keeps its write
        if same_pid:
            if not start_at_same_pid(ns, PROBER, lock_name):
                pytest.skip("clone3 cannot choose pids here (needs Linux 5.5)")
        else:
            assert ns.start(PROBER, lock_name)["started"]
        seen = ns.answer()
        if same_pid:
            assert seen["nspid"][0] == seen["nspid"][1]
        assert seen["admitted"] is False, \
            "admitted beside a running holder: /proc of another namespace was asked"
        with pyshmlock.RWLock(lock_name).attached() as lk:
            assert lk.info().recoveries == []
    finally:
        ns.close()


# A lock two users share (group opt-in): the holder is root, the prober
# uid and gid 65534 ("nobody"), under a /proc that hides other users'
# processes (a private mount namespace: nothing changes outside it).
GROUP = 65534
GROUP_HOLDER = PLAIN_HOLDER.replace("pyshmlock.RWLock(sys.argv[1])",
                                    f"pyshmlock.RWLock(sys.argv[1], mode=0o660, group={GROUP})")
HIDDEN_PROBER = textwrap.dedent(f'''
    import os, sys, pyshmlock
    lk = pyshmlock.RWLock(sys.argv[1], mode=0o660, group={GROUP})
    print(os.path.exists("/proc/" + sys.argv[2]), lk.acquire_write(1), flush=True)
''')


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
@pytest.mark.parametrize("hidepid", [0, 2])
def test_a_process_that_proc_hides_is_not_taken_for_gone(lock_name, hidepid):
    assert GROUP_HOLDER != PLAIN_HOLDER
    with pyshmlock.RWLock(lock_name, mode=0o660, group=GROUP).attached() as lk:
        holder = spawn(GROUP_HOLDER, lock_name, "write")
        try:
            assert holder.stdout.readline().strip() == "holding"
            keeper_exits_alone(holder.pid)
            r = subprocess.run(
                ["unshare", "--mount", "sh", "-c",
                 f"mount -t proc -o hidepid={hidepid} proc /proc && "
                 f"exec setpriv --reuid={GROUP} --regid={GROUP} --clear-groups \"$@\"",
                 "sh", sys.executable, "-c", HIDDEN_PROBER, lock_name, str(holder.pid)],
                capture_output=True, text=True, timeout=60, cwd="/",
                env=dict(os.environ, PYTHONPATH=PACKAGE_PARENT))
            assert r.returncode == 0, r.stderr
            visible, admitted = r.stdout.split()
            assert visible == ("True" if hidepid == 0 else "False")
            assert admitted == "False", "admitted beside a running holder that /proc hides"
            assert holder.poll() is None
            assert lk.info().recoveries == []
        finally:
            kill(holder)


# A pauser that detached after its pause() and runs on, and an opener of
# another user (whose /proc may hide it) with the default stale="reset".
DETACHED_PAUSER = textwrap.dedent(f'''
    import sys, time, pyshmlock
    lk = pyshmlock.RWLock(sys.argv[1], mode=0o660, group={GROUP})
    assert lk.pause()
    lk.close()
    print("holding", flush=True)
    time.sleep(600)
''')
STALE_OPENER = textwrap.dedent(f'''
    import os, sys, pyshmlock
    lk = pyshmlock.RWLock(sys.argv[1], mode=0o660, group={GROUP})
    print(os.path.exists("/proc/" + sys.argv[2]), lk.info().paused, flush=True)
''')


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
@pytest.mark.parametrize("hidepid", [0, 2])
def test_a_pause_whose_pauser_proc_hides_is_not_reset_as_stale(lock_name, hidepid):
    """The stale reset clears a pause only once its pauser no longer runs
    (docs/DESIGN.md, "Stale segments"); a pauser that /proc hides runs."""
    pauser = spawn(DETACHED_PAUSER, lock_name)
    try:
        assert pauser.stdout.readline().strip() == "holding"
        r = subprocess.run(
            ["unshare", "--mount", "sh", "-c",
             f"mount -t proc -o hidepid={hidepid} proc /proc && "
             f"exec setpriv --reuid={GROUP} --regid={GROUP} --clear-groups \"$@\"",
             "sh", sys.executable, "-c", STALE_OPENER, lock_name, str(pauser.pid)],
            capture_output=True, text=True, timeout=60, cwd="/",
            env=dict(os.environ, PYTHONPATH=PACKAGE_PARENT))
        assert r.returncode == 0, r.stderr
        visible, paused = r.stdout.split()
        assert visible == ("True" if hidepid == 0 else "False")
        assert paused == "True", "a running pauser's pause was reset as stale"
    finally:
        kill(pauser)
