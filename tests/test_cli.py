"""The `pyshmlock` command: real subprocesses against real locks."""
import json
import os

import pytest
from helpers import run_python

import pyshmlock

pytestmark = pytest.mark.timeout(120)


def run(*args, timeout=60):
    p = run_python("-m", "pyshmlock", *args, timeout=timeout)
    assert "Traceback" not in p.stderr, p.stderr
    return p


def test_status_pause_resume_rm(lock, lock_name):
    assert lock.acquire_read(1)
    p = run("status", lock_name)
    assert p.returncode == 0
    assert f"pid {os.getpid()}: 1" in p.stdout and "paused        no" in p.stdout
    assert run("pause", lock_name).returncode == 0
    assert lock.paused
    data = json.loads(run("status", lock_name, "--json").stdout)
    assert data["paused"] is True and data["readers"] == {str(os.getpid()): 1}
    assert data["paused_by_pid"] not in (None, os.getpid())
    assert run("resume", lock_name, "--timeout", "2").returncode == 0
    assert not lock.paused
    p = run("ls")
    assert lock_name in p.stdout
    p = run("rm", lock_name)
    assert p.returncode == 1 and "1 live process(es) attached" in p.stderr
    lock.release_read()
    assert run("rm", lock_name, "--force").returncode == 0
    assert lock_name not in run("ls").stdout


def test_resume_timeout_exit_code(lock, lock_name):
    lock.pause()
    assert lock.acquire_update(1)
    p = run("resume", lock_name, "--timeout", "0.2")
    assert p.returncode == 3 and "still paused" in p.stderr
    lock.release_update()
    assert run("resume", lock_name, "--timeout", "2").returncode == 0


def test_missing_lock_is_a_clean_error(lock_name):
    for cmd in (["status", lock_name], ["pause", lock_name], ["resume", lock_name],
                ["rm", lock_name], ["watch", lock_name, "--count", "1"]):
        p = run(*cmd)
        assert p.returncode == 1 and "no lock named" in p.stderr, cmd


def test_invalid_name_and_usage():
    p = run("status", "bad/name")
    assert p.returncode == 2 and "invalid lock name" in p.stderr   # a usage error
    assert run().returncode == 2


def test_watch_refreshes(lock, lock_name):
    p = run("watch", lock_name, "--count", "2", "--interval", "0.05")
    assert p.returncode == 0 and p.stdout.count(f"lock {lock_name}") == 2


@pytest.mark.needs_robust_futex
def test_status_reports_recoveries(lock, lock_name, children):
    from test_crash import hold_and_hang
    c = children(hold_and_hang, lock_name, "write")
    c.expect("holding")
    c.kill()
    p = run("status", lock_name)
    # status only observes: it reports the dead holder, an attached process reclaims
    assert f"write by pid {c.pid} (dead)" in p.stdout and "DATA SUSPECT" in p.stdout
    lock.info()
    p = run("status", lock_name)
    assert f"pid {c.pid} died holding write" in p.stdout and "DATA SUSPECT" in p.stdout
    assert pyshmlock.RWLock  # the library and the CLI agree on the same segment


# The demo's third-party modules, hidden from a fresh interpreter as if its
# extra were not installed (an import of one raises ModuleNotFoundError).
_WITHOUT_DEMO_EXTRA = """
import runpy, sys
class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"fastapi", "uvicorn", "httpx"}:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, NotInstalled())
sys.argv = ["pyshmlock", "demo", "--workers", "3"]
runpy.run_module("pyshmlock", run_name="__main__")
"""


def test_demo_without_its_extra_names_the_extra_in_one_line():
    """`pyshmlock demo` reaches the lab's demo lazily; without the `demo`
    extra's modules it says which extra to install, before starting
    anything, with no traceback."""
    p = run_python("-c", _WITHOUT_DEMO_EXTRA, timeout=60)
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert p.stderr.splitlines() == [
        "pyshmlock: `pyshmlock demo` needs the 'demo' extra (missing: fastapi, uvicorn, "
        "httpx): pip install 'pyshmlock[demo]'"], p.stderr
