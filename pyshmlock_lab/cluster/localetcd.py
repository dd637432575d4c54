"""A real etcd cluster on loopback ports, for the tests and the cluster demo.

``LocalEtcd(members=3)`` starts ``members`` etcd processes (the Debian
``etcd-server`` binary) listening on free 127.0.0.1 ports, with their data
directories in one temporary directory.  Start-up is bounded; ``stop()``
kills every member by pid and removes the directory, and is safe to call on
any failure path.  One member can be killed (SIGKILL) and restarted with its
data directory, which is how the fault tests take the Raft leader away;
``pause(i)``/``cont(i)`` stop and continue one (SIGSTOP/SIGCONT), and
``stop_majority()`` stops the leader and one more.

Options for the cluster tests: ``tls`` (certificate, key, CA and
``client_cert_auth``: the members serve https and may demand client
certificates), ``addrs``/``netns`` (each member on its own address inside
its own network namespace; the health probe runs from ``probe_netns``),
``extra`` (more etcd flags, e.g. a small ``--quota-backend-bytes``).
"""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Dict, List, Optional, Sequence, TypeVar

from pyshmlock.cluster._proc import spawn

__all__ = ["EtcdUnavailable", "LocalEtcd", "etcd_binary"]


_T = TypeVar("_T")
# Linux's CLONE_NEWNET (sched.h); os has it from Python 3.12 on.
_CLONE_NEWNET = getattr(os, "CLONE_NEWNET", 0x40000000)


def in_netns(ns: Optional[str], fn: Callable[[], _T]) -> _T:
    """Run ``fn`` in a thread that has entered network namespace ``ns``
    (sockets it opens belong there); ``ns=None`` runs it here."""
    if ns is None:
        return fn()
    box: Dict[str, Any] = {}

    def run() -> None:
        try:
            fd = os.open(f"/var/run/netns/{ns}", os.O_RDONLY)
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                if libc.setns(fd, _CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns {ns}")
            finally:
                os.close(fd)
            box["r"] = fn()
        except BaseException as e:
            box["e"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join()
    if "e" in box:
        raise box["e"]
    return box["r"]  # type: ignore[no-any-return]


class EtcdUnavailable(RuntimeError):
    """No etcd binary, or the cluster did not come up in time."""


def etcd_binary() -> Optional[str]:
    return shutil.which("etcd")


def _all_threads_stopped(pid: int) -> bool:
    """Whether every thread of pid is in the stopped state (T) per /proc."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return True                       # gone: nothing of it runs
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                state = f.read().rpartition(")")[2].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue                      # that thread ended meanwhile
        if state not in ("T", "t"):
            return False
    return True


def _free_ports(n: int) -> List[int]:
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


class LocalEtcd:
    def __init__(self, members: int = 3, *, start_timeout: float = 20.0,
                 heartbeat_ms: int = 50, election_ms: int = 500,
                 tls: Optional[Dict[str, Any]] = None, addrs: Optional[Sequence[str]] = None,
                 netns: Optional[Sequence[Optional[str]]] = None,
                 probe_netns: Optional[str] = None, extra: Sequence[str] = ()) -> None:
        binary = etcd_binary()
        if binary is None:
            raise EtcdUnavailable("etcd is not installed (Debian: apt-get install etcd-server)")
        self.binary = binary
        self.n = members
        self.heartbeat_ms = heartbeat_ms
        self.election_ms = election_ms
        self.tls = tls
        self.scheme = "https" if tls else "http"
        self.addrs = list(addrs) if addrs else ["127.0.0.1"] * members
        self.netns = list(netns) if netns else [None] * members
        self.probe_netns = probe_netns
        self.extra = list(extra)
        self.dir = tempfile.mkdtemp(prefix="pyshmlock-etcd-")
        if addrs:       # each member on its own address: the default ports are free
            self.client_ports = [2379] * members
            self.peer_ports = [2380] * members
        else:
            ports = _free_ports(2 * members)
            self.client_ports = ports[:members]
            self.peer_ports = ports[members:]
        self.names = [f"m{i}" for i in range(members)]
        self.procs: List[Optional[subprocess.Popen[Any]]] = [None] * members
        self._token = os.path.basename(self.dir)
        try:
            for i in range(members):
                self._spawn(i, "new")
            self.wait_healthy(start_timeout)
        except BaseException:
            self.stop()
            raise

    @property
    def endpoints(self) -> List[str]:
        return [f"{self.scheme}://{a}:{p}" for a, p in zip(self.addrs, self.client_ports)]

    def _tls_flags(self) -> List[str]:
        t = self.tls
        if not t:
            return []
        flags = ["--cert-file", t["cert"], "--key-file", t["key"]]
        if t.get("ca"):
            flags += ["--trusted-ca-file", t["ca"]]
        if t.get("client_cert_auth"):
            flags += ["--client-cert-auth"]
        return flags

    def _spawn(self, i: int, state: str) -> None:
        cluster = ",".join(f"{n}=http://{a}:{p}"
                           for n, a, p in zip(self.names, self.addrs, self.peer_ports))
        client = f"{self.scheme}://{self.addrs[i]}:{self.client_ports[i]}"
        peer = f"http://{self.addrs[i]}:{self.peer_ports[i]}"
        log = open(os.path.join(self.dir, f"{self.names[i]}.log"), "ab")  # noqa: SIM115 (closed below)
        pre = ["ip", "netns", "exec", self.netns[i]] if self.netns[i] else []
        try:
            self.procs[i] = spawn(
                pre + [self.binary, "--name", self.names[i],
                 "--data-dir", os.path.join(self.dir, self.names[i]),
                 "--listen-client-urls", client, "--advertise-client-urls", client,
                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", cluster, "--initial-cluster-state", state,
                 "--initial-cluster-token", self._token,
                 "--heartbeat-interval", str(self.heartbeat_ms),
                 "--election-timeout", str(self.election_ms),
                 "--listen-metrics-urls", "", "--log-level", "warn",
                 "--logger", "zap"] + self._tls_flags() + self.extra,
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        finally:
            log.close()

    def _ssl(self) -> Optional[ssl.SSLContext]:
        if not self.tls:
            return None
        ctx = ssl.create_default_context(cafile=self.tls.get("ca"))
        if self.tls.get("client_cert"):
            ctx.load_cert_chain(self.tls["client_cert"], self.tls["client_key"])
        return ctx

    def _status(self, i: int, timeout: float = 1.0) -> Optional[Dict[str, Any]]:
        url = f"{self.endpoints[i]}/v3/maintenance/status"

        def probe() -> Optional[Dict[str, Any]]:
            req = urllib.request.Request(url, data=b"{}", method="POST",
                                         headers={"content-type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=timeout, context=self._ssl()) as r:
                    status: Dict[str, Any] = json.loads(r.read())
                    return status
            except (OSError, ValueError, urllib.error.URLError):
                return None

        return in_netns(self.probe_netns, probe)

    def wait_healthy(self, timeout: float = 20.0) -> None:
        """Wait until every running member answers and agrees on a leader."""
        give_up = time.monotonic() + timeout
        while True:
            for i, p in enumerate(self.procs):
                if p is not None and p.poll() is not None:
                    raise EtcdUnavailable(f"etcd member {self.names[i]} exited "
                                          f"({p.returncode}); see {self.dir}")
            running = [i for i, p in enumerate(self.procs) if p is not None]
            sts = [self._status(i) for i in running]
            leaders = {int(s.get("leader", 0)) for s in sts if s}
            ids = {int(s["header"]["member_id"]) for s in sts if s}
            if all(sts) and len(leaders) == 1 and leaders <= ids:
                return
            if time.monotonic() > give_up:
                raise EtcdUnavailable(f"etcd cluster not healthy after {timeout:.0f} s")
            time.sleep(0.05)

    def leader(self) -> int:
        """Index of the current Raft leader."""
        for i, p in enumerate(self.procs):
            if p is None:
                continue
            s = self._status(i)
            if s and int(s.get("leader", 0)) == int(s["header"]["member_id"]):
                return i
        raise EtcdUnavailable("no etcd leader")

    def kill(self, i: int) -> None:
        p = self.procs[i]
        if p is not None:
            p.kill()
            p.wait(10)
            self.procs[i] = None

    def pause(self, i: int, timeout: float = 10.0) -> None:
        """SIGSTOP member i and return once every thread of it is stopped
        (kill() returns before a running thread has stopped)."""
        p = self.procs[i]
        if p is None:
            return
        os.kill(p.pid, signal.SIGSTOP)
        deadline = time.monotonic() + timeout
        while not _all_threads_stopped(p.pid):
            if time.monotonic() > deadline:
                raise EtcdUnavailable(f"etcd member {i} did not stop within {timeout} s")
            time.sleep(0.001)

    def stop_majority(self) -> List[int]:
        """Stop the leader and one other member (no quorum until cont());
        the leader is read once, so the two are distinct whatever elections
        run meanwhile.  Returns their indices, for cont()."""
        leader = self.leader()
        other = next(i for i, p in enumerate(self.procs) if p is not None and i != leader)
        stopped = [leader, other]
        try:
            for i in stopped:
                self.pause(i)
        except BaseException:
            for i in stopped:             # none left stopped behind a failure
                self.cont(i)
            raise
        return stopped

    def cont(self, i: int) -> None:
        p = self.procs[i]
        if p is not None:
            os.kill(p.pid, signal.SIGCONT)

    def restart(self, i: int, timeout: float = 20.0) -> None:
        if self.procs[i] is None:
            self._spawn(i, "existing")
        self.wait_healthy(timeout)

    def stop(self) -> None:
        for i, p in enumerate(self.procs):
            if p is None:
                continue
            try:
                os.killpg(p.pid, signal.SIGKILL)   # its own session: only etcd
            except ProcessLookupError:
                pass
            try:
                os.kill(p.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
            self.procs[i] = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalEtcd:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
