"""The `pyshmlock` command as an operator uses it.
Real subprocesses against real locks; nothing mocked."""
import io
import os
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout

import pytest
from conftest import unique_name
from helpers import remove_lock, run_python

import pyshmlock
from pyshmlock import cli

pytestmark = pytest.mark.timeout(120)


def run(*args, timeout=60, user=None):
    p = run_python("-m", "pyshmlock", *args, timeout=timeout, user=user)
    assert "Traceback" not in p.stderr, p.stderr
    return p


def test_status_on_a_full_lock_and_without_counting_itself(lock_name):
    lk = pyshmlock.RWLock(lock_name, max_processes=1)
    try:
        assert lk.acquire_read(1)
        p = run("status", lock_name)
        assert p.returncode == 0, p.stderr
        assert f"1 of 1 process slots ({os.getpid()})" in p.stdout, p.stdout
        p = run("ls")
        mine = [line for line in p.stdout.splitlines() if line.startswith(lock_name)]
        # (other locks on the host, e.g. of other test runs, are not this test's)
        assert p.returncode == 0 and len(mine) == 1 and "unreadable" not in mine[0], p.stdout
        p = run("watch", lock_name, "--count", "1", "--interval", "0.01")
        assert p.returncode == 0 and f"pid {os.getpid()}: 1" in p.stdout, p.stderr
        lk.release_read()
    finally:
        lk.close()


def test_status_as_another_user_with_mode_0644(lock_name):
    if os.geteuid() != 0:
        pytest.skip("needs root to run a process as another user")
    lk = pyshmlock.RWLock(lock_name, mode=0o644)
    try:
        lk.pause()
        p = run("status", lock_name, user=65534)
        assert p.returncode == 0, p.stderr
        assert f"by pid {os.getpid()} (attached)" in p.stdout, p.stdout
    finally:
        lk.close()


def test_status_says_the_pauser_is_gone(lock_name):
    p = run("pause", lock_name)     # the CLI pauses, then exits
    assert p.returncode == 1        # no such lock yet
    lk = pyshmlock.RWLock(lock_name)
    lk.close()
    p = run("pause", lock_name)
    assert p.returncode == 0
    p = run("status", lock_name)
    assert "(exited)" in p.stdout and "stale" in p.stdout.lower(), p.stdout
    # The CLI itself keeps a stale pause: looking or pausing again changes nothing.
    assert pyshmlock.inspect(lock_name).paused


def test_running_watch_does_not_block_rm_and_notices_removal():
    name = unique_name("watch")
    pyshmlock.RWLock(name).close()      # a lock nobody is attached to
    w = subprocess.Popen([sys.executable, "-m", "pyshmlock", "watch", name, "--interval",
                          "0.05"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd="/", env=dict(os.environ, PYTHONPATH=os.path.dirname(
                             os.path.dirname(pyshmlock.__file__))))
    try:
        assert w.stdout.readline().startswith(f"lock {name}")
        p = run("rm", name)
        assert p.returncode == 0, p.stderr
        out, err = w.communicate(timeout=10)
        assert w.returncode == 1 and "removed" in err, (out, err)
    finally:
        if w.poll() is None:
            w.kill()
            w.wait(5)
        remove_lock(name)


def test_rm_words_and_confirmation(lock, lock_name):
    p = run("rm", lock_name)
    assert p.returncode == 1 and "--force" in p.stderr and "force=True" not in p.stderr
    assert str(os.getpid()) in p.stderr
    # Attached, paused and held: --force alone warns and refuses.
    assert lock.acquire_read(1)
    lock.pause()
    p = run("rm", lock_name, "--force")
    assert p.returncode == 1 and "--confirm-split" in p.stderr and "paused" in p.stderr
    assert os.path.exists(f"/dev/shm/pyshmlock.{lock_name}")
    p = run("rm", lock_name, "--force", "--confirm-split")
    assert p.returncode == 0 and "warning" in p.stderr.lower()
    assert not os.path.exists(f"/dev/shm/pyshmlock.{lock_name}")
    lock.release_read()


def test_empty_segment_does_not_stall_ls_or_status():
    name = unique_name("empty")
    path = f"/dev/shm/pyshmlock.{name}"
    open(path, "wb").close()
    try:
        for argv in (["ls"], ["status", name]):
            out, err = io.StringIO(), io.StringIO()
            t0 = time.monotonic()
            with redirect_stdout(out), redirect_stderr(err):
                cli.main(argv)
            took = time.monotonic() - t0
            assert "never initialised" in out.getvalue() + err.getvalue()
            # A stall is the core's wait for a creator, 2 s (OPEN_WAIT_NS):
            # at least that long, however loaded the machine.
            assert took < 2.0, f"{argv} took {took:.1f} s on an empty segment"
    finally:
        os.unlink(path)


def test_bad_numbers_are_usage_errors(lock, lock_name):
    for argv in (["watch", lock_name, "--interval", "-1"], ["watch", lock_name, "--count", "-1"],
                 ["watch", lock_name, "--interval", "nan"],
                 ["resume", lock_name, "--timeout", "-1"]):
        p = run(*argv)
        assert p.returncode == 2, (argv, p.stderr)
    p = run("resume", lock_name, "--timeout", "1e30")
    assert p.returncode == 0, p.stderr


def test_version_help_and_exit_codes():
    p = run("--version")
    assert p.returncode == 0 and pyshmlock.__version__ in p.stdout


def test_version_names_the_sglang_releases_the_integration_was_tested_with():
    from pyshmlock.integrations.sglang import TESTED_VERSIONS
    p = run("--version")
    assert p.returncode == 0, p.stderr
    assert f"tested with SGLang {', '.join(TESTED_VERSIONS)}" in p.stdout, p.stdout


def test_help_and_exit_codes():
    p = run("--help")
    assert "exit codes" in p.stdout.lower() and " 3 " in p.stdout
    parser = cli.build_parser()
    subs = next(a for a in parser._actions if a.choices and isinstance(a.choices, dict))
    for sub, sp in subs.choices.items():
        for a in sp._actions:
            assert a.help, f"`pyshmlock {sub}`: {a.dest} has no description"
    assert "lock name" in run("status", "--help").stdout.lower()
