"""The cluster gate on a real 3-member etcd on loopback (issue 17).

One etcd cluster serves the whole module (each test uses its own cluster
name, so their keys never meet); a test that kills the Raft leader restarts
that member before it ends.  Hosts are simulated by real processes: an agent
(``python -m pyshmlock agent``) and worker processes attached to that host's
own lock.  Without etcd the module skips, unless PYSHMLOCK_REQUIRE_ETCD=1
(set by CI), where it fails.
"""
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from pyshmlock.cluster.localetcd import LocalEtcd, etcd_binary

if etcd_binary() is None:
    if os.environ.get("PYSHMLOCK_REQUIRE_ETCD") == "1":
        raise RuntimeError("PYSHMLOCK_REQUIRE_ETCD=1 but etcd is not installed "
                           "(Debian: apt-get install etcd-server)")
    pytest.skip("etcd is not installed (Debian: apt-get install etcd-server); "
                "the cluster tests need a real etcd", allow_module_level=True)


@pytest.fixture(scope="module")
def etcd():
    e = LocalEtcd(members=3)
    try:
        yield e
    finally:
        e.stop()
        assert not os.path.exists(e.dir)


def test_harness_survives_leader_kill(etcd):
    from pyshmlock.cluster._store import Store
    s = Store(etcd.endpoints)
    k = f"/h/{uuid.uuid4().hex}"
    s.put(k, "1")
    leader = etcd.leader()
    etcd.kill(leader)
    try:
        s.put(k, "2")                           # fails over to a live member
        assert s.get(k)[0][0]["value"] == b"2"
    finally:
        etcd.restart(leader)
    assert all(p is not None and p.poll() is None for p in etcd.procs)
