"""Corrupted and random segment contents never crash the process: the core
opens them or refuses them with a clear error.

Two fuzzers: a mutation fuzz through the Python API (always; it runs in a
child process so that a crash fails the test instead of killing pytest), and
the coverage-guided libFuzzer target verify/fuzz_open.c built with ASan and
UBSan (when clang and libFuzzer are installed; `make fuzz` runs it longer)."""
import contextlib
import glob
import os
import random
import shutil
import struct
import subprocess

import pytest

import pyshmlock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEEDS = os.path.join(ROOT, "verify", "fuzz-seeds")


def mutate_and_open(q, name, seeds, rounds, seed):
    """Child: open mutated segments; report how each attempt ended."""
    rnd = random.Random(seed)
    path = f"/dev/shm/pyshmlock.{name}"
    outcomes = {}
    for _ in range(rounds):
        original = rnd.choice(seeds)
        data = bytearray(original)
        for _ in range(rnd.randint(1, 12)):
            kind = rnd.random()
            if kind < 0.6 and data:                      # overwrite bytes
                i = rnd.randrange(len(data))
                data[i] = rnd.randrange(256)
            elif kind < 0.8 and data:                    # a 32-bit field
                i = rnd.randrange(0, max(1, len(data) - 4)) & ~3
                data[i:i + 4] = rnd.choice([0, 1, 0xFFFFFFFF, 4095, 4096,
                                            rnd.getrandbits(32)]).to_bytes(4, "little")
            else:                                        # grow or shrink
                data = data[:rnd.randrange(len(data) + 1)] if rnd.random() < 0.5 else \
                    data + bytes(rnd.randrange(1, 300))
        if len(data) >= 36 and rnd.random() < 0.97:
            # Mostly keep the `ready` word: a segment never marked ready makes
            # the opener wait 2 s for its creator (tested, but rarely).
            data[32:36] = original[32:36]
        with open(path, "wb") as f:
            f.write(data)
        try:     # the read-only observer first, on the untouched bytes
            pyshmlock.inspect(name)
        except (pyshmlock.SegmentError, OSError):
            pass
        try:
            lk = pyshmlock.RWLock(name, create=False)
        except (pyshmlock.SegmentError, pyshmlock.TooManyProcessesError, OSError) as e:
            outcomes[type(e).__name__] = outcomes.get(type(e).__name__, 0) + 1
            continue
        try:
            # Opened: then the file is exactly the size its header describes
            # (a shorter one would fault past its end, SIGBUS).
            hsize, ssize, nmax = struct.unpack_from("<III", data, 8)
            assert len(data) == hsize + nmax * ssize, (len(data), hsize, ssize, nmax)
            lk.info()
            lk.is_locked()
            if lk.acquire_read(0):
                lk.release_read()
            if lk.acquire_write(0):
                lk.release_write()
            # Sessions, resume and fences read header fields of their own.
            session = lk.info().session
            if session is not None:
                try:
                    lk.end_session(session.token)
                except pyshmlock.SessionError:
                    pass
            try:
                lk.resume(0)
            except (pyshmlock.DataSuspectError, pyshmlock.ManagedLockError):
                pass
            with contextlib.suppress(TimeoutError):
                lk.end_session(lk.begin_session(ttl=1, timeout=0))
            lk.raise_fence(lk.fence + 1)
            outcomes["opened"] = outcomes.get("opened", 0) + 1
        except (pyshmlock.SegmentError, RuntimeError) as e:
            outcomes[type(e).__name__] = outcomes.get(type(e).__name__, 0) + 1
        finally:
            try:
                lk.close()
            except pyshmlock.LockInUseError:
                pass
    os.unlink(path)
    q.put(outcomes)


@pytest.mark.timeout(120)
def test_mutated_segments_never_crash(lock_name, children):
    seeds = []
    for f in sorted(os.listdir(SEEDS)):
        with open(os.path.join(SEEDS, f), "rb") as fh:
            seeds.append(fh.read())
    assert seeds
    c = children(mutate_and_open, lock_name, seeds, 600, 7)
    outcomes = c.get(timeout=100)
    assert c.join(20) == 0, "the child crashed on a mutated segment"
    # Both paths were exercised: some segments refused, some opened.
    assert outcomes.get("opened", 0) > 0 and sum(outcomes.values()) == 600, outcomes
    assert outcomes.get("CorruptSegmentError", 0) + outcomes.get("ForeignSegmentError", 0) > 0


def _without_preload(**extra):
    """The environment minus LD_PRELOAD (`make sanitize` preloads gcc's ASan,
    which a clang-built fuzzer must not inherit)."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env.update(extra)
    return env


def _libfuzzer_clang():
    for cc in ("clang-14", "clang"):
        path = shutil.which(cc)
        if path:
            probe = subprocess.run([path, "-print-file-name=libclang_rt.fuzzer-x86_64.a"],
                                   capture_output=True, text=True)
            if os.path.exists(probe.stdout.strip()):
                return path
    return None


@pytest.mark.timeout(300)
@pytest.mark.skipif(_libfuzzer_clang() is None,
                    reason="clang with libFuzzer is not installed; .ci/run installs it")
def test_libfuzzer_target_short_run(tmp_path):
    binary = tmp_path / "fuzz_open"
    subprocess.run([_libfuzzer_clang(), "-g", "-O1", "-fsanitize=fuzzer,address,undefined",
                    "-fno-sanitize-recover=undefined", "-DOPEN_WAIT_NS=0",
                    "-I", os.path.join(ROOT, "csrc"), "-I", os.path.join(ROOT, "csrc", "core"),
                    *sorted(glob.glob(os.path.join(ROOT, "csrc", "core", "*.c"))),
                    os.path.join(ROOT, "verify", "fuzz_open.c"), "-o", str(binary),
                    "-lpthread"], check=True, timeout=180, env=_without_preload())
    corpus = tmp_path / "corpus"
    shutil.copytree(SEEDS, corpus)
    p = subprocess.run([str(binary), "-max_total_time=20", "-timeout=10", str(corpus)],
                       capture_output=True, text=True, timeout=120,
                       env=_without_preload(ASAN_OPTIONS="detect_leaks=0"))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Done" in p.stderr and "ERROR" not in p.stderr
