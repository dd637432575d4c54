"""The `pyshmlock` command as an on-call operator meets it: the reason of a
refusal is printed whole, the gate can be flipped on a lock whose slots are
all taken, a full lock says which max_processes it has, STALE says what is
left, a missing extra is one line, a bad name is a usage error, advice names
commands (never Python calls), a pipe's reader may stop early, a name may
start with a dash.  Real subprocesses against real locks."""
import os
import subprocess
import sys
import textwrap

import pytest
from helpers import run_python, wait_for
from test_cli_ops import run

import pyshmlock
from pyshmlock import cli

pytestmark = pytest.mark.timeout(120)

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as another user")


def as_nobody(code, *args):
    run_python("-c", code, *args, timeout=30, user=NOBODY, check=True)


@needs_root
def test_a_refusal_names_the_owner_the_mode_and_the_fix(lock_name):
    as_nobody("import pyshmlock, sys; pyshmlock.RWLock(sys.argv[1], mode=0o644).close()",
              lock_name)
    for cmd in (["pause", lock_name], ["resume", lock_name], ["rm", lock_name]):
        p = run(*cmd)
        assert p.returncode == 1, p
        assert "uid 65534 (nobody)" in p.stderr and "0644" in p.stderr, p.stderr
    p = run("status", lock_name)           # observing needs only read permission
    assert p.returncode == 0 and "paused        no" in p.stdout, p.stderr


def test_pause_and_resume_work_on_a_lock_whose_slots_are_all_taken(lock_name):
    lk = pyshmlock.RWLock(lock_name, max_processes=1)
    try:
        p = run("pause", lock_name)
        assert p.returncode == 0 and "paused" in p.stdout, p.stderr
        assert lk.paused
        p = run("resume", lock_name)
        assert p.returncode == 0 and "running" in p.stdout, p.stderr
        assert not lk.paused
        assert lk.info().attached_pids == [os.getpid()], "the CLI took a slot"
    finally:
        lk.close()


def test_a_full_lock_names_its_max_processes_and_the_one_asked_for(lock_name):
    lk = pyshmlock.RWLock(lock_name, max_processes=1)
    try:
        code = "import pyshmlock, sys; pyshmlock.RWLock(sys.argv[1], max_processes=8)"
        p = subprocess.run([sys.executable, "-c", code, lock_name], capture_output=True,
                           text=True, timeout=30)
        assert "TooManyProcessesError" in p.stderr
        assert "max_processes=1" in p.stderr and "max_processes=8" in p.stderr, p.stderr
        assert "pyshmlock rm" in p.stderr
    finally:
        lk.close()


def test_stale_says_what_is_left_and_what_the_next_opener_does(lock_name):
    code = textwrap.dedent("""
        import os, sys, pyshmlock
        lk = pyshmlock.RWLock(sys.argv[1])
        lk.acquire_read()
        os._exit(0)          # dies holding a read: no pause left
    """)
    subprocess.run([sys.executable, "-c", code, lock_name], check=True, timeout=30)
    p = run("status", lock_name)
    stale = [ln for ln in p.stdout.splitlines() if "STALE" in ln]
    assert stale and "holds or claims of dead pid" in stale[0], p.stdout
    assert "clears the pause" not in stale[0], "it is not paused"
    info = pyshmlock.inspect(lock_name)
    assert info.stale and info.stale_left == ["holds of dead processes"]
    code = textwrap.dedent("""
        import os, sys, pyshmlock
        lk = pyshmlock.RWLock(sys.argv[1]); lk.pause()
        os._exit(0)
    """)
    subprocess.run([sys.executable, "-c", code, lock_name], check=True, timeout=30)
    p = run("status", lock_name)
    assert "a pause by pid" in p.stdout and "clears the pause" in p.stdout, p.stdout




def _block(tmp_path, blocked):
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent(f'''
        import sys
        class _Missing:
            def find_spec(self, name, path=None, target=None):
                if any(name == b or name.startswith(b + ".") for b in {blocked!r}):
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None
        sys.meta_path.insert(0, _Missing())
    '''))
    return dict(os.environ, PYTHONPATH=f"{tmp_path}:" + os.path.dirname(
        os.path.dirname(pyshmlock.__file__)))


def test_the_cluster_commands_need_no_extra(tmp_path):
    """The cluster's etcd client is the standard library's: with httpx and
    etcd3gw missing, `pyshmlock cluster` runs (an unreachable etcd is exit 3)."""
    env = _block(tmp_path, ("httpx", "etcd3gw", "requests"))
    p = subprocess.run([sys.executable, "-m", "pyshmlock", "cluster", "status", "--etcd",
                        "http://127.0.0.1:1", "x", "--etcd-timeout", "0.5"],
                       capture_output=True, text=True, timeout=60, env=env, cwd="/")
    assert p.returncode == 3 and "etcd unreachable" in p.stderr, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("command,extra,blocked", [
    (["demo"], "demo", "fastapi"),
])
def test_a_missing_extra_is_one_line_naming_it(tmp_path, command, extra, blocked):
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent(f'''
        import sys
        class _Missing:
            """This interpreter lacks {blocked!r}, as a plain wheel would."""
            def find_spec(self, name, path=None, target=None):
                if name == {blocked!r} or name.startswith({blocked!r} + "."):
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None
        sys.meta_path.insert(0, _Missing())
    '''))
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}:" + os.path.dirname(
        os.path.dirname(pyshmlock.__file__)))
    p = subprocess.run([sys.executable, "-m", "pyshmlock", *command], capture_output=True,
                       text=True, timeout=60, env=env, cwd="/")
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and f"pip install 'pyshmlock[{extra}]'" in lines[0], p.stderr


@pytest.mark.parametrize("cmd", ["status", "pause", "resume", "rm", "watch"])
def test_an_invalid_lock_name_is_a_usage_error(cmd):
    p = run(cmd, "no/slashes")
    assert p.returncode == 2 and "invalid lock name" in p.stderr, p.stderr


# ------------------------------------------------ advice names CLI commands

PYTHON_WORDS = ("pyshmlock.unlink(", "info()", "force=True", "resume(force", "RWLock(")


def _no_python_advice(text):
    for word in PYTHON_WORDS:
        assert word not in text, f"the CLI advises a Python call ({word!r}): {text}"


def test_an_unfinished_segment_names_the_rm_command(lock_name):
    open(f"/dev/shm/pyshmlock.{lock_name}", "wb").close()     # its creator died at once
    for cmd in (["pause", lock_name], ["resume", lock_name], ["status", lock_name]):
        p = run(*cmd)
        assert p.returncode == 1, p
        assert f"pyshmlock rm --force {lock_name}" in p.stderr, p.stderr
        _no_python_advice(p.stderr)


def test_suspect_data_names_the_cli_commands(lock_name):
    code = textwrap.dedent("""
        import os, sys, pyshmlock
        lk = pyshmlock.RWLock(sys.argv[1])
        lk.pause()
        lk.acquire_update()
        os._exit(0)          # dies holding the update: the data is suspect
    """)
    subprocess.run([sys.executable, "-c", code, lock_name], check=True, timeout=60)
    p = run("resume", lock_name)
    assert p.returncode == 1 and "suspect" in p.stderr, p.stderr
    assert f"pyshmlock resume --force {lock_name}" in p.stderr
    assert f"pyshmlock status {lock_name}" in p.stderr
    _no_python_advice(p.stderr)


def test_rm_of_a_lock_in_use_names_only_the_cli_flag(lock, lock_name):
    p = run("rm", lock_name)
    assert p.returncode == 1 and f"pyshmlock rm --force {lock_name}" in p.stderr, p.stderr
    _no_python_advice(p.stderr)


@pytest.mark.parametrize("cmd", ["status", "pause", "resume", "rm"])
def test_a_foreign_segment_gets_a_fix(lock_name, cmd):
    with open(f"/dev/shm/pyshmlock.{lock_name}", "wb") as f:
        f.write(b"something else entirely " * 1000)
    p = run(cmd, lock_name)
    assert p.returncode == 1, p
    assert "not a pyshmlock lock" in p.stderr, p.stderr
    assert f"pyshmlock rm --force {lock_name}" in p.stderr, p.stderr
    _no_python_advice(p.stderr)


# ------------------------------------------------------- the command line

@pytest.mark.parametrize("argv", [["status", "{}"], ["status", "{}", "--json"], ["ls"]])
def test_a_reader_that_stops_early_gets_no_broken_pipe_error(lock, argv):
    """`pyshmlock status NAME | head -1`: the pipe's reader has gone when the
    command writes (here before it starts, so that no timing decides it)."""
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run([sys.executable, "-m", "pyshmlock",
                            *[a.format(lock.name) for a in argv]],
                           stdout=w, stderr=subprocess.PIPE, text=True, timeout=60, cwd="/")
    finally:
        os.close(w)
    assert p.stderr == "", p.stderr
    assert p.returncode == cli.EXIT_PIPE, p.returncode


def test_a_name_that_starts_with_a_dash_needs_no_double_dash(lock_name):
    name = "-" + lock_name
    lk = pyshmlock.RWLock(name)
    try:
        p = run("status", name)
        assert p.returncode == 0 and f"lock {name}" in p.stdout, p.stderr
        p = run("pause", name)
        assert p.returncode == 0 and lk.paused, p.stderr
        p = run("resume", name, "--timeout", "5")
        assert p.returncode == 0 and not lk.paused, p.stderr
        p = run("resume", "--timeout", "5", name)
        assert p.returncode == 0, p.stderr
        p = run("status", name, "--format", "json")
        assert p.returncode == 0 and f'"name": "{name}"' in p.stdout, p.stderr
        p = run("watch", name, "--count", "1", "--interval", "0.01")
        assert p.returncode == 0, p.stderr
        p = run("status", "--", name)             # the usual spelling still works
        assert p.returncode == 0, p.stderr
    finally:
        lk.close()
    p = run("rm", name)
    assert p.returncode == 0, p.stderr
    # an option it does not know stays a usage error, naming the option
    p = run("status", lock_name, "--no-such-option")
    assert p.returncode == 2 and "--no-such-option" in p.stderr, p.stderr


def test_bench_refuses_an_output_in_a_missing_directory(tmp_path):
    missing = tmp_path / "no" / "such" / "dir"
    for opt in ("--json", "--png"):
        p = run("bench", "--quick", opt, str(missing / "x.out"), timeout=60)
        assert p.returncode == 2 and "no such directory" in p.stderr, p.stderr
        assert not (tmp_path / "no").exists(), "bench created the directory"


# --------------------------------------------------------- update sessions

def _dead_session(name, ttl=600.0):
    """A session begun by a process that was then SIGKILLed: (token, pid)."""
    code = textwrap.dedent("""
        import os, signal, sys, pyshmlock
        lk = pyshmlock.RWLock(sys.argv[1])
        print(lk.begin_session(ttl=float(sys.argv[2])), os.getpid(), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    p = run_python("-c", code, name, str(ttl), timeout=60)
    token, pid = p.stdout.split()
    return int(token), int(pid)


def test_status_shows_the_session_its_owner_and_its_expiry(lock_name):
    token, pid = _dead_session(lock_name)
    p = run("status", lock_name)
    line = [ln for ln in p.stdout.splitlines() if ln.strip().startswith("session")]
    assert line, p.stdout
    assert str(token) in line[0] and f"pid {pid} (exited)" in line[0], line
    assert "expires in" in line[0], line


def test_resume_says_which_session_pins_and_how_to_end_it(lock_name):
    token, pid = _dead_session(lock_name)
    p = run("resume", lock_name, "--timeout", "0.5")
    assert p.returncode == 3, p
    assert str(token) in p.stderr and f"pid {pid} (exited)" in p.stderr, p.stderr
    assert f"pyshmlock resume --force {lock_name}" in p.stderr, p.stderr
    assert f"pyshmlock session end {lock_name}" in p.stderr, p.stderr


def test_resume_force_ends_the_session_of_a_process_that_is_gone(lock_name):
    token, pid = _dead_session(lock_name)
    p = run("resume", lock_name, "--force", "--timeout", "5")
    assert p.returncode == 0, p.stderr
    assert f"ended update session {token}" in p.stdout, p.stdout
    info = pyshmlock.inspect(lock_name)
    assert not info.paused and info.session is None and not info.data_suspect
    assert ("update session",) in [r.lost for r in info.recoveries]


def test_session_end_without_a_token_ends_it_as_lost(lock_name):
    token, pid = _dead_session(lock_name)
    p = run("session", "end", lock_name)
    assert p.returncode == 0 and "suspect" in p.stdout, (p.stdout, p.stderr)
    info = pyshmlock.inspect(lock_name)
    assert info.session is None and info.paused and info.data_suspect
    p = run("resume", lock_name)
    assert p.returncode == 1 and f"pyshmlock resume --force {lock_name}" in p.stderr, p.stderr
    p = run("resume", lock_name, "--force")
    assert p.returncode == 0, p.stderr
    p = run("session", "end", lock_name)            # nothing left to end
    assert p.returncode == 1 and "no update session" in p.stderr, p.stderr


def test_session_end_with_its_token_is_its_normal_end(lock_name):
    token, pid = _dead_session(lock_name)
    p = run("session", "end", lock_name, str(token + 1))
    assert p.returncode == 1 and "no current update session" in p.stderr, p.stderr
    _no_python_advice(p.stderr)
    p = run("session", "end", lock_name, str(token))
    assert p.returncode == 0, p.stderr
    info = pyshmlock.inspect(lock_name)
    assert info.session is None and info.paused and not info.data_suspect
    p = run("resume", lock_name)
    assert p.returncode == 0, p.stderr


def test_an_expired_session_with_nobody_attached_is_ended_by_resume(lock_name):
    _dead_session(lock_name, ttl=0.2)
    wait_for(lambda: pyshmlock.inspect(lock_name).session.expires_in <= 0, 30,
             "the session's deadline")
    p = run("status", lock_name)
    assert "expired" in p.stdout and f"pyshmlock resume {lock_name}" in p.stdout, p.stdout
    p = run("resume", lock_name)            # ends it (data suspect) and refuses
    assert p.returncode == 1 and "suspect" in p.stderr, p.stderr
    p = run("resume", lock_name, "--force")
    assert p.returncode == 0, p.stderr
