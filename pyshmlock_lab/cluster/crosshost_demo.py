"""``pyshmlock cluster-demo``: the cross-host pause/update races, on a real
3-member etcd on loopback and simulated hosts, driven once through
pyshmlock.cluster (etcd + one agent per host) and once through the HTTP
fan-out that RL frameworks use today (a loop over servers calling
/pause_generation and /continue_generation).

Each simulated host has its own lock name and worker processes that keep
taking short read holds ("requests") and log them.  A scenario's verdict
comes from those logs: FAIL when some host served a request during a
weight update window.  Everything started is stopped by pid at the end, on
SIGINT/SIGTERM/SIGHUP too, and children die with the demo (PDEATHSIG); no
/dev/shm segment is left behind.  (A SIGKILL of the demo runs no code: its
processes still die, but its segments and temp dir stay.)
"""
from __future__ import annotations

import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple

from pyshmlock._args import segment_path
from pyshmlock.cluster._proc import spawn
from pyshmlock.lock import unlink

HOLD = 0.05           # a "request": a read hold of 50 ms
TTL = 2


def _now() -> float:
    return time.monotonic()


class SimHost:
    def __init__(self, idx: int, mode: str, run_id: str, tmp: str, endpoints: List[str],
                 cluster: str, workers: int = 2) -> None:
        self.idx, self.mode, self.tmp = idx, mode, tmp
        self.id = f"h{idx}"
        self.lock_name = f"cdemo-{run_id}-{mode}-{idx}"
        self.endpoints, self.cluster = endpoints, cluster
        self.nworkers = workers
        self.ctl: Any = None          # agent (cluster) or HTTP server (fan-out)
        self.workers: List[Any] = []
        self.logs: List[str] = []
        self.url = ""

    def start(self) -> None:
        if self.mode == "cluster":
            self.ctl = spawn([sys.executable, "-m", "pyshmlock", "agent",
                              "--etcd", ",".join(self.endpoints), "--cluster", self.cluster,
                              "--lock", self.lock_name, "--host-id", self.id, "--ttl", str(TTL)],
                             stdout=subprocess_devnull(), stderr=subprocess_devnull(),
                             env=self.env())
        else:
            portfile = os.path.join(self.tmp, f"{self.lock_name}.port")
            if os.path.exists(portfile):
                os.unlink(portfile)
            self.ctl = spawn([sys.executable, "-m", "pyshmlock_lab.cluster.fanout",
                              self.lock_name, portfile])
            give_up = _now() + 15
            while not os.path.exists(portfile):
                if _now() > give_up or self.ctl.poll() is not None:
                    raise RuntimeError(f"{self.id}: the HTTP server did not start")
                time.sleep(0.01)
            with open(portfile) as f:
                self.url = f"http://127.0.0.1:{f.read().strip()}"
        give_up = _now() + 15
        while not os.path.exists(segment_path(self.lock_name)):
            if _now() > give_up or self.ctl.poll() is not None:
                raise RuntimeError(f"{self.id}: no lock was made")
            time.sleep(0.01)
        for _ in range(self.nworkers):
            log = os.path.join(self.tmp, f"{self.lock_name}.w{len(self.logs)}")
            self.logs.append(log)
            self.workers.append(spawn([sys.executable, "-m", "pyshmlock_lab.cluster.simhost",
                                       self.lock_name, log, str(HOLD)], env=self.env()))

    def env(self) -> Dict[str, str]:
        """The demo's hosts keep their host setting in the demo's temp dir."""
        from pyshmlock._hostconf import ENV
        return dict(os.environ, **{ENV: os.path.join(self.tmp, "cluster.d")})

    def reads(self) -> List[Tuple[float, float, float]]:
        out: List[Tuple[float, float, float]] = []
        for log in self.logs:
            try:
                with open(log) as f:
                    for ln in f:
                        p = ln.split()
                        if len(p) == 3:
                            out.append((float(p[0]), float(p[1]), float(p[2])))
            except FileNotFoundError:
                pass
        return out

    def served_during(self, t0: float, t1: float) -> int:
        """Requests that held a read at some instant of [t0, t1]."""
        return sum(1 for _, a, r in self.reads() if a < t1 and r > t0)

    def procs(self) -> List[Any]:
        return [p for p in [self.ctl] + self.workers if p is not None]

    def signal_ctl(self, sig: int) -> None:
        if self.ctl is not None and self.ctl.poll() is None:
            os.kill(self.ctl.pid, sig)

    def kill(self) -> None:
        for p in self.procs():
            if p.poll() is None:
                p.kill()
        for p in self.procs():
            p.wait(10)
        self.ctl, self.workers = None, []

    def stop(self) -> None:
        for p in self.procs():
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                    p.terminate()
                except ProcessLookupError:
                    pass
        for p in self.procs():
            try:
                p.wait(10)
            except Exception:
                p.kill()
                p.wait(5)
        self.ctl, self.workers = None, []
        try:
            unlink(self.lock_name, force=True)
        except FileNotFoundError:
            pass


def subprocess_devnull() -> Any:
    import subprocess
    return subprocess.DEVNULL


# ------------------------------------------------------------ the two drivers
class FanOut:
    """What frameworks do today: one HTTP call per server, errors logged."""

    def __init__(self, hosts: List[SimHost]) -> None:
        self.hosts = hosts

    def _post(self, h: SimHost, path: str) -> bool:
        try:
            req = urllib.request.Request(h.url + path, data=b"{}", method="POST",
                                         headers={"content-type": "application/json"})
            with urllib.request.urlopen(req, timeout=0.5) as r:
                return bool(r.status == 200)
        except Exception:
            return False

    def pause(self) -> None:
        for h in self.hosts:
            self._post(h, "/pause_generation")

    def resume(self) -> None:
        for h in self.hosts:
            self._post(h, "/continue_generation")

    def update(self, seconds: float, windows: List[Tuple[float, float]]) -> None:
        self.pause()
        t0 = _now()
        time.sleep(seconds)              # pushing weights
        windows.append((t0, _now()))
        self.resume()


class ViaCluster:
    def __init__(self, endpoints: List[str], name: str, who: str = "") -> None:
        from pyshmlock.cluster._sync import Cluster
        self.c = Cluster(endpoints, name, who=who or None)

    def pause(self) -> None:
        self.c.pause(timeout=30)

    def resume(self) -> None:
        self.c.resume(timeout=30)

    def update(self, seconds: float, windows: List[Tuple[float, float]]) -> None:
        with self.c.update(timeout=60):
            t0 = _now()
            time.sleep(seconds)
            windows.append((t0, _now()))
        self.c.resume(timeout=30)


# ---------------------------------------------------------------- scenarios
def _served(hosts: List[SimHost], windows: List[Tuple[float, float]]) -> int:
    return sum(h.served_during(a, b) for h in hosts for a, b in windows)


def sc_missed_pause(hosts: List[SimHost], drv: Any) -> Tuple[bool, str]:
    """Host h2 is unreachable (stopped) when the pause goes out."""
    victim = hosts[2]
    victim.signal_ctl(signal.SIGSTOP)
    windows: List[Tuple[float, float]] = []
    try:
        drv.update(0.5, windows)
    finally:
        victim.signal_ctl(signal.SIGCONT)
    n = _served(hosts, windows)
    time.sleep(0.3)
    drv.resume()              # a late pause may land after the continue
    return n == 0, f"{n} served in update"


def sc_restart_mid_update(hosts: List[SimHost], drv: Any) -> Tuple[bool, str]:
    victim = hosts[1]
    windows: List[Tuple[float, float]] = []

    def restart_during() -> None:
        time.sleep(0.1)
        victim.kill()
        victim.start()

    t = threading.Thread(target=restart_during)
    orig = drv.update

    def update_with_restart(seconds: float, w: List[Tuple[float, float]]) -> None:
        t.start()
        orig(seconds, w)
    update_with_restart(1.5, windows)
    t.join(30)
    n = _served(hosts, windows)
    return n == 0, f"{n} served in update"


def sc_two_controllers(hosts: List[SimHost], make: Callable[[str], Any]
                       ) -> Tuple[Tuple[bool, str], Tuple[bool, str]]:
    windows: List[Tuple[float, float]] = []
    mu = threading.Lock()
    errs: List[str] = []

    def ctl(k: int) -> None:
        d = make(f"controller-{k}")
        try:
            for _ in range(3):
                w: List[Tuple[float, float]] = []
                d.update(0.3, w)
                with mu:
                    windows.extend(w)
        except Exception as e:
            errs.append(repr(e))

    ts = [threading.Thread(target=ctl, args=(k,)) for k in (0, 1)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    ws = sorted(windows)
    overlaps = sum(1 for a, b in zip(ws, ws[1:]) if b[0] < a[1])
    n = _served(hosts, ws)
    hung = any(t.is_alive() for t in ts)
    r1 = (overlaps == 0 and not hung and not errs,
          f"{overlaps} overlaps" + (" HUNG" if hung else "") + (f" {errs[0]}" if errs else ""))
    r2 = (n == 0, f"{n} served in updates")
    return r1, r2


def sc_update_drains(hosts: List[SimHost], drv: Any) -> Tuple[bool, str]:
    windows: List[Tuple[float, float]] = []
    drv.update(0.2, windows)
    (t0, _), = windows
    held = sum(1 for h in hosts for _, a, r in h.reads() if a < t0 < r)
    return held == 0, f"{held} running at start"


# --------------------------------------------------------------------- run
ROWS = [
    ("missed pause: h2 unreachable", "h2 keeps serving during the update"),
    ("restart mid-update: h1 killed + back", "restarted host comes up unpaused"),
    ("two controllers: updates serialize", "their pause/update/continue interleave"),
    ("no continue lands mid-update", "a continue opens hosts mid-update"),
    ("update starts after requests drain", "requests still run when it starts"),
]


def _fit(s: str, n: int) -> str:
    return s if len(s) <= n else s[:n - 1] + "~"


def measure_cost(endpoints: List[str], name: str, rounds: int = 15) -> Dict[str, float]:
    """Median cluster pause() for the registered hosts vs one etcd write RTT,
    both through the same client in the same run."""
    from pyshmlock.cluster._sync import Cluster
    c = Cluster(endpoints, name)
    e = c.a.etcd
    key = f"/pyshmlock/bench/{uuid.uuid4().hex}"
    writes, pauses = [], []
    try:
        for _ in range(rounds):
            t = time.perf_counter()
            c._run(e.txn([], [e.op_put(key, "x")]), 30)
            writes.append(time.perf_counter() - t)
            t = time.perf_counter()
            c.pause(timeout=30)
            pauses.append(time.perf_counter() - t)
            c.resume(timeout=30)
            time.sleep(0.05)
        c._run(e.txn([], [e.op_delete(key)]), 30)
    finally:
        c.close()
    w, p = statistics.median(writes), statistics.median(pauses)
    return {"write_ms": w * 1e3, "pause_ms": p * 1e3, "ratio": p / w}


def run_cluster_demo(hosts: int = 3, workers: int = 2, out: Any = None) -> bool:
    from .localetcd import LocalEtcd
    out = out or sys.stdout
    run_id = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
    tmp = tempfile.mkdtemp(prefix="pyshmlock-cdemo-")
    started: List[SimHost] = []
    etcd: Optional[LocalEtcd] = None
    old = {}

    def on_signal(sig: int, frame: Any) -> None:
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGHUP):
        old[sig] = signal.signal(sig, on_signal)
    results: Dict[str, List[Tuple[bool, str]]] = {}
    cost: Dict[str, float] = {}
    try:
        print("starting a 3-member etcd on loopback ...", file=out, flush=True)
        etcd = LocalEtcd(members=3)
        for mode in ("cluster", "fanout"):
            name = f"demo-{run_id}-{mode}"
            hs = [SimHost(i, mode, run_id, tmp, etcd.endpoints, name, workers)
                  for i in range(hosts)]
            started += hs
            for h in hs:
                h.start()
            print(f"{mode}: {hosts} hosts x {workers} workers up", file=out, flush=True)
            if mode == "cluster":
                probe = ViaCluster(etcd.endpoints, name)
                probe.c.wait_hosts(hosts, timeout=20)
                probe.c.close()

                def make(who: str, _n: Any = name) -> Any:
                    return ViaCluster(etcd.endpoints, _n, who)
                drv: Any = make("demo")
            else:
                def make(who: str, _n: Any = hs) -> Any:
                    return FanOut(_n)
                drv = make("demo")
            time.sleep(0.5)
            res = [sc_missed_pause(hs, drv)]
            print(f"  {mode}: missed pause done", file=out, flush=True)
            res.append(sc_restart_mid_update(hs, drv))
            print(f"  {mode}: restart mid-update done", file=out, flush=True)
            res += list(sc_two_controllers(hs, make))
            print(f"  {mode}: two controllers done", file=out, flush=True)
            res.append(sc_update_drains(hs, drv))
            results[mode] = res
            if mode == "cluster":
                cost = measure_cost(etcd.endpoints, name)
            for h in hs:
                h.stop()
    except KeyboardInterrupt:
        print("interrupted", file=out)
        return False
    finally:
        for h in started:
            h.stop()
        if etcd is not None:
            etcd.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        for sig, handler in old.items():
            signal.signal(sig, handler)
    w1, w2 = 38, 28
    print("", file=out)
    print(f"{'scenario (3 hosts)':<{w1}} {'pyshmlock.cluster (etcd)':<{w2}} "
          f"{'HTTP fan-out (today)':<{w2}}", file=out)
    print("-" * (w1 + 2 * w2 + 2), file=out)
    ok = True
    for i, (row, _) in enumerate(ROWS):
        c_ok, c_d = results["cluster"][i]
        f_ok, f_d = results["fanout"][i]
        ok &= c_ok
        print(f"{_fit(row, w1):<{w1}} {_fit(('PASS ' if c_ok else 'FAIL ') + c_d, w2):<{w2}} "
              f"{_fit(('PASS ' if f_ok else 'FAIL ') + f_d, w2):<{w2}}", file=out)
    if cost:
        print(f"\ncost: cluster pause() for {hosts} hosts {cost['pause_ms']:.1f} ms median = "
              f"{cost['ratio']:.1f}x one etcd write round-trip ({cost['write_ms']:.2f} ms)",
              file=out)
    print(f"\n{'PASS' if ok else 'FAIL'}: pyshmlock.cluster passed "
          f"{sum(r[0] for r in results['cluster'])}/{len(ROWS)}", file=out)
    return ok
