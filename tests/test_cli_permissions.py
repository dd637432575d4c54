"""Every user meets a refusal that names the lock's owner, its mode and a
command that works: an unprivileged user on root's lock, root on another
user's group-shared lock, the owner of a group-shared lock opening it
plainly.  Each suggested command is run as the user it names, and must do
what it says (no refusal suggests something that then fails).  Real
processes as real users (setpriv, as tests/helpers.run_python does); CI runs
as root."""
import os
import re
import shlex
import subprocess
import sys
import textwrap

import pytest
from helpers import run_python

import pyshmlock

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as other users")]

NOBODY = 65534
DAEMON_GID = 1          # group daemon (Debian): nobody joins it where a test says so


def run_as(uid, *args, groups=(), timeout=60):
    """`python -m pyshmlock *args` as uid (gid = uid for nobody, 0 for root),
    with the supplementary groups given."""
    cmd = [sys.executable, "-m", "pyshmlock", *args]
    if uid != 0:
        cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}",
               f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups", *cmd]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd="/",
                       env=dict(os.environ, PYTHONPATH=os.path.dirname(
                           os.path.dirname(pyshmlock.__file__))))
    assert "Traceback" not in p.stderr, p.stderr
    return p


def python_as(uid, code, *args, groups=()):
    cmd_user = None if uid == 0 else uid
    if groups:
        cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}",
               f"--groups={','.join(map(str, groups))}", sys.executable, "-c", code, *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd="/",
                              env=dict(os.environ, PYTHONPATH=os.path.dirname(
                                  os.path.dirname(pyshmlock.__file__))))
    return run_python("-c", code, *args, timeout=60, user=cmd_user)


def suggested(text, user):
    """The commands a refusal to ``user`` suggests: `sudo -u USER pyshmlock
    ...` and `pyshmlock ...`, as (uid to run as, the pyshmlock arguments)."""
    out = []
    for cmd in re.findall(r"`((?:sudo -u \S+ )?pyshmlock [^`]+)`", text):
        words = shlex.split(cmd)
        uid = user
        if words[0] == "sudo":
            who = words[2]
            uid = int(who[1:]) if who.startswith("#") else __import__("pwd").getpwnam(who).pw_uid
            words = words[3:]
        out.append((uid, words[1:]))
    return out


def assert_refusal_names_owner_mode_and_fix(p, owner, mode, cmd, user):
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    err = p.stderr
    assert owner in err and f"mode {mode:04o}" in err, err
    assert not re.search(r"permission denied: \w+: Permission denied: /dev/shm", err), \
        f"a bare errno: {err}"
    fixes = suggested(err, user)
    assert fixes, f"no command to run in: {err}"
    assert any(args and args[0] == cmd.split()[0] for _, args in fixes), (cmd, err)
    return fixes


@pytest.fixture
def roots_lock(lock_name):
    lk = pyshmlock.RWLock(lock_name)            # root, 0600
    yield lk
    lk.close()


@pytest.mark.parametrize("cmd", ["status", "status --json", "status --format prometheus",
                                 "watch --count 1", "pause", "resume --timeout 1",
                                 "session end", "rm"])
def test_an_unprivileged_user_on_roots_lock_gets_the_owner_the_mode_and_a_fix(roots_lock, cmd):
    name = roots_lock.name
    argv = cmd.split()[:1] + (["end"] if cmd.startswith("session") else []) + [name] + \
        [w for w in cmd.split()[1:] if w != "end"]
    p = run_as(NOBODY, *argv)
    fixes = assert_refusal_names_owner_mode_and_fix(p, "uid 0 (root)", 0o600, cmd, NOBODY)
    # The fix is the same command as root: it runs (an empty lock: session
    # end has nothing to end, rm removes it).
    uid, args = fixes[0]
    assert uid == 0 and args[0] == argv[0], fixes
    done = run_as(uid, *args)
    if cmd.startswith("session"):
        assert done.returncode == 1 and "no update session" in done.stderr, done.stderr
    elif cmd == "rm":
        assert done.returncode == 1 and "live process" in done.stderr, done.stderr
    else:
        assert done.returncode == 0, (args, done.stderr)


def test_an_unprivileged_python_open_names_the_owner_and_the_mode(roots_lock):
    p = python_as(NOBODY, "import pyshmlock, sys; pyshmlock.RWLock(sys.argv[1])",
                  roots_lock.name)
    assert "PermissionError" in p.stderr, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert "uid 0 (root)" in last and "mode 0600" in last and "owner" in last, last


def test_rm_never_suggests_a_command_that_fails(lock_name):
    """A 0644 lock of root with root attached: nobody may look, not remove."""
    lk = pyshmlock.RWLock(lock_name, mode=0o644)
    try:
        for argv in (["rm", lock_name], ["rm", "--force", lock_name]):
            p = run_as(NOBODY, *argv)
            assert p.returncode == 1, p
            for uid, args in suggested(p.stderr, NOBODY):
                assert uid == 0, f"suggests a command nobody cannot run: {p.stderr}"
        # What it suggests, run as root: removes it or asks for the split
        # confirmation, which then removes it.
        uid, args = suggested(run_as(NOBODY, "rm", lock_name).stderr, NOBODY)[0]
        done = run_as(uid, *args)
        while done.returncode != 0:
            more = [a for u, a in suggested(done.stderr, 0) if u == 0]
            assert more, done.stderr
            done = run_as(0, *more[0])
        assert not os.path.exists(f"/dev/shm/pyshmlock.{lock_name}")
    finally:
        lk.close()


GROUP_SHARED = textwrap.dedent("""
    import sys, pyshmlock
    pyshmlock.RWLock(sys.argv[1], mode=0o660, group="daemon").close()
""")


def test_root_on_a_group_shared_lock_of_another_user(lock_name):
    p = python_as(NOBODY, GROUP_SHARED, lock_name, groups=(DAEMON_GID,))
    assert p.returncode == 0, p.stderr
    for cmd in (["pause", lock_name], ["resume", lock_name, "--timeout", "1"],
                ["session", "end", lock_name]):
        p = run_as(0, *cmd)
        fixes = assert_refusal_names_owner_mode_and_fix(p, "uid 65534 (nobody)", 0o660, cmd[0],
                                                        0)
        assert "planted" not in p.stderr, p.stderr
        assert "group gid 1 (daemon)" in p.stderr, p.stderr
        # the group opt-in opens it for root; so does its owner
        opt_in = [a for u, a in fixes if "--group" in a]
        assert opt_in, p.stderr
        done = run_as(0, *opt_in[0])
        assert done.returncode == 0 or "no update session" in done.stderr, done.stderr
    p = run_as(0, "pause", "--group", "daemon", lock_name)     # --group implies 0660
    assert p.returncode == 0, p.stderr


def test_the_owner_of_a_group_shared_lock_opens_it_plainly(lock_name):
    """Created the documented way; the same user's plain RWLock(name) and
    the command open it (the owner's own group grant is its opt-in)."""
    lk = pyshmlock.RWLock(lock_name, mode=0o660, group="daemon")
    try:
        p = run_python("-c", "import pyshmlock, sys; pyshmlock.RWLock(sys.argv[1]).close()",
                       lock_name, timeout=60)
        assert p.returncode == 0, p.stderr
        for cmd in (["pause", lock_name], ["resume", lock_name, "--timeout", "2"]):
            p = run_as(0, *cmd)
            assert p.returncode == 0, (cmd, p.stderr)
    finally:
        lk.close()


def test_a_lock_open_to_every_user_names_the_mode_that_opens_it(lock_name):
    """The owner's own lock writable by every user (mode 0666) is refused to
    a plain open, naming the mode that accepts it: not 'planted'."""
    pyshmlock.RWLock(lock_name, mode=0o666).close()
    with pytest.raises(PermissionError) as e:
        pyshmlock.RWLock(lock_name)
    assert "mode=0o666" in str(e.value) and "planted" not in str(e.value), e.value
    p = run_as(0, "pause", lock_name)
    assert p.returncode == 1 and "--mode 0666" in p.stderr, p.stderr
    p = run_as(0, "pause", "--mode", "0666", lock_name)
    assert p.returncode == 0, p.stderr


def test_ls_as_an_unprivileged_user_names_the_owner_the_mode_and_a_command(roots_lock):
    name = roots_lock.name
    p = run_as(NOBODY, "ls")
    assert p.returncode == 0, p.stderr
    line = [ln for ln in p.stdout.splitlines() if ln.split()[:1] == [name]]
    assert line, p.stdout
    assert "uid 0 (root)" in line[0] and "mode 0600" in line[0], line
    fixes = suggested(line[0], NOBODY)
    assert fixes and fixes[0][0] == 0, line
    uid, args = fixes[0]
    done = run_as(uid, *args)
    assert done.returncode == 0 and name in done.stdout, done


# Every verb of the command, as root on a group-shared lock of another user:
# it works, or its refusal names the owner, the mode and a command that does.
EVERY_VERB = [["ls"], ["status", "{}"], ["status", "{}", "--json"],
              ["status", "{}", "--format", "prometheus"], ["watch", "{}", "--count", "1"],
              ["pause", "{}"], ["resume", "{}", "--timeout", "1"], ["session", "end", "{}"],
              ["rm", "{}"]]


@pytest.mark.parametrize("verb", EVERY_VERB, ids=lambda v: " ".join(w for w in v if w != "{}"))
def test_root_on_a_group_shared_lock_every_verb_works_or_names_the_fix(lock_name, verb):
    p = python_as(NOBODY, GROUP_SHARED, lock_name, groups=(DAEMON_GID,))
    assert p.returncode == 0, p.stderr
    argv = [w.format(lock_name) for w in verb]
    p = run_as(0, *argv)
    if p.returncode == 0:
        return
    if verb[0] == "session" and "no update session" in p.stderr:
        return                                   # it opened the lock: nothing to end
    fixes = assert_refusal_names_owner_mode_and_fix(p, "uid 65534 (nobody)", 0o660, argv[0], 0)
    uid, args = fixes[0]
    done = run_as(uid, *args, groups=(DAEMON_GID,) if uid == NOBODY else ())
    assert done.returncode == 0 or "no update session" in done.stderr, (args, done.stderr)
