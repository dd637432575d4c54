"""AsyncRWLock as a drop-in for SGLang's ``sglang.srt.utils.aio_rwlock.RWLock``.

SGLang's real lock is fetched at test time, never copied into this
repository: ``pip download --no-deps sglang==0.5.23`` into
``~/.cache/pyshmlock-tests`` (once; later runs reuse the wheel), and the one
file ``sglang/srt/utils/aio_rwlock.py`` is read out of the wheel and
imported as a standalone module (it imports only asyncio).  Without the
package index the tests are skipped with the reason.

- conformance: every public method/property of SGLang's RWLock exists on
  AsyncRWLock with the same kind and a compatible signature, and so do its
  holds' ``__aenter__``/``__aexit__``;
- differential: each behaviour SGLang's own unit tests check is one test
  body run against SGLang's real lock and against AsyncRWLock (through the
  adapter in sglang_adapter.py); both must pass the same assertions;
- opt-in: with ``SGLANG_SRC`` pointing at an SGLang checkout, its own
  ``test/registered/unit/utils/test_aio_rwlock*.py`` run unmodified against
  AsyncRWLock (``sglang.srt.utils.aio_rwlock`` is the stand-in in
  tests/sglang_shim).
"""
import asyncio
import glob
import importlib.util
import inspect
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest
from sglang_adapter import SGLangShapedRWLock, close_made

import pyshmlock

SGLANG_VERSION = "0.5.23"
CACHE = Path.home() / ".cache" / "pyshmlock-tests"
MEMBER = "sglang/srt/utils/aio_rwlock.py"
HERE = Path(__file__).resolve().parent

# the first test also fetches the wheel (at most 150 s, then it skips)
pytestmark = pytest.mark.timeout(200)


def _wheel():
    """The sglang wheel in the cache, downloading it first if needed."""
    pattern = str(CACHE / f"sglang-{SGLANG_VERSION}-*.whl")
    found = sorted(glob.glob(pattern))
    if found:
        return found[0]
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        # The file is pure Python and the same in every build: pin one
        # build so that every interpreter fetches (and caches) the same one.
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps",
               "--only-binary=:all:", "--python-version", "3.11",
               "--platform", "manylinux_2_34_x86_64", "--timeout", "30",
               f"sglang=={SGLANG_VERSION}", "-d", tmp]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
        except subprocess.TimeoutExpired:
            pytest.skip(f"could not fetch SGLang's RWLock from the package "
                        f"index: 'pip download sglang=={SGLANG_VERSION}' took "
                        "over 150 s")
        got = glob.glob(os.path.join(tmp, "sglang-*.whl"))
        if r.returncode != 0 or not got:
            tail = (r.stderr or r.stdout).strip().splitlines()[-1:]
            pytest.skip(f"could not fetch SGLang's RWLock from the package "
                        f"index: 'pip download sglang=={SGLANG_VERSION}' "
                        f"failed ({' '.join(tail)})")
        dest = CACHE / os.path.basename(got[0])
        os.replace(got[0], dest)       # atomic: a parallel run sees all or nothing
    return str(dest)


@pytest.fixture(scope="module")
def sglang_aio_rwlock(tmp_path_factory):
    """SGLang 0.5.23's aio_rwlock module, imported from the wheel's file."""
    if sys.version_info < (3, 11):
        pytest.skip("SGLang 0.5.23 supports Python 3.11 and later only (its Requires-Python)")
    with zipfile.ZipFile(_wheel()) as z:
        source = z.read(MEMBER)
    path = tmp_path_factory.mktemp("sglang") / "aio_rwlock.py"
    path.write_bytes(source)
    spec = importlib.util.spec_from_file_location("sglang_0_5_23_aio_rwlock", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def adapted():
    """Make SGLang-shaped AsyncRWLocks; close them after the test."""
    yield SGLangShapedRWLock
    close_made()


# -- conformance --------------------------------------------------------------

def _public(cls):
    return sorted(n for n in vars(cls) if not n.startswith("_"))


def _kind(obj):
    if isinstance(obj, property):
        return "property"
    if inspect.iscoroutinefunction(obj):
        return "coroutine"
    if callable(obj):
        return "plain"
    return "attribute"


def _accepts_every_call_of(ours, theirs):
    """True if each call valid for ``theirs`` is valid for ``ours``: same
    parameter names, kinds and defaults; extra ones only with defaults."""
    o = inspect.signature(ours).parameters
    t = inspect.signature(theirs).parameters
    for name, p in t.items():
        q = o.get(name)
        if q is None or q.kind != p.kind or q.default != p.default:
            return False
    return all(q.default is not q.empty or q.kind in (q.VAR_POSITIONAL, q.VAR_KEYWORD)
               for n, q in o.items() if n not in t)


def test_sglang_rwlock_api_is_asyncrwlock_api(sglang_aio_rwlock, adapted):
    theirs = sglang_aio_rwlock.RWLock
    names = _public(theirs)
    # guard against an empty or wrong file: the methods SGLang's code calls
    assert {"reader_lock", "writer_lock", "acquire_reader", "release_reader",
            "acquire_writer", "release_writer", "is_locked"} <= set(names)
    assert inspect.iscoroutinefunction(theirs.is_locked)   # 0.5.23's spelling
    ours = adapted()
    for name in names:
        t = inspect.getattr_static(theirs, name)
        if _kind(t) == "property":
            # SGLang: a property building a hold; ours: the hold itself,
            # an instance attribute (README: same object each time)
            o = getattr(ours, name)
            assert not callable(o) and not inspect.ismethod(o), name
            assert getattr(ours, name) is o
            continue
        o = inspect.getattr_static(pyshmlock.AsyncRWLock, name)
        assert _kind(o) == _kind(t), (name, _kind(o), _kind(t))
        assert _accepts_every_call_of(o, t), (name, inspect.signature(o),
                                             inspect.signature(t))
    # the hold objects: what SGLang's callers use on them (`async with`).
    # SGLang's are coroutine functions; ours are C methods returning
    # awaitables (a granted `async with` runs no Python frame).
    sg = theirs()
    for name in ("reader_lock", "writer_lock"):
        t_hold, o_hold = type(getattr(sg, name)), type(getattr(ours, name))
        for dunder in ("__aenter__", "__aexit__"):
            assert inspect.iscoroutinefunction(getattr(t_hold, dunder)), (name, dunder)
        hold = getattr(ours, name)
        # SGLang's __aexit__(self, exc_type, exc, tb): the arguments callers pass
        nexit = len(inspect.signature(t_hold.__aexit__).parameters) - 1

        async def enter_exit(hold=hold, nexit=nexit):
            entered = hold.__aenter__()
            assert inspect.isawaitable(entered), (name, "__aenter__")
            assert await entered is hold
            exited = hold.__aexit__(*[None] * nexit)      # same arity as SGLang's
            assert inspect.isawaitable(exited), (name, "__aexit__")
            assert await exited is None
        asyncio.run(enter_exit())
        assert not hold.lock.is_locked()


# -- differential: one body, both locks ---------------------------------------

@pytest.fixture(params=["sglang-0.5.23", "pyshmlock"])
def make_lock(request, adapted):
    if request.param == "pyshmlock":
        return adapted
    return request.getfixturevalue("sglang_aio_rwlock").RWLock


def run(body, timeout=10):
    """Run one async test body, bounded."""
    asyncio.run(asyncio.wait_for(body(), timeout))


async def until(pred, timeout=5):
    """Poll a condition (yielding to the loop) until it holds, bounded."""
    async def poll():
        while not pred():
            await asyncio.sleep(0.001)
    await asyncio.wait_for(poll(), timeout)


async def stays_blocked(task, grace=0.05):
    """The task does not finish within ``grace`` seconds."""
    done, _ = await asyncio.wait({task}, timeout=grace)
    return not done


def test_initial_state(make_lock):
    async def body():
        lk = make_lock()
        assert lk._readers == 0
        assert lk._writer_active is False
        assert lk._waiting_writers == 0
        assert await lk.is_locked() is False
    run(body)


def test_is_locked(make_lock):
    async def body():
        lk = make_lock()
        assert not await lk.is_locked()
        async with lk.reader_lock:
            assert await lk.is_locked()
        assert not await lk.is_locked()
        async with lk.writer_lock:
            assert await lk.is_locked()
            assert lk._writer_active
        assert not await lk.is_locked()
        await lk.acquire_reader()
        await lk.acquire_reader()
        assert lk._readers == 2 and await lk.is_locked()
        await lk.release_reader()
        assert await lk.is_locked()
        await lk.release_reader()
        assert not await lk.is_locked()
    run(body)


def test_readers_hold_concurrently(make_lock):
    async def body():
        lk = make_lock()
        n = 4
        inside = 0
        all_in, leave = asyncio.Event(), asyncio.Event()

        async def reader():
            nonlocal inside
            async with lk.reader_lock:
                inside += 1
                if inside == n:
                    all_in.set()
                await leave.wait()        # nobody leaves before all are in
                inside -= 1

        tasks = [asyncio.create_task(reader()) for _ in range(n)]
        await asyncio.wait_for(all_in.wait(), 5)
        assert inside == n and lk._readers == n
        leave.set()
        await asyncio.gather(*tasks)
        assert lk._readers == 0
        assert not await lk.is_locked()
    run(body)


def test_writer_is_exclusive(make_lock):
    async def body():
        lk = make_lock()
        events = []
        await lk.acquire_writer()
        assert lk._writer_active

        async def reader():
            async with lk.reader_lock:
                events.append("r+")
                await asyncio.sleep(0.01)
                events.append("r-")

        async def writer():
            async with lk.writer_lock:
                events.append("w+")
                await asyncio.sleep(0.01)
                events.append("w-")

        r = asyncio.create_task(reader())
        w = asyncio.create_task(writer())
        assert await stays_blocked(r) and await stays_blocked(w)
        assert events == []
        await lk.release_writer()
        await asyncio.gather(r, w)
        # the reader and the second writer never overlapped
        assert sorted(events) == ["r+", "r-", "w+", "w-"]
        assert events in (["r+", "r-", "w+", "w-"], ["w+", "w-", "r+", "r-"])
        assert not await lk.is_locked()
    run(body)


def test_writer_waits_for_readers(make_lock):
    async def body():
        lk = make_lock()
        await lk.acquire_reader()
        w = asyncio.create_task(lk.acquire_writer())
        await until(lambda: lk._waiting_writers == 1)
        assert await stays_blocked(w)
        assert not lk._writer_active and lk._readers == 1
        await lk.release_reader()
        await asyncio.wait_for(w, 5)
        assert lk._writer_active and lk._waiting_writers == 0 and lk._readers == 0
        await lk.release_writer()
        assert not await lk.is_locked()
    run(body)


def test_waiting_writer_blocks_new_readers(make_lock):
    async def body():
        lk = make_lock()
        order = []
        await lk.acquire_reader()

        async def writer():
            async with lk.writer_lock:
                order.append("writer")

        async def late_reader():
            async with lk.reader_lock:
                order.append("late reader")

        w = asyncio.create_task(writer())
        await until(lambda: lk._waiting_writers == 1)
        r = asyncio.create_task(late_reader())
        assert await stays_blocked(r)          # it queues behind the writer
        assert order == []
        await lk.release_reader()
        await asyncio.gather(w, r)
        assert order == ["writer", "late reader"]
        assert not await lk.is_locked()
    run(body)


def test_cancelled_waiting_reader_leaves_lock_usable(make_lock):
    async def body():
        lk = make_lock()
        await lk.acquire_writer()
        r = asyncio.create_task(lk.acquire_reader())
        assert await stays_blocked(r)
        r.cancel()
        with pytest.raises(asyncio.CancelledError):
            await r
        assert lk._readers == 0
        await lk.release_writer()
        assert not await lk.is_locked()
        async with lk.writer_lock:              # nothing left behind
            assert lk._writer_active and lk._readers == 0
        async with lk.reader_lock:
            assert lk._readers == 1
        assert not await lk.is_locked()
    run(body)


async def reader_behind_cancelled_writer(lk):
    """Hold a read, queue a writer, queue a reader behind it (it must
    block), then cancel the writer.  Returns the queued reader's task."""
    await lk.acquire_reader()
    w = asyncio.create_task(lk.acquire_writer())
    await until(lambda: lk._waiting_writers == 1)
    blocked = asyncio.create_task(lk.acquire_reader())
    assert await stays_blocked(blocked)
    w.cancel()
    with pytest.raises(asyncio.CancelledError):
        await w
    return blocked


def test_cancelled_waiting_writer_leaves_lock_usable(make_lock):
    async def body():
        lk = make_lock()
        blocked = await reader_behind_cancelled_writer(lk)
        assert lk._waiting_writers == 0 and not lk._writer_active
        await lk.release_reader()
        await asyncio.wait_for(blocked, 5)      # at the latest now
        assert lk._readers == 1
        await lk.release_reader()
        async with lk.writer_lock:              # no claim left behind
            assert lk._writer_active
        assert not await lk.is_locked()
    run(body)


# SGLang 0.5.23 wakes nobody when a waiting writer is cancelled, so a reader
# queued behind that writer waits for the remaining readers to leave.  The
# unit tests SGLang added later (test_aio_rwlock_cancellation.py) expect the
# wake and fail on 0.5.23; this test records that, and that AsyncRWLock
# wakes the reader.  From Python 3.13 on, asyncio.Condition.wait() itself
# passes a wake-up on to another waiter when a waiter is cancelled, which
# hides SGLang's bug (3.12 patch releases may have that too: not strict).
_SGLANG_WRITER_CANCEL_BUG = sys.version_info < (3, 13)


@pytest.mark.parametrize("make_lock", [
    pytest.param("sglang-0.5.23", marks=pytest.mark.xfail(
        condition=_SGLANG_WRITER_CANCEL_BUG, strict=sys.version_info < (3, 12),
        reason="SGLang 0.5.23 on Python < 3.13: a cancelled waiting writer wakes "
               "no reader (SGLang's newer unit tests expect it)")),
    "pyshmlock"], indirect=True)
def test_cancelled_waiting_writer_wakes_queued_reader(make_lock):
    async def body():
        lk = make_lock()
        blocked = await reader_behind_cancelled_writer(lk)
        try:
            done, _ = await asyncio.wait({blocked}, timeout=1)
            assert done, "the reader queued behind the cancelled writer still waits"
        finally:
            await lk.release_reader()
            await asyncio.wait_for(blocked, 5)
            await lk.release_reader()
    run(body)


def test_holds_are_async_context_managers(make_lock):
    async def body():
        lk = make_lock()
        for hold, field in (("reader_lock", "_readers"), ("writer_lock", "_writer_active")):
            async with getattr(lk, hold) as h:
                assert h is not None
                assert getattr(lk, field)
            assert not await lk.is_locked()
            with pytest.raises(KeyError):       # released on the way out
                async with getattr(lk, hold):
                    raise KeyError(hold)
            assert not await lk.is_locked()
    run(body)


# -- opt-in: SGLang's own unit tests, unmodified ------------------------------

def _sglang_test_files():
    src = os.environ.get("SGLANG_SRC")
    if not src:
        return [pytest.param(None, marks=pytest.mark.skip(
            reason="set SGLANG_SRC to an SGLang checkout to run its "
                   "test/registered/unit/utils/test_aio_rwlock*.py against "
                   "AsyncRWLock"))]
    found = sorted(glob.glob(os.path.join(
        src, "test", "registered", "unit", "utils", "test_aio_rwlock*.py")))
    if not found:     # a wrong path must not pass as "nothing to run"
        return [pytest.param(src, id="no-tests-found")]
    return [pytest.param(f, id=os.path.basename(f)) for f in found]


@pytest.mark.parametrize("test_file", _sglang_test_files())
def test_sglang_own_unit_tests(test_file, tmp_path):
    assert os.path.isfile(test_file), (
        f"SGLANG_SRC={test_file}: no test/registered/unit/utils/test_aio_rwlock*.py")
    # Run the file as it is, with unittest, in a child interpreter whose
    # ``sglang`` package is the stand-in (tests/sglang_shim) and whose
    # RWLock is AsyncRWLock through the adapter.  The file is copied into a
    # directory of its own so that nothing beside it shadows a module.
    shutil.copy(test_file, tmp_path)
    # The copy's own directory goes on the path too: the child runs with
    # PYTHONSAFEPATH (conftest), so its working directory is not searched.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(tmp_path), str(HERE / "sglang_shim"), str(HERE)]
        + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    r = subprocess.run(
        [sys.executable, "-m", "unittest", "-v", os.path.basename(test_file)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=100)
    report = r.stdout + r.stderr
    assert r.returncode == 0, report
    ran = re.search(r"^Ran (\d+) tests?", report, re.M)
    assert ran and int(ran.group(1)) > 0, report


def test_the_readmes_command_for_sglangs_own_tests_runs_a_checkouts_tests(tmp_path):
    """`SGLANG_SRC=... pytest tests/test_sglang_compat.py -k own_unit_tests`
    (the README's command) imports and runs the checkout's test files: here
    a checkout shaped like SGLang's with one such file, using the RWLock the
    way SGLang's tests do."""
    utils = tmp_path / "test" / "registered" / "unit" / "utils"
    utils.mkdir(parents=True)
    (utils / "test_aio_rwlock_shape.py").write_text(
        "import asyncio, unittest\n"
        "from sglang.srt.utils.aio_rwlock import RWLock\n\n"
        "class T(unittest.TestCase):\n"
        "    def test_reader_then_writer(self):\n"
        "        async def main():\n"
        "            lock = RWLock()\n"
        "            async with lock.reader_lock:\n"
        "                self.assertTrue(await lock.is_locked())\n"
        "            async with lock.writer_lock:\n"
        "                pass\n"
        "            self.assertFalse(await lock.is_locked())\n"
        "        asyncio.run(main())\n")
    env = dict(os.environ, SGLANG_SRC=str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        str(HERE / "test_sglang_compat.py"), "-k", "own_unit_tests"],
                       cwd=str(HERE.parent), env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout + r.stderr
