"""A real etcd cluster on loopback ports, for the tests and the cluster demo.

``LocalEtcd(members=3)`` starts ``members`` etcd processes (the Debian
``etcd-server`` binary) listening on free 127.0.0.1 ports, with their data
directories in one temporary directory.  Start-up is bounded; ``stop()``
kills every member by pid and removes the directory, and is safe to call on
any failure path.  One member can be killed (SIGKILL) and restarted with its
data directory, which is how the fault tests take the Raft leader away.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Any, Dict, List, Optional

from ._proc import spawn

__all__ = ["EtcdUnavailable", "LocalEtcd", "etcd_binary"]


class EtcdUnavailable(RuntimeError):
    """No etcd binary, or the cluster did not come up in time."""


def etcd_binary() -> Optional[str]:
    return shutil.which("etcd")


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
                 heartbeat_ms: int = 50, election_ms: int = 500) -> None:
        binary = etcd_binary()
        if binary is None:
            raise EtcdUnavailable("etcd is not installed (Debian: apt-get install etcd-server)")
        self.binary = binary
        self.n = members
        self.heartbeat_ms = heartbeat_ms
        self.election_ms = election_ms
        self.dir = tempfile.mkdtemp(prefix="pyshmlock-etcd-")
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
        return [f"http://127.0.0.1:{p}" for p in self.client_ports]

    def _spawn(self, i: int, state: str) -> None:
        cluster = ",".join(f"{n}=http://127.0.0.1:{p}" for n, p in zip(self.names, self.peer_ports))
        client = f"http://127.0.0.1:{self.client_ports[i]}"
        peer = f"http://127.0.0.1:{self.peer_ports[i]}"
        log = open(os.path.join(self.dir, f"{self.names[i]}.log"), "ab")  # noqa: SIM115 (closed below)
        try:
            self.procs[i] = spawn(
                [self.binary, "--name", self.names[i],
                 "--data-dir", os.path.join(self.dir, self.names[i]),
                 "--listen-client-urls", client, "--advertise-client-urls", client,
                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", cluster, "--initial-cluster-state", state,
                 "--initial-cluster-token", self._token,
                 "--heartbeat-interval", str(self.heartbeat_ms),
                 "--election-timeout", str(self.election_ms),
                 "--listen-metrics-urls", "", "--log-level", "warn",
                 "--logger", "zap"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        finally:
            log.close()

    def _status(self, i: int, timeout: float = 1.0) -> Optional[Dict[str, Any]]:
        import requests
        try:
            r = requests.post(f"http://127.0.0.1:{self.client_ports[i]}/v3/maintenance/status",
                              json={}, timeout=timeout)
            if r.status_code == 200:
                status: Dict[str, Any] = r.json()
                return status
        except requests.RequestException:
            pass
        return None

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
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
            self.procs[i] = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalEtcd:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
