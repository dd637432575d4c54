"""An asyncio etcd v3 client over etcd's HTTP/JSON gateway (``/v3/...``), stdlib only.

Why its own client: the agent and the controllers need, from one code path,
(1) cancellation that leaves nothing behind (an asyncio task cancelled inside
a request closes that request's connection), (2) calls bounded by the
caller's deadline, every request included, (3) fail-over to another member
well before a host's local lease runs out, (4) TLS with a private CA, client
certificates and etcd's user authentication, with errors that say so.

* **Reads and lease keep-alives are hedged.**  They go to the member that
  answered last; if it has not answered within ``hedge_after`` the same
  request also goes to the next member, and the first answer wins.  So a
  hung member (stopped, partitioned) costs ``hedge_after``, not a timeout.
* **A write is never sent twice to a member still working on it.**  It goes
  to one member; if that member has not answered within ``request_timeout``
  it also goes to the next (every write the cluster code sends compares
  revisions or is idempotent, so two copies cannot apply twice), and the
  first answer wins.  An attempt is not abandoned before the call's
  deadline: a member slow to answer under load is not sent the write again.
* **Every call is bounded by the caller's deadline** (``op_timeout``, 10 s,
  only when the caller gives none); when it passes the call raises
  :class:`EtcdUnavailable` with ``took_effect`` False (nothing sent got
  through) or None (a write was sent and its answer was lost).
* **Answers are untrusted.**  Each is parsed and type-checked where it
  arrives (``parse``); bad JSON, wrong types, bad base64, an unframed or cut
  answer (``_http``) counts as that member's failure, and the call moves on
  to the next member.  What the caller sees is a result or an
  :class:`EtcdError` naming the member, never a raw ValueError or KeyError.
"""
from __future__ import annotations

import asyncio
import json
import ssl
import time
from typing import Any, AsyncIterator, Callable, Dict, List, Optional, Sequence, Tuple
from urllib.parse import urlparse

from ._answers import (
    PARSE_ERRORS,
    Compacted,
    b64,
    decode_kv,
    parse_grant,
    parse_keepalive,
    parse_object,
    parse_range,
    parse_token,
    parse_ttl,
    parse_txn,
    parse_watch,
    unb64,
    why,
)
from ._errors import (
    AuthenticationError,
    CertificateError,
    ClusterError,
    EtcdError,
    EtcdUnavailable,
    QuotaError,
)
from ._http import Broken, ConnectFailed, Pool, wait_for

__all__ = ["TLS", "Compacted", "Etcd", "LeaseNotFound", "b64", "decode_kv", "prefix_end", "unb64"]

#: A request to one member gives up after this long (or at the caller's deadline).
REQUEST_TIMEOUT = 1.0
#: A read or keep-alive also goes to the next member after this long.
HEDGE_AFTER = 0.15


def prefix_end(prefix: str) -> str:
    b = bytearray(prefix.encode())
    b[-1] += 1
    return bytes(b).decode()


class LeaseNotFound(EtcdError):
    """etcd no longer has the lease a request names."""


#: The requests that change nothing in etcd (a lease's time-to-live query
#: does not renew it): one that fails took no effect.
READ_PATHS = frozenset({"/kv/range", "/lease/timetolive"})


class _Retry(Exception):
    """One member failed in a way another member may not: try the next."""

    def __init__(self, why: str, maybe_applied: bool, tls: bool = False) -> None:
        super().__init__(why)
        self.maybe_applied = maybe_applied
        self.tls = tls


class _BadToken(Exception):
    """The auth token expired or was revoked: authenticate again."""


def _ssl_cause(e: BaseException) -> Optional[BaseException]:
    seen = 0
    x: Optional[BaseException] = e
    while x is not None and seen < 8:
        if isinstance(x, ssl.SSLError):
            return x
        x = x.__cause__ or x.__context__
        seen += 1
    text = str(e)
    if "CERTIFICATE" in text.upper() or "SSL" in text or "TLS" in text.upper():
        return e
    return None


class TLS:
    """TLS and authentication settings for etcd (all optional).

    ``ca``: the CA bundle that signed the members' certificates (default: the
    system's); ``cert``/``key``: this client's certificate and key, for etcd's
    ``--client-cert-auth``; ``user``/``password``: etcd user authentication
    (the client authenticates once and re-authenticates when the token
    expires); ``token``: an already issued auth token instead."""

    def __init__(self, ca: Optional[str] = None, cert: Optional[str] = None,
                 key: Optional[str] = None, user: Optional[str] = None,
                 password: Optional[str] = None, token: Optional[str] = None) -> None:
        if (cert is None) != (key is None):
            raise ValueError("a client certificate needs both cert and key")
        if password is not None and user is None:
            raise ValueError("a password needs a user")
        self.ca, self.cert, self.key = ca, cert, key
        self.user, self.password, self.token = user, password, token

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca)
        if self.cert is not None:
            ctx.load_cert_chain(self.cert, self.key)
        return ctx


def _now() -> float:
    return time.monotonic()


class Etcd:
    """A client of one etcd cluster (any number of member URLs)."""

    def __init__(self, endpoints: Sequence[str] | str, *, tls: Optional[TLS] = None,
                 request_timeout: float = REQUEST_TIMEOUT, hedge_after: float = HEDGE_AFTER,
                 op_timeout: float = 10.0, prefer: int = 0) -> None:
        if isinstance(endpoints, str):
            endpoints = [e.strip() for e in endpoints.split(",") if e.strip()]
        if not endpoints:
            raise ValueError("no etcd endpoints")
        self.urls = []
        for ep in endpoints:
            u = urlparse(ep if "://" in ep else "http://" + ep)
            if u.scheme not in ("http", "https"):
                raise ValueError(f"etcd endpoint {ep!r}: http:// or https:// only")
            self.urls.append(f"{u.scheme}://{u.hostname}:{u.port or 2379}")
        self.endpoints = list(endpoints)
        self.tls = tls or TLS()
        self.request_timeout = request_timeout
        self.hedge_after = hedge_after
        self.op_timeout = op_timeout
        self._pools: List[Optional[Pool]] = [None] * len(self.urls)
        self._pref = prefer % len(self.urls)    # the member that answered last
        self._token: Optional[str] = self.tls.token
        self._auth_mu: Optional[asyncio.Lock] = None
        self._ssl: Optional[ssl.SSLContext] = None
        if any(u.startswith("https") for u in self.urls):
            try:
                self._ssl = self.tls.ssl_context()
            except (OSError, ssl.SSLError) as e:
                raise CertificateError(f"etcd TLS settings: certificate or key: {e}") from None

    # ------------------------------------------------------------ plumbing
    def _pool(self, i: int) -> Pool:
        p = self._pools[i]
        if p is None:
            u = urlparse(self.urls[i])
            p = Pool(u.hostname or "127.0.0.1", u.port or 2379,
                     self._ssl if u.scheme == "https" else None)
            self._pools[i] = p
        return p

    async def aclose(self) -> None:
        ps, self._pools = self._pools, [None] * len(self.urls)
        for p in ps:
            if p is not None:
                p.close()

    def _headers(self) -> Dict[str, str]:
        return {"Authorization": self._token} if self._token else {}

    def _classify(self, i: int, path: str, status: int, data: bytes) -> BaseException:
        """The exception for a non-200 answer of member ``i``.  An answer
        that is not etcd's JSON error (a proxy's page, garbage) is a bad
        member: the call moves on to the next one."""
        url = self.urls[i]
        text = data.decode(errors="replace")
        try:
            j = json.loads(data)
        except (ValueError, RecursionError):
            j = None
        if not isinstance(j, dict) or not isinstance(j.get("error", j.get("message")), str):
            return _Retry(f"{url}: HTTP {status} with an answer that is not etcd's: "
                          f"{text.strip()[:120]!r}", maybe_applied=path not in READ_PATHS)
        msg = str(j.get("error") or j.get("message") or "")
        code = j.get("code", 0)
        if isinstance(code, bool) or not isinstance(code, int):
            code = 0
        low = msg.lower()
        if "invalid auth token" in low or "auth: revision" in low:
            return _BadToken(msg)
        if "lease not found" in low:
            return LeaseNotFound(f"etcd: {msg}")
        if ("user name is empty" in low or "authentication failed" in low
                or "permission denied" in low or "not capable" in low
                or code in (7, 16) or status == 401):
            return AuthenticationError(f"etcd authentication refused {path}: {msg}")
        if "database space exceeded" in low or "nospace" in low or code == 8:
            return QuotaError(f"etcd space quota exceeded (NOSPACE alarm) at {path}: {msg}; "
                              "compact, defragment and disarm the alarm "
                              "(docs/OPERATIONS.md, 'etcd's space quota')")
        if (status >= 500 or code in (4, 10, 13, 14) or "no leader" in low
                or "leader changed" in low or "timed out" in low or "too many" in low
                or "stopped" in low):
            return _Retry(f"{url}: {status} {msg}",
                          maybe_applied=code in (4, 13) or status >= 500)
        return EtcdError(f"etcd at {url} refused {path}: {msg}")

    async def _one(self, i: int, path: str, payload: bytes, timeout: float,
                   parse: Callable[[Any], Any]) -> Any:
        url = self.urls[i]
        try:
            status, data = await wait_for(
                self._pool(i).post(path, payload, self._headers()), timeout)
        except asyncio.TimeoutError:
            raise _Retry(f"{url}: no answer in {timeout:.2f} s", maybe_applied=True) from None
        except ssl.SSLError as e:
            raise _Retry(f"{url}: TLS: {e}", maybe_applied=False, tls=True) from None
        except ConnectFailed as e:
            raise _Retry(f"{url}: {e}", maybe_applied=False) from None
        except (Broken, OSError) as e:
            tls = await self._diagnose_tls(i)
            what = f"TLS: {tls}" if tls is not None else f"{type(e).__name__} {e}".rstrip()
            raise _Retry(f"{url}: {what}", maybe_applied=True, tls=tls is not None) from None
        if status != 200:
            raise self._classify(i, path, status, data)
        try:
            return parse(json.loads(data))
        except PARSE_ERRORS as e:
            # Whatever the member sent: the next one may answer properly.  A
            # write it answered this way may have been applied.
            raise _Retry(f"{url}: malformed answer to {path}: {why(e)}",
                         maybe_applied=path not in READ_PATHS) from None

    async def _diagnose_tls(self, i: int) -> Optional[BaseException]:
        """A connection that broke right after a TLS 1.3 handshake is how a
        server refuses a client certificate (or the lack of one): TLS 1.3
        checks it after the handshake.  Ask once more with TLS 1.2, which
        checks it during the handshake, to get the server's reason."""
        if self._ssl is None:
            return None
        u = urlparse(self.urls[i])
        ctx = self.tls.ssl_context()
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        try:
            _r, w = await wait_for(asyncio.open_connection(
                u.hostname, u.port, ssl=ctx), min(1.0, self.request_timeout))
        except ssl.SSLError as e:
            return e
        except (OSError, asyncio.TimeoutError):
            return None
        w.close()
        return None

    def _fail(self, path: str, errors: List[_Retry], t0: float) -> BaseException:
        # A request that changes nothing (a read) took no effect, whatever
        # happened to it on the way.
        maybe = path not in READ_PATHS and any(e.maybe_applied for e in errors)
        last = errors[-1] if errors else None
        if errors and all(e.tls for e in errors[-len(self.urls):]):
            return CertificateError(
                f"etcd at {','.join(self.urls)}: certificate problem: {last}")
        return EtcdUnavailable(
            f"etcd unreachable at {','.join(self.urls)} after {_now() - t0:.2f} s "
            f"({path}): {last or 'no time left'}",
            ["etcd"], took_effect=None if maybe else False)

    async def call(self, path: str, body: Dict[str, Any], *, deadline: Optional[float] = None,
                   hedge: bool = False, parse: Optional[Callable[[Any], Any]] = None) -> Any:
        """One request, to as many members as needed before ``deadline``
        (absolute monotonic seconds; None: ``op_timeout`` from now).  The
        answer goes through ``parse`` (default: it must be a JSON object);
        an answer it refuses counts as that member's failure."""
        t0 = _now()
        end = t0 + self.op_timeout if deadline is None else deadline
        parse = parse or parse_object
        payload = json.dumps(body).encode()
        if self.tls.user is not None and self._token is None and path != "/auth/authenticate":
            await self._authenticate(end)
        for attempt in range(3):
            try:
                return await self._call(path, payload, t0, end, hedge, parse)
            except _BadToken:
                if self.tls.user is None or attempt == 2:
                    raise AuthenticationError(
                        f"etcd refused the auth token at {path}: it expired or was "
                        "revoked (give user and password to re-authenticate)") from None
                self._token = None
                await self._authenticate(end)
        raise AssertionError("unreachable")    # pragma: no cover

    async def _call(self, path: str, payload: bytes, t0: float, end: float, hedge: bool,
                    parse: Callable[[Any], Any]) -> Any:
        """Hedged (reads, keep-alives): a new attempt, on the next member,
        whenever ``hedge_after`` passes without an answer (up to two per
        member in flight), so a request stuck in a member that forwards it
        to a dead leader does not hold up the answer of a new leader.

        Writes: an attempt is never abandoned before the deadline (a member
        slow to answer may still be working on it); after
        ``request_timeout`` without an answer the write also goes to a
        member that has none of this call's attempts in flight, never again
        to one that has.  Only a member whose attempt failed gets it again."""
        n = len(self.urls)
        errors: List[_Retry] = []
        pending: Dict[asyncio.Task[Any], int] = {}
        launched = 0                    # attempts started, round robin from _pref
        since_sleep = 0
        start = self._pref
        last_launch = 0.0
        try:
            while True:
                now = _now()
                if now >= end:
                    if pending and not hedge:   # a write still in flight may apply
                        errors.append(_Retry(f"no answer before the deadline ({path})", True))
                    raise self._fail(path, errors, t0)
                if not pending and since_sleep >= n:     # a round of failures
                    if len(errors) >= n and all(x.tls for x in errors[-n:]):
                        raise CertificateError(
                            f"etcd at {','.join(self.urls)}: certificate problem "
                            f"(TLS): {errors[-1]}")
                    since_sleep = 0
                    start = self._pref - launched
                    await asyncio.sleep(min(0.05, max(0.0, end - now)))
                    continue
                busy = set(pending.values())
                if hedge:
                    launch = not pending or (now - last_launch >= self.hedge_after
                                             and len(pending) < 2 * n)
                    patience = self.hedge_after
                else:
                    launch = len(busy) < n and (
                        not pending or now - last_launch >= self.request_timeout)
                    patience = self.request_timeout if len(busy) + launch < n else end - now
                if launch:
                    i = (start + launched) % n
                    launched += 1
                    while not hedge and i in busy:
                        i = (start + launched) % n
                        launched += 1
                    since_sleep += 1
                    last_launch = now
                    limit = min(self.request_timeout, end - now) if hedge else end - now
                    pending[asyncio.ensure_future(self._one(
                        i, path, payload, max(0.001, limit), parse))] = i
                wait = min(end - _now(), max(0.0, last_launch + patience - _now()))
                done, _ = await asyncio.wait(list(pending), timeout=max(0.0, wait),
                                             return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    i = pending.pop(t)
                    exc = t.exception()
                    if exc is None:
                        self._pref = i
                        return t.result()
                    if isinstance(exc, _Retry):
                        errors.append(exc)
                        if self._pref == i:
                            self._pref = (i + 1) % n
                        continue
                    raise exc
        finally:
            for t in pending:           # the losers of a hedge, or a cancelled call
                t.cancel()
                t.add_done_callback(_retrieve)

    async def _authenticate(self, end: float) -> None:
        if self._auth_mu is None:
            self._auth_mu = asyncio.Lock()
        async with self._auth_mu:
            if self._token is not None:
                return
            body = {"name": self.tls.user, "password": self.tls.password or ""}
            try:
                token = await self._call("/auth/authenticate", json.dumps(body).encode(),
                                         _now(), end, True, parse_token)
            except AuthenticationError as e:
                raise AuthenticationError(
                    f"etcd authentication failed for user {self.tls.user!r}: {e}") from None
            except EtcdError as e:
                if "authentication is not enabled" in str(e):
                    self._token = ""
                    return
                raise
            self._token = token

    # ------------------------------------------------------------------ kv
    async def range(self, key: str, *, prefix: bool = False, keys_only: bool = False,
                    deadline: Optional[float] = None) -> Tuple[List[Dict[str, Any]], int]:
        """Linearizable range read: (kvs with decoded key/value, header revision)."""
        body: Dict[str, Any] = {"key": b64(key)}
        if prefix:
            body["range_end"] = b64(prefix_end(key))
        if keys_only:
            body["keys_only"] = True
        r: Tuple[List[Dict[str, Any]], int] = await self.call(
            "/kv/range", body, deadline=deadline, hedge=True, parse=parse_range)
        return r

    async def txn(self, compare: List[Dict[str, Any]], success: List[Dict[str, Any]],
                  failure: Optional[List[Dict[str, Any]]] = None, *,
                  deadline: Optional[float] = None
                  ) -> Tuple[bool, int, List[List[Dict[str, Any]]]]:
        """One transaction: (succeeded, header revision, the kvs of each of
        the taken branch's operations: a range's kvs, [] for a put or a
        delete)."""
        r: Tuple[bool, int, List[List[Dict[str, Any]]]] = await self.call(
            "/kv/txn", {"compare": compare, "success": success, "failure": failure or []},
            deadline=deadline, parse=parse_txn)
        return r

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
    def op_delete(key: str, prefix: bool = False) -> Dict[str, Any]:
        req = {"key": b64(key)}
        if prefix:
            req["range_end"] = b64(prefix_end(key))
        return {"request_delete_range": req}

    @staticmethod
    def op_range(key: str, prefix: bool = False, keys_only: bool = False) -> Dict[str, Any]:
        req: Dict[str, Any] = {"key": b64(key)}
        if prefix:
            req["range_end"] = b64(prefix_end(key))
        if keys_only:            # revisions and lease, no values: O(keys), not O(bytes)
            req["keys_only"] = True
        return {"request_range": req}

    # -------------------------------------------------------------- leases
    async def lease_grant(self, ttl: float, *, deadline: Optional[float] = None) -> int:
        lease: int = await self.call("/lease/grant", {"TTL": str(max(1, round(ttl)))},
                                     deadline=deadline, parse=parse_grant)
        return lease

    async def lease_keepalive(self, lease: int, *, deadline: Optional[float] = None) -> int:
        """Renew (hedged); returns the TTL left (0: the lease has expired or is unknown)."""
        ttl: int = await self.call("/lease/keepalive", {"ID": str(lease)}, deadline=deadline,
                                   hedge=True, parse=parse_keepalive)
        return ttl

    async def lease_ttl(self, lease: int, *, deadline: Optional[float] = None
                        ) -> Tuple[int, int]:
        """(whole seconds the lease has left, its granted TTL); TTL -1: gone."""
        r: Tuple[int, int] = await self.call("/lease/timetolive", {"ID": str(lease)},
                                             deadline=deadline, hedge=True, parse=parse_ttl)
        return r

    async def lease_revoke(self, lease: int, *, deadline: Optional[float] = None) -> bool:
        try:
            await self.call("/lease/revoke", {"ID": str(lease)},
                            deadline=_now() + 2.0 if deadline is None else deadline)
            return True
        except LeaseNotFound:
            return True
        except ClusterError:
            return False     # a lease that cannot be revoked expires on its own

    # --------------------------------------------------------------- watch
    async def watch(self, prefix: str, start_revision: int, member: Optional[int] = None
                    ) -> AsyncIterator[Tuple[int, List[Dict[str, Any]]]]:
        """Yield (revision, events) for every change under ``prefix`` from
        ``start_revision`` on, from one member (``member`` or the preferred
        one).  Ends with an exception when the stream breaks or a message is
        malformed (an event skipped would leave a copy wrong without notice);
        raises :class:`Compacted` when ``start_revision`` was compacted away."""
        i = self._pref if member is None else member
        url = self.urls[i]
        body = {"create_request": {"key": b64(prefix), "range_end": b64(prefix_end(prefix)),
                                   "start_revision": str(start_revision)}}
        status, lines, conn = await wait_for(
            self._pool(i).stream("/watch", json.dumps(body).encode(), self._headers()),
            self.request_timeout)
        try:
            if status != 200:
                data = b"".join([x async for x in lines])
                raise _public(self._classify(i, "/watch", status, data))
            async for line in lines:
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                    if isinstance(obj, dict) and "error" in obj:
                        raise _public(self._classify(i, "/watch", 500, line))
                    got = parse_watch(obj)
                except PARSE_ERRORS as e:
                    raise EtcdError(f"{url}: malformed watch message: {why(e)}") from None
                if got is None:
                    continue
                yield got
        finally:
            conn.close()

    @property
    def preferred(self) -> int:
        return self._pref


def _retrieve(t: asyncio.Task[Any]) -> None:
    if not t.cancelled():
        t.exception()


def _public(e: BaseException) -> BaseException:
    """A member's refusal as the caller sees it (a retry is an EtcdError)."""
    return EtcdError(str(e)) if isinstance(e, (_Retry, _BadToken)) else e
