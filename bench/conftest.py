"""Microbenchmark fixtures, and a summary that states every figure as a ratio
to the floors (two cffi calls; two bare C-API calls) and to posix_ipc's pair,
all measured in the same run."""
import mmap
import os
import statistics
import tempfile
import uuid

import pytest

import pyshmlock

PAIRS_PER_ASYNC_CALL = 1000


@pytest.fixture
def lock():
    name = f"bench-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    lk = pyshmlock.RWLock(name)
    yield lk
    lk.close()
    pyshmlock.unlink(name, force=True)


@pytest.fixture
def shm_word():
    """A 4-byte word in a real shared-memory mapping, for the floor."""
    path = os.path.join("/dev/shm", f"bench-floor-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, 4096)
    m = mmap.mmap(fd, 4096)
    os.close(fd)
    yield m
    m.close()
    os.unlink(path)


@pytest.fixture
def tmp_path_file():
    d = tempfile.mkdtemp(prefix="pyshmlock-bench-")
    yield os.path.join(d, "lockfile")
    for f in os.listdir(d):
        os.unlink(os.path.join(d, f))
    os.rmdir(d)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    bs = getattr(config, "_benchmarksession", None)
    if not bs or not bs.benchmarks:
        return
    med = {}
    for b in bs.benchmarks:
        if not b.stats or not b.stats.data:
            continue
        per = b.extra_info.get("pairs_per_call", 1)
        med[b.name] = statistics.median(b.stats.data) / per * 1e9
    floor = med.get("test_floor_two_cffi_atomic_calls")
    # the asyncio rows, each to asyncio.Lock's async with on the same loop
    asyncio_lock = {n.split("[")[1]: ns for n, ns in med.items()
                    if n.startswith("test_peer_asyncio_lock_async_with[")}
    sem = med.get("test_peer_posix_ipc_semaphore_pair")
    capi = med.get("test_floor_two_bare_capi_calls")
    tr = terminalreporter
    tr.section("medians, as ratios to the floors and to posix_ipc in this run")
    tr.write_line(f"{'benchmark':46} {'median':>10} {'/ cffi floor':>13} "
                  f"{'/ C-API floor':>14} {'/ posix_ipc':>12}")
    for name, ns in sorted(med.items(), key=lambda kv: kv[1]):
        r1 = f"{ns / floor:.2f}x" if floor else "-"
        r3 = f"{ns / capi:.2f}x" if capi else "-"
        r2 = f"{ns / sem:.2f}x" if sem else "-"
        tr.write_line(f"{name[5:]:46} {ns:>8.0f}ns {r1:>13} {r3:>14} {r2:>12}")
    if asyncio_lock:
        tr.write_line("asyncio rows, as ratios to `async with asyncio.Lock()` on the same loop:")
        for name, ns in sorted(med.items()):
            loop = name.split("[")[1].rstrip("]") if "[" in name else None
            if loop and loop + "]" in asyncio_lock and "asyncio_lock" not in name:
                tr.write_line(f"  {name[5:]:44} {ns:>8.0f}ns "
                              f"{ns / asyncio_lock[loop + ']']:>8.2f}x asyncio.Lock")
    _instructions(tr)


def _instructions(tr):
    """The same kind of cases counted in instructions (callgrind): exact, so
    a change's cost shows the same on any machine (pyshmlock_lab/bench/
    instructions.py; skipped, saying why, without valgrind)."""
    from pyshmlock_lab.bench import instructions
    rows = instructions()
    tr.section("instructions per call (callgrind), net of the loop, this run")
    if "error" in rows:
        tr.write_line(rows["error"])
        return
    for name, r in rows.items():
        ratio = (f"{r['vs_multiprocessing_lock']:.2f}x multiprocessing.Lock pair"
                 if r.get("vs_multiprocessing_lock") else "")
        tr.write_line(f"{name:58} {r['instructions']:>8.0f} {ratio}")
