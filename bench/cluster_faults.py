"""The cluster gate's fault matrix (agents, etcd members, partitions), as
a soak (not a test: outside the default suite; it asserts nothing and
prints what it measured).

    python bench/cluster_faults.py [--cycles 27] [--hosts 3] [--locks 2]

Every etcd member, every host and the controllers in their own network
namespace (tests/netlab.py); etcd's default timings; the agents' default TTL.
Each host runs one agent for its ``--locks`` locks (one per engine) and a
worker on each lock that logs every admitted read.  Each
cycle, a controller pauses, checks the admission logs against the moment
``pause()`` returned, runs a cluster update whose chunks are applied at every
host through ``lock.fenced_update(token)``, and resumes; one fault is
injected during the cycle, in turn:

  agent-stop      an agent SIGSTOPped for 3 s
  agent-kill      an agent SIGKILLed and restarted
  host-cut        a host's link cut for 4 s
  member-stop     an etcd follower SIGSTOPped for 4 s
  leader-kill     the Raft leader SIGKILLed (restarted afterwards)
  leader-cut      the Raft leader's link cut for 4 s
  racing          a second controller pausing and resuming meanwhile
  stale-updater   an updater stopped past its 2 s lease; another controller
                  resumes (and waits for every host); the updater wakes and
                  keeps pushing chunks
  host-restart    a host's processes killed, its /dev/shm locks removed,
                  servers started before the agent

It reports: reads admitted at acknowledged hosts after a returned pause()
(before the next resume was called by anyone); reads admitted at lost hosts
later than the bound the pause gave for them (``closing``); stale chunks
applied at a host after another controller reopened the fleet;
milliseconds each lock was closed during the routine etcd faults
(member-stop, leader-kill, leader-cut), injected with the fleet open and
sampled for 5 s; every call's overrun of its timeout.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import netlab  # noqa: E402
from clusterlab import Host, now, stop_hosts  # noqa: E402

import pyshmlock  # noqa: E402
from pyshmlock.cluster import Cluster, ClusterError  # noqa: E402
from pyshmlock_lab.cluster.localetcd import LocalEtcd, in_netns  # noqa: E402

FAULTS = ["agent-stop", "agent-kill", "host-cut", "member-stop", "leader-kill", "leader-cut",
          "racing", "stale-updater", "host-restart"]
TIMEOUT = 20.0

PUSHER = """
import sys, time, pyshmlock
from pyshmlock.cluster import Cluster
eps, name, log = sys.argv[1].split(","), sys.argv[2], sys.argv[3]
locks = [pyshmlock.RWLock(n, create=False) for n in sys.argv[4:]]
c = Cluster(eps, name, ttl=2)
with open(log, "a", buffering=1) as f:
    try:
        with c.update(timeout=20) as u:
            f.write(f"token {u.token}\\n")
            while True:
                for lk in locks:
                    try:
                        with lk.fenced_update(u.token, timeout=2):
                            f.write(f"applied {lk.name} {time.monotonic()}\\n")
                    except pyshmlock.FencingError:
                        f.write(f"refused {lk.name} {time.monotonic()}\\n")
                time.sleep(0.01)
    except Exception as e:
        f.write(f"exit {type(e).__name__}\\n")
"""


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return ""


class Sampler:
    def __init__(self, lock_name):
        self.lk = pyshmlock.RWLock(lock_name, create=False, stale="keep")
        self.closed = 0.0
        self.on = False
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        last, was = now(), False
        while not self._stop.is_set():
            try:
                p = self.lk.paused
            except ValueError:
                return
            t = now()
            if was and self.on:
                self.closed += t - last
            was, last = p, t
            time.sleep(0.001)

    def close(self):
        self._stop.set()
        self._t.join(5)
        self.lk.close()


class Matrix:
    def __init__(self, nhosts, tmp, locks=2):
        self.ids = [f"h{i}" for i in range(nhosts)]
        self.lab = netlab.NetLab(["m0", "m1", "m2", *self.ids, "ctl", "ctl2"])
        self.etcd = LocalEtcd(members=3, heartbeat_ms=100, election_ms=1000,
                              addrs=[self.lab.addr[m] for m in ("m0", "m1", "m2")],
                              netns=[self.lab.ns[m] for m in ("m0", "m1", "m2")],
                              probe_netns=self.lab.ns["ctl"])
        self.name = f"fm-{uuid.uuid4().hex[:8]}"
        self.tmp = tmp
        self.hosts = [Host(self.etcd.endpoints, self.name, h, tmp, workers=1, ttl=None,
                           netns=self.lab.ns[h], locks=locks) for h in self.ids]
        self.c = in_netns(self.lab.ns["ctl"], lambda: Cluster(self.etcd.endpoints, self.name))
        self.c.wait_hosts(nhosts, timeout=30)
        self.resume_calls = []          # (start) of every resume, any controller
        self.after_pause = 0
        self.after_closing = 0
        self.not_serving = []           # hosts that did not serve again after a cycle
        self.reads = 0
        self.stale_applied = 0
        self.closed = {}
        self.overruns = []
        self.errors = []
        self.pauses = 0

    def call(self, fn, timeout, *a, **kw):
        t = now()
        try:
            return fn(*a, timeout=timeout, **kw)
        finally:
            self.overruns.append(now() - t - timeout)

    def resume(self, c=None, wait=False):
        self.resume_calls.append(now())
        return self.call((c or self.c).resume, TIMEOUT, wait=wait)

    def check_pause(self, r, t_ret):
        """Reads admitted at acknowledged hosts after pause() returned, and
        at lost hosts after the bound it gave them, before the next resume
        was called (by anyone)."""
        later = [t for t in self.resume_calls if t > t_ret]
        until = min(later) if later else now()
        for h in self.hosts:
            if h.id in r.acknowledged:
                self.after_pause += len(h.admitted_after(t_ret, until))
            elif h.id in r.lost:
                self.after_closing += len(h.admitted_after(
                    t_ret + r.closing.get(h.id, 0.0) + 0.35, until))

    def fenced_update(self):
        with self.c.update(timeout=TIMEOUT) as u:
            for h in self.hosts:
                for name in h.lock_names:
                    try:
                        lk = pyshmlock.RWLock(name, create=False, stale="keep")
                    except FileNotFoundError:
                        continue
                    try:
                        with lk.fenced_update(u.token, timeout=2):
                            pass
                    finally:
                        lk.close()

    def cycle(self, fault):
        lab, e, hs = self.lab, self.etcd, self.hosts
        victim = hs[self.pauses % len(hs)]
        samplers = []
        if fault in ("member-stop", "leader-kill", "leader-cut"):
            samplers = [Sampler(n) for h in hs for n in h.lock_names]
            for s in samplers:
                s.on = True
        bg = None
        stop = threading.Event()
        try:
            if fault == "agent-stop":
                victim.signal_agent(signal.SIGSTOP)
                threading.Timer(3.0, victim.signal_agent, (signal.SIGCONT,)).start()
            elif fault == "agent-kill":
                victim.signal_agent(signal.SIGKILL)
                victim.agent.wait(5)
            elif fault == "host-cut":
                lab.cut(victim.id)
                threading.Timer(4.0, lab.heal, (victim.id,)).start()
            elif fault == "member-stop":
                f = next(i for i in range(3) if i != e.leader())
                e.pause(f)
                threading.Timer(4.0, e.cont, (f,)).start()
            elif fault == "leader-kill":
                self._killed = e.leader()
                e.kill(self._killed)
            elif fault == "leader-cut":
                ldr = e.leader()
                lab.cut(f"m{ldr}")
                threading.Timer(4.0, lab.heal, (f"m{ldr}",)).start()
            elif fault == "racing":
                c2 = in_netns(lab.ns["ctl2"], lambda: Cluster(e.endpoints, self.name))

                def race():
                    while not stop.is_set():
                        try:
                            r = self.call(c2.pause, TIMEOUT)
                            self.check_pause(r, now())
                            self.resume(c2)
                        except ClusterError as ex:
                            self.errors.append(f"racing: {ex}")
                    c2.close()
                bg = threading.Thread(target=race)
                bg.start()
            if samplers:
                # A routine etcd fault with the fleet open: no host may close
                # (the samplers count any closed time until the fault is over).
                time.sleep(5.0)
                for s in samplers:
                    s.on = False
            r = self.call(self.c.pause, TIMEOUT)
            t_ret = now()
            self.pauses += 1
            time.sleep(0.3 + max(r.closing.values(), default=0.0))   # the lost ones close
            self.check_pause(r, t_ret)
            if fault == "stale-updater":
                self.stale_cycle()
            else:
                self.fenced_update()
            self.resume()
        finally:
            stop.set()
            if bg is not None:
                bg.join(60)
            for s in samplers:
                self.closed.setdefault(fault, []).append(round(s.closed * 1e3, 1))
                s.close()
        if fault == "agent-kill":
            victim.start_agent()
        if fault == "leader-kill":
            e.restart(self._killed)
        if fault == "host-restart":
            victim.kill_all()
            for name in victim.lock_names:
                pyshmlock.unlink(name, force=True)
            self.call(self.c.pause, TIMEOUT)
            t = now()
            victim.start_workers(create=True)
            time.sleep(0.5)
            victim.start_agent()
            time.sleep(0.5)
            self.after_pause += len(victim.admitted_after(t))
            self.resume()
        for n in ["m0", "m1", "m2", *self.ids]:
            lab.heal(n)
        for h in hs:
            h.signal_agent(signal.SIGCONT)
        e.wait_healthy(30)
        self.c.wait_hosts(len(hs), timeout=30)
        self.serves_again()

    def serves_again(self):
        """After the cycle every host serves again (0 reads after a pause
        must not come from a fleet that never reopened).  A host left
        behind or partial (restarted with an empty /dev/shm, or holding the
        stale updater's chunks) is brought back as an operator would: by
        the fleet's next update."""
        t = now()
        if any(reg.get("behind") for reg in self.c.status(timeout=10).hosts.values()):
            self.call(self.c.pause, TIMEOUT)
            self.fenced_update()
            self.resume()
        for h in self.hosts:
            while not all(h.admitted_after(t, lock=n) for n in h.lock_names):
                if now() - t > 30:
                    self.not_serving.append(h.id)
                    break
                time.sleep(0.05)
        self.reads = sum(len(h.admissions()) for h in self.hosts)

    def stale_cycle(self):
        log = os.path.join(self.tmp, f"pusher-{uuid.uuid4().hex[:6]}.log")
        self.resume()
        p = subprocess.Popen(["ip", "netns", "exec", self.lab.ns["ctl2"], sys.executable, "-c",
                              PUSHER, ",".join(self.etcd.endpoints), self.name, log]
                             + [n for h in self.hosts for n in h.lock_names])
        try:
            t = now()
            while _read(log).count("applied") < 5:
                if now() - t > 30:
                    self.errors.append("stale-updater: the pusher applied nothing")
                    return
                time.sleep(0.05)
            os.kill(p.pid, signal.SIGSTOP)
            t = now()
            while self.c.status(timeout=5).update is not None and now() - t < 15:
                time.sleep(0.1)
            # Reopened: with wait, every host has mirrored the resume, and so
            # the loss of the update before it (each raised its fences; a host
            # holding the stale chunks stays paused, partial).  A chunk landing
            # earlier lands on a host still paused that never serves it.
            self.resume(wait=True)
            t_open = now()
            os.kill(p.pid, signal.SIGCONT)
            time.sleep(1.5)
        finally:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
            p.wait(10)
        for ln in _read(log).split("\n"):
            if ln.startswith("applied") and float(ln.split()[2]) > t_open:
                self.stale_applied += 1
        self.call(self.c.pause, TIMEOUT)
        self.fenced_update()          # the fleet's own update: the hosts whole again

    def close(self):
        try:
            self.c.close()
        except Exception:
            pass
        stop_hosts(self.hosts)
        self.etcd.stop()
        self.lab.close()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=len(FAULTS) * 3)
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--locks", type=int, default=2, help="locks (engines) per host")
    a = ap.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="pyshmlock-faults-")
    os.environ["PYSHMLOCK_CLUSTER_DIR"] = os.path.join(tmp, "cluster.d")
    m = Matrix(a.hosts, tmp, a.locks)
    t0 = time.monotonic()
    try:
        m.resume()
        for i in range(a.cycles):
            fault = FAULTS[i % len(FAULTS)]
            try:
                m.cycle(fault)
            except ClusterError as e:
                m.errors.append(f"{fault}: {type(e).__name__}: {e}")
            print(f"cycle {i + 1:>3} {fault:<14} reads after pause {m.after_pause} "
                  f"(lost hosts past their bound {m.after_closing}) "
                  f"stale applied {m.stale_applied}; reads so far {m.reads}; "
                  f"hosts not serving again {m.not_serving}", flush=True)
    finally:
        m.close()
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    out = {"cycles": a.cycles, "pauses": m.pauses, "hosts": a.hosts,
           "locks_per_host": a.locks,
           "reads_admitted_after_a_returned_pause": m.after_pause,
           "reads_at_lost_hosts_after_their_bound": m.after_closing,
           "stale_chunks_applied": m.stale_applied,
           "reads_admitted": m.reads, "hosts_not_serving_again_after_a_cycle": m.not_serving,
           "closed_ms_during_routine_etcd_faults": m.closed,
           "max_call_overrun_s": round(max(m.overruns), 3) if m.overruns else None,
           "calls": len(m.overruns), "errors": m.errors,
           "minutes": round((time.monotonic() - t0) / 60, 1)}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
