"""Simulated hosts for the cluster tests: real agent and worker processes,
optionally each host in its own network namespace (see netlab.py).

A Host has a lock of its own, its agent (``python -m pyshmlock agent``) and
worker processes that take read holds and log every admission
(``pyshmlock_lab.cluster.simhost``).  Everything is stopped by pid.
"""
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from conftest import unique_name
from helpers import remove_lock

from pyshmlock_lab.cluster.localetcd import LocalEtcd, etcd_binary


def now():
    return time.monotonic()


def require_etcd():
    """At a test module's top: skip the module when etcd is not installed,
    or fail it under PYSHMLOCK_REQUIRE_ETCD=1 (CI), where the cluster tests
    must run."""
    if etcd_binary() is None:
        if os.environ.get("PYSHMLOCK_REQUIRE_ETCD") == "1":
            raise RuntimeError("PYSHMLOCK_REQUIRE_ETCD=1 but etcd is not installed "
                               "(Debian: apt-get install etcd-server)")
        pytest.skip("etcd is not installed (Debian: apt-get install etcd-server); "
                    "the cluster tests need a real etcd", allow_module_level=True)


def three_member_etcd():
    """The body of a module's ``etcd`` fixture (``etcd =
    pytest.fixture(scope="module", name="etcd")(three_member_etcd)``): one
    real 3-member etcd on loopback for the whole module, stopped at its end
    with its data directory removed."""
    e = LocalEtcd(members=3)
    try:
        yield e
    finally:
        e.stop()
        assert not os.path.exists(e.dir)


class Host:
    """One simulated host: ``locks`` locks of its own (one per engine), its
    agent (one per host, for all of them) and worker processes on each."""

    def __init__(self, endpoints, cluster, host_id, tmp, workers=2, hold=0.0, ttl=2,
                 netns=None, agent_args=(), lock_name=None, start=True, env=None, locks=1):
        self.endpoints, self.cluster, self.id = list(endpoints), cluster, host_id
        self.lock_name = lock_name or unique_name(f"cl-{host_id}")
        self.lock_names = [self.lock_name] + [f"{self.lock_name}-{i}" for i in range(1, locks)]
        self.tmp = tmp
        self.hold = hold
        self.ttl = ttl
        self.netns = netns
        self.agent_args = list(agent_args)
        self.nworkers = workers
        self.env = dict(os.environ, PYSHMLOCK_CLUSTER_DIR=os.path.join(tmp, "cluster.d"))
        if env:
            self.env.update(env)
        self.agent = None
        self.workers = []
        self.logs = []
        self.log_lock = {}
        self.agent_log = os.path.join(self.tmp, f"{self.id}.{self.lock_name[-6:]}.agent.log")
        if start:
            self.start_agent()
            self.start_workers()

    def _cmd(self, args):
        if self.netns:
            return ["ip", "netns", "exec", self.netns] + args
        return args

    def agent_cmd(self):
        cmd = [sys.executable, "-m", "pyshmlock", "agent", "--etcd", ",".join(self.endpoints),
               "--cluster", self.cluster, "--host-id", self.id]
        for name in self.lock_names:
            cmd += ["--lock", name]
        if self.ttl is not None:
            cmd += ["--ttl", str(self.ttl)]
        return self._cmd(cmd + self.agent_args)

    def start_agent(self, wait=True):
        with open(self.agent_log, "a") as err:
            self.agent = subprocess.Popen(self.agent_cmd(), stdout=subprocess.DEVNULL,
                                          stderr=err, env=self.env)
        if wait:
            give_up = now() + 15
            while not all(os.path.exists(f"/dev/shm/pyshmlock.{n}") for n in self.lock_names):
                assert now() < give_up and self.agent.poll() is None, \
                    f"agent did not create its lock: {self.agent_text()}"
                time.sleep(0.01)

    def agent_text(self):
        try:
            with open(self.agent_log) as f:
                return f.read()[-3000:]
        except FileNotFoundError:
            return ""

    def start_workers(self, n=None, create=False, lock=None):
        """``n`` workers (``workers`` by default) on each lock, or on ``lock``."""
        for name in [lock] if lock else self.lock_names:
            for _ in range(self.nworkers if n is None else n):
                log = os.path.join(self.tmp,
                                   f"{self.id}.{name[-8:]}.w{len(self.logs)}.log")
                self.logs.append(log)
                self.log_lock[log] = name
                args = [sys.executable, "-m", "pyshmlock_lab.cluster.simhost", name, log,
                        str(self.hold)]
                if create:
                    args.append("create")
                self.workers.append(subprocess.Popen(self._cmd(args), env=self.env))

    def admissions(self, lock=None):
        """(t_before, t_admitted, t_released) of every completed read (on
        ``lock`` only, if given)."""
        out = []
        for log in self.logs:
            if lock is not None and self.log_lock.get(log) != lock:
                continue
            if os.path.exists(log):
                with open(log) as f:
                    out += [tuple(map(float, ln.split())) for ln in f if ln.count(" ") == 2]
        return out

    def admitted_after(self, t, until=float("inf"), lock=None):
        return [a for a in self.admissions(lock) if t < a[0] and a[1] < until]

    def last_admission(self):
        a = self.admissions()
        return max(x[1] for x in a) if a else None

    def wait_admitting(self, timeout=10, lock=None):
        """Until every lock with workers (or ``lock``) admitted a read."""
        t = now()
        names = [lock] if lock else sorted(set(self.log_lock.values()))
        while not all(self.admitted_after(t, lock=n) for n in names):
            assert now() - t < timeout, f"{self.id} admits nothing: {self.agent_text()}"
            time.sleep(0.02)

    def signal_agent(self, sig):
        if self.agent is not None and self.agent.poll() is None:
            os.kill(self.agent.pid, sig)

    def kill_all(self):
        for p in [self.agent] + self.workers:
            if p is not None and p.poll() is None:
                p.kill()
        for p in [self.agent] + self.workers:
            if p is not None:
                p.wait(10)
        self.workers = []

    def procs(self):
        return [p for p in [self.agent] + self.workers if p is not None]

    def stop(self):
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
            except subprocess.TimeoutExpired:
                print("DID NOT EXIT:", p.args, file=sys.stderr)
                p.kill()
                p.wait(5)
        for name in self.lock_names:
            remove_lock(name)


def stop_hosts(hosts):
    for h in hosts:                     # signal them all at once, then reap
        for p in h.procs():
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                    p.terminate()
                except ProcessLookupError:
                    pass
    for h in hosts:
        h.stop()


def fleet_of_hosts(etcd, tmp_path, *, prefix, n, ttl):
    """The body of a ``fleet`` (or ``hosts``) fixture on ``etcd``:
    ``make(n, name=None, wait=True, **kw)`` starts n simulated hosts h0..
    (``kw`` goes to Host; ``ttl`` by default) of a cluster named after
    ``prefix`` unless ``name`` is given, and returns (Cluster, [Host]) once
    every host registered (``wait``).  Every host is stopped and every
    controller closed afterwards; ``make.hosts`` and ``make.controllers``
    list them."""
    from pyshmlock.cluster import Cluster
    made, ctls = [], []
    default_n = n

    def make(n=default_n, name=None, wait=True, **kw):
        name = name or f"{prefix}-{uuid.uuid4().hex[:10]}"
        kw.setdefault("ttl", ttl)
        hs = [Host(etcd.endpoints, name, f"h{i}", str(tmp_path), **kw) for i in range(n)]
        made.extend(hs)
        c = Cluster(etcd.endpoints, name)
        ctls.append(c)
        if wait and n:
            c.wait_hosts(n, timeout=15)
        return c, hs

    make.hosts = made
    make.controllers = ctls
    yield make
    stop_hosts(made)
    for c in ctls:
        c.close()


# ------------------------------------------------------------ untrusted members
import socket  # noqa: E402
import threading  # noqa: E402


def _read_request(conn):
    """One HTTP request from ``conn``: (path, body), or None at EOF."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        d = conn.recv(65536)
        if not d:
            return None
        buf += d
    head, _, body = buf.partition(b"\r\n\r\n")
    n = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            n = int(v)
    while len(body) < n:
        d = conn.recv(65536)
        if not d:
            return None
        body += d
    return head.split(b" ")[1].decode(), body


class _LocalServer:
    """A TCP server on 127.0.0.1 whose thread runs the subclass's _accept
    until stop(): the url to give a client, the connections to close.  A
    subclass sets what _accept uses before calling this __init__."""

    def __init__(self):
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._conns = []
        self._t = threading.Thread(target=self._accept, daemon=True)
        self._t.start()

    def stop(self):
        self._stop.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)     # wakes the accept
        except OSError:
            pass
        self._sock.close()
        for c in self._conns:
            try:
                c.close()
            except OSError:
                pass
        self._t.join(5)


class FakeMember(_LocalServer):
    """A TCP server on 127.0.0.1 standing for an etcd member that answers
    badly: every request gets ``answer(path, body)``, a list of byte strings
    sent one by one ``gap`` seconds apart (separate TCP segments), after
    which the connection is closed when ``close`` is true or held open (a
    member that never finishes its answer) until the server stops.
    ``requests`` lists the paths asked for."""

    def __init__(self, answer, *, gap=0.0, close=True):
        self.answer, self.gap, self.close_after = answer, gap, close
        self.requests = []
        super().__init__()

    def _accept(self):
        while not self._stop.is_set():
            try:
                c, _ = self._sock.accept()
            except OSError:
                return
            self._conns.append(c)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        try:
            while not self._stop.is_set():
                req = _read_request(c)
                if req is None:
                    return
                self.requests.append(req[0])
                for i, part in enumerate(self.answer(*req)):
                    if i and self.gap:
                        time.sleep(self.gap)
                    c.sendall(part)
                if self.close_after:
                    return
                self._stop.wait()
        except OSError:
            return
        finally:
            try:
                c.close()
            except OSError:
                pass


class DelayProxy(_LocalServer):
    """A TCP proxy in front of one real etcd member that holds every request
    ``delay`` seconds before passing it on (a member slow to answer, still
    working on what it was sent), and counts the requests it passed."""

    def __init__(self, upstream_url, delay):
        from urllib.parse import urlparse
        u = urlparse(upstream_url)
        self.upstream = (u.hostname, u.port)
        self.delay = delay
        self.requests = 0
        self._mu = threading.Lock()
        super().__init__()

    def _accept(self):
        while not self._stop.is_set():
            try:
                c, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        up = socket.create_connection(self.upstream, timeout=30)
        self._conns += [c, up]

        def back():
            try:
                while True:
                    d = up.recv(65536)
                    if not d:
                        break
                    c.sendall(d)
            except OSError:
                pass
            finally:
                for s in (c, up):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

        threading.Thread(target=back, daemon=True).start()
        try:
            while not self._stop.is_set():
                req = _read_request(c)
                if req is None:
                    return
                with self._mu:
                    self.requests += 1
                if self._stop.wait(self.delay):
                    return
                path, body = req
                up.sendall(f"POST {path} HTTP/1.1\r\nHost: etcd\r\nContent-Type: "
                           f"application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                           + body)
        except OSError:
            return

