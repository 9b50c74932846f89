"""A scripted stand-in for vLLM behind httpx.MockTransport, and a gateway fixture in front of it.

The scripted engine streams SSE events when told to and records every request it got and every
stream the gateway closed, so each test can check what reached the engine and what was dropped.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx

from bot.diagnosis.probes.exposition import Exposition
from bot.gateway.app import Gateway
from bot.gateway.limits import Limits
from bot.gateway.server import GatewayServer

ADMIN_TOKEN = "s3cret"
ENGINE_METRICS = (
    b"# HELP vllm:generation_tokens_total Number of generation tokens processed.\n"
    b"# TYPE vllm:generation_tokens_total counter\n"
    b'vllm:generation_tokens_total{engine="0",model_name="m"} 42.0\n'
    b"# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
    b"# TYPE vllm:num_requests_running gauge\n"
    b'vllm:num_requests_running{engine="0",model_name="m"} 1.0\n'
)
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def event(i: int) -> bytes:
    """One completions chunk as vLLM streams it (with continuous usage)."""
    chunk = {
        "id": "cmpl-1", "object": "text_completion", "model": "m",
        "choices": [{"index": 0, "text": f"t{i}", "finish_reason": None}],
        "usage": {"prompt_tokens": 3, "completion_tokens": i + 1, "total_tokens": i + 4},
    }  # fmt: skip
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


class Script(httpx.AsyncByteStream):
    """A streamed body: ``tokens`` events, each released by the engine's ``step`` event."""

    def __init__(self, engine: ScriptedEngine, tokens: int) -> None:
        self.engine, self.tokens = engine, tokens

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for i in range(self.tokens):
            if self.engine.gated:
                await self.engine.step.get()
            if self.engine.split:  # each event in two reads, the second released by a step too
                half = len(event(i)) // 2
                yield event(i)[:half]
                await self.engine.step.get()
                yield event(i)[half:]
                continue
            yield event(i)
        if self.engine.linger:
            # the end marker in two pieces, and the HTTP body ends only when the test says so
            yield b"data: [DO"
            yield b"NE]\n\n"
            await self.engine.body_end.wait()
        else:
            yield b"data: [DONE]\n\n"

    async def aclose(self) -> None:
        self.engine.closed += 1


class Body(httpx.AsyncByteStream):
    """A whole body, streamed the way a real transport hands it over (not preloaded)."""

    def __init__(self, data: object) -> None:
        self.data = json.dumps(data).encode()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.data


class Chunks(httpx.AsyncByteStream):
    """A body streamed in the given pieces."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self.pieces:
            yield piece


def json_response(status: int, data: object) -> httpx.Response:
    """A JSON response as a real transport would produce it."""
    return httpx.Response(status, headers={"content-type": "application/json"}, stream=Body(data))


class ScriptedEngine:
    """Stand-in for vLLM behind httpx.MockTransport."""

    def __init__(
        self, *, gated: bool = False, stall: bool = False, linger: bool = False, split: bool = False
    ) -> None:
        self.requests: list[httpx.Request] = []
        self.closed = 0
        self.gated = gated
        self.stall = stall
        self.linger = linger
        self.split = split  # gated events arrive in two reads each
        self.body_end = asyncio.Event()
        self.step: asyncio.Queue[None] = asyncio.Queue()
        self.metrics_status = 200

    def metrics(self) -> httpx.Response:
        """The engine's /metrics page, in two chunks as a real server may send it."""
        half = len(ENGINE_METRICS) // 2
        return httpx.Response(
            self.metrics_status,
            headers={"content-type": METRICS_TYPE},
            stream=Chunks([ENGINE_METRICS[:half], ENGINE_METRICS[half:]]),
        )

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.url.path == "/metrics":
            return self.metrics()
        if request.url.path == "/v1/models":
            return json_response(200, {"object": "list", "data": [{"id": "m"}]})
        if self.stall:
            await asyncio.Event().wait()  # never answers: only a deadline or a cancel ends this
        body = json.loads(request.content)
        if body.get("model") != "m":
            return json_response(404, {"error": {"message": "no such model", "code": 404}})
        tokens = body.get("max_tokens", 4)
        if body.get("stream"):
            return httpx.Response(
                200, headers={"content-type": "text/event-stream"}, stream=Script(self, tokens)
            )
        return json_response(200, {"choices": [{"index": 0, "text": "x" * tokens}],
                                   "usage": {"completion_tokens": tokens}})  # fmt: skip


class Gateways:
    """Starts gateways (real uvicorn) in front of scripted engines; stops them all on exit."""

    def __init__(self) -> None:
        self._open: list[tuple[GatewayServer, httpx.AsyncClient]] = []

    async def start(self, engine: ScriptedEngine, **limits: object) -> tuple[str, Gateway]:
        """A gateway with these limits in front of ``engine``: its URL and the app."""
        upstream = httpx.AsyncClient(
            transport=httpx.MockTransport(engine), base_url="http://engine"
        )
        app = Gateway(client=upstream, limits=Limits(**limits), admin_token=ADMIN_TOKEN)  # type: ignore[arg-type]
        server = GatewayServer(app)
        await server.__aenter__()
        self._open.append((server, upstream))
        return server.base_url, app

    async def __aenter__(self) -> Gateways:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for server, upstream in reversed(self._open):
            await server.__aexit__(None, None, None)
            await upstream.aclose()


async def scrape(client: httpx.AsyncClient, base: str) -> Exposition:
    """The gateway's own /metrics, parsed."""
    return Exposition.parse((await client.get(f"{base}/metrics")).text, at=0.0)


def outcome(page: Exposition, name: str) -> float:
    """requests_total for one outcome."""
    return page.total("ruleloop_gateway_requests_total", where={"outcome": name}) or 0.0


STREAM = {"model": "m", "prompt": [1, 2, 3], "max_tokens": 4, "stream": True}
