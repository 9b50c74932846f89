"""The gateway's upstream transport against real local servers (uvicorn, and raw asyncio)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from bot.engine.process import free_port
from bot.gateway.transport import HIGH_WATER, UpstreamTransport


class Upstream:
    """A raw ASGI app that records who connected and whether the client went away."""

    def __init__(self) -> None:
        self.clients: list[tuple[str, int]] = []
        self.bodies: list[bytes] = []
        self.disconnected = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return
        self.clients.append(scope["client"])
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.bodies.append(body)
        path = scope["path"]
        if path == "/big":
            size = 4 * HIGH_WATER
            headers = [(b"content-length", str(size).encode())]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            for _ in range(16):
                await send(
                    {"type": "http.response.body", "body": b"x" * (size // 16), "more_body": True}
                )
            await send({"type": "http.response.body", "body": b""})
        elif path == "/stream":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"first", "more_body": True})
            await self.release.wait()
            if (await receive())["type"] == "http.disconnect":
                self.disconnected.set()
        else:
            await send(
                {
                    "type": "http.response.start",
                    "status": 201,
                    "headers": [(b"x-seen", str(len(body)).encode())],
                }
            )
            await send({"type": "http.response.body", "body": b"ok:" + body})


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[str, Upstream]]:
    """The recording app on uvicorn in this loop."""
    app = Upstream()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, port=port, lifespan="off", log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    yield f"http://127.0.0.1:{port}", app
    app.release.set()
    server.should_exit = True
    await task
    await asyncio.sleep(0.05)  # let closed sockets finish closing before the loop ends


async def test_transport_reads_bodies_and_reuses_kept_alive_connections(upstream) -> None:
    base, app = upstream
    async with httpx.AsyncClient(transport=UpstreamTransport(), base_url=base) as client:
        first = await client.post("/echo?x=1", content=b"hello")
        second = await client.post("/echo", json={"a": 1})
    assert (first.status_code, first.content, first.headers["x-seen"]) == (201, b"ok:hello", "5")
    assert second.content == b'ok:{"a":1}'
    assert app.clients[0] == app.clients[1]  # same client port: the connection was reused


async def test_transport_sends_streamed_request_bodies_chunked(upstream) -> None:
    base, app = upstream

    async def parts() -> AsyncIterator[bytes]:
        yield b"ab"
        yield b"cd"

    async with httpx.AsyncClient(transport=UpstreamTransport(), base_url=base) as client:
        response = await client.post("/echo", content=parts())
    assert response.content == b"ok:abcd" and app.bodies == [b"abcd"]


async def test_transport_streams_large_bodies_through_backpressure(upstream) -> None:
    base, _ = upstream
    transport = UpstreamTransport()
    async with (
        httpx.AsyncClient(transport=transport, base_url=base) as client,
        client.stream("GET", "/big") as response,
    ):
        total = 0
        async for chunk in response.aiter_raw():
            total += len(chunk)
            await asyncio.sleep(0)  # a slow reader: the transport pauses the socket
    assert total == 4 * HIGH_WATER


async def test_transport_closing_an_unfinished_response_disconnects_upstream(upstream) -> None:
    base, app = upstream
    transport = UpstreamTransport()
    async with (
        httpx.AsyncClient(transport=transport, base_url=base) as client,
        client.stream("GET", "/stream") as response,
    ):
        assert await anext(response.aiter_raw()) == b"first"
    app.release.set()
    await asyncio.wait_for(app.disconnected.wait(), timeout=30)


async def test_transport_reports_refused_connections_as_connect_errors() -> None:
    async with httpx.AsyncClient(transport=UpstreamTransport()) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(f"http://127.0.0.1:{free_port()}/")


async def test_transport_refuses_what_is_not_http_with_the_url() -> None:
    async with httpx.AsyncClient(transport=UpstreamTransport()) as client:
        with pytest.raises(httpx.UnsupportedProtocol, match="http and https, not ftp"):
            await client.get("ftp://127.0.0.1:1/")


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate and key for 127.0.0.1 (openssl's CLI)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(  # noqa: S603
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


async def test_transport_speaks_https_and_verifies_the_upstreams_certificate(
    certificate: tuple[Path, Path],
) -> None:
    cert, key = certificate
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(cert, key)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await _read_request(reader):
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\ntls")
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=served)
    base = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    trusting = ssl.create_default_context(cafile=str(cert))
    async with server:
        transport = UpstreamTransport(ssl_context=trusting)
        async with httpx.AsyncClient(transport=transport, base_url=base) as client:
            first, second = await client.get("/"), await client.get("/")
        # the system's CAs do not know this certificate: refused, and the error says why
        async with httpx.AsyncClient(transport=UpstreamTransport(), base_url=base) as client:
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await client.get("/")
    assert (first.status_code, first.content, second.content) == (200, b"tls", b"tls")


async def _raw_server(handler) -> tuple[asyncio.Server, str]:  # type: ignore[no-untyped-def]
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


async def _read_request(reader: asyncio.StreamReader) -> bool:
    head = await reader.readuntil(b"\r\n\r\n") if not reader.at_eof() else b""
    return bool(head)


async def test_transport_retries_once_when_a_reused_connection_was_closed() -> None:
    connections = 0
    finished: list[None] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        if await _read_request(reader):
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            await writer.drain()
        # keep-alive was implied, but the server drops the connection at the next request
        with contextlib.suppress(asyncio.IncompleteReadError):
            await reader.readuntil(b"\r\n\r\n")
        writer.close()
        await writer.wait_closed()
        finished.append(None)

    server, base = await _raw_server(handler)
    transport = UpstreamTransport()
    async with server, httpx.AsyncClient(transport=transport, base_url=base) as client:
        assert (await client.get("/")).content == b"ok"
        assert (await client.get("/")).content == b"ok"
    while len(finished) < 2:  # both server sides closed before the loop ends
        await asyncio.sleep(0.01)
    assert connections == 2
    # both answers came on a new connection: the failed reuse is not counted as kept
    assert (transport.sent_on_new, transport.sent_on_kept) == (2, 0)


async def test_transport_reports_a_body_cut_short_as_a_protocol_error() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc")
        await writer.drain()
        writer.close()

    server, base = await _raw_server(handler)
    async with server, httpx.AsyncClient(transport=UpstreamTransport(), base_url=base) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.get("/")
