"""The little HTTP/1.1 the etcd gateway needs, on asyncio streams (stdlib only).

etcd's HTTP/JSON gateway is Go's net/http: a unary call is a POST whose
answer has a Content-Length; a watch is a POST whose answer is chunked, one
JSON message per line, for as long as the stream lives.  That is all this
speaks: keep-alive connections per member (one request at a time on each),
TLS through ``ssl`` (a CA, a client certificate), no redirects, no proxies.

Why not an HTTP library: a pause costs each agent one watch event and one
write, and on a host running many agents (the tests and the benchmark run
16 on 2 CPUs) a general client's per-request work (about 4 ms of CPU per
gate change with httpx, against under 1 ms here) was what grew with the
number of hosts.  Cancellation is asyncio's: a request cancelled or timed
out closes its connection, which is never reused.
"""
from __future__ import annotations

import asyncio
import ssl
from typing import Any, AsyncIterator, Awaitable, Dict, List, Optional, Tuple, TypeVar

_T = TypeVar("_T")

__all__ = ["Broken", "ConnectFailed", "Pool", "wait_for"]

_MAX_HEAD = 64 * 1024
_MAX_BODY = 64 * 1024 * 1024


async def wait_for(aw: Awaitable[_T], timeout: float) -> _T:
    """asyncio.wait_for that never swallows a cancellation.  Before Python
    3.12, wait_for returns the inner result when the inner awaitable ends
    just as the outer task is cancelled: the cancellation is lost, and a
    cancelled update acquire went on into its block (caught by
    test_cancelled_async_update_leaves_nothing_held).  asyncio.wait raises
    the cancellation in every case; the inner task is then cancelled."""
    t = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait({t}, timeout=timeout)
    except BaseException:
        t.cancel()
        t.add_done_callback(_retrieve)
        raise
    if not done:
        t.cancel()
        t.add_done_callback(_retrieve)
        raise asyncio.TimeoutError()
    return t.result()


def _retrieve(t: asyncio.Future[Any]) -> None:
    if not t.cancelled():
        t.exception()


class ConnectFailed(OSError):
    """No connection could be made (refused, unreachable): nothing was sent."""


class Broken(OSError):
    """The connection broke after the request was (maybe) sent."""


class _Conn:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    def close(self) -> None:
        try:
            self.writer.close()
        except Exception:
            pass


class Pool:
    """Connections to one member (``host:port``, TLS if ``ssl_ctx``)."""

    def __init__(self, host: str, port: int, ssl_ctx: Optional[ssl.SSLContext]) -> None:
        self.host, self.port, self.ssl = host, port, ssl_ctx
        self._idle: List[_Conn] = []
        self._hosthdr = f"{host}:{port}".encode()

    async def _connect(self) -> _Conn:
        try:
            r, w = await asyncio.open_connection(
                self.host, self.port, ssl=self.ssl,
                server_hostname=self.host if self.ssl is not None else None,
                limit=_MAX_HEAD)
        except ssl.SSLError:
            raise
        except OSError as e:
            raise ConnectFailed(e.errno, f"connect {self.host}:{self.port}: {e}") from None
        return _Conn(r, w)

    def _head(self, path: str, n: int, headers: Dict[str, str]) -> bytes:
        extra = b"".join(f"{k}: {v}\r\n".encode() for k, v in headers.items())
        return (b"POST /v3" + path.encode() + b" HTTP/1.1\r\nHost: " + self._hosthdr +
                b"\r\nContent-Type: application/json\r\nContent-Length: " + str(n).encode() +
                b"\r\n" + extra + b"\r\n")

    @staticmethod
    async def _read_head(c: _Conn) -> Tuple[int, Dict[str, str]]:
        line = await c.reader.readline()
        if not line:
            raise Broken("connection closed before an answer")
        try:
            status = int(line.split(None, 2)[1])
        except (IndexError, ValueError):
            raise Broken(f"not an HTTP answer: {line[:80]!r}") from None
        hdrs: Dict[str, str] = {}
        size = 0
        while True:
            h = await c.reader.readline()
            size += len(h)
            if not h or size > _MAX_HEAD:
                raise Broken("bad HTTP header")
            if h in (b"\r\n", b"\n"):
                return status, hdrs
            k, _, v = h.decode("latin-1").partition(":")
            hdrs[k.strip().lower()] = v.strip()

    @staticmethod
    async def _chunks(c: _Conn) -> AsyncIterator[bytes]:
        while True:
            line = await c.reader.readline()
            if not line:
                raise Broken("connection closed inside a chunked answer")
            try:
                n = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise Broken("bad chunk size") from None
            if n == 0:
                while (await c.reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
                return
            if n > _MAX_BODY:
                raise Broken("chunk too large")
            data = await c.reader.readexactly(n)
            await c.reader.readexactly(2)
            yield data

    async def post(self, path: str, body: bytes, headers: Dict[str, str]) -> Tuple[int, bytes]:
        """One request; (status, body).  Raises ConnectFailed, ssl.SSLError,
        Broken; a cancelled or failed request closes its connection."""
        reused = bool(self._idle)
        c = self._idle.pop() if reused else await self._connect()
        ok = False
        try:
            c.writer.write(self._head(path, len(body), headers) + body)
            await c.writer.drain()
            status, hdrs = await self._read_head(c)
            if "content-length" in hdrs:
                n = int(hdrs["content-length"])
                if n > _MAX_BODY:
                    raise Broken("answer too large")
                data = await c.reader.readexactly(n)
            elif "chunked" in hdrs.get("transfer-encoding", ""):
                data = b"".join([x async for x in self._chunks(c)])
            else:
                data = await c.reader.read(_MAX_BODY)
                hdrs["connection"] = "close"
            ok = hdrs.get("connection", "").lower() != "close"
            return status, data
        except (ConnectionError, asyncio.IncompleteReadError) as e:
            raise Broken(f"{type(e).__name__}: {e}") from None
        finally:
            if ok:
                self._idle.append(c)
            else:
                c.close()

    async def stream(self, path: str, body: bytes, headers: Dict[str, str]
                     ) -> Tuple[int, AsyncIterator[bytes], _Conn]:
        """A streaming request on a connection of its own: (status, an
        iterator over the answer's lines, the connection to close)."""
        c = await self._connect()
        try:
            c.writer.write(self._head(path, len(body), headers) + body)
            await c.writer.drain()
            status, hdrs = await self._read_head(c)
        except BaseException:
            c.close()
            raise
        chunked = "chunked" in hdrs.get("transfer-encoding", "")

        async def lines() -> AsyncIterator[bytes]:
            buf = b""
            try:
                if chunked:
                    async for data in self._chunks(c):
                        buf += data
                        while b"\n" in buf:
                            line, buf = buf.split(b"\n", 1)
                            yield line
                else:
                    n = int(hdrs.get("content-length", "0") or 0)
                    buf = await c.reader.readexactly(n) if n else await c.reader.read()
                if buf.strip():
                    yield buf
            except (ConnectionError, asyncio.IncompleteReadError) as e:
                raise Broken(f"{type(e).__name__}: {e}") from None

        return status, lines(), c

    def close(self) -> None:
        idle, self._idle = self._idle, []
        for c in idle:
            c.close()
