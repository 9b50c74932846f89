"""The gateway in front of a real vLLM engine: cancel drain, deadlines, budget, fidelity, metrics.

Token counts come from the engine's own ``vllm:generation_tokens_total``; "extra tokens" are
those the engine generated beyond what the client had received when it went away.
"""

from __future__ import annotations

import asyncio
import json
import statistics
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest

from bot.canary.client import Outcome as CanaryOutcome
from bot.canary.runner import CanaryRun
from bot.canary.workload import CancelMode, Workload
from bot.engine.process import EngineInfo
from bot.gateway.app import Gateway
from bot.gateway.limits import Limits
from bot.gateway.server import GatewayServer, upstream_client
from bot.probes.exposition import Exposition
from bot.probes.vllm_metrics import GENERATION_TOKENS, RUNNING, WAITING, gauge

pytestmark = pytest.mark.engine

LONG = 4000  # tokens a request would generate if nobody stopped it
USAGE = {"include_usage": True, "continuous_usage_stats": True}

StartGateway = Callable[..., Awaitable[tuple[str, Gateway]]]


def body(
    engine: EngineInfo, *, max_tokens: int, seed: int = 0, stream: bool = True
) -> dict[str, Any]:
    """A deterministic completions request with an 8-token prompt."""
    return {
        "model": engine.model, "prompt": [100 + seed + i for i in range(8)],
        "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0, "stream": stream,
        "stream_options": USAGE,
    }  # fmt: skip


@pytest.fixture
async def start_gateway(engine: EngineInfo) -> AsyncIterator[StartGateway]:
    """Start gateways (real uvicorn) in front of the test engine; stop them after the test."""
    opened: list[tuple[GatewayServer, httpx.AsyncClient]] = []

    async def start(**limits: Any) -> tuple[str, Gateway]:
        client = upstream_client(engine.base_url)
        app = Gateway(client=client, limits=Limits(**limits))
        server = GatewayServer(app)
        await server.__aenter__()
        opened.append((server, client))
        return server.base_url, app

    yield start
    for server, client in reversed(opened):
        await server.__aexit__(None, None, None)
        await client.aclose()


def outcome_counts(page: Exposition, outcomes: tuple[str, ...]) -> dict[str, float | None]:
    """The gateway's requests_total for each outcome."""
    return {
        o: page.total("ruleloop_gateway_requests_total", where={"outcome": o}) for o in outcomes
    }


async def engine_page(client: httpx.AsyncClient, engine: EngineInfo) -> Exposition:
    """The engine's /metrics, parsed."""
    return Exposition.parse((await client.get(f"{engine.base_url}/metrics")).text, at=0.0)


async def settled_generated(client: httpx.AsyncClient, engine: EngineInfo) -> float:
    """generation_tokens_total once the engine is idle and the counter has stopped moving."""
    last = None
    while True:
        page = await engine_page(client, engine)
        total = gauge(page, GENERATION_TOKENS)
        idle = (gauge(page, RUNNING) or 0) + (gauge(page, WAITING) or 0) == 0
        if idle and total == last:
            assert total is not None
            return total
        last = total
        await asyncio.sleep(0.1)


async def read_then_leave(
    client: httpx.AsyncClient, url: str, request: dict[str, Any], tokens: int
) -> int:
    """Stream until ``tokens`` arrived, then close the connection; return tokens received."""
    received = 0
    async with client.stream("POST", url, json=request) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                received = json.loads(line[6:])["usage"]["completion_tokens"]
                if received >= tokens:
                    break
    return received


async def extra_after_disconnect(client: httpx.AsyncClient, engine: EngineInfo, base: str) -> float:
    """Tokens the engine generated after a client left ``base`` mid-stream."""
    before = await settled_generated(client, engine)
    received = await read_then_leave(
        client, f"{base}/v1/completions", body(engine, max_tokens=LONG), 10
    )
    return await settled_generated(client, engine) - before - received


async def test_gateway_disconnect_stops_the_engine_within_a_few_steps(
    engine, start_gateway
) -> None:
    base, app = await start_gateway()
    direct, via_gateway = [], []
    async with httpx.AsyncClient(timeout=120) as client:
        for _ in range(3):  # median of three: the box is shared, one slow step is noise
            direct.append(await extra_after_disconnect(client, engine, engine.base_url))
            via_gateway.append(await extra_after_disconnect(client, engine, base))
        page = Exposition.parse((await client.get(f"{base}/metrics")).text, at=0.0)
    print(f"\nextra tokens generated after disconnect: direct {direct}, via gateway {via_gateway}")
    assert statistics.median(via_gateway) < 64  # of the 4000 it would otherwise generate
    assert statistics.median(direct) < 64
    assert page.total("ruleloop_gateway_requests_total", where={"outcome": "client_cancel"}) == 3
    assert (page.total("ruleloop_gateway_output_tokens_total", where={"kind": "wasted"}) or 0) >= 30
    assert app.budget.in_flight_tokens == 0


async def test_gateway_deadline_drops_a_stream_with_a_final_error_event(
    engine, start_gateway
) -> None:
    base, app = await start_gateway()
    async with httpx.AsyncClient(timeout=120) as client:
        before = await settled_generated(client, engine)
        response = await client.post(
            f"{base}/v1/completions",
            json=body(engine, max_tokens=LONG),
            headers={"X-Request-Timeout": "400ms"},
        )
        generated = await settled_generated(client, engine) - before
        page = Exposition.parse((await client.get(f"{base}/metrics")).text, at=0.0)
    events = [e.removeprefix("data: ") for e in response.text.split("\n\n") if e]
    assert response.status_code == 200 and events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "deadline_exceeded"
    received = max(json.loads(e)["usage"]["completion_tokens"] for e in events[:-2])
    # vLLM notices the closed connection on its next turn of the event loop: a few steps on a
    # quiet box, up to a second or two when this shared box is overloaded; never the 4000.
    assert generated - received < 200
    assert page.total("ruleloop_gateway_requests_total", where={"outcome": "deadline"}) == 1
    assert app.budget.in_flight_tokens == 0


async def test_gateway_budget_429_and_back_to_zero_after_every_ending(
    engine, start_gateway
) -> None:
    base, app = await start_gateway(max_inflight_tokens=LONG + 100, retry_after_s=2)
    url = f"{base}/v1/completions"

    def drained() -> bool:
        return app.budget.in_flight_tokens == 0 and app.budget.in_flight_requests == 0

    async with httpx.AsyncClient(timeout=120) as client:
        ok = await client.post(url, json=body(engine, max_tokens=4))
        assert ok.status_code == 200 and drained()
        error = await client.post(
            url, json={**body(engine, max_tokens=4), "model": "no-such-model"}
        )
        assert error.status_code == 404 and drained()
        deadline = await client.post(
            url, json=body(engine, max_tokens=LONG), headers={"X-Request-Timeout": "300ms"}
        )
        assert "deadline_exceeded" in deadline.text and drained()
        async with client.stream("POST", url, json=body(engine, max_tokens=LONG)) as held:
            first = await anext(held.aiter_lines())
            assert first.startswith("data: ") and app.budget.in_flight_tokens == LONG + 8
            refused = await client.post(url, json=body(engine, max_tokens=200))
        while not drained():  # the held stream was abandoned: the gateway releases it on its own
            await asyncio.sleep(0.05)
        page = Exposition.parse((await client.get(f"{base}/metrics")).text, at=0.0)
    assert refused.status_code == 429 and refused.headers["retry-after"] == "2"
    assert set(refused.json()["error"]) == {"message", "type", "param", "code"}
    counts = outcome_counts(page, ("ok", "upstream_error", "deadline", "client_cancel", "rejected"))
    assert counts == {
        "ok": 1,
        "upstream_error": 1,
        "deadline": 1,
        "client_cancel": 1,
        "rejected": 1,
    }
    assert page.total("ruleloop_gateway_inflight_tokens") == 0


def content(text: str) -> tuple[str, str | None, int, bool]:
    """What a stream delivered: the text, the finish reason, the final token count, a [DONE].

    Event boundaries are not compared: vLLM merges tokens into one event when its consumer lags,
    so they differ between any two runs; the bytes of the content do not.
    """
    pieces, finish, tokens, done = [], None, 0, False
    for raw in text.split("\n\n"):
        payload = raw.removeprefix("data: ")
        if payload == "[DONE]":
            done = True
        elif payload:
            chunk = json.loads(payload)
            for choice in chunk["choices"]:
                pieces.append(
                    choice.get("text") or (choice.get("delta") or {}).get("content") or ""
                )
                finish = choice.get("finish_reason") or finish
            tokens = (chunk.get("usage") or {}).get("completion_tokens", tokens)
    return "".join(pieces), finish, tokens, done


@pytest.mark.parametrize("chat", [False, True])
async def test_gateway_stream_content_is_identical_to_the_engines(
    engine, start_gateway, chat: bool
) -> None:
    base, _ = await start_gateway()
    request = body(engine, max_tokens=24, seed=7)
    path = "/v1/completions"
    if chat:
        path = "/v1/chat/completions"
        request.pop("prompt")
        request["messages"] = [{"role": "user", "content": "abc def"}]
    async with httpx.AsyncClient(timeout=120) as client:
        direct = await client.post(f"{engine.base_url}{path}", json=request)
        proxied = await client.post(f"{base}{path}", json=request)
    assert proxied.headers["content-type"] == direct.headers["content-type"]
    assert content(proxied.text) == content(direct.text)
    assert content(direct.text)[1:] == ("length", 24, True)


async def test_gateway_metrics_add_up_against_the_engine(engine, start_gateway) -> None:
    base, _ = await start_gateway()
    url = f"{base}/v1/completions"
    async with httpx.AsyncClient(timeout=120) as client:
        before = await settled_generated(client, engine)
        done = await asyncio.gather(
            *(client.post(url, json=body(engine, max_tokens=6 + i, seed=i)) for i in range(3))
        )
        seen = [content(r.text)[2] for r in done]
        left = await read_then_leave(client, url, body(engine, max_tokens=LONG), 5)
        deadline = await client.post(
            url, json=body(engine, max_tokens=LONG), headers={"X-Request-Timeout": "300ms"}
        )
        generated = await settled_generated(client, engine) - before
        page = Exposition.parse((await client.get(f"{base}/metrics")).text, at=0.0)
    outcomes = outcome_counts(
        page, ("ok", "client_cancel", "deadline", "upstream_error", "rejected", "invalid")
    )
    assert outcomes == {
        "ok": 3,
        "client_cancel": 1,
        "deadline": 1,
        "upstream_error": 0,
        "rejected": 0,
        "invalid": 0,
    }
    delivered = page.total("ruleloop_gateway_output_tokens_total", where={"kind": "delivered"})
    wasted = page.total("ruleloop_gateway_output_tokens_total", where={"kind": "wasted"})
    assert delivered == sum(seen) == 6 + 7 + 8
    assert wasted is not None and wasted >= left
    assert (
        delivered + wasted <= generated
    )  # the gateway never counts a token the engine did not make
    assert page.total("ruleloop_gateway_prompt_tokens_total", where={"kind": "admitted"}) == 8 * 5
    assert page.total("ruleloop_gateway_prompt_tokens_total", where={"kind": "wasted"}) == 8 * 2
    # the 300 ms request has a TTFT only if its first token beat the deadline: then the stream
    # started (200, ended by an error event); else the gateway answered 504 (a loaded box)
    first_token = deadline.status_code == 200
    assert deadline.status_code in (200, 504)
    assert page.total("ruleloop_gateway_ttft_seconds_count") == 4 + first_token
    assert page.total("ruleloop_gateway_tpot_seconds_count") == 3


async def test_canary_header_deadlines_through_the_gateway_match_its_counts(
    engine, start_gateway
) -> None:
    base, _ = await start_gateway()
    workload = Workload(
        endpoint=f"{base}/v1/completions", concurrency=4, num_requests=8, prompt_length=16,
        output_length=64, cancel_share=0.5, cancel_after_ms=60, cancel_mode=CancelMode.HEADER,
        seed=3,
    )  # fmt: skip
    run = CanaryRun(workload, metrics_url=f"{engine.base_url}/metrics", sample_interval_s=0.5)
    await run.run()
    async with httpx.AsyncClient() as client:
        page = Exposition.parse((await client.get(f"{base}/metrics")).text, at=0.0)
    cancelled = sum(r.outcome is CanaryOutcome.CANCELLED for r in run.records)
    ok = sum(r.outcome is CanaryOutcome.OK for r in run.records)
    assert ok + cancelled == 8
    assert page.total("ruleloop_gateway_requests_total", where={"outcome": "deadline"}) == cancelled
    assert page.total("ruleloop_gateway_requests_total", where={"outcome": "ok"}) == ok
