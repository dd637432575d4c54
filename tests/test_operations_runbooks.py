"""The runbooks of docs/OPERATIONS.md, run: each documented command is run
against a lock in the state its section describes, and what the section
says the tools print is checked twice, in the document and in the output,
so that neither can change without the other.  Real processes (killed with
SIGKILL where a section's process died), real locks, the real command."""
import json
import os
import re
import textwrap
import time

import pytest
from helpers import run_python
from test_cli_ops import run

import pyshmlock

pytestmark = pytest.mark.timeout(180)

OPS = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                        "OPERATIONS.md")).read()


def section(title):
    """The text of the OPERATIONS section whose heading contains title."""
    m = re.search(r"^##+ [^\n]*" + re.escape(title) + r"[^\n]*\n(.*?)(?=^## |\Z)", OPS,
                  re.S | re.M)
    assert m, f"OPERATIONS.md has no section {title!r}"
    return " ".join(m.group(1).split())


def documented(sec, *phrases):
    """Each phrase is in the section (whitespace as one space)."""
    for ph in phrases:
        assert " ".join(ph.split()) in sec, f"OPERATIONS.md no longer says {ph!r}"


def cmd(sec, line, name):
    """A command the section documents (NAME in it), made runnable."""
    documented(sec, f"`{line}`")
    return [w.replace("NAME", name) for w in line.split()[1:]]


def in_child(code, name, *args):
    """Run code in a fresh process that is then SIGKILLed; its stdout."""
    prog = textwrap.dedent(code) + "\nos.kill(os.getpid(), signal.SIGKILL)\n"
    p = run_python("-c", "import os, signal, sys, pyshmlock\n" + prog, name, *args,
                   timeout=60)
    return p.stdout


def test_data_suspect_runbook(lock_name):
    sec = section('"Data suspect"')
    keeper = pyshmlock.RWLock(lock_name)        # an attached process: not stale
    try:
        in_child("""
            lk = pyshmlock.RWLock(sys.argv[1])
            lk.pause()
            lk.acquire_update()
        """, lock_name)
        # "An observer already shows it while the dead holder is not
        # reclaimed yet"; the recovery log names it once an attached process
        # looked (info()).
        documented(sec, "`DATA SUSPECT`", "`died holding update`",
                   "An observer already shows it while the dead holder is not reclaimed yet")
        assert "DATA SUSPECT" in run("status", lock_name).stdout
        keeper.info()
        p = run("status", lock_name)
        assert "DATA SUSPECT" in p.stdout and "died holding update" in p.stdout, p.stdout
        # "`pyshmlock resume NAME` exits 1 saying so"
        documented(sec, "`pyshmlock resume NAME` exits 1 saying so")
        p = run(*cmd(sec, "pyshmlock resume NAME", lock_name))
        assert p.returncode == 1 and "suspect" in p.stderr, p
        # "`pyshmlock resume --force NAME` ... opens the gate and clears the mark"
        p = run(*cmd(sec, "pyshmlock resume --force NAME", lock_name))
        assert p.returncode == 0, p.stderr
        info = pyshmlock.inspect(lock_name)
        assert not info.paused and not info.data_suspect
    finally:
        keeper.close()


def test_a_pause_left_on_runbook(lock_name):
    sec = section("A pause left on")
    keeper = pyshmlock.RWLock(lock_name)
    try:
        # A `pyshmlock pause` you ran yourself shows as `(exited)`.
        documented(sec, "A `pyshmlock pause` you ran yourself shows as `(exited)`")
        assert run("pause", lock_name).returncode == 0
        p = run("status", lock_name)
        documented(sec, "`paused yes, by pid N (...) since T`")
        line = [ln for ln in p.stdout.splitlines() if ln.strip().startswith("paused")]
        assert line and re.search(r"paused\s+yes, by pid \d+ \(exited\) since \d{4}-", line[0]), \
            p.stdout
        # "`(exited)` and other processes are attached: ... `pyshmlock resume NAME`"
        p = run(*cmd(sec, "pyshmlock resume NAME", lock_name))
        assert p.returncode == 0 and not keeper.paused, p.stderr
        # A live pauser is `(attached)`.
        keeper.pause()
        documented(sec, "`(attached)`")
        assert f"by pid {os.getpid()} (attached)" in run("status", lock_name).stdout
        keeper.resume()
    finally:
        keeper.close()


def dead_session(name, ttl=600.0):
    out = in_child("""
        lk = pyshmlock.RWLock(sys.argv[1])
        print(lk.begin_session(ttl=float(sys.argv[2])), os.getpid(), flush=True)
    """, name, str(ttl))
    token, pid = out.split()
    return int(token), int(pid)


def test_resume_exits_3_runbook_an_update_session(lock_name):
    sec = section("`resume` exits 3")
    token, pid = dead_session(lock_name)
    documented(sec, "`pyshmlock resume NAME` exits 3 when an update hold or an update "
                    "session still pins the pause after `--timeout`")
    p = run("resume", lock_name, "--timeout", "0.5")
    assert p.returncode == 3 and str(token) in p.stderr and f"pid {pid}" in p.stderr, p
    # status shows `session  token T, begun by pid N (running|exited) at ...; expires in S s`
    documented(sec, "`session token T, begun by pid N (running|exited) at ...; expires in S s`")
    line = [ln for ln in run("status", lock_name).stdout.splitlines()
            if ln.strip().startswith("session")]
    assert line and re.search(
        rf"session\s+token {token}, begun by pid {pid} \(exited\) at .*; expires in \d+ s",
        line[0]), line
    # 2. Its process exited: end it alone, redo the update, then resume.
    p = run(*cmd(sec, "pyshmlock session end NAME", lock_name))
    assert p.returncode == 0, p.stderr
    with pyshmlock.RWLock(lock_name, stale="keep").attached() as lk:
        assert lk.info().data_suspect
        with lk.update(10):
            pass                              # the update, redone
    p = run(*cmd(sec, "pyshmlock resume NAME", lock_name))
    assert p.returncode == 0, p.stderr
    assert not pyshmlock.inspect(lock_name).paused


def test_resume_exits_3_runbook_resume_force_on_a_dead_session(lock_name):
    sec = section("`resume` exits 3")
    token, _ = dead_session(lock_name)
    documented(sec, "`pyshmlock resume --force NAME` ends it as lost and opens the gate")
    p = run(*cmd(sec, "pyshmlock resume --force NAME", lock_name))
    assert p.returncode == 0, p.stderr
    info = pyshmlock.inspect(lock_name)
    assert not info.paused and info.session is None


def test_resume_exits_3_runbook_the_sessions_normal_end(lock_name):
    sec = section("`resume` exits 3")
    token, _ = dead_session(lock_name)
    args = cmd(sec, "pyshmlock session end NAME TOKEN", lock_name)
    p = run(*[str(token) if a == "TOKEN" else a for a in args])
    assert p.returncode == 0, p.stderr
    info = pyshmlock.inspect(lock_name)
    assert info.session is None and not info.data_suspect
    assert run("resume", lock_name).returncode == 0


def test_resume_exits_3_runbook_an_expired_session(lock_name):
    sec = section("`resume` exits 3")
    dead_session(lock_name, ttl=0.2)
    deadline = time.monotonic() + 30
    while pyshmlock.inspect(lock_name).session.expires_in > 0:
        assert time.monotonic() < deadline, "the session never expired"
        time.sleep(0.05)
    # 3. It expired: `pyshmlock resume NAME` itself when nobody is attached
    # ends it and marks the data suspect.
    documented(sec, "`pyshmlock resume NAME` itself when nobody is attached, ends it and "
                    "marks the data suspect")
    p = run("resume", lock_name)
    assert p.returncode == 1 and "suspect" in p.stderr, p
    info = pyshmlock.inspect(lock_name)
    assert info.session is None and info.data_suspect


def test_resume_exits_3_runbook_an_update_hold(lock_name):
    sec = section("`resume` exits 3")
    lk = pyshmlock.RWLock(lock_name)
    try:
        lk.pause()
        assert lk.acquire_update(5)
        documented(sec, "`exclusive update by pid N (held)`")
        line = [ln for ln in run("status", lock_name).stdout.splitlines()
                if ln.strip().startswith("exclusive")]
        assert line and re.search(rf"exclusive\s+update by pid {os.getpid()} \(held\)",
                                  line[0]), line
        p = run("resume", lock_name, "--timeout", "0.3")
        assert p.returncode == 3, p
        lk.release_update()
        assert run("resume", lock_name).returncode == 0
    finally:
        lk.close()


def test_a_stale_segment_runbook(lock_name):
    sec = section("A stale segment after a restart")
    in_child("""
        lk = pyshmlock.RWLock(sys.argv[1])
        lk.acquire_read()
        lk.pause()
    """, lock_name)
    documented(sec, "`status` prints `STALE`", "`ls` marks it `(stale)`",
               "`--json` has `stale` and `stale_left` (`\"pause\"`, `\"holds of dead processes\"`)")
    assert "STALE" in run("status", lock_name).stdout
    line = [ln for ln in run("ls").stdout.splitlines() if ln.split()[:1] == [lock_name]]
    assert line and "(stale)" in line[0], line
    d = json.loads(run("status", lock_name, "--json").stdout)
    assert d["stale"] is True and set(d["stale_left"]) == {"pause", "holds of dead processes"}, d
    # The first process of a restarted server clears the pause, and logs it.
    documented(sec, "`pid N died holding pause`")
    with pyshmlock.RWLock(lock_name).attached() as lk:
        assert not lk.paused
    assert "died holding pause" in run("status", lock_name).stdout
    # To start from nothing: `pyshmlock rm NAME`; it refuses while live
    # processes are attached (it lists their pids); `rm --force` asks for
    # `--confirm-split` on a paused lock.
    documented(sec, "`pyshmlock rm NAME`", "`rm --force`", "`--confirm-split`")
    lk = pyshmlock.RWLock(lock_name)
    try:
        p = run(*cmd(sec, "pyshmlock rm NAME", lock_name))
        assert p.returncode == 1 and str(os.getpid()) in p.stderr, p.stderr
        lk.pause()
        p = run("rm", "--force", lock_name)
        assert p.returncode == 1 and "--confirm-split" in p.stderr, p.stderr
        p = run("rm", "--force", "--confirm-split", lock_name)
        assert p.returncode == 0, p.stderr
    finally:
        lk.close()
    assert not os.path.exists(f"/dev/shm/pyshmlock.{lock_name}")


def test_restarting_with_more_processes_runbook(lock_name):
    sec = section("Restarting with more")
    pyshmlock.RWLock(lock_name, max_processes=2).close()
    with pyshmlock.RWLock(lock_name, max_processes=8).attached() as lk:
        assert lk.info().max_processes == 8
        documented(sec, "`has max_processes=2 ...; this process asked for max_processes=8`")
        p = run_python("-c", "import sys, pyshmlock; pyshmlock.RWLock(sys.argv[1], "
                       "max_processes=16)", lock_name, timeout=60)
        assert "has max_processes=8" in p.stderr and "asked for max_processes=16" in p.stderr
        for c in ("pyshmlock status NAME", "pyshmlock rm NAME"):
            documented(sec, f"`{c}`")
            assert c.replace("NAME", lock_name) in p.stderr, p.stderr
