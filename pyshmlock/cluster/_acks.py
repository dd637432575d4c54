"""The direct acknowledgement path: hosts tell the controllers what they
mirrored in one UDP datagram each, instead of one etcd write each.

Why: a pause used to cost each host's agent one etcd write (its
registration, carrying ``mirrored``), so a pause of N hosts was N + 1 Raft
writes and grew with the fleet.  Now a controller that waits for hosts
listens on a UDP port and publishes where, with a secret key, in etcd
(``ctl/ackers/<session>``, bound to its session lease); every agent watches
``ctl/`` anyway, so it knows every live acker, and after each change of
what it mirrored it sends its report to each of them.  A pause costs the
controller's one write, the watch events that carry it, and N datagrams.

Authority stays in etcd: the gate, the update lock, the generation and the
registrations (liveness, identity) are etcd keys; a datagram only reports
what a registered agent did, and it counts only for the registration it
names (its create revision).  Reports are sealed with HMAC-SHA256 under the
acker's key (readable only with etcd access, never sent): a datagram that
does not verify is dropped.  A datagram is sent once, never answered: a
controller still waiting for some hosts after ``PATIENCE`` (a datagram
lost, a firewall, a controller behind NAT) asks them, by one etcd write
(``ctl/ackreq``), to write their report in etcd, which every controller
reads as well; so a lost datagram costs time, never correctness.
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import os
import socket
from typing import Any, Callable, Dict, List, Optional, Tuple

__all__ = ["PATIENCE", "AckReceiver", "AckSender", "Report", "local_address", "new_key", "pack",
           "unpack"]

_ACK = b"PSA1"
_MAC = 16
#: The largest report sent as a datagram; a larger one goes to etcd.
MAX_DATAGRAM = 16384
#: A controller still waiting for hosts this long after its write asks them
#: to write their reports in etcd.
PATIENCE = 1.0

Report = Dict[str, Any]


def new_key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


def _key(text: Any) -> Optional[bytes]:
    try:
        k = base64.b64decode(str(text), validate=True)
    except ValueError:
        return None
    return k if len(k) >= 16 else None


def seal(key: bytes, magic: bytes, payload: Dict[str, Any]) -> bytes:
    body = json.dumps(payload, separators=(",", ":")).encode()   # the MAC covers these bytes
    return magic + hmac.new(key, magic + body, hashlib.sha256).digest()[:_MAC] + body


def unseal(key: bytes, magic: bytes, data: bytes) -> Optional[Dict[str, Any]]:
    """The payload of a datagram sealed with ``key``; None for anything else."""
    if len(data) <= 4 + _MAC or data[:4] != magic:
        return None
    mac, body = data[4:4 + _MAC], data[4 + _MAC:]
    if not hmac.compare_digest(mac, hmac.new(key, magic + body, hashlib.sha256).digest()[:_MAC]):
        return None
    try:
        v = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return v if isinstance(v, dict) else None


def local_address(host: str, port: int) -> str:
    """The address this machine uses to reach ``host`` (where agents, which
    reach the same etcd, can most likely reach a controller)."""
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_DGRAM)
    try:
        s.connect((host, port))      # UDP: picks a route, sends nothing
        return str(s.getsockname()[0])
    finally:
        s.close()


#: A lock's standing on the wire (``_keys.CURRENT`` ...), and back.
_STANDING = {"current": 0, "behind": 1, "partial": 2}
_STANDING_OF = {v: k for k, v in _STANDING.items()}
#: The receive buffer a controller asks for: a pause of N hosts is N
#: datagrams in one burst (the kernel caps it at net.core.rmem_max unless
#: the process may force it).
RCVBUF = 4 * 1024 * 1024


def pack(report: Report) -> Dict[str, Any]:
    """A report as a datagram carries it: each lock as
    [paused, drained, suspect, standing, applied, users] (a host of 8 locks
    is about 300 bytes, so a burst of them fits a receive buffer)."""
    return {"m": report["mirrored"], "p": report["paused"], "d": report["drained"],
            "l": {name: [v["paused"], v["drained"], v["suspect"],
                         _STANDING.get(v["standing"], 1), v["applied"], v["users"]]
                  for name, v in report["locks"].items()}}


def unpack(d: Any) -> Optional[Report]:
    """The report of a datagram; None if it is not one."""
    if not isinstance(d, dict) or not isinstance(d.get("l"), dict):
        return None
    locks = {}
    for name, v in d["l"].items():
        if not isinstance(v, list) or len(v) != 6:
            return None
        locks[name] = {"paused": v[0] is True, "drained": v[1] is True, "suspect": v[2] is True,
                       "standing": _STANDING_OF.get(v[3], "behind"), "applied": v[4],
                       "users": v[5]}
    return {"mirrored": d.get("m"), "paused": d.get("p") is True,
            "drained": d.get("d") is True, "locks": locks}


class AckReceiver:
    """A controller's end: keeps the newest report of each host, per
    registration.  A plain non-blocking socket read to empty at each
    readiness (asyncio's datagram transport takes one datagram per turn of
    the loop: a burst of N reports was N turns, and overflowed the buffer
    at 128 hosts)."""

    def __init__(self, cluster: str, key: str, on_report: Callable[[], None]) -> None:
        k = _key(key)
        assert k is not None
        self.cluster, self.key_text, self.key = cluster, key, k
        self.on_report = on_report
        #: host id -> (registration create revision, sequence, report)
        self.reports: Dict[str, Tuple[int, int, Report]] = {}
        #: the hosts whose report changed, in order (from position ``base``):
        #: a waiter re-checks only those, not the whole fleet at each report
        self.changes: List[str] = []
        self.base = 0
        self.address: Tuple[str, int] = ("", 0)
        self.sock: Optional[socket.socket] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    @classmethod
    async def start(cls, cluster: str, on_report: Callable[[], None], bind: str,
                    port: int = 0) -> AckReceiver:
        fam = socket.AF_INET6 if ":" in bind else socket.AF_INET
        me = cls(cluster, new_key(), on_report)
        sock = socket.socket(fam, socket.SOCK_DGRAM)
        try:
            for opt in (getattr(socket, "SO_RCVBUFFORCE", None), socket.SO_RCVBUF):
                if opt is not None:
                    try:
                        sock.setsockopt(socket.SOL_SOCKET, opt, RCVBUF)
                        break
                    except OSError:
                        continue
            sock.bind((bind, port))
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        me.sock = sock
        me.address = (bind, int(sock.getsockname()[1]))
        me._loop = asyncio.get_running_loop()
        me._loop.add_reader(sock.fileno(), me._drain)
        return me

    def _drain(self) -> None:
        assert self.sock is not None
        heard = False
        while True:
            try:
                data = self.sock.recv(MAX_DATAGRAM + 64)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            heard = self._take(data) or heard
        if heard:
            self.on_report()

    def _take(self, data: bytes) -> bool:
        v = unseal(self.key, _ACK, data)
        if v is None or v.get("c") != self.cluster:
            return False
        host, reg, seq = v.get("h"), v.get("g"), v.get("q")
        report = unpack(v.get("r"))
        if not (isinstance(host, str) and isinstance(reg, int) and isinstance(seq, int)
                and report is not None) or isinstance(reg, bool) or isinstance(seq, bool):
            return False
        prev = self.reports.get(host)
        if prev is not None and (reg, seq) <= prev[:2]:
            return False
        self.reports[host] = (reg, seq, report)
        self.changes.append(host)
        if len(self.changes) > 65536:
            drop = len(self.changes) // 2
            del self.changes[:drop]
            self.base += drop
        return True

    def changed_since(self, pos: int) -> Optional[List[str]]:
        """The hosts reported since position ``pos`` (None: too long ago,
        re-check every host); the current position is ``base + len(changes)``."""
        if pos < self.base:
            return None
        return self.changes[pos - self.base:]

    @property
    def position(self) -> int:
        return self.base + len(self.changes)

    def report(self, host: str, registration: int) -> Optional[Report]:
        r = self.reports.get(host)
        return r[2] if r is not None and r[0] == registration else None

    def close(self) -> None:
        if self.sock is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self.sock.fileno())
            self.sock.close()
            self.sock = None


class _Acker:
    __slots__ = ("addr", "key", "raw", "sent_seq")

    def __init__(self, addr: Tuple[str, int], key: bytes, raw: Dict[str, Any]) -> None:
        self.addr, self.key, self.raw = addr, key, raw
        self.sent_seq = 0           # the last report sent to it


class AckSender(asyncio.DatagramProtocol):
    """An agent's end: sends its report to every live acker, once."""

    def __init__(self, cluster: str, host: str) -> None:
        self.cluster, self.host = cluster, host
        self.ackers: Dict[str, _Acker] = {}
        self.registration = 0
        self.seq = 0
        self.payload: Optional[Dict[str, Any]] = None
        self._transports: Dict[int, asyncio.DatagramTransport] = {}

    def set_ackers(self, ackers: Dict[str, Dict[str, Any]]) -> bool:
        """Follow the ackers in etcd; True if one was added."""
        added = False
        for sid in list(self.ackers):
            if sid not in ackers:
                del self.ackers[sid]
        for sid, v in ackers.items():
            cur = self.ackers.get(sid)
            if cur is not None and cur.raw == v:
                continue                          # unchanged (checked at every change)
            key = _key(v.get("key"))
            addr, port = v.get("addr"), v.get("port")
            if key is None or not isinstance(addr, str) or not isinstance(port, int) \
                    or isinstance(port, bool) or not 0 < port < 65536:
                continue
            self.ackers[sid] = _Acker((addr, port), key, v)
            added = True
        return added

    def send(self, registration: int, report: Report) -> bool:
        """Send ``report`` to every acker; False if it cannot go as a
        datagram (none to send to, or too large): write it in etcd."""
        self.seq += 1
        self.registration = registration
        self.payload = {"c": self.cluster, "h": self.host, "g": registration, "q": self.seq,
                        "r": pack(report)}
        if not self.ackers:
            return False
        sent = True
        for a in self.ackers.values():      # to every one, whatever the others did
            sent = self._send_to(a) and sent
        return sent

    def resend_to_new(self) -> None:
        """Ackers that appeared since the last report get it too."""
        if self.payload is not None:
            for a in self.ackers.values():
                if a.sent_seq != self.seq:
                    self._send_to(a)

    def _send_to(self, a: _Acker) -> bool:
        assert self.payload is not None
        a.sent_seq = self.seq
        data = seal(a.key, _ACK, self.payload)
        if len(data) > MAX_DATAGRAM:
            return False
        t = self._transports.get(socket.AF_INET6 if ":" in a.addr[0] else socket.AF_INET)
        if t is None or t.is_closing():
            return False
        try:
            t.sendto(data, a.addr)
        except OSError:
            return False
        return True

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        for fam, bind in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
            try:
                t, _ = await loop.create_datagram_endpoint(lambda: self, local_addr=(bind, 0),
                                                           family=fam)
            except OSError:
                continue          # no IPv6 here
            self._transports[fam] = t

    def datagram_received(self, data: bytes, addr: Any) -> None:
        pass            # nothing is sent to an agent

    def error_received(self, exc: Exception) -> None:
        pass            # an acker gone (ICMP unreachable): its controller asks in etcd

    def close(self) -> None:
        for t in self._transports.values():
            t.close()
        self._transports = {}
