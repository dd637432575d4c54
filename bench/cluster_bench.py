"""The cluster benchmark: median ``pause()`` against one etcd
write round trip, measured in the same run through the same client, for 3,
8 and 16 hosts.  Not a test: it asserts nothing and is not collected by
pytest.

    python bench/cluster_bench.py [--hosts 3,8,16] [--rounds 25] [--workers 0]

Each host is a real agent process (and ``--workers`` worker processes) on
a local 3-member etcd (``LocalEtcd``, loopback).  A round is: one etcd write
(a one-put transaction, the same kind of request as the pause), then
``pause()`` (which returns once every host acknowledged), then ``resume()``.
Rounds of the two alternate, so both see the same machine load; each write
is measured once every host has reopened (mirrored the last resume).
"""
import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from clusterlab import Host, stop_hosts  # noqa: E402

from pyshmlock.cluster import Cluster  # noqa: E402
from pyshmlock.cluster.localetcd import LocalEtcd  # noqa: E402


def settled(c, rev, n, timeout=30):
    """Wait until every host mirrored the resume (and published it)."""
    give_up = time.monotonic() + timeout
    while True:
        st = c.a.mirror.state
        if sum(1 for reg in st.hosts.values() if reg.get("mirrored", -1) >= rev
               and not reg.get("paused")) >= n:
            return
        assert time.monotonic() < give_up, "hosts did not reopen"
        time.sleep(0.002)


def measure(etcd, n, rounds, workers, tmp):
    name = f"bench-{uuid.uuid4().hex[:8]}"
    hs = []
    c = None
    try:
        hs = [Host(etcd.endpoints, name, f"h{i}", tmp, workers=workers, ttl=10)
              for i in range(n)]
        c = Cluster(etcd.endpoints, name)
        c.wait_hosts(n, timeout=60)
        c.resume(timeout=30)
        e = c.a.etcd
        key = f"/pyshmlock/bench/{uuid.uuid4().hex}"
        writes, pauses = [], []
        for r in range(rounds + 3):
            t = time.perf_counter()
            c._run(e.txn([], [e.op_put(key, "x")]), 30)
            w = time.perf_counter() - t
            t = time.perf_counter()
            res = c.pause(timeout=30)
            p = time.perf_counter() - t
            assert len(res.acknowledged) == n, res
            rev = c.resume(timeout=30)
            settled(c, rev, n)               # the next write meets a quiet etcd
            if r >= 3:                       # the first rounds warm connections up
                writes.append(w)
                pauses.append(p)
            time.sleep(0.02)
        c._run(e.txn([], [e.op_delete(key)]), 30)
        return statistics.median(writes), statistics.median(pauses)
    finally:
        if c is not None:
            c.close()
        stop_hosts(hs)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="3,8,16")
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--workers", type=int, default=0)
    a = ap.parse_args(argv)
    sizes = [int(x) for x in a.hosts.split(",")]
    tmp = tempfile.mkdtemp(prefix="pyshmlock-cbench-")
    os.environ["PYSHMLOCK_CLUSTER_DIR"] = os.path.join(tmp, "cluster.d")
    etcd = LocalEtcd(members=3)
    rows = []
    try:
        for n in sizes:
            w, p = measure(etcd, n, a.rounds, a.workers, tmp)
            rows.append((n, w, p))
            print(f"{n:>3} hosts: pause() {p * 1e3:7.2f} ms median, etcd write round trip "
                  f"{w * 1e3:6.2f} ms median: {p / w:4.2f}x", flush=True)
    finally:
        etcd.stop()
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    print("\n| hosts | median pause() | median etcd write | ratio |")
    print("|---|---|---|---|")
    for n, w, p in rows:
        print(f"| {n} | {p * 1e3:.1f} ms | {w * 1e3:.2f} ms | {p / w:.2f}x |")


if __name__ == "__main__":
    main()
