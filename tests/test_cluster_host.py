"""The cluster gate's host side on a real 3-member etcd: fencing
at the resource, fail-closed hosts whatever starts first, and a local resume
of a cluster-managed lock."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from clusterlab import fleet_of_hosts, now, require_etcd, three_member_etcd
from helpers import wait_for

require_etcd()

pytestmark = pytest.mark.timeout(120)
TTL = 2


etcd = pytest.fixture(scope="module", name="etcd")(three_member_etcd)


@pytest.fixture
def fleet(etcd, tmp_path):
    """fleet(n, **kw) -> (Cluster, [Host]); everything is stopped afterwards."""
    yield from fleet_of_hosts(etcd, tmp_path, prefix="hs", n=2, ttl=TTL)


PUSHER = textwrap.dedent("""
    import sys, time, pyshmlock
    from pyshmlock.cluster import Cluster
    eps, name, log = sys.argv[1].split(","), sys.argv[2], sys.argv[3]
    locks = [pyshmlock.RWLock(n, create=False) for n in sys.argv[4:]]
    c = Cluster(eps, name, ttl=2)
    with open(log, "a", buffering=1) as f:
        try:
            with c.update(timeout=20) as u:
                f.write(f"token {u.token}\\n")
                for i in range(100000):
                    for lk in locks:
                        try:
                            with lk.fenced_update(u.token, timeout=2):
                                f.write(f"applied {lk.name} {time.monotonic()}\\n")
                        except pyshmlock.FencingError:
                            f.write(f"refused {lk.name} {time.monotonic()}\\n")
                    time.sleep(0.01)
        except Exception as e:
            f.write(f"exit {type(e).__name__}\\n")
""")


def test_a_stale_updater_is_refused_at_every_host(fleet, tmp_path, etcd):
    """An updater stopped inside `with fleet.update()` past its lease loses
    the lock, having applied part of its update at every host; another
    controller resumes: the hosts stay paused, reported as holding part of
    an update the fleet did not complete (they never serve it); that
    controller's own update brings them current and they serve.  The stale
    updater wakes and keeps pushing chunks through lock.fenced_update(token):
    every one is refused at every host."""
    import pyshmlock
    c, hs = fleet(2, workers=1)
    log = str(tmp_path / "pusher.log")
    p = subprocess.Popen([sys.executable, "-c", PUSHER, ",".join(etcd.endpoints), c.name, log]
                         + [h.lock_name for h in hs])
    locks = [pyshmlock.RWLock(h.lock_name, create=False, stale="keep") for h in hs]
    try:
        wait_for(lambda: os.path.exists(log) and open(log).read().count("applied") >= 10, 20,
                 "the updater applies chunks")
        os.kill(p.pid, signal.SIGSTOP)               # stopped inside its update
        t_stop = now()
        wait_for(lambda: c.status().update is None, 3 * TTL + 5, "its lease ran out")
        c.resume(timeout=10)                          # another controller reopens
        t_resumed = now()
        wait_for(lambda: all(any(v.get("standing") == "partial"
                                 for v in c.status().hosts.get(h.id, {}).get("locks", {})
                                 .values()) for h in hs), 10, "the hosts report a partial update")
        assert all(h.admitted_after(t_resumed) == [] for h in hs), "a partial update was served"
        with c.update(timeout=15) as u:               # the fleet's own update reaches them
            for lk in locks:
                with lk.fenced_update(u.token, timeout=5):
                    pass
        c.resume(timeout=10)
        for h in hs:
            h.wait_admitting(10)
        t_open = now()
        os.kill(p.pid, signal.SIGCONT)                # the stale updater wakes up
        wait_for(lambda: open(log).read().count("refused") >= 20 or p.poll() is not None,
                 20, "the stale updater tried again")
    finally:
        os.kill(p.pid, signal.SIGCONT)
        p.kill()
        p.wait(10)
        for lk in locks:
            lk.close()
    lines = open(log).read().split("\n")
    applied = [float(ln.split()[2]) for ln in lines if ln.startswith("applied")]
    refused = [float(ln.split()[2]) for ln in lines if ln.startswith("refused")]
    assert refused and min(refused) > t_open
    late = [t for t in applied if t > t_stop]
    assert late == [], f"{len(late)} stale chunks applied after the updater was stopped"
    for h in hs:
        lk = pyshmlock.RWLock(h.lock_name, create=False, stale="keep")
        try:
            assert lk.fence > int(lines[0].split()[1])   # the fence moved past the token
        finally:
            lk.close()


def test_a_hosts_refusal_is_the_clusters_fencing_error(fleet):
    """A host's refusal of a stale token (lock.fenced_update raises
    pyshmlock.FencingError) is caught by `except pyshmlock.cluster.FencingError`
    as well, and the cluster's own refusal by `except pyshmlock.FencingError`:
    one class for the one condition."""
    import pyshmlock
    import pyshmlock.cluster
    c, hs = fleet(1, workers=0)
    lk = pyshmlock.RWLock(hs[0].lock_name, create=False, stale="keep")
    try:
        with c.update(timeout=15) as u:
            token = u.token
        wait_for(lambda: lk.fence > token, 10, "the agent raised the fence past the token")
        with pytest.raises(pyshmlock.cluster.FencingError):
            with lk.fenced_update(token, timeout=5):
                pass
        u = c.update(timeout=15)
        u.__enter__()
        c._run(c.a.etcd.lease_revoke(u.lease))         # as if its lease expired
        with pytest.raises(pyshmlock.FencingError):
            u.check()
        with pytest.raises(pyshmlock.cluster.FencingError):
            u.__exit__(None, None, None)
    finally:
        lk.close()


def _write_setting(d, lock, cluster, content=None):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"{lock}.json"), "w") as f:
        f.write(content if content is not None else json.dumps(
            {"cluster": cluster, "lock": lock, "host_id": "h0", "etcd": []}))


@pytest.mark.parametrize("setting", ["written", "unreadable"])
def test_a_fresh_host_admits_nothing_before_its_agent(fleet, tmp_path, setting):
    """A host of a paused cluster restarted with an empty /dev/shm,
    its servers started before its agent (they create the segment, with
    the default stale="reset"): nothing is admitted until the agent mirrors
    the cluster, also when the host setting exists but cannot be read."""
    import pyshmlock
    c, hs = fleet(1, workers=1)
    h = hs[0]
    c.pause(timeout=10)
    h.kill_all()                                     # the host goes down
    pyshmlock.unlink(h.lock_name, force=True)        # and comes back with an empty /dev/shm
    if setting == "unreadable":
        _write_setting(h.env["PYSHMLOCK_CLUSTER_DIR"], h.lock_name, c.name, "{not json")
    t0 = now()
    h.start_workers(create=True)                     # servers first
    wait_for(lambda: os.path.exists(f"/dev/shm/pyshmlock.{h.lock_name}"), 10,
             "the servers created the lock")
    time.sleep(1.0)
    assert h.admitted_after(t0) == [], "servers admitted reads before the agent"
    h.start_agent()
    wait_for(lambda: "h0" in c.status().hosts, 15, "the agent registered")
    time.sleep(0.5)
    assert h.admitted_after(t0) == [], "the host admitted reads during the cluster pause"
    c.resume(timeout=10)
    h.wait_admitting(10)


def test_a_local_resume_of_a_managed_host_is_refused(fleet):
    """`pyshmlock resume` on a host whose agent manages the lock
    refuses, naming the cluster; --force opens it, and the agent closes it
    again at its next pass."""
    c, hs = fleet(1, workers=1)
    h = hs[0]
    c.pause(timeout=10)
    t0 = now()
    p = subprocess.run([sys.executable, "-m", "pyshmlock", "resume", h.lock_name],
                       capture_output=True, text=True, timeout=30, env=h.env)
    assert p.returncode != 0
    assert c.name in p.stderr and "cluster" in p.stderr, p.stderr
    time.sleep(0.5)
    assert h.admitted_after(t0) == []
    p = subprocess.run([sys.executable, "-m", "pyshmlock", "resume", "--force", h.lock_name],
                       capture_output=True, text=True, timeout=30, env=h.env)
    assert p.returncode == 0 and "running" in p.stdout, p.stderr
    time.sleep(TTL / 4 + 0.5)                        # the agent's next pass closes it again
    t2 = now()
    time.sleep(0.3)
    assert h.admitted_after(t2) == [], "the agent did not re-pause"
    assert c.status().paused
