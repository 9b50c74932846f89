"""What the canary sends a real vLLM engine, read on the wire, and how it counts what comes back.

A recording proxy sits between the canary and the engine: it keeps every request body and every
streamed byte. The canary asks for usage once, as production clients do; usage on every chunk
(vLLM's `continuous_usage_stats`) made the engine's API server build it for every token on the
cores the engine runs on, and the canary measured a heavier request than production sends
(docs/canary.md). Without it the canary counts tokens per chunk while a stream runs, and takes
the engine's exact count from the final usage chunk.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from bot.canary.client import Outcome, RequestRecord, stream_request
from bot.canary.runner import CanaryRun
from bot.canary.workload import PromptFactory, Workload
from bot.engine.process import EngineInfo

pytestmark = pytest.mark.engine

GUARD_S = 120.0  # a hang guard for a broken client, never reached by a working one


class RecordingProxy:
    """Forwards every request to the engine; keeps POST bodies and the bytes streamed back."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.bodies: list[dict[str, object]] = []
        self.streams: list[bytearray] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        if request.method == "POST":
            self.bodies.append(json.loads(raw))
        async with (
            aiohttp.ClientSession() as session,
            session.request(request.method, self.upstream + request.path_qs, data=raw,
                            headers={"Content-Type": "application/json"}) as upstream,
        ):  # fmt: skip
            response = web.StreamResponse(status=upstream.status)
            response.content_type = upstream.content_type
            await response.prepare(request)
            seen = bytearray()
            if request.method == "POST":
                self.streams.append(seen)
            async for data in upstream.content.iter_any():
                seen += data
                try:
                    await response.write(data)
                except ConnectionResetError:  # the client hung up: so does the proxy
                    break
            return response


def events(stream: bytes) -> list[dict[str, object]]:
    """The JSON chunks of one recorded SSE stream (vLLM frames events with LF)."""
    return [
        json.loads(line.removeprefix(b"data: "))
        for line in stream.split(b"\n")
        if line.startswith(b"data: {")
    ]


@pytest.fixture
async def proxy(engine: EngineInfo) -> AsyncIterator[tuple[RecordingProxy, str]]:
    """A recording proxy in front of the engine, and its base URL."""
    recorder = RecordingProxy(engine.base_url)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", recorder.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield recorder, f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_the_canary_asks_for_usage_once_and_the_engine_sends_it_once(
    proxy: tuple[RecordingProxy, str],
) -> None:
    """Fails if the body regains `continuous_usage_stats` (or any other way to get usage on
    every chunk): the engine then puts usage in every chunk, and this reads it on the wire."""
    recorder, url = proxy
    workload = Workload(endpoint=f"{url}/v1/completions", concurrency=2, num_requests=4,
                        prompt_length=32, output_length=12)  # fmt: skip
    run = CanaryRun(workload, metrics_url=None, discover_metrics=False)
    await asyncio.wait_for(run.run(), GUARD_S)
    assert len(recorder.bodies) == 4 and len(recorder.streams) == 4
    for body in recorder.bodies:
        assert body["stream_options"] == {"include_usage": True}
    for stream in recorder.streams:
        chunks = events(bytes(stream))
        with_usage = [c for c in chunks if c.get("usage")]
        assert len(with_usage) == 1 and with_usage[0] is chunks[-1]  # the final chunk only
        assert with_usage[0]["usage"]["completion_tokens"] == 12  # type: ignore[index]
    # The count of a whole answer is the engine's own, from that final chunk.
    assert [(r.outcome, r.output_tokens) for r in run.records] == [(Outcome.OK, 12)] * 4


async def test_a_cancelled_stream_counts_the_tokens_it_received_without_usage_per_chunk(
    engine: EngineInfo, proxy: tuple[RecordingProxy, str]
) -> None:
    """An impatient client hangs up after 3 tokens of 64. No chunk it read carried usage (the
    engine sends it only at the end, which a cancelled stream never reaches), so the 3 are the
    client's own per-chunk count; a patient stream of the same body counts the engine's 64."""
    recorder, url = proxy
    workload = Workload(endpoint=f"{url}/v1/completions", prompt_length=32, output_length=64)
    prompts = PromptFactory(workload, salt="cancel")
    records = []
    async with aiohttp.ClientSession() as session:
        for cancel_after in (3, None):
            record = RequestRecord(sent_at=time.perf_counter())
            await stream_request(session, workload.endpoint, prompts.body(engine.model), record,
                                 cancel_after_tokens=cancel_after, timeout_s=GUARD_S)  # fmt: skip
            records.append(record)
    cancelled, patient = records
    assert cancelled.outcome is Outcome.CANCELLED and cancelled.output_tokens == 3
    assert cancelled.first_token_at is not None and len(cancelled.itl_s) == 2
    assert patient.outcome is Outcome.OK and patient.output_tokens == 64
    first = events(bytes(recorder.streams[0]))
    # What the client read of the cancelled stream: its first 3 token chunks, none with usage.
    assert all(not c.get("usage") for c in first[:3]) and all(c["choices"] for c in first[:3])
