"""Every open lock keeps one file descriptor per process (its liveness
lock, docs/DESIGN.md §4).  Running out of descriptors gives a clear error
and leaves nothing behind: no segment the failed open created, no handle
that stays unusable once descriptors are free again."""
import textwrap

import pytest
from conftest import unique_name
from helpers import remove_lock, run_python

pytestmark = pytest.mark.timeout(60)

# Lets exactly one more descriptor be opened (the lowest free one).
ONE_FREE = textwrap.dedent('''
    import os, resource
    def one_descriptor_free():
        r, w = os.pipe()
        os.close(r)
        os.close(w)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (r + 1, hard))
        return soft, hard
''')


def test_an_open_refused_for_want_of_a_descriptor_leaves_no_segment_behind():
    name = unique_name("nofile")
    code = ONE_FREE + textwrap.dedent('''
        import errno, os, resource, sys, pyshmlock
        limits = one_descriptor_free()      # shm_open gets it; the liveness one cannot
        try:
            pyshmlock.RWLock(sys.argv[1])
            print("opened")
        except OSError as e:
            resource.setrlimit(resource.RLIMIT_NOFILE, limits)
            print(errno.errorcode[e.errno], "too many open files" in str(e))
        print(os.path.exists("/dev/shm/pyshmlock." + sys.argv[1]))
    ''')
    try:
        r = run_python("-c", code, name, timeout=30)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == ["EMFILE", "True", "False"], r.stdout
    finally:
        remove_lock(name)


def test_a_child_forked_without_a_free_descriptor_uses_the_lock_once_it_has_one():
    """At fork() each inherited handle gets a liveness descriptor of its own;
    a child that could not get one then (no descriptor free) must not be
    left with a handle that fails for good, with a FileNotFoundError about
    a lock that exists."""
    name = unique_name("nofilefork")
    code = ONE_FREE + textwrap.dedent('''
        import os, resource, sys, pyshmlock
        lk = pyshmlock.RWLock(sys.argv[1])
        rd, wr = os.pipe()
        soft, hard = one_descriptor_free()
        taken = os.dup(0)                   # and that one too: none free at the fork
        pid = os.fork()
        if pid == 0:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            try:
                ok = lk.acquire_read(5)
                lk.release_read()
                out = "read" if ok else "timed out"
            except Exception as e:
                out = f"{type(e).__name__}: {e}"
            os.write(wr, out.encode())
            os._exit(0)
        os.close(taken)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        os.close(wr)
        os.waitpid(pid, 0)
        print(os.read(rd, 4096).decode())
        lk.close()
    ''')
    try:
        r = run_python("-c", code, name, timeout=30)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "read", r.stdout
    finally:
        remove_lock(name)
