"""The little HTTP/1.1 the etcd gateway needs, on asyncio streams (stdlib only).

etcd's HTTP/JSON gateway is Go's net/http: a unary call is a POST whose
answer has a Content-Length; a watch is a POST whose answer is chunked, one
JSON message per line, for as long as the stream lives.  That is all this
speaks: keep-alive connections per member (one request at a time on each),
TLS through ``ssl`` (a CA, a client certificate), no redirects, no proxies.

Why not an HTTP library: a pause costs each agent one watch event, and on
a machine running many agents (the tests and the benchmark run up to 128 on
2 CPUs) a general client's per-request work (about 4 ms of CPU per gate
change with httpx, against about 0.3 ms for the whole agent here) is what
grows with the number of hosts.  Cancellation is asyncio's: a request cancelled or timed
out closes its connection, which is never reused.

A member's answer is untrusted input: anything but a well-formed answer
(a bad status line, oversized or too many header lines, a bad length or
chunk size, a body cut short) raises :class:`Broken`, never asyncio's own
ValueError, so the client moves on to the next member.  An answer with
neither a length nor chunks ends when the server closes the connection.
"""
from __future__ import annotations

import asyncio
import ssl
from typing import Any, AsyncIterator, Awaitable, Dict, List, Optional, Tuple, TypeVar

_T = TypeVar("_T")

__all__ = ["Broken", "ConnectFailed", "Pool", "wait_for"]

_MAX_HEAD = 64 * 1024
_MAX_BODY = 64 * 1024 * 1024
_MAX_HEADERS = 100


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
    async def _line(c: _Conn, what: str) -> bytes:
        """One line, at most ``_MAX_HEAD`` bytes (a longer one is a broken
        answer, not asyncio's ValueError)."""
        try:
            return await c.reader.readline()
        except (ValueError, asyncio.LimitOverrunError):
            raise Broken(f"{what} longer than {_MAX_HEAD} bytes") from None

    @classmethod
    async def _read_head(cls, c: _Conn) -> Tuple[int, Dict[str, str]]:
        line = await cls._line(c, "status line")
        if not line:
            raise Broken("connection closed before an answer")
        parts = line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit() \
                or len(parts[1]) != 3:
            raise Broken(f"not an HTTP/1.x answer: {line[:80]!r}")
        status = int(parts[1])
        hdrs: Dict[str, str] = {}
        size = 0
        while True:
            h = await cls._line(c, "header line")
            size += len(h)
            if not h:
                raise Broken("connection closed inside the answer's header")
            if size > _MAX_HEAD or len(hdrs) > _MAX_HEADERS:
                raise Broken(f"answer header larger than {_MAX_HEAD} bytes")
            if h in (b"\r\n", b"\n"):
                return status, hdrs
            k, _, v = h.decode("latin-1").partition(":")
            hdrs[k.strip().lower()] = v.strip()

    @staticmethod
    def _length(hdrs: Dict[str, str]) -> Optional[int]:
        """The answer's Content-Length (None: there is none)."""
        v = hdrs.get("content-length")
        if v is None:
            return None
        if not v.isdigit():
            raise Broken(f"bad Content-Length {v[:40]!r}")
        n = int(v)
        if n > _MAX_BODY:
            raise Broken(f"answer too large ({n} bytes)")
        return n

    @classmethod
    async def _chunks(cls, c: _Conn) -> AsyncIterator[bytes]:
        while True:
            line = await cls._line(c, "chunk size line")
            if not line:
                raise Broken("connection closed inside a chunked answer")
            size = line.split(b";", 1)[0].strip()
            if not size or len(size) > 16 or \
                    not all(ch in b"0123456789abcdefABCDEF" for ch in size):
                raise Broken(f"bad chunk size {line[:40]!r}")
            n = int(size, 16)
            if n == 0:
                while (await cls._line(c, "trailer line")) not in (b"\r\n", b"\n", b""):
                    pass
                return
            if n > _MAX_BODY:
                raise Broken("chunk too large")
            data = await c.reader.readexactly(n)
            if await c.reader.readexactly(2) != b"\r\n":
                raise Broken("a chunk not followed by CRLF")
            yield data

    @staticmethod
    async def _to_eof(c: _Conn) -> bytes:
        """An unframed answer: everything until the server closes (a
        read() returns one segment, not the whole answer)."""
        parts: List[bytes] = []
        size = 0
        while True:
            d = await c.reader.read(65536)
            if not d:
                return b"".join(parts)
            size += len(d)
            if size > _MAX_BODY:
                raise Broken("answer too large")
            parts.append(d)

    async def post(self, path: str, body: bytes, headers: Dict[str, str]) -> Tuple[int, bytes]:
        """One request; (status, body).  Raises ConnectFailed, ssl.SSLError,
        Broken (whatever the answer's bytes); a cancelled or failed request
        closes its connection."""
        reused = bool(self._idle)
        c = self._idle.pop() if reused else await self._connect()
        ok = False
        try:
            c.writer.write(self._head(path, len(body), headers) + body)
            await c.writer.drain()
            status, hdrs = await self._read_head(c)
            n = self._length(hdrs)
            if "chunked" in hdrs.get("transfer-encoding", "").lower():
                data = b"".join([x async for x in self._chunks(c)])
            elif n is not None:
                data = await c.reader.readexactly(n)
            else:
                data = await self._to_eof(c)
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
        iterator over the answer's lines, the connection to close).  The
        iterator raises Broken for anything but a well-formed answer."""
        c = await self._connect()
        try:
            c.writer.write(self._head(path, len(body), headers) + body)
            await c.writer.drain()
            status, hdrs = await self._read_head(c)
            n = self._length(hdrs)
        except BaseException:
            c.close()
            raise
        chunked = "chunked" in hdrs.get("transfer-encoding", "").lower()

        async def lines() -> AsyncIterator[bytes]:
            buf = b""
            try:
                if chunked:
                    async for data in self._chunks(c):
                        buf += data
                        if len(buf) > _MAX_BODY:
                            raise Broken("a streamed message too large")
                        while b"\n" in buf:
                            line, buf = buf.split(b"\n", 1)
                            yield line
                else:
                    buf = await c.reader.readexactly(n) if n is not None else await self._to_eof(c)
                if buf.strip():
                    yield buf
            except (ConnectionError, asyncio.IncompleteReadError) as e:
                raise Broken(f"{type(e).__name__}: {e}") from None

        return status, lines(), c

    def close(self) -> None:
        idle, self._idle = self._idle, []
        for c in idle:
            c.close()
