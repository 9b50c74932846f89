"""A lean HTTP/1.1 transport for httpx: the gateway's default way to its upstream engine.

httpx's default transport (httpcore + h11 + anyio) costs about 0.5 ms of CPU per streamed token
at 200 concurrent streams here, most of it in its connection pool, which scans every connection
(polling each idle socket) on every request and response. On a 2-core box shared with the
engine that is a throughput loss nobody would accept. This transport keeps the httpx seam (the
gateway still takes an ``httpx.AsyncClient``; tests still pass ``httpx.MockTransport``) and
does the work with asyncio protocols, httptools' C parser and an O(1) pool of idle connections.
``UpstreamClient`` is the httpx client to use it with: its ``send`` goes straight to the transport.

Body chunks that arrive while the reader is busy are handed over together; reading pauses past
``HIGH_WATER`` buffered bytes, so a slow client backpressures the engine instead of the heap.
Closing a response before its end closes the connection: that is how the engine learns to abort.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ssl
from collections.abc import AsyncIterator
from typing import Any

import httptools
import httpx

from bot.gateway.protocol import set_nodelay

HIGH_WATER = 256 * 1024
Key = tuple[str, str, int]


class _Connection(asyncio.Protocol):
    """One upstream connection: parses responses, queues body chunks for one reader."""

    def __init__(self, pool: UpstreamTransport, key: Key) -> None:
        self.pool, self.key = pool, key
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.headers: list[tuple[bytes, bytes]] = []
        self.head: asyncio.Future[None] | None = None
        self.chunks: collections.deque[bytes] = collections.deque()
        self.buffered = 0
        self.waiter: asyncio.Future[None] | None = None
        self.complete = self.closed = self.paused = False
        self.error: Exception | None = None
        self.received_any = False
        self.keep_alive = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        set_nodelay(transport)  # each request leaves at once, whatever was written before it

    def data_received(self, data: bytes) -> None:
        self.received_any = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"malformed response from upstream: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        if not self.complete:
            self._fail(httpx.RemoteProtocolError("upstream closed the connection mid-response"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        # Asked here: after the message completes, httptools no longer says.
        self.keep_alive = self.parser.should_keep_alive()
        if self.head is not None and not self.head.done():
            self.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()

    # the reader's side
    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _fail(self, exc: Exception) -> None:
        self.error = exc
        if self.head is not None and not self.head.done():
            self.head.set_exception(exc)
        self._wake()

    def begin(self, loop: asyncio.AbstractEventLoop) -> None:
        """Reset per-response state before a request goes out on this connection."""
        self.headers = []
        self.chunks.clear()
        self.buffered = 0
        self.complete = self.received_any = False
        self.error = None
        self.head = loop.create_future()

    async def body(self) -> AsyncIterator[bytes]:
        """The response body, chunk by chunk (chunks buffered meanwhile come joined)."""
        chunks = self.chunks
        while True:
            if chunks:
                data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
                chunks.clear()
                self.buffered = 0
                if self.paused and self.transport is not None:
                    self.paused = False
                    self.transport.resume_reading()
                yield data
            elif self.complete:
                return
            elif self.error is not None:
                raise self.error
            else:
                self.waiter = asyncio.get_running_loop().create_future()
                await self.waiter
                self.waiter = None

    def close(self) -> None:
        """Close the socket now (the upstream sees the client go away)."""
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class _Body(httpx.AsyncByteStream):
    """A response body that returns its connection to the pool, or closes it if unfinished."""

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        self._released = False

    def __aiter__(self) -> AsyncIterator[bytes]:  # type: ignore[override]
        return self._conn.body()  # no generator of our own in between: one layer less per event

    async def aclose(self) -> None:
        if self._released:
            return
        self._released = True
        conn = self._conn
        if conn.complete and not conn.closed and conn.keep_alive:
            conn.pool.release(conn)
        else:
            conn.close()


class UpstreamTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 (over TLS for https) with a LIFO pool of idle keep-alive connections per host."""

    def __init__(
        self, *, max_idle_per_host: int = 1024, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self._idle: dict[Key, collections.deque[_Connection]] = collections.defaultdict(
            collections.deque
        )
        self._max_idle = max_idle_per_host
        self._ssl_context = ssl_context  # for https upstreams; the system's CAs when None
        # requests answered on a connection opened for them / on a kept-alive one (metrics)
        self.sent_on_new = 0
        self.sent_on_kept = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send one request and return as soon as the response headers are in."""
        url = request.url
        key = (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))
        if key[0] not in ("http", "https"):
            raise httpx.UnsupportedProtocol(
                f"the upstream transport speaks http and https, not {key[0]} ({url})"
            )
        payload = await _serialize(request)
        timeout = request.extensions.get("timeout", {}).get("connect")
        for attempt in (0, 1):
            conn = self._take(key)
            reused = conn is not None
            if conn is None:
                conn = await self._connect(key, timeout)
            try:
                response = await self._exchange(conn, payload)
            except httpx.RemoteProtocolError:
                # A kept-alive connection the server closed just as we reused it: retry once
                # on a fresh one, but only if nothing of a response had arrived.
                if not (reused and attempt == 0 and not conn.received_any):
                    raise
                continue
            except BaseException:
                conn.close()
                raise
            if reused:
                self.sent_on_kept += 1
            else:
                self.sent_on_new += 1
            return response
        raise AssertionError("unreachable")

    async def _exchange(self, conn: _Connection, payload: bytes) -> httpx.Response:
        conn.begin(asyncio.get_running_loop())
        assert conn.transport is not None and conn.head is not None
        conn.transport.write(payload)
        await conn.head
        return httpx.Response(
            conn.parser.get_status_code(), headers=conn.headers, stream=_Body(conn),
            extensions={"http_version": b"HTTP/1.1"},
        )  # fmt: skip

    async def _connect(self, key: Key, timeout: float | None) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self, key), key[1], key[2], **self._tls(key)
                )
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {key[1]}:{key[2]} timed out") from None
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to {key[1]}:{key[2]}: {exc}") from exc
        return conn

    def _tls(self, key: Key) -> dict[str, Any]:
        """create_connection's TLS arguments for an https upstream (none for http)."""
        if key[0] != "https":
            return {}
        if self._ssl_context is None:
            self._ssl_context = ssl.create_default_context()  # verifies against system CAs
        return {"ssl": self._ssl_context, "server_hostname": key[1]}

    def _take(self, key: Key) -> _Connection | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                return conn
        return None

    def release(self, conn: _Connection) -> None:
        """Keep a connection whose response ended cleanly for the next request."""
        idle = self._idle[conn.key]
        if len(idle) >= self._max_idle:
            conn.close()
        else:
            idle.append(conn)

    def forget(self, conn: _Connection) -> None:
        """Drop a closed connection from the idle pool."""
        idle = self._idle.get(conn.key)
        if idle:
            with contextlib.suppress(ValueError):
                idle.remove(conn)

    async def aclose(self) -> None:
        """Close every idle connection."""
        for idle in self._idle.values():
            while idle:
                idle.pop().close()
        await asyncio.sleep(0)  # let the closed transports finish (connection_lost) in this loop


class UpstreamClient(httpx.AsyncClient):
    """An httpx client whose ``send`` hands the request straight to its transport.

    A proxy wants none of what ``httpx.AsyncClient.send`` wraps around the transport: auth
    flows, redirects, event hooks, a log line per request, and a cookie jar that would hand
    cookies one user's response set to every later user's requests. Skipping them saves about
    70 us of CPU per request here (and a generator layer per streamed event).
    """

    def __init__(self, *, transport: httpx.AsyncBaseTransport, **kwargs: Any) -> None:
        super().__init__(transport=transport, **kwargs)
        self.upstream = transport

    async def send(
        self,
        request: httpx.Request,
        *,
        stream: bool = False,
        auth: Any = httpx.USE_CLIENT_DEFAULT,
        follow_redirects: Any = httpx.USE_CLIENT_DEFAULT,
    ) -> httpx.Response:
        """Send one request as it is; read the body unless ``stream``."""
        response = await self.upstream.handle_async_request(request)
        response.request = request
        if not stream:
            try:
                await response.aread()
            finally:
                await response.aclose()
        return response


async def _serialize(request: httpx.Request) -> bytes:
    """Request line, headers and body as bytes (a streamed body is sent chunked)."""
    body = await request.aread()  # the whole body: inference requests are small JSON
    chunked = request.headers.get("transfer-encoding", "").lower() == "chunked"
    lines = [b"%s %s HTTP/1.1\r\n" % (request.method.encode(), request.url.raw_path)]
    lines += [b"%s: %s\r\n" % (k, v) for k, v in request.headers.raw]
    lines.append(b"\r\n")
    if chunked:
        if body:
            lines.append(b"%x\r\n%s\r\n" % (len(body), body))
        lines.append(b"0\r\n\r\n")
    else:
        lines.append(body)
    return b"".join(lines)
