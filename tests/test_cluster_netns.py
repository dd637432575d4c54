"""The cluster gate under real partitions: every etcd member, every host and the
controller in its own network namespace (netlab.py), faults injected by
cutting links.  The etcd runs etcd's default timings (100 ms heartbeat,
1 s election timeout) and the agents the default TTL unless a test says
otherwise.  Needs root and iproute2; skips (or fails under
PYSHMLOCK_REQUIRE_ETCD=1 on a machine that has them) otherwise."""
import os
import threading
import time
import uuid

import netlab
import pytest
from clusterlab import Host, now, stop_hosts
from helpers import wait_for

from pyshmlock_lab.cluster.localetcd import LocalEtcd, etcd_binary, in_netns

if etcd_binary() is None or not netlab.available():
    if os.environ.get("PYSHMLOCK_REQUIRE_ETCD") == "1" and os.geteuid() == 0:
        raise RuntimeError("PYSHMLOCK_REQUIRE_ETCD=1 but etcd or network namespaces are missing")
    pytest.skip("needs etcd, root and network namespaces", allow_module_level=True)

pytestmark = pytest.mark.timeout(120)

SLACK = 0.35
HOSTS = ["h0", "h1", "h2"]


@pytest.fixture(scope="module")
def lab():
    lab = netlab.NetLab(["m0", "m1", "m2", *HOSTS, "ctl"])
    etcd = None
    try:
        etcd = LocalEtcd(members=3, heartbeat_ms=100, election_ms=1000,
                         addrs=[lab.addr[m] for m in ("m0", "m1", "m2")],
                         netns=[lab.ns[m] for m in ("m0", "m1", "m2")],
                         probe_netns=lab.ns["ctl"])
        lab.etcd = etcd
        yield lab
    finally:
        if etcd is not None:
            etcd.stop()
        lab.close()
        assert lab.leftovers() == []


@pytest.fixture
def fleet(lab, tmp_path):
    made, ctls = [], []

    def make(ids=HOSTS, ttl=None, workers=1, name=None, endpoints=None):
        from pyshmlock.cluster import Cluster
        name = name or f"n-{uuid.uuid4().hex[:8]}"
        eps = endpoints or lab.etcd.endpoints
        hs = [Host(lab.etcd.endpoints, name, hid, str(tmp_path), workers=workers, ttl=ttl,
                   netns=lab.ns[hid]) for hid in ids]
        made.extend(hs)
        c = in_netns(lab.ns["ctl"], lambda: Cluster(eps, name))
        ctls.append(c)
        if ids:
            c.wait_hosts(len(ids), timeout=20)
        return c, hs

    make.hosts = made
    yield make
    for n in ["m0", "m1", "m2", *HOSTS, "ctl"]:
        lab.heal(n)
    stop_hosts(made)
    for c in ctls:
        c.close()
    lab.etcd.wait_healthy(30)


class Sampler:
    def __init__(self, lock_name):
        import pyshmlock
        self.lk = pyshmlock.RWLock(lock_name, create=False, stale="keep")
        self.closed = 0.0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        last, was = now(), False
        while not self._stop.is_set():
            p = self.lk.paused
            t = now()
            if was:
                self.closed += t - last
            was, last = p, t
            time.sleep(0.001)

    def close(self):
        self._stop.set()
        self._t.join(5)
        self.lk.close()


def test_cut_off_host_fails_closed_and_rejoins(fleet, lab):
    """Guarantee 2 with a real partition: a host whose link is cut stops
    admitting within 3/4 TTL (+ one poll) of its last keep-alive, is
    reported lost, and after the link heals re-registers and mirrors the
    pause before it admits again."""
    ttl = 2
    c, hs = fleet(["h0", "h1"], ttl=ttl)
    c.resume(timeout=10)
    for h in hs:
        h.wait_admitting(15)
    victim = hs[1]
    t_cut = now()
    lab.cut("h1")
    r = c.pause(timeout=20)
    t_ret = now()
    assert r.acknowledged == ["h0"] and r.lost == ["h1"], r
    time.sleep(r.closing["h1"] + 0.3)           # closed by its own lease by then
    stop_after = victim.last_admission() - t_cut
    assert stop_after < 0.75 * ttl + SLACK, stop_after
    t_closed = t_ret + r.closing["h1"] + SLACK
    assert victim.admitted_after(t_closed) == []
    lab.heal("h1")
    wait_for(lambda: c.status().hosts.get("h1", {}).get("mirrored", -1) >= r.revision, 20,
             "h1 re-registered and mirrored the pause")
    assert victim.admitted_after(t_closed) == []
    c.resume(timeout=10)
    victim.wait_admitting(15)


def test_partitioned_members_close_no_host(fleet, lab):
    """Leader changes under real partitions, with the default TTL: a
    follower cut off for 4 s, then the Raft leader cut off for 4 s (a new
    leader is elected behind it): no host is closed for a single
    millisecond."""
    c, hs = fleet()
    c.resume(timeout=10)
    for h in hs:
        h.wait_admitting(15)
    samplers = [Sampler(h.lock_name) for h in hs]
    try:
        e = lab.etcd
        leader = e.leader()
        follower = next(i for i in range(3) if i != leader)
        lab.cut(f"m{follower}")
        time.sleep(4.0)
        lab.heal(f"m{follower}")
        e.wait_healthy(20)
        time.sleep(1.0)
        leader = e.leader()
        lab.cut(f"m{leader}")
        time.sleep(4.0)
        lab.heal(f"m{leader}")
        e.wait_healthy(30)
        time.sleep(1.0)
        closed = {h.id: round(s.closed * 1000, 1) for h, s in zip(hs, samplers)}
        assert all(v == 0 for v in closed.values()), \
            f"hosts closed (ms): {closed}\n" + "\n".join(h.agent_text() for h in hs)
        r = c.pause(timeout=10)
        assert r.acknowledged == HOSTS
        c.resume(timeout=10)
    finally:
        for s in samplers:
            s.close()


def test_calls_keep_their_timeouts_across_partitions(fleet, lab):
    """Call timeouts under real partitions: the controller's own member cut
    off, then a majority cut off: every call returns or raises
    ClusterTimeout within its timeout plus the slack."""
    from pyshmlock.cluster import ClusterTimeout
    e = lab.etcd
    leader = e.leader()
    order = [leader] + [i for i in range(3) if i != leader]
    c, hs = fleet(["h0"], endpoints=[e.endpoints[i] for i in order])
    c.status(timeout=5)
    lab.cut(f"m{order[0]}")
    took = []
    for call in (lambda: c.pause(timeout=2), lambda: c.resume(timeout=2),
                 lambda: c.status(timeout=1)):
        t0 = now()
        try:
            call()
        except ClusterTimeout:
            pass
        took.append(now() - t0)
    assert took[0] < 2 + SLACK and took[1] < 2 + SLACK and took[2] < 1 + SLACK, took
    lab.cut(f"m{order[1]}")                               # and a majority down
    for call in (lambda: c.pause(timeout=1), lambda: c.resume(timeout=1),
                 lambda: c.status(timeout=1)):
        t0 = now()
        with pytest.raises(ClusterTimeout):
            call()
        assert now() - t0 < 1 + SLACK, now() - t0


def test_duplicate_id_with_one_cut_off(fleet, lab, tmp_path):
    """A duplicate host id with one agent of the pair cut off.  The second
    cannot take the id while the first's registration lives, so pause()
    never counts one host's acknowledgement for the other; once it does
    take it, the cut-off host has paused itself."""
    ttl = 2
    c, (a,) = fleet(["h0"], ttl=ttl)
    c.resume(timeout=10)
    a.wait_admitting(15)
    lab.cut("h0")
    t_cut = now()
    b = Host(lab.etcd.endpoints, c.name, "h0", str(tmp_path), workers=1, ttl=ttl,
             netns=lab.ns["h1"])
    fleet.hosts.append(b)
    r = c.pause(timeout=20)
    t_ret = now()
    # Acknowledged by b, or lost (a's registration expired before b took it).
    assert r.acknowledged + r.lost == ["h0"], r
    wait_for(lambda: c.status().hosts.get("h0", {}).get("pid") == b.agent.pid, 15,
             "the live agent took the id")
    wait_for(lambda: c.status().hosts["h0"]["mirrored"] >= r.revision, 10,
             "the live agent mirrored the pause")
    assert a.last_admission() - t_cut < 0.75 * ttl + SLACK
    time.sleep(0.3)
    # the cut-off agent, if the pause counted it lost: closed within its bound
    t_closed = t_ret + r.closing.get("h0", 0.0) + SLACK
    assert a.admitted_after(t_closed) == [] and b.admitted_after(t_ret) == []
    lab.heal("h0")                                    # the first one comes back: refused
    rc = a.agent.wait(4 * ttl + 15)
    assert rc == 2, a.agent_text()
    assert "already registered" in a.agent_text()
    assert a.admitted_after(t_closed) == []
