"""The cluster benchmark at RL scale: a fleet's calls against one etcd write
round trip, measured in the same run through the same client, for 8 to 512
engines (8 locks per simulated host: one agent per host).  Not a test: it
asserts nothing and is not collected by pytest.

    python bench/cluster_bench.py [--engines 8,64,128,256,512] [--locks 8]
                                  [--rounds 21] [--idle 10] [--json FILE]

Each host is a real agent process serving ``--locks`` locks on a local
3-member etcd (``LocalEtcd``, loopback), all on this machine; the agents
spread over the members, each controller talks to the Raft leader first.  A round,
repeated ``--rounds`` times (after 3 warm-up rounds), measures in turn:

* one etcd write (a one-put transaction, the same kind of request as a pause);
* ``pause()`` on the open fleet, until every host acknowledged;
* ``resume(wait=True)``: until every host reopened;
* ``pause(drain=True)``, then ``resume(wait=True)`` again;
* ``update()`` entered on the open fleet (its pause and drain included) and
  left (the release, which reopens the gate), then the wait until every host
  reopened (not counted).

Every size's rounds alternate with rounds of a one-host fleet (8 engines)
kept up for the whole run, so each size has the 8-engine figures of the same
minutes beside it (the machine is shared: its load moves).  Every figure is
reported as its median and as a ratio to the median etcd write of the same
size's rounds.  Then the fleet idles for ``--idle``
seconds: the CPU each agent and each etcd member used, and each agent's
resident memory.  Every host's lease expiries (a host that closed on its
own) are summed before and after, and etcd's health is checked.
"""
import argparse
import json
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
from pyshmlock_lab.cluster.localetcd import LocalEtcd  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
FIGURES = ["pause", "pause_drain", "resume_open", "update_enter", "update_exit"]


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def expiries(c):
    return sum(int(reg.get("lease_expiries") or 0) for reg in c.status(timeout=30).hosts.values())


class Fleet:
    """``nhosts`` real agents of ``locks`` locks each, and their controller."""

    def __init__(self, etcd, nhosts, locks, tmp):
        self.nhosts, self.locks = nhosts, locks
        self.name = f"bench-{uuid.uuid4().hex[:8]}"
        self.key = f"/pyshmlock/bench/{uuid.uuid4().hex}"
        self.got = {k: [] for k in ["write", *FIGURES]}
        self.hs, self.c = [], None
        t0 = time.monotonic()
        try:
            self._start(etcd, nhosts, locks, tmp)
        except BaseException:
            self.close()                  # a fleet that did not come up leaves nothing
            raise
        print(f"  {nhosts} hosts x {locks} locks up in {time.monotonic() - t0:.1f} s",
              flush=True)

    def _start(self, etcd, nhosts, locks, tmp):
        self.hs = [Host(etcd.endpoints, self.name, f"h{i}", tmp, workers=0, ttl=None,
                        locks=locks, start=False) for i in range(nhosts)]
        for h in self.hs:
            h.start_agent(wait=False)
        # Every controller talks to the Raft leader first (its write and its
        # pause take the same path, whichever fleet); the agents spread over
        # all the members, as they do by default.
        lead = etcd.leader()
        eps = [etcd.endpoints[lead]] + [u for i, u in enumerate(etcd.endpoints) if i != lead]
        self.c = Cluster(eps, self.name)
        self.c.wait_hosts(nhosts, timeout=120 + 2 * nhosts)
        self.c.resume(timeout=60, wait=True)


    def round(self, keep):
        c, e = self.c, self.c.a.etcd

        def timed(fn):
            t = time.perf_counter()
            v = fn()
            return time.perf_counter() - t, v

        row = {}
        # A read first: the machine idled between rounds, and the first
        # request after an idle spell pays the wake-up of every process on
        # its path; the write is measured warm, like the calls after it.
        c._run(e.range(self.key), 30)
        row["write"], _ = timed(lambda: c._run(e.txn([], [e.op_put(self.key, "x")]), 30))
        row["pause"], res = timed(lambda: c.pause(timeout=60))
        assert len(res.acknowledged) == self.nhosts, res
        row["resume_open"], _ = timed(lambda: c.resume(timeout=60, wait=True))
        row["pause_drain"], res = timed(lambda: c.pause(timeout=60, drain=True))
        assert len(res.acknowledged) == self.nhosts and res.drained, res
        c.resume(timeout=60, wait=True)
        u = c.update(timeout=60)
        row["update_enter"], _ = timed(u.__enter__)
        row["update_exit"], _ = timed(lambda: u.__exit__(None, None, None))
        c.resume(timeout=60, wait=True)            # every host open before the next round
        if keep:
            for k, v in row.items():
                self.got[k].append(v)

    def medians(self):
        return {k: statistics.median(v) for k, v in self.got.items()}

    def idle(self, etcd, seconds):
        """(CPU seconds per second per agent, per etcd (all members), mean RSS MB)."""
        agents = [h.agent.pid for h in self.hs]
        members = [p.pid for p in etcd.procs]
        a0 = {p: cpu_seconds(p) for p in agents}
        m0 = {p: cpu_seconds(p) for p in members}
        ti = time.monotonic()
        time.sleep(seconds)
        span = time.monotonic() - ti
        return (statistics.mean(cpu_seconds(p) - a0[p] for p in agents) / span,
                sum(cpu_seconds(p) - m0[p] for p in members) / span,
                statistics.mean(rss_mb(p) for p in agents))

    def close(self):
        if self.c is not None:
            try:
                self.c._run(self.c.a.etcd.txn([], [self.c.a.etcd.op_delete(self.key)]), 30)
            except Exception:
                pass
            self.c.close()
        stop_hosts(self.hs)


def measure(etcd, ref, nhosts, locks, rounds, idle, tmp):
    """The fleet of ``nhosts``, its rounds interleaved with the reference
    fleet's (one host), so that both see the same machine."""
    fleet = ref if nhosts == ref.nhosts else None
    try:
        if fleet is None:
            fleet = Fleet(etcd, nhosts, locks, tmp)
        ref.got = {k: [] for k in ref.got}
        if fleet is not ref:
            fleet.got = {k: [] for k in fleet.got}
        time.sleep(2.0)
        exp0 = expiries(fleet.c)
        for r in range(rounds + 3):
            # The first rounds warm connections up; the two fleets take turns
            # going first (ABBA), so that neither always follows the other.
            pair = [ref, fleet] if fleet is not ref else [ref]
            for f in pair if r % 2 else pair[::-1]:
                f.round(keep=r >= 3)
                time.sleep(0.05)
        agent_cpu, etcd_cpu, mem = fleet.idle(etcd, idle)
        time.sleep(1.5)                            # the hosts' status settles
        closed = expiries(fleet.c) - exp0
        etcd.wait_healthy(30)
        med, refmed = fleet.medians(), ref.medians()
        return {"engines": nhosts * locks, "hosts": nhosts, "locks_per_host": locks,
                "rounds": rounds, "median_s": med,
                "ratio": {k: med[k] / med["write"] for k in FIGURES},
                "reference_median_s": refmed,
                "idle_agent_cpu_s_per_s": agent_cpu, "idle_etcd_cpu_s_per_s": etcd_cpu,
                "agent_rss_mb": mem, "hosts_closed_on_their_own": closed}
    finally:
        if fleet is not None and fleet is not ref:
            fleet.close()


def table(rows):
    out = ["| engines (hosts) | etcd write | pause() | pause(drain) | update enter | "
           "update exit | resume to all open | 8 engines in the same rounds: pause(), write | "
           "idle CPU / host | RSS / host | hosts closed |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m, q, ref = r["median_s"], r["ratio"], r["reference_median_s"]
        cells = [f"{m[k] * 1e3:.1f} ms ({q[k]:.1f}x)" for k in
                 ("pause", "pause_drain", "update_enter", "update_exit", "resume_open")]
        out.append(f"| {r['engines']} ({r['hosts']}) | {m['write'] * 1e3:.2f} ms | "
                   + " | ".join(cells)
                   + f" | {ref['pause'] * 1e3:.1f} ms, {ref['write'] * 1e3:.2f} ms | "
                     f"{r['idle_agent_cpu_s_per_s'] * 1e3:.1f} ms/s | "
                     f"{r['agent_rss_mb']:.0f} MB | {r['hosts_closed_on_their_own']} |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", default="8,64,128,256,512")
    ap.add_argument("--locks", type=int, default=8, help="locks (engines) per host")
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--idle", type=float, default=10.0)
    ap.add_argument("--json", default=None, help="also write the figures here")
    a = ap.parse_args(argv)
    sizes = [int(x) for x in a.engines.split(",")]
    tmp = tempfile.mkdtemp(prefix="pyshmlock-cbench-")
    os.environ["PYSHMLOCK_CLUSTER_DIR"] = os.path.join(tmp, "cluster.d")
    etcd = LocalEtcd(members=3)
    rows = []
    ref = None
    try:
        ref = Fleet(etcd, 1, a.locks, tmp)
        for n in sizes:
            r = measure(etcd, ref, max(1, n // a.locks), a.locks, a.rounds, a.idle, tmp)
            rows.append(r)
            m, q = r["median_s"], r["ratio"]
            print(f"{r['engines']:>4} engines: write {m['write'] * 1e3:.2f} ms; "
                  + "; ".join(f"{k} {m[k] * 1e3:.1f} ms {q[k]:.2f}x" for k in FIGURES)
                  + f"; 8 engines in the same rounds: pause "
                    f"{r['reference_median_s']['pause'] * 1e3:.1f} ms, write "
                    f"{r['reference_median_s']['write'] * 1e3:.2f} ms"
                  + f"; idle {r['idle_agent_cpu_s_per_s'] * 1e3:.1f} ms/s per agent, "
                    f"etcd {r['idle_etcd_cpu_s_per_s'] * 1e3:.0f} ms/s; "
                    f"{r['agent_rss_mb']:.0f} MB per agent; "
                    f"closed on their own: {r['hosts_closed_on_their_own']}", flush=True)
    finally:
        if ref is not None:
            ref.close()
        etcd.stop()
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print(table(rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
