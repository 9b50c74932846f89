"""What a lone stream pays for the gateway: the behaviour that once cost it every request.

Traced hop by hop (bench/gateway_trace.py, docs/gateway.md "Latency"): the response head left
in its own write before the first event (the client woke for the head, and the first event
waited on it), and the body's end left in its own write after `[DONE]` (a client that stops
reading at `[DONE]`, as the canary and OpenAI's SDKs do, saw its response unfinished, dropped
the connection and paid a new one on its next request). Checked here on the wire, with a real
HTTP engine (tests/fakes/sse_engine.py), the real gateway on uvicorn and a raw socket client.
No timing is asserted: segments and connections are counted.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
import sys
from collections.abc import AsyncIterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bot.gateway.app import Gateway
from bot.gateway.server import GatewayServer, upstream_client
from tests.fakes.sse_engine import MODEL, SseEngine

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads Linux's TCP_INFO")

TCPI_DATA_SEGS_IN = 152  # offset of tcpi_data_segs_in in struct tcp_info (Linux >= 4.6)
BODY = json.dumps(
    {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 3, "stream": True,
     "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
).encode()  # fmt: skip
HANG_GUARD_S = 30  # a broken gateway fails the test instead of hanging it


def request(host: str) -> bytes:
    """A streaming completions request, as raw HTTP/1.1."""
    return (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(BODY)}\r\n\r\n"
    ).encode() + BODY


def data_segments_in(sock: socket.socket) -> int:
    """TCP segments with data this socket has received (the kernel's count)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return int(struct.unpack_from("I", info, TCPI_DATA_SEGS_IN)[0])


async def read_until(reader: asyncio.StreamReader, seen: bytearray, marker: bytes) -> None:
    """Read into ``seen`` until it holds ``marker``."""
    async with asyncio.timeout(HANG_GUARD_S):
        while marker not in seen:
            data = await reader.read(65536)
            assert data, f"the gateway closed the connection before {marker!r}: {bytes(seen)!r}"
            seen += data


@pytest.fixture
async def gateway_for() -> AsyncIterator[object]:
    """Start the real gateway (uvicorn, the lean upstream client) in front of an engine.

    Gives the gateway's host:port and its app.
    """
    opened: list[tuple[GatewayServer, object]] = []

    async def start(engine: SseEngine) -> tuple[str, Gateway]:
        client = upstream_client(engine.base_url)
        app = Gateway(client=client)
        server = GatewayServer(app)
        await server.__aenter__()
        opened.append((server, client))
        return server.base_url.removeprefix("http://"), app

    yield start
    for server, client in reversed(opened):
        await server.__aexit__(None, None, None)
        await client.aclose()  # type: ignore[attr-defined]


async def test_the_first_event_leaves_with_the_response_head_in_one_segment(gateway_for) -> None:
    # The engine sends its first token and then holds the stream: the client gets that token
    # while the next does not exist yet, and in the same segment as the response head.
    async with SseEngine(hold_after=1) as engine:
        host, app = await gateway_for(engine)
        reader, writer = await asyncio.open_connection(*host.split(":"))
        writer.write(request(host))
        seen = bytearray()
        await read_until(reader, seen, b'"completion_tokens": 1')
        segments = data_segments_in(writer.get_extra_info("socket"))
        writer.close()
        await writer.wait_closed()
        async with asyncio.timeout(HANG_GUARD_S):
            await engine.disconnected.wait()
    assert seen.startswith(b"HTTP/1.1 200 ")
    assert engine.disconnects == [1]  # the engine never sent a second token
    assert segments == 1, f"head and first event came in {segments} segments: {bytes(seen)!r}"


async def test_the_response_ends_with_done_while_the_engines_body_goes_on(gateway_for) -> None:
    # The engine sends [DONE] and holds its HTTP body open: the client's response must be
    # complete anyway (its last chunk with [DONE]), so the client can send its next request on
    # the same connection; the gateway reads the engine's body to its end and reuses that
    # connection too.
    async with SseEngine(hold_body_end=True) as engine:
        host, app = await gateway_for(engine)
        reader, writer = await asyncio.open_connection(*host.split(":"))
        writer.write(request(host))
        first = bytearray()
        await read_until(reader, first, b"data: [DONE]\n\n")
        await read_until(reader, first, b"\r\n0\r\n\r\n")
        finished_before_engine = not engine.body_end.is_set()
        engine.body_end.set()
        async with asyncio.timeout(HANG_GUARD_S):
            while app.budget.in_flight_requests:  # the gateway read the engine's body to its end
                await asyncio.sleep(0.01)
        writer.write(request(host))
        second = bytearray()
        await read_until(reader, second, b"\r\n0\r\n\r\n")
        writer.close()
        await writer.wait_closed()
    assert finished_before_engine
    assert first.startswith(b"HTTP/1.1 200 ") and second.startswith(b"HTTP/1.1 200 ")
    assert first.count(b"data: [DONE]") == 1 and first.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
    assert engine.completed == 2 and engine.connections == 1


def tcp_sockets_of_this_process() -> list[socket.socket]:
    """Every TCP socket this process holds, as duplicated fds (the caller closes them)."""
    found = []
    for fd in map(int, os.listdir("/proc/self/fd")):
        try:
            dup = os.dup(fd)
        except OSError:
            continue  # the directory's own fd, gone by now
        try:
            sock = socket.socket(fileno=dup)
        except OSError:
            os.close(dup)  # not a socket
            continue
        if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM:
            found.append(sock)
        else:
            sock.close()
    return found


async def test_both_gateway_sockets_have_nagle_off(gateway_for) -> None:
    # TCP_NODELAY on the client's socket and the engine's: a small event never waits for the
    # ACK of the one before it (the kernel's default, Nagle, would hold it up to 40 ms).
    async with SseEngine(hold_after=1) as engine:
        host, app = await gateway_for(engine)
        gw_port = int(host.split(":")[1])
        engine_port = int(engine.base_url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection(*host.split(":"))
        writer.write(request(host))
        await read_until(reader, bytearray(), b'"completion_tokens": 1')
        client_port = writer.get_extra_info("sockname")[1]
        nodelay = {}
        for sock in tcp_sockets_of_this_process():
            with sock:
                try:
                    local, peer = sock.getsockname()[1], sock.getpeername()[1]
                except OSError:
                    continue  # a listening socket
                if local == gw_port and peer == client_port:
                    nodelay["accepted from the client"] = sock.getsockopt(
                        socket.IPPROTO_TCP, socket.TCP_NODELAY
                    )
                elif peer == engine_port:
                    nodelay["to the engine"] = sock.getsockopt(
                        socket.IPPROTO_TCP, socket.TCP_NODELAY
                    )
        writer.close()
        await writer.wait_closed()
    assert nodelay == {"accepted from the client": 1, "to the engine": 1}


async def test_upstream_requests_are_counted_by_connection_new_or_kept(gateway_for) -> None:
    # An engine that closes idle connections (vLLM: after 5 s) makes the next request pay a
    # new one; /metrics says how often, so an operator can see an engine keep-alive too short.
    async with SseEngine(idle_timeout_s=0.5) as engine:
        host, _ = await gateway_for(engine)
        async with httpx.AsyncClient(base_url=f"http://{host}", timeout=HANG_GUARD_S) as client:

            async def complete() -> None:
                answer = await client.post(
                    "/v1/completions", content=BODY, headers={"content-type": "application/json"}
                )
                assert answer.status_code == 200 and answer.text.rstrip().endswith("[DONE]")

            async def counts() -> dict[str, float]:
                page = (await client.get("/metrics")).text
                return {
                    sample.labels["connection"]: sample.value
                    for family in text_string_to_metric_families(page)
                    if family.name == "ruleloop_gateway_upstream_requests"
                    for sample in family.samples
                    if sample.name.endswith("_total")
                }

            for _ in range(3):
                await complete()
            assert await counts() == {"new": 1.0, "kept": 2.0}
            async with asyncio.timeout(HANG_GUARD_S):
                while not engine.idle_closed:  # the engine closed the kept connection
                    await asyncio.sleep(0.05)
            await complete()
            assert await counts() == {"new": 2.0, "kept": 2.0}
            assert engine.connections == 2
