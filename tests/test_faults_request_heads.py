"""Request heads have a ceiling and a deadline in `ruleloop serve`, the gateway and the GPU agent
(real servers).

All run uvicorn with bot/kernel/runtime/heads.py's protocol: ``serve`` as ``bot/app/cli/serve.py`` builds
it (its protocol class, a small app), the gateway as ``GatewayServer`` (scripted engine), the
agent through its own ``serve`` (its app over a fake NVML).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest
import uvicorn

from bot.agent.app import create_app
from bot.agent.server import serve as agent_serve
from bot.agent.session import NvmlSession
from bot.gateway.app import Gateway
from bot.gateway.limits import Limits
from bot.gateway.server import GatewayServer
from bot.kernel.listening import QuietServer, bind
from bot.kernel.runtime.heads import GuardedHttpToolsProtocol, HeadLimits
from tests.fakes.nvml import FakeNvml
from tests.gateway_scripted import STREAM, ScriptedEngine

pytestmark = pytest.mark.faults

LIMITS = HeadLimits(max_bytes=64 * 1024, max_headers=100, timeout_s=2.0)
Scope = dict[str, object]


async def hello(scope: Scope, receive: Callable[[], Awaitable[dict]], send: Callable) -> None:
    """The smallest app: 200 and a body, as the bot's routes answer."""
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


@contextlib.asynccontextmanager
async def serve_server() -> AsyncIterator[str]:
    """A uvicorn server as `ruleloop serve` builds it, with a short head timeout."""
    sock = bind("127.0.0.1", 0)
    protocol = GuardedHttpToolsProtocol.with_limits(LIMITS)
    server = QuietServer(uvicorn.Config(hello, log_level="warning", lifespan="off", http=protocol))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        sock.close()


@contextlib.asynccontextmanager
async def gateway_server() -> AsyncIterator[str]:
    """The gateway on uvicorn in front of a scripted engine, with a short head timeout."""
    upstream = httpx.AsyncClient(
        transport=httpx.MockTransport(ScriptedEngine()), base_url="http://engine"
    )
    app = Gateway(client=upstream, limits=Limits(max_inflight_tokens=0))
    async with GatewayServer(app, head_limits=LIMITS) as server:
        yield server.base_url
    await upstream.aclose()


@contextlib.asynccontextmanager
async def agent_server() -> AsyncIterator[str]:
    """`ruleloop agent` as bot/app/cli/agent.py runs it, over a fake NVML, with a short timeout."""
    sock = bind("127.0.0.1", 0)
    app = create_app(NvmlSession(FakeNvml.no_driver(), watch_xid=False), token="t" * 32)
    started: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        agent_serve(app, sock, on_started=started.set_result, head_limits=LIMITS)
    )
    try:
        yield await started
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        sock.close()


SERVERS = {"serve": serve_server, "gateway": gateway_server, "agent": agent_server}


def rss_mb() -> float:
    """This process's resident memory (the servers run in it)."""
    with open(f"/proc/{os.getpid()}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


async def flood(base: str, head: bytes, line: bytes, total: int) -> tuple[int, bytes]:
    """Send ``head`` then ``line`` until ``total`` bytes or the server stops reading."""
    port = int(base.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    sent = 0
    try:
        writer.write(head)
        chunk = line * (64 * 1024 // len(line))
        while sent < total and not reader.at_eof():
            writer.write(chunk)
            await asyncio.wait_for(writer.drain(), 5)
            sent += len(chunk)
    except (OSError, TimeoutError):  # the server closed: refused
        pass
    try:
        answer = await asyncio.wait_for(reader.read(4096), 5)
    except OSError:  # reset: the refusal was lost with the unread flood
        answer = b""
    writer.close()
    return sent, answer


@pytest.mark.parametrize("kind", SERVERS)
async def test_a_flood_of_header_lines_is_refused_and_memory_stays_flat(kind: str) -> None:
    async with SERVERS[kind]() as base:
        before = rss_mb()
        sent, answer = await flood(
            base, b"GET / HTTP/1.1\r\nHost: x\r\n", b"X-Pad: " + b"a" * 120 + b"\r\n", 50 * 2**20
        )
        after = rss_mb()
    print(f"{kind}: RSS {before:.1f} -> {after:.1f} MB, {sent / 2**20:.1f} MB sent")
    assert answer.startswith(b"HTTP/1.1 431") or answer == b""
    assert sent < 50 * 2**20  # the server closed long before the flood ended
    assert after - before < 16, (before, after)


@pytest.mark.parametrize("kind", SERVERS)
async def test_one_huge_header_value_is_refused(kind: str) -> None:
    async with SERVERS[kind]() as base:
        before = rss_mb()
        sent, answer = await flood(base, b"GET / HTTP/1.1\r\nX-Big: ", b"b" * 1024, 50 * 2**20)
        after = rss_mb()
    print(f"{kind}: one value, RSS {before:.1f} -> {after:.1f} MB, {sent / 2**20:.1f} MB sent")
    assert answer.startswith(b"HTTP/1.1 431") or answer == b""
    assert after - before < 16, (before, after)


@pytest.mark.parametrize("kind", SERVERS)
async def test_too_many_header_lines_in_one_small_head_is_a_431(kind: str) -> None:
    head = b"GET / HTTP/1.1\r\nHost: x\r\n" + b"a: b\r\n" * 500 + b"\r\n"
    async with SERVERS[kind]() as base:
        port = int(base.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head)
        answer = await asyncio.wait_for(reader.read(4096), 5)
        writer.close()
    assert answer.startswith(b"HTTP/1.1 431"), answer


@pytest.mark.parametrize("kind", SERVERS)
async def test_a_slowloris_head_is_closed_at_the_head_timeout(kind: str) -> None:
    async with SERVERS[kind]() as base:
        port = int(base.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n")
        loop = asyncio.get_running_loop()
        started = loop.time()
        with contextlib.suppress(ConnectionError):
            for i in range(10):  # one header line a second, never the end of the head
                if reader.at_eof():
                    break
                writer.write(b"X-Line-%d: a\r\n" % i)
                await writer.drain()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(reader.read(4096), 1)
        closed_after = loop.time() - started
        writer.close()
    assert reader.at_eof() and closed_after < LIMITS.timeout_s + 1.5, closed_after


@pytest.mark.parametrize("kind", SERVERS)
async def test_ordinary_requests_with_a_few_kilobytes_of_headers_are_served(kind: str) -> None:
    headers = {f"x-h{i}": "v" * 200 for i in range(50)}  # 50 lines, about 10 KB
    async with SERVERS[kind]() as base, httpx.AsyncClient() as client:
        path = {"serve": "/", "gateway": "/v1/models", "agent": "/healthz"}[kind]
        answers = [await client.get(f"{base}{path}", headers=headers) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 200]


async def test_the_gateway_still_streams_behind_the_head_limits() -> None:
    async with (
        gateway_server() as base,
        httpx.AsyncClient() as client,
        client.stream("POST", f"{base}/v1/completions", json=STREAM) as response,
    ):
        text = "".join([chunk async for chunk in response.aiter_text()])
    assert response.status_code == 200
    assert text.count("data: ") >= 2 and text.rstrip().endswith("data: [DONE]"), text


def test_head_limits_refuse_unusable_values() -> None:
    with pytest.raises(ValueError, match="unusable head limits"):
        HeadLimits(max_bytes=10)
