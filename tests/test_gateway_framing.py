"""The gateway relays SSE framed with CRLF or CR as it relays LF: whole events, byte for byte.

The engine here streams given reads (behind httpx.MockTransport, as tests/gateway_scripted.py);
the gateway runs on real uvicorn. Where events end comes from bot.kernel.runtime.sse, the parser the
canary reads with, so the end marker and event boundaries are found in every framing.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest

from bot.kernel.runtime.sse import SSEParser
from tests.gateway_scripted import STREAM, Gateways, event, outcome, scrape

GUARD_S = 10.0  # a hang guard: the old relay waited here for a body end that never came
ENDS = pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])


class Reads:
    """A stand-in engine that answers every stream with these reads, then maybe waits."""

    def __init__(self, reads: list[bytes], *, then: asyncio.Event | None = None) -> None:
        self.reads, self.then, self.closed = reads, then, 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Body(self))


class Body(httpx.AsyncByteStream):
    def __init__(self, engine: Reads) -> None:
        self.engine = engine

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for read in self.engine.reads:
            yield read
        if self.engine.then is not None:
            await self.engine.then.wait()

    async def aclose(self) -> None:
        self.engine.closed += 1


def framed(data: bytes, end: bytes) -> bytes:
    return data.replace(b"\n", end)


def stream(end: bytes) -> bytes:
    return framed(b"".join(event(i) for i in range(4)) + b"data: [DONE]\n\n", end)


@pytest.fixture
async def gateways() -> AsyncIterator[Gateways]:
    async with Gateways() as running:
        yield running


@ENDS
@pytest.mark.parametrize("split", [False, True], ids=["one read", "a read per line end byte"])
async def test_any_framing_is_relayed_unchanged_and_its_tokens_counted(
    gateways: Gateways, end: bytes, split: bool
) -> None:
    raw = stream(end)
    # split: a new read starts at every CR and LF, so each CRLF is cut between two reads
    cuts = [i for i in range(1, len(raw)) if raw[i] in b"\r\n"]
    reads = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    base, _ = await gateways.start(Reads(reads if split else [raw]))  # type: ignore[arg-type]
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{base}/v1/completions", json=STREAM)
        page = await scrape(client, base)
    # The marker's blank line ends at its CR: the response ends there, and the LF of that CRLF,
    # in a read of its own, comes after the end (read, not relayed; no event can change).
    relayed = raw.removesuffix(b"\n") if split and end == b"\r\n" else raw
    assert response.status_code == 200 and response.content == relayed
    assert outcome(page, "ok") == 1
    assert page.total("ruleloop_gateway_output_tokens_total", where={"kind": "delivered"}) == 4


@ENDS
async def test_the_end_marker_ends_the_clients_response_in_any_framing(
    gateways: Gateways, end: bytes
) -> None:
    # The engine's body goes on after [DONE]: the client's response must end at the marker.
    lingering = asyncio.Event()
    engine = Reads([stream(end)], then=lingering)
    base, _ = await gateways.start(engine)  # type: ignore[arg-type]
    async with httpx.AsyncClient() as client:
        response = await asyncio.wait_for(
            client.post(f"{base}/v1/completions", json=STREAM), GUARD_S
        )
        lingering.set()
        page = await scrape(client, base)
        while outcome(page, "ok") == 0:
            await asyncio.sleep(0.01)
            page = await scrape(client, base)
    assert response.content == stream(end)
    assert outcome(page, "client_cancel") == 0


@pytest.mark.parametrize("end", [b"\r\n", b"\r"], ids=["CRLF", "CR"])
async def test_a_deadline_mid_event_relays_whole_events_then_the_error_event(
    gateways: Gateways, end: bytes
) -> None:
    # Event 0 whole, then half of event 1 and nothing more: the deadline fires mid-event.
    half = framed(event(1), end)[:40]
    engine = Reads([framed(event(0), end), half], then=asyncio.Event())
    base, _ = await gateways.start(engine)  # type: ignore[arg-type]
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{base}/v1/completions", json=STREAM, headers={"X-Request-Timeout": "0.3s"}
        )
    assert response.status_code == 200  # event 0 went out before the deadline, not a 504
    rest = response.content.removeprefix(framed(event(0), end))
    assert rest.startswith(b'data: {"error": ')  # not half of event 1 glued before it
    parser = SSEParser()
    events = [e.data for e in parser.feed(response.content) + parser.end()]
    assert len(events) == 3 and events[-1] == "[DONE]", events
    assert json.loads(events[0])["usage"]["completion_tokens"] == 1
    assert json.loads(events[1])["error"]["code"] == "deadline_exceeded"
    assert engine.closed == 1
