"""No finaliser takes a lock: not the library's, not its lab's, not the
test suite's own.  A finaliser (``__del__``, a ``weakref.finalize``
callback) runs inside whatever call the garbage collection interrupts; if
it waits for a lock that call holds (the registry lock, held by every open
and close of a lock), the thread waits for good.  pytest-timeout cannot end
that: the error its alarm raises inside a finaliser is printed and
swallowed, and the next finaliser waits again.

Found as a hang of the aarch64 CI job (the job's 90 minutes ran out): a
test helper closed its locks from a finaliser, and a collection inside a
close() of a later test ran it.  Two checks close the class:

* every finaliser in ``pyshmlock/``, ``pyshmlock_lab/`` and ``tests/`` is
  one listed here with why it takes no lock, so a new one is read before it
  lands (the library's own is also tested in tests/test_dropped_lock.py);
* the suite's lock-making helpers, their locks dropped while the registry
  lock is held, do not wait (in a child, so that a hang fails this test
  instead of the worker).
"""
import ast
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCANNED = ("pyshmlock", "pyshmlock_lab", "tests")

# (file, what runs as the finaliser) -> why it takes no lock
LOCK_FREE_FINALISERS = {
    ("pyshmlock/lock.py", "RWLock.__del__"):
        "warns, then queues the attachment reference on a deque "
        "(_attachment.drop); the next open or close settles it",
    ("pyshmlock/_park.py", "self._dead.append"):
        "deque.append: the watcher's next park or close removes the entry",
    ("pyshmlock/cluster/_sync.py", "_stop_loop"):
        "loop.call_soon_threadsafe(loop.stop): a deque append and one "
        "byte to the loop's self-pipe",
}


def _finalisers():
    """(file, finaliser, line) for every __del__ and weakref.finalize."""
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            tree = ast.parse(path.read_text(), rel)
            for cls in ast.walk(tree):
                if isinstance(cls, ast.ClassDef):
                    for fn in cls.body:
                        if isinstance(fn, ast.FunctionDef) and fn.name == "__del__":
                            yield rel, f"{cls.name}.__del__", fn.lineno
            for call in ast.walk(tree):
                if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                        and call.func.attr == "finalize"
                        and isinstance(call.func.value, ast.Name)
                        and call.func.value.id == "weakref"):
                    yield rel, ast.unparse(call.args[1]), call.lineno


def test_every_finaliser_is_one_known_to_take_no_lock():
    found = {(f, what): line for f, what, line in _finalisers()}
    new = [f"{f}:{line}: {what}" for (f, what), line in found.items()
           if (f, what) not in LOCK_FREE_FINALISERS]
    assert not new, (
        "finalisers not yet shown to take no lock (a collection may run them "
        "inside a call holding the lock they would wait for): make them "
        "lock-free and list them in LOCK_FREE_FINALISERS with why, or keep "
        "the object alive and close it explicitly:\n  " + "\n  ".join(new))
    gone = sorted(set(LOCK_FREE_FINALISERS) - set(found))
    assert not gone, f"listed finalisers no longer in the code: {gone}"


HELPERS = {
    # the CPython lock tests' lock factory
    "test_lock_tests.write_hold": "from test_lock_tests import write_hold as make",
    # the SGLang-shaped AsyncRWLock (also used by SGLang's own unit tests)
    "sglang_adapter.SGLangShapedRWLock":
        "from sglang_adapter import SGLangShapedRWLock as make",
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("helper", sorted(HELPERS))
def test_a_helpers_lock_dropped_while_the_registry_lock_is_held_does_not_wait(helper):
    child = textwrap.dedent(f"""
        import gc, sys
        sys.path.insert(0, {str(ROOT / "tests")!r})
        {HELPERS[helper]}
        from pyshmlock import _attachment
        made = make()
        with _attachment._registry_lock:    # as inside an open or a close
            del made
            gc.collect()
        print("not waited")
    """)
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"{helper}: dropping its lock inside the registry lock waited "
                    f"(a finaliser takes that lock):\n{out}")
    assert proc.returncode == 0 and "not waited" in out, out


def test_the_library_enters_its_registry_lock_only_through_the_check_for_its_holder():
    """An application's finaliser may open or close a lock inside this
    thread's own open or close: the registry lock is entered only through
    _registry_lock_unless_held(), which refuses its holder
    (WouldDeadlockError) instead of waiting for itself (behaviour:
    tests/test_dropped_lock.py)."""
    direct = []
    for path in sorted((ROOT / "pyshmlock").rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if "_registry_lock" in line and ("with " in line or ".acquire(" in line) \
                    and "_registry_lock_unless_held()" not in line:
                direct.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not direct, direct
