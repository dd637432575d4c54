"""Cluster updates that fail, on a real 3-member etcd: an exception inside
``with fleet.update():`` or ``with fleet.paused():`` leaves the fleet
paused, and the hosts that did not apply the update stay paused as behind;
a failed apply recorded on the update handle keeps that host behind; what
each host applied is reported on the handle; a host's currency survives a
restart of its agent."""
import signal
import time

import pytest
from clusterlab import fleet_of_hosts, now, require_etcd, three_member_etcd
from helpers import wait_for

import pyshmlock

require_etcd()

pytestmark = pytest.mark.timeout(120)
TTL = 2

etcd = pytest.fixture(scope="module", name="etcd")(three_member_etcd)


@pytest.fixture
def fleet(etcd, tmp_path):
    """fleet(n, **kw) -> (Cluster, [Host]); everything is stopped afterwards."""
    yield from fleet_of_hosts(etcd, tmp_path, prefix="up", n=2, ttl=TTL)


def _behind(c, host):
    return bool(c.status().hosts.get(host, {}).get("behind"))


def _serving(hs):
    for h in hs:
        h.wait_admitting(15)


def test_an_update_that_raises_leaves_the_fleet_paused_and_unapplied_hosts_behind(fleet):
    """On an open fleet, an update applied at one host (through
    lock.fenced_update) and not at the other, then an exception: the fleet
    stays paused (it does not reopen on mixed weights), the update counts as
    the fleet's last (its generation), the host that did not apply is
    behind, and the exception says the fleet stays paused."""
    c, hs = fleet(2, workers=1)
    c.resume(timeout=10)
    _serving(hs)
    lk = pyshmlock.RWLock(hs[0].lock_name, create=False, stale="keep")
    try:
        with pytest.raises(RuntimeError) as ei:
            with c.update(timeout=15) as u:
                token = u.token
                with lk.fenced_update(u.token, timeout=5):
                    pass                             # h0's weights applied
                wait_for(lambda: u.applied.get("h0") == {hs[0].lock_name: True}, 10,
                         "the update reports h0's apply")
                assert u.applied.get("h1") == {hs[1].lock_name: False}
                raise RuntimeError("h1's weights did not arrive")
    finally:
        lk.close()
    assert "paused" in "\n".join(getattr(ei.value, "__notes__", [])), ei.value
    t = now()
    st = c.status()
    assert st.paused and st.update is None and st.generation["token"] == token
    wait_for(lambda: _behind(c, "h1"), 10, "h1 reported behind")
    assert not _behind(c, "h0")
    c.resume(timeout=10)
    hs[0].wait_admitting(15)
    time.sleep(1.0)
    assert hs[1].admitted_after(t) == [], "a host without the update served"


def test_a_failed_apply_marked_on_the_update_keeps_that_host_behind(fleet):
    """A host whose apply failed, recorded with ``u.mark_failed(host)``, is
    not counted as current: after the update and a resume it stays paused
    (behind) while the others serve, until an update reaches it."""
    c, hs = fleet(2, workers=1)
    c.pause(timeout=15)
    with c.update(timeout=15) as u:
        u.mark_failed("h1")
    t = now()
    c.resume(timeout=10, wait=True)     # returns: h1 keeps its lock paused for a reason
    with pyshmlock.RWLock(hs[0].lock_name, create=False, stale="keep").attached() as lk:
        assert not lk.paused                    # h0 reopened before resume() returned
    hs[0].wait_admitting(15)
    wait_for(lambda: _behind(c, "h1"), 10, "h1 reported behind")
    assert hs[1].admitted_after(t) == [], "a host whose apply failed served"
    with c.update(timeout=15):
        pass                                        # this time it applies
    _serving(hs)
    wait_for(lambda: not _behind(c, "h1"), 10, "h1 reported current")


def test_a_paused_block_that_raises_leaves_the_fleet_paused(fleet):
    """``with fleet.paused(drain=True):`` pauses and drains; the block
    completes: the fleet resumes; it raises: the fleet stays paused, and
    the exception says so."""
    c, hs = fleet(2, workers=1)
    c.resume(timeout=10)
    _serving(hs)
    with c.paused(timeout=15, drain=True) as r:
        assert r.drained and r.acknowledged == ["h0", "h1"]
        assert c.status().paused
    _serving(hs)
    with pytest.raises(ValueError) as ei:
        with c.paused(timeout=15, drain=True):
            raise ValueError("the trainer failed")
    t = now()
    assert "paused" in "\n".join(getattr(ei.value, "__notes__", [])), ei.value
    time.sleep(0.5)
    assert c.status().paused
    assert all(h.admitted_after(t) == [] for h in hs)
    c.resume(timeout=10)


def test_a_restarted_agent_of_a_current_host_reopens_with_the_fleet(fleet):
    """An update applied without lock.fenced_update (the host counts as
    current because it was registered through it); then the host's agent
    is killed and restarted.  The host's lock remembers that it is current,
    so it reopens with the fleet instead of staying behind."""
    c, hs = fleet(2, workers=1)
    c.pause(timeout=15)
    with c.update(timeout=15):
        pass
    c.resume(timeout=10)
    _serving(hs)
    victim = hs[1]
    victim.signal_agent(signal.SIGKILL)
    victim.agent.wait(10)
    victim.start_agent()
    wait_for(lambda: c.status().hosts.get("h1", {}).get("pid") == victim.agent.pid, 20,
             "h1's new agent registered")
    c.pause(timeout=15)
    c.resume(timeout=10)
    victim.wait_admitting(15)
    wait_for(lambda: not _behind(c, "h1"), 10, "h1 reported current")
