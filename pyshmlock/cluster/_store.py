"""A thin etcd v3 access layer over etcd3gw, with endpoint fail-over.

etcd3gw talks to one member through etcd's HTTP/JSON gateway (no protobuf,
no gRPC).  This layer sends the raw v3 requests the cluster code needs
(range, txn with revision compares, lease grant/keep-alive/revoke, watch)
through ``Etcd3Client.post`` and moves to the next endpoint when a member
is unreachable or has no leader, so a killed Raft leader costs one retry.
Every call is bounded by ``op_timeout``.
"""
from __future__ import annotations

import base64
import json
import queue
import socket
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple
from urllib.parse import urlparse

try:
    import etcd3gw
    from etcd3gw import exceptions as _gwexc
except ImportError as e:   # pragma: no cover - the optional extra is missing
    raise ImportError("pyshmlock.cluster needs the 'cluster' extra: "
                      "pip install 'pyshmlock[cluster]'") from e

__all__ = ["EtcdError", "LeaseNotFound", "Store", "b64", "prefix_end", "unb64"]


class EtcdError(RuntimeError):
    """etcd could not be reached through any endpoint in time."""


def b64(x: Any) -> str:
    if isinstance(x, str):
        x = x.encode()
    return base64.b64encode(x).decode()


def unb64(x: Optional[str]) -> bytes:
    return base64.b64decode(x) if x else b""


def prefix_end(prefix: str) -> str:
    b = bytearray(prefix.encode())
    b[-1] += 1
    return bytes(b).decode()


# Unreachable member, no leader (503), timeout, internal error: try another
# member.  Anything else (e.g. "requested lease not found") is an answer.
_RETRYABLE = (_gwexc.ConnectionFailedError, _gwexc.ConnectionTimeoutError,
              _gwexc.InternalServerError)


class LeaseNotFound(RuntimeError):
    """etcd refused a request that names a lease it no longer has."""


class Store:
    def __init__(self, endpoints: Sequence[str] | str, *, op_timeout: float = 10.0,
                 request_timeout: float = 2.0) -> None:
        if isinstance(endpoints, str):
            endpoints = [e for e in endpoints.split(",") if e.strip()]
        if not endpoints:
            raise ValueError("no etcd endpoints")
        self.endpoints = list(endpoints)
        self.op_timeout = op_timeout
        self._clients = []
        for ep in self.endpoints:
            u = urlparse(ep if "://" in ep else "http://" + ep)
            self._clients.append(etcd3gw.Etcd3Client(
                host=u.hostname or "127.0.0.1", port=u.port or 2379,
                protocol=u.scheme or "http", timeout=request_timeout, api_path="/v3/"))
        self._cur = 0
        self._mu = threading.Lock()

    # ------------------------------------------------------------ plumbing
    def _post(self, path: str, body: Dict[str, Any], timeout: Optional[float] = None) -> Any:
        give_up = time.monotonic() + (self.op_timeout if timeout is None else timeout)
        last: Optional[BaseException] = None
        while True:
            with self._mu:
                i = self._cur
            c = self._clients[i]
            try:
                return c.post(c.get_url(path), json=body)
            except _RETRYABLE as e:
                last = e
            except _gwexc.Etcd3Exception as e:
                if "lease not found" in str(e):
                    raise LeaseNotFound(str(e)) from None
                raise EtcdError(f"etcd refused {path}: {e}") from None
            with self._mu:
                if self._cur == i:
                    self._cur = (i + 1) % len(self._clients)
            if time.monotonic() > give_up:
                waited = time.monotonic() - give_up + (
                    self.op_timeout if timeout is None else timeout)
                raise EtcdError(f"etcd unreachable at {','.join(self.endpoints)} "
                                f"after {waited:.1f} s: "
                                f"{type(last).__name__} {last or ''}".rstrip())
            time.sleep(0.02)

    # ------------------------------------------------------------------ kv
    def get(self, key: str, *, prefix: bool = False) -> Tuple[List[Dict[str, Any]], int]:
        """Linearizable range read: (kvs with decoded key/value, header revision)."""
        body: Dict[str, Any] = {"key": b64(key)}
        if prefix:
            body["range_end"] = b64(prefix_end(key))
        r = self._post("/kv/range", body)
        kvs = []
        for kv in r.get("kvs", []):
            kvs.append({"key": unb64(kv["key"]).decode(), "value": unb64(kv.get("value")),
                        "create_revision": int(kv.get("create_revision", 0)),
                        "mod_revision": int(kv.get("mod_revision", 0)),
                        "lease": int(kv.get("lease", 0))})
        return kvs, int(r["header"]["revision"])

    def txn(self, compare: List[Dict[str, Any]], success: List[Dict[str, Any]],
            failure: Optional[List[Dict[str, Any]]] = None) -> Tuple[bool, int, Any]:
        r = self._post("/kv/txn", {"compare": compare, "success": success,
                                   "failure": failure or []})
        return bool(r.get("succeeded", False)), int(r["header"]["revision"]), r

    # txn building blocks (the v3 JSON forms)
    @staticmethod
    def cmp_create(key: str, rev: int, result: str = "EQUAL") -> Dict[str, Any]:
        return {"key": b64(key), "target": "CREATE", "result": result,
                "create_revision": str(rev)}

    @staticmethod
    def cmp_mod(key: str, rev: int, result: str = "EQUAL") -> Dict[str, Any]:
        return {"key": b64(key), "target": "MOD", "result": result, "mod_revision": str(rev)}

    @staticmethod
    def op_put(key: str, value: Any, lease: int = 0) -> Dict[str, Any]:
        if not isinstance(value, (bytes, str)):
            value = json.dumps(value, sort_keys=True)
        req: Dict[str, Any] = {"key": b64(key), "value": b64(value)}
        if lease:
            req["lease"] = str(lease)
        return {"request_put": req}

    @staticmethod
    def op_delete(key: str) -> Dict[str, Any]:
        return {"request_delete_range": {"key": b64(key)}}

    def put(self, key: str, value: Any, lease: int = 0) -> int:
        _ok, rev, _ = self.txn([], [self.op_put(key, value, lease)])
        return rev

    # -------------------------------------------------------------- leases
    def lease_grant(self, ttl: float) -> int:
        r = self._post("/lease/grant", {"TTL": str(max(1, round(ttl)))})
        return int(r["ID"])

    def lease_keepalive(self, lease: int, timeout: Optional[float] = None) -> int:
        """Renew; returns the TTL left (0: the lease has expired or is unknown)."""
        r = self._post("/lease/keepalive", {"ID": str(lease)}, timeout=timeout)
        res = r.get("result", r)
        return int(res.get("TTL", 0))

    def lease_revoke(self, lease: int) -> None:
        try:
            self._post("/lease/revoke", {"ID": str(lease)}, timeout=2.0)
        except Exception:
            pass   # a lease that cannot be revoked expires on its own

    # --------------------------------------------------------------- watch
    def open_watch(self, prefix: str, after_revision: int) -> Watch:
        """A watch stream on ``prefix`` from ``after_revision + 1`` that stays
        open across waits (one HTTP stream instead of one per wait)."""
        return Watch(self, prefix, after_revision)

    def wait_change(self, prefix: str, after_revision: int, timeout: float) -> bool:
        """Block until some key under ``prefix`` changes after ``after_revision``
        or ``timeout`` passes.  Returns True on a change.  A member that dies
        ends the wait early (the caller re-reads anyway)."""
        if timeout <= 0:
            return False
        w = Watch(self, prefix, after_revision)
        try:
            if w.resp is None:
                time.sleep(min(timeout, 0.05))
                return False
            try:
                w.q.get(timeout=timeout)
                return True
            except queue.Empty:
                return False
        finally:
            w.close()


class Watch:
    """One watch stream (etcd's /v3/watch through the gateway), read by a
    daemon thread; every request on it has a connect and read timeout, so
    neither the caller nor the thread can block forever on a dead member."""

    def __init__(self, store: Store, prefix: str, after_revision: int) -> None:
        self.store, self.prefix = store, prefix
        self.q: queue.Queue[int] = queue.Queue()
        self.resp: Any = None
        self._open(after_revision)

    def _open(self, after_revision: int) -> None:
        with self.store._mu:
            c = self.store._clients[self.store._cur]
        body = {"create_request": {"key": b64(self.prefix),
                                   "range_end": b64(prefix_end(self.prefix)),
                                   "start_revision": str(after_revision + 1)}}
        try:
            self.resp = c.session.post(c.get_url("/watch"), json=body, stream=True,
                                       timeout=(1.0, 5.0))
            if self.resp.status_code != 200:
                raise EtcdError(f"watch refused: {self.resp.status_code}")
        except Exception:
            self.close()
            with self.store._mu:
                self.store._cur = (self.store._cur + 1) % len(self.store._clients)
            return
        threading.Thread(target=self._pump, args=(self.resp, self.q), daemon=True,
                         name="pyshmlock-etcd-watch").start()

    @staticmethod
    def _pump(resp: Any, q: queue.Queue[int]) -> None:
        try:
            for line in resp.iter_lines():
                if not line:
                    continue
                res = json.loads(line).get("result", {})
                if res.get("events"):
                    q.put(1)
        except Exception:
            pass

    def wait(self, timeout: float, after_revision: int) -> bool:
        """True when an event came; on a quiet timeout the stream is reopened
        from ``after_revision`` (it may have died with its member)."""
        if self.resp is None:
            self._open(after_revision)
            if self.resp is None:
                time.sleep(min(timeout, 0.05))
                return False
        try:
            self.q.get(timeout=timeout)
        except queue.Empty:
            self.close()
            self._open(after_revision)
            return False
        while True:                       # take every event already queued
            try:
                self.q.get_nowait()
            except queue.Empty:
                return True

    def close(self) -> None:
        resp, self.resp = self.resp, None
        if resp is None:
            return
        # Shut the socket down first: the pump thread is blocked reading it,
        # and a plain close() would wait for that read to time out.
        try:
            s = socket.fromfd(resp.raw._fp.fileno(), socket.AF_INET, socket.SOCK_STREAM)
            s.shutdown(socket.SHUT_RDWR)
            s.close()
        except Exception:
            pass
        try:
            resp.close()
        except Exception:
            pass
