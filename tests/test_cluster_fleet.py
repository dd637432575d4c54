"""The cluster gate run by a fleet, on a real 3-member etcd on loopback:
cancelled updates, duplicate host ids, hosts that missed an update, racing
pauses, timeouts with members down, long updates, idle agents, leader
changes, expected hosts and eviction, who paused, and etcd's space quota.
The partition tests, with every host in its own network namespace, are in
test_cluster_netns.py, TLS and auth in test_cluster_tls.py.
"""
import asyncio
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest
from clusterlab import Host, fleet_of_hosts, now, require_etcd, stop_hosts, three_member_etcd
from helpers import wait_for

from pyshmlock_lab.cluster.localetcd import LocalEtcd

require_etcd()

pytestmark = pytest.mark.timeout(90)

TTL = 2
SLACK = 0.35          # documented slack of a call's timeout (docs/DESIGN.md §11)


etcd = pytest.fixture(scope="module", name="etcd")(three_member_etcd)


@pytest.fixture
def fleet(etcd, tmp_path):
    """fleet(n, **kw) -> (Cluster, [Host]); everything is stopped afterwards."""
    yield from fleet_of_hosts(etcd, tmp_path, prefix="f", n=2, ttl=TTL)


def _revision(etcd):
    from pyshmlock.cluster import Cluster
    with Cluster(etcd.endpoints, "probe") as c:
        return c.status().revision


# ----------------------------------------------------- a cancelled update
def test_cancelled_async_update_leaves_nothing_held(fleet, etcd):
    """Cancelling AsyncCluster.update() at any await point leaves
    no update lock held: the cancelled task ends cancelled at once (it never
    goes on into the block), and resume() goes through."""
    from pyshmlock.cluster import AsyncCluster
    c, _hs = fleet(1, workers=0)

    async def enter(ac):
        async with ac.update(timeout=20):
            await asyncio.sleep(30)

    async def go():
        ac = AsyncCluster(etcd.endpoints, c.name)
        for delay in [i * 0.004 for i in range(40)] + [0.4]:
            t = asyncio.ensure_future(enter(ac))
            await asyncio.sleep(delay)
            t.cancel()
            done, _ = await asyncio.wait({t}, timeout=5)
            assert done and t.cancelled(), f"a cancelled update went on (delay {delay})"
            await ac.resume(timeout=3)            # no leaked update lock pins the gate
            st = await ac.status()
            assert st.update is None, (delay, st.update)
            assert not st.paused, (delay, st.gate)
        await ac.aclose()

    asyncio.run(asyncio.wait_for(go(), 80))


# --------------------------------------------------- a host that crashed
def test_a_crashed_host_is_reported_lost_before_its_registration_expires(fleet):
    """A host whose agent was killed (a crashed machine or pod) does not
    stall the next pause until its registration expires (a TTL: 20 s here):
    the pause returns once the host's etcd lease shows its agent silent,
    naming it lost with the bound its own lease keeps (it admits nothing
    later than ``r.closing[host]`` seconds after the pause returned)."""
    c, hs = fleet(2, workers=1, ttl=20)
    victim = hs[1]
    victim.wait_admitting()
    victim.signal_agent(signal.SIGKILL)
    r = c.pause(timeout=40)
    t_ret = now()
    assert r.acknowledged == ["h0"] and r.lost == ["h1"], r
    assert "h1" in c.status().hosts, "the pause waited for the registration to expire"
    closing = r.closing["h1"]
    assert 0 < closing <= 0.75 * 20 + 1
    wait_for(lambda: victim.last_admission() is not None
             and now() - victim.last_admission() > 1.0, closing + 5, "h1 closed")
    assert victim.last_admission() < t_ret + closing + SLACK


# ------------------------------------------------ one agent, many locks
def test_one_agent_serves_every_lock_of_its_host(fleet):
    """One agent per host, for all its locks (one per engine): one
    registration naming them, one pause acknowledged for all of them, and a
    killed agent closes every one of them by the lease (without its help)."""
    import pyshmlock
    c, hs = fleet(2, workers=1, locks=3)
    st = c.status()
    assert sorted(st.hosts) == ["h0", "h1"]
    for h in hs:
        assert sorted(st.hosts[h.id]["locks"]) == sorted(h.lock_names)
        h.wait_admitting()
    r = c.pause(timeout=15)
    t = now()
    assert r.acknowledged == ["h0", "h1"]
    time.sleep(0.3)
    assert all(h.admitted_after(t) == [] for h in hs)
    c.resume(timeout=10, wait=True)                 # returns once every lock is open
    for h in hs:
        for n in h.lock_names:
            lk = pyshmlock.RWLock(n, create=False, stale="keep")
            try:
                assert not lk.paused, n
            finally:
                lk.close()
        h.wait_admitting()                          # every lock admits again
    victim = hs[1]
    victim.signal_agent(signal.SIGKILL)
    t_kill = now()
    locks = [pyshmlock.RWLock(n, create=False, stale="keep") for n in victim.lock_names]
    try:
        wait_for(lambda: all(lk.paused for lk in locks), TTL + 5, "every lock closed")
    finally:
        for lk in locks:
            lk.close()
    for n in victim.lock_names:
        assert victim.admitted_after(t_kill + 0.75 * TTL + SLACK, lock=n) == []


def _quiet_revision(etcd, still=1.5, timeout=20):
    """etcd's revision once nothing has been written for ``still`` seconds."""
    t_end = now() + timeout
    rev = _revision(etcd)
    since = now()
    while now() - since < still:
        assert now() < t_end, "etcd never went quiet"
        time.sleep(0.1)
        cur = _revision(etcd)
        if cur != rev:
            rev, since = cur, now()
    return rev


def test_a_pause_costs_one_etcd_write_whatever_the_fleet(fleet, etcd):
    """Hosts acknowledge a controller directly: a pause of 4 hosts of 2
    locks writes the gate and nothing else in etcd until it returns (with
    acknowledgements in etcd, as one-shot commands ask, it was one write per
    host more).  The hosts write their status once it has settled."""
    from pyshmlock.cluster import Cluster
    c, hs = fleet(4, workers=0, locks=2)
    c.resume(timeout=10)
    before = _quiet_revision(etcd)
    r = c.pause(timeout=15)
    after = _revision(etcd)
    assert r.acknowledged == ["h0", "h1", "h2", "h3"]
    assert after - before == 1, f"{after - before} writes for one pause of 4 hosts"
    wait_for(lambda: all(v.get("mirrored", -1) >= r.revision and v.get("paused")
                         for v in c.status().hosts.values()), 10, "status written")
    with Cluster(etcd.endpoints, c.name, acks="etcd") as old_way:
        before = _quiet_revision(etcd)
        r = old_way.pause(timeout=15)
        assert _revision(etcd) - before >= 1 + 4
    c.resume(timeout=10)


def test_acknowledgements_reach_a_controller_whose_port_is_closed_through_etcd(fleet):
    """A controller whose acknowledgement port the hosts cannot reach (a
    firewall, a controller behind NAT): each host, unanswered, writes its
    acknowledgement in etcd, and the pause completes all the same."""
    c, hs = fleet(2, workers=1)
    c.pause(timeout=15)                        # the controller's port is open and known
    rcv = c.a.waits.receiver
    c._loop.loop.call_soon_threadsafe(rcv.close)
    wait_for(lambda: rcv.sock is None, 5, "port closed")
    c.resume(timeout=10)
    t = now()
    r = c.pause(timeout=15)
    t_ret = now()
    assert r.acknowledged == ["h0", "h1"] and r.lost == []
    time.sleep(0.3)
    assert all(h.admitted_after(t_ret) == [] for h in hs)
    assert t_ret - t >= 0.3                    # it waited for the hosts' writes to etcd
    c.resume(timeout=10)


@pytest.mark.parametrize("forgery", ["another key", "another registration"])
def test_a_forged_acknowledgement_is_not_counted(fleet, forgery):
    """An acknowledgement datagram that is not sealed with the controller's
    key, or that names another registration of the host, does not count:
    a host whose agent is stopped is reported lost, not acknowledged."""
    import base64
    import socket

    from pyshmlock.cluster._acks import _ACK, new_key, pack, seal
    c, hs = fleet(2, workers=1)
    c.pause(timeout=15)
    rcv = c.a.waits.receiver
    cr = c.a.mirror.state.host_create["h1"]
    key, reg = base64.b64decode(rcv.key_text), cr
    if forgery == "another key":
        key = base64.b64decode(new_key())
    else:
        reg = cr + 10**6
    rep = pack({"mirrored": 10**9, "paused": True, "drained": True, "locks": {
        hs[1].lock_name: {"paused": True, "drained": True, "suspect": False,
                          "standing": "current", "applied": 0, "users": 1}}})
    hs[1].signal_agent(signal.SIGSTOP)
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        stop = threading.Event()

        def forge():
            q = 10**9
            while not stop.is_set():
                q += 1
                sock.sendto(seal(key, _ACK, {"c": c.name, "h": "h1", "g": reg, "q": q,
                                             "r": rep}), rcv.address)
                time.sleep(0.01)

        t = threading.Thread(target=forge)
        t.start()
        try:
            r = c.pause(timeout=30)
        finally:
            stop.set()
            t.join(5)
            sock.close()
        assert r.acknowledged == ["h0"] and r.lost == ["h1"], r
    finally:
        hs[1].signal_agent(signal.SIGCONT)


# ------------------------------------------------------- duplicate host id
def test_duplicate_host_id_is_refused(fleet, etcd, tmp_path):
    """A second live agent with a host id already registered refuses
    to run (and the first one's registration is untouched)."""
    c, hs = fleet(1, workers=1)
    before = c.status().hosts["h0"]
    dup = Host(etcd.endpoints, c.name, "h0", str(tmp_path), workers=0, ttl=TTL, start=False)
    fleet.hosts.append(dup)
    dup.start_agent(wait=False)
    rc = dup.agent.wait(4 * TTL + 10)
    assert rc not in (0, None), "the duplicate agent kept running"
    assert "h0" in dup.agent_text() and "already registered" in dup.agent_text()
    after = c.status().hosts["h0"]
    assert after["pid"] == before["pid"] == hs[0].agent.pid


# ---------------------------------------- a host that missed an update
def test_host_that_missed_an_update_stays_paused(fleet):
    """A host dead during an update comes back behind the fleet's
    update generation: it stays paused until the next update has it."""
    c, hs = fleet(2, workers=1)
    victim = hs[1]
    victim.kill_all()
    wait_for(lambda: "h1" not in c.status().hosts, 3 * TTL + 5, "h1's registration expired")
    with c.update(timeout=15) as u:
        assert u.result.acknowledged == ["h0"]
    assert not c.status().paused
    victim.start_agent()
    victim.start_workers()
    wait_for(lambda: "h1" in c.status().hosts, 15, "h1 registered again")
    t = now()
    time.sleep(1.0)
    assert victim.admitted_after(t) == [], "a host that missed the update serves"
    wait_for(lambda: c.status().hosts["h1"].get("behind") is True, 10, "h1 reported behind")
    hs[0].wait_admitting()
    with c.update(timeout=15) as u:                 # brought up to date
        assert u.result.acknowledged == ["h0", "h1"]
    victim.wait_admitting()
    wait_for(lambda: not c.status().hosts["h1"].get("behind"), 10,
             "h1 reported current (a host writes its status once it settles)")


# --------------------------------------------------------- racing pauses
def test_racing_pause_returns_only_when_paused(fleet, etcd):
    """A pause() racing resumes returns only once every host has
    acknowledged a paused gate (it never returns 'superseded')."""
    from pyshmlock.cluster import Cluster
    c, _hs = fleet(2, workers=0)
    stop = threading.Event()
    errors = []

    def resumer():
        r = Cluster(etcd.endpoints, c.name)
        try:
            while not stop.is_set():
                r.resume(timeout=10)
        except BaseException as e:
            errors.append(e)
        finally:
            r.close()

    t = threading.Thread(target=resumer)
    t.start()
    try:
        for _ in range(30):
            r = c.pause(timeout=20)
            assert r.acknowledged == ["h0", "h1"], r
            assert not getattr(r, "superseded", False), r
    finally:
        stop.set()
        t.join(30)
    assert errors == []


# ------------------------------------------ timeouts with members down
def test_timeouts_hold_with_a_majority_down(fleet, etcd):
    """With two of three members stopped, pause/resume/status with
    timeout=1 raise ClusterTimeout within the timeout plus the slack."""
    from pyshmlock.cluster import ClusterError, ClusterTimeout
    c, _hs = fleet(1, workers=0)
    c.resume(timeout=5)                 # its session is open: the next write is the call's
    stopped = etcd.stop_majority()
    try:
        # A write sent to stopped members may still apply when they continue:
        # took_effect is None ("maybe"), not False; a read changes nothing.
        for call, effect in ((lambda: c.pause(timeout=1), None),
                             (lambda: c.resume(timeout=1), None),
                             (lambda: c.status(timeout=1), False)):
            t0 = now()
            with pytest.raises(ClusterTimeout) as ei:
                call()
            took = now() - t0
            assert took < 1 + SLACK, took
            assert isinstance(ei.value, ClusterError)
            assert ei.value.took_effect is effect, ei.value
    finally:
        for i in stopped:
            etcd.cont(i)
    etcd.wait_healthy(20)


def test_timeouts_hold_with_the_controllers_member_stopped(fleet, etcd):
    """With the controller's own member stopped, every call returns
    within its timeout (it fails over), and a pause that timed out says it
    took effect."""
    from pyshmlock.cluster import Cluster, ClusterTimeout
    c, hs = fleet(1, workers=0)
    i = etcd.leader()
    eps = [etcd.endpoints[i]] + [e for j, e in enumerate(etcd.endpoints) if j != i]
    ctl = Cluster(eps, c.name)
    fleet.controllers.append(ctl)
    ctl.status(timeout=5)
    etcd.pause(i)
    try:
        for _ in range(3):
            for call in (lambda: ctl.pause(timeout=1), lambda: ctl.resume(timeout=1),
                         lambda: ctl.status(timeout=1)):
                t0 = now()
                try:
                    call()
                except ClusterTimeout:
                    pass
                assert now() - t0 < 1 + SLACK, now() - t0
        hs[0].signal_agent(signal.SIGSTOP)               # a host that cannot answer
        t0 = now()
        with pytest.raises(ClusterTimeout) as ei:
            ctl.pause(timeout=0.5)
        assert now() - t0 < 0.5 + SLACK
        assert ei.value.took_effect is True and ei.value.pending == ["h0"]
        assert ctl.status(timeout=2).paused               # it did pause the fleet
    finally:
        hs[0].signal_agent(signal.SIGCONT)
        etcd.cont(i)
    etcd.wait_healthy(20)


# --------------------------------- an update lease and a GIL-bound trainer
def test_update_survives_a_gil_holding_trainer(fleet):
    """The default update lease outlives a trainer that holds the
    GIL for about 3 s in one call (as a large pickle.dumps does; here a C loop,
    sum(range(n)), which never releases it), so the keep-alive thread cannot
    run meanwhile."""
    c, _hs = fleet(1, workers=0)
    t0 = now()
    sum(range(2 * 10**7))
    per = (now() - t0) / (2 * 10**7)
    held = 0.0
    with c.update(timeout=30) as u:
        for _ in range(3):                          # a loaded machine runs slower
            t0 = now()
            sum(range(int(4.0 / per)))              # GIL held throughout
            held = now() - t0
            if held > 2.4:
                break
            per *= held / 4.0
        u.check()
    assert held > 2.4, held
    assert not c.status().paused


# ------------------------------------------------- idle agents, etcd quota
def test_idle_agents_write_nothing(fleet, etcd):
    """Idle agents do not rewrite their registrations: etcd's
    revision stays put while nothing changes."""
    c, hs = fleet(3, workers=1)
    for h in hs:
        h.wait_admitting()
    time.sleep(1.2)                       # past the agents' first count of users
    r0 = _revision(etcd)
    time.sleep(2.5)
    r1 = _revision(etcd)
    assert r1 - r0 <= 1, f"{r1 - r0} revisions in 2.5 s with 3 idle hosts"


# -------------------------------------------- leader changes close no host
class Sampler:
    """Samples a host lock's gate every millisecond from this process and
    adds up the time it was seen closed."""

    def __init__(self, lock_name):
        import pyshmlock
        self.lk = pyshmlock.RWLock(lock_name, create=False, stale="keep")
        self.closed = 0.0
        self.episodes = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        last, was, since = now(), False, None
        while not self._stop.is_set():
            p = self.lk.paused
            t = now()
            if p and not was:
                since = t
            if was:
                self.closed += t - last
            if was and not p:
                self.episodes.append((since, t))
            was, last = p, t
            time.sleep(0.001)

    def close(self):
        self._stop.set()
        self._t.join(5)
        self.lk.close()


def test_no_host_closes_on_routine_etcd_events(tmp_path):
    """With etcd's default timings and the agent's default TTL, a
    leader kill, a leader stopped for 2 s and a stopped follower close no
    host (0 ms), while a quorum answers."""
    from pyshmlock.cluster import Cluster
    from pyshmlock.cluster._lease import lease_info
    e = LocalEtcd(members=3, heartbeat_ms=100, election_ms=1000)
    hs, samplers, c = [], [], None
    try:
        name = f"f8-{uuid.uuid4().hex[:8]}"
        hs = [Host(e.endpoints, name, f"h{i}", str(tmp_path), workers=1, ttl=None)
              for i in range(3)]
        c = Cluster(e.endpoints, name)
        c.wait_hosts(3, timeout=20)
        c.resume(timeout=10)
        for h in hs:
            h.wait_admitting(15)
        samplers = [Sampler(h.lock_name) for h in hs]
        expiries = [lease_info(s.lk)["expiries"] for s in samplers]
        def renewed(since):
            # Every host's lease was renewed after the fault began at `since`:
            # without a renewal since then, at most 7.5 s - (now - since) would
            # remain (the local deadline is 3/4 of the 10 s TTL).
            left = [lease_info(s.lk)["remaining"] for s in samplers]
            bound = 0.75 * 10 - (now() - since)
            assert all(r is not None and r > bound + 0.1 for r in left), (left, bound)

        leader = e.leader()
        t = now()
        e.kill(leader)                                  # 1. the leader dies
        time.sleep(4.0)
        renewed(t)
        e.restart(leader)
        leader = e.leader()
        t = now()
        e.pause(leader)                                 # 2. the leader stops for 2 s
        time.sleep(2.0)
        e.cont(leader)
        time.sleep(1.5)
        renewed(t)
        e.wait_healthy(20)
        follower = next(i for i in range(3) if i != e.leader())
        t = now()
        e.pause(follower)                               # 3. a follower stops for 2.5 s
        time.sleep(2.5)
        renewed(t)
        e.cont(follower)
        closed = {h.id: round(s.closed * 1000, 1) for h, s in zip(hs, samplers)}
        assert all(v == 0 for v in closed.values()), f"hosts closed (ms): {closed}"
        assert [lease_info(s.lk)["expiries"] for s in samplers] == expiries
    finally:
        for s in samplers:
            s.close()
        stop_hosts(hs)
        if c is not None:
            c.close()
        e.stop()


# ------------------------------------------- expected hosts and eviction
def test_expected_hosts_eviction_and_lock_users(fleet, etcd, tmp_path):
    """A controller names the hosts it expects and the call fails
    when one is missing; a dead host with a long TTL is evicted instead of
    waited for; each agent reports whether any process uses its lock."""
    from pyshmlock.cluster import MissingHostsError
    c, hs = fleet(2, workers=1)
    wait_for(lambda: all(r.get("users", 0) >= 1 for r in c.status().hosts.values()), 10,
             "agents report their lock's users")
    with pytest.raises(MissingHostsError) as ei:
        c.pause(timeout=10, expect=["h0", "h1", "h9"])
    assert ei.value.missing == ["h9"] and ei.value.took_effect is True
    assert c.status().paused
    c.resume(timeout=5)
    slow = Host(etcd.endpoints, c.name, "h2", str(tmp_path), workers=0, ttl=30)
    fleet.hosts.append(slow)
    wait_for(lambda: "h2" in c.status().hosts, 15, "h2 registered")
    assert c.status().hosts["h2"]["users"] == 0            # a --lock typo shows
    slow.signal_agent(signal.SIGSTOP)                      # dead to the cluster, TTL 30 s
    try:
        threading.Timer(0.5, lambda: c.evict("h2")).start()
        t0 = now()
        r = c.pause(timeout=25)
        assert now() - t0 < 5, "pause() waited for an evicted host"
        assert r.acknowledged == ["h0", "h1"] and r.lost == ["h2"]
    finally:
        slow.signal_agent(signal.SIGCONT)
    time.sleep(1.0)
    st = c.status()
    assert "h2" not in st.hosts and "h2" in st.evicted    # it stays out
    c.admit("h2")
    wait_for(lambda: "h2" in c.status().hosts, 15, "h2 admitted again")


# ------------------------------------------------- who paused, and alive
def test_status_shows_who_paused_and_whether_alive(fleet, etcd):
    """Status names the controller that paused, whether it is
    alive and for how long; a controller killed inside an update shows as
    dead, and `cluster break-update` + `cluster resume` recover the fleet."""
    c, hs = fleet(1, workers=1)
    c.pause(timeout=10)
    st = c.status()
    assert st.paused_by == c.who and st.paused_by_alive is True and st.paused_for >= 0
    eps = ",".join(etcd.endpoints)
    code = ("import os, sys; from pyshmlock.cluster import Cluster\n"
            f"c = Cluster({etcd.endpoints!r}, {c.name!r}, who='doomed')\n"
            "u = c.update(timeout=15).__enter__(); print(u.token, flush=True)\n"
            "os.kill(os.getpid(), 9)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == -signal.SIGKILL, p.stderr
    token = int(p.stdout.split()[0])
    wait_for(lambda: c.status().paused_by_alive is False, 12, "the dead controller shows")
    st = c.status()
    assert st.paused and st.paused_by == "doomed" and st.update_token == token
    run = lambda *a: subprocess.run([sys.executable, "-m", "pyshmlock", "cluster", *a],  # noqa: E731
                                    capture_output=True, text=True, timeout=60)
    out = run("status", "--etcd", eps, c.name)
    assert "doomed" in out.stdout and "not alive" in out.stdout, out.stdout
    out = run("break-update", "--etcd", eps, c.name)
    assert out.returncode == 0, out.stderr
    out = run("resume", "--etcd", eps, c.name, "--timeout", "5")
    assert out.returncode == 0, out.stderr
    hs[0].wait_admitting()


def test_agent_never_sleeps_through_a_gate_change(fleet):
    """A gate change that lands while the agent waits for etcd (publishing
    the previous one) wakes it at once, not at the next resync (TTL/4:
    7.5 s here), or back-to-back pause/resume calls time out (60 cycles
    would take 60 s, not 3)."""
    c, _hs = fleet(1, workers=0, ttl=30)
    for _ in range(25):
        c.pause(timeout=5)
        c.resume(timeout=5)


def test_space_quota_fails_calls_at_once_and_hosts_keep_serving(tmp_path):
    """At etcd's space quota (NOSPACE alarm) a pause fails at once
    with QuotaError, saying so, while the hosts keep their gate (their
    keep-alives still succeed: no host closes)."""
    from pyshmlock.cluster import Cluster, QuotaError
    e = LocalEtcd(members=3, extra=["--quota-backend-bytes=4194304"])
    hs, c = [], None
    try:
        name = f"fq-{uuid.uuid4().hex[:8]}"
        hs = [Host(e.endpoints, name, "h0", str(tmp_path), workers=1, ttl=TTL)]
        c = Cluster(e.endpoints, name)
        c.wait_hosts(1, timeout=15)
        hs[0].wait_admitting()
        ex = c.a.etcd
        blob = "x" * (512 * 1024)
        with pytest.raises(QuotaError):
            for i in range(64):                   # fill the backend past its quota
                c._run(ex.txn([], [ex.op_put(f"/fill/{i}", blob)]), 30)
        t0 = now()
        with pytest.raises(QuotaError, match="quota"):
            c.pause(timeout=10)
        assert now() - t0 < 2, "a refused pause waited"
        t1 = now()
        time.sleep(2 * TTL)                       # longer than the host's local lease
        assert hs[0].admitted_after(t1 + 2 * TTL - 0.5), "the host stopped serving"
    finally:
        stop_hosts(hs)
        if c is not None:
            c.close()
        e.stop()
