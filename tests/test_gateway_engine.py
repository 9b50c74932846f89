"""The gateway in front of a real vLLM engine: cancel drain, deadlines, budget, fidelity, metrics.

Token counts come from the engine's own ``vllm:generation_tokens_total``; "extra tokens" are
those the engine generated beyond what the client had received when it went away.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from bot.canary.client import Outcome as CanaryOutcome
from bot.canary.runner import CanaryRun
from bot.canary.workload import CancelMode, Workload
from bot.diagnosis.probes.exposition import Exposition
from bot.diagnosis.probes.vllm_metrics import (
    GENERATION_TOKENS,
    REQUEST_SUCCESS,
    RUNNING,
    TTFT,
    WAITING,
    gauge,
    parse_page,
)
from bot.engine.process import EngineInfo
from bot.gateway.app import Gateway
from bot.gateway.limits import Limits
from bot.gateway.server import GatewayServer, upstream_client
from bot.kernel.errors import ProbeError
from tests.conftest import EngineFactory

pytestmark = pytest.mark.engine

PROMPT = 8  # tokens in every request's prompt
CONTEXT = 131072  # tokens the module's engine takes per request
USAGE = {"include_usage": True, "continuous_usage_stats": True}
FEW_STEPS = 64  # decode steps; one token each for a single stream

StartGateway = Callable[..., Awaitable[tuple[str, Gateway]]]


def body(
    engine: EngineInfo, *, max_tokens: int, seed: int = 0, stream: bool = True
) -> dict[str, Any]:
    """A deterministic completions request with an 8-token prompt."""
    return {
        "model": engine.model, "prompt": [100 + seed + i for i in range(PROMPT)],
        "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0, "stream": stream,
        "stream_options": USAGE,
    }  # fmt: skip


@pytest.fixture(scope="module")
def long_engine(engine_factory: EngineFactory) -> EngineInfo:
    """The test engine with a 128k context instead of the model's 16k, for requests to cut.

    The tests that cut a request need it still running when its client leaves or its deadline
    passes. A 16k request lasted about 18 s on a shared 2-core box, which a stalled box has
    outwaited; a 128k one lasts minutes. (Past the model's own positions is fine for dummy
    weights; vLLM wants that said with VLLM_ALLOW_LONG_MAX_MODEL_LEN.)
    """
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
        return engine_factory(["--max-model-len", str(CONTEXT)])


@pytest.fixture
async def start_gateway() -> AsyncIterator[StartGateway]:
    """Start gateways (real uvicorn) in front of an engine; stop them after the test."""
    opened: list[tuple[GatewayServer, httpx.AsyncClient]] = []

    async def start(engine: EngineInfo, **limits: Any) -> tuple[str, Gateway]:
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


@pytest.fixture
async def longest(long_engine: EngineInfo) -> int:
    """max_tokens of the longest request the long engine takes (its context minus the prompt).

    A request this long cannot end on its own before a client that left after its first tokens,
    or a deadline early in its stream, reaches the engine.
    """
    async with httpx.AsyncClient(timeout=60) as client:
        card = (await client.get(f"{long_engine.base_url}/v1/models")).json()["data"][0]
    return int(card["max_model_len"]) - PROMPT


def outcome_counts(page: Exposition, outcomes: tuple[str, ...]) -> dict[str, float | None]:
    """The gateway's requests_total for each outcome."""
    return {
        o: page.total("ruleloop_gateway_requests_total", where={"outcome": o}) for o in outcomes
    }


# The disconnect and deadline tests scrape /metrics between streams that take seconds. A pooled
# connection idle for the engine's keep-alive timeout (uvicorn: 5 s) can be closed by the engine
# just as it is reused ("Server disconnected without sending a response", seen once in CI), so
# those clients keep no idle connections: every request opens its own.
FRESH_CONNECTIONS = httpx.Limits(max_keepalive_connections=0)


async def engine_page(client: httpx.AsyncClient, engine: EngineInfo) -> Exposition:
    """The engine's /metrics, parsed."""
    return Exposition.parse((await client.get(f"{engine.base_url}/metrics")).text, at=0.0)


@dataclass(frozen=True)
class EngineCounts:
    """The engine's own counters: tokens generated, requests that ran to their max_tokens."""

    generated: float
    ran_to_length: float

    def __sub__(self, other: EngineCounts) -> EngineCounts:
        return EngineCounts(
            self.generated - other.generated, self.ran_to_length - other.ran_to_length
        )


async def settled(client: httpx.AsyncClient, engine: EngineInfo) -> EngineCounts:
    """The engine's counters once it is idle and generation_tokens_total has stopped moving."""
    last = None
    while True:
        page = await engine_page(client, engine)
        total = gauge(page, GENERATION_TOKENS)
        idle = (gauge(page, RUNNING) or 0) + (gauge(page, WAITING) or 0) == 0
        if idle and total == last:
            assert total is not None
            length = page.total(REQUEST_SUCCESS[0], where={"finished_reason": "length"})
            return EngineCounts(generated=total, ran_to_length=length or 0.0)
        last = total
        await asyncio.sleep(0.1)


def tokens_in(event: str) -> int:
    """completion_tokens of one streamed event (continuous usage)."""
    return int(json.loads(event.removeprefix("data: "))["usage"]["completion_tokens"])


async def leave_after(
    client: httpx.AsyncClient,
    url: str,
    request: dict[str, Any],
    tokens: int,
    *,
    headers: dict[str, str] | None = None,
) -> int:
    """Stream until ``tokens`` arrived, then close the connection; return tokens received."""
    received = 0
    async with client.stream("POST", url, json=request, headers=headers) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                received = tokens_in(line)
                if received >= tokens:
                    break
    return received


@dataclass(frozen=True)
class Cut:
    """One request cut short mid-stream: tokens the client got, what the engine did for it."""

    received: int
    engine: EngineCounts

    @property
    def extra(self) -> float:
        """Tokens the engine generated that the client never got."""
        return self.engine.generated - self.received


def assert_stopped_early(cuts: list[Cut], longest: int) -> None:
    """The engine stopped each request before its end (with ignore_eos only an abort does)."""
    for cut in cuts:
        assert cut.engine.ran_to_length == 0 and cut.engine.generated < longest, cut


async def test_gateway_disconnect_makes_the_engine_abort_within_a_few_steps(
    long_engine, start_gateway, longest: int
) -> None:
    base, app = await start_gateway(long_engine)
    direct: list[Cut] = []
    via_gateway: list[Cut] = []
    async with httpx.AsyncClient(timeout=None, limits=FRESH_CONNECTIONS) as client:
        for seed in range(3):
            request = body(long_engine, max_tokens=longest, seed=seed)
            for root, cuts in ((long_engine.base_url, direct), (base, via_gateway)):
                before = await settled(client, long_engine)
                received = await leave_after(client, f"{root}/v1/completions", request, 1)
                cuts.append(Cut(received, await settled(client, long_engine) - before))
        page = Exposition.parse((await client.get(f"{base}/metrics")).text, at=0.0)
    print(f"\ntokens generated after the client left ({longest} asked, left after the first): "
          f"direct {[c.extra for c in direct]}, via gateway {[c.extra for c in via_gateway]}")  # fmt: skip
    assert_stopped_early(via_gateway, longest)
    # Leaving through the gateway costs at most a few decode steps more than leaving vLLM
    # directly. Both include vLLM's own delay in noticing (seconds at times when the CPU is
    # contended), so the best of three is compared.
    assert min(c.extra for c in via_gateway) <= min(c.extra for c in direct) + FEW_STEPS
    assert page.total("ruleloop_gateway_requests_total", where={"outcome": "client_cancel"}) == 3
    wasted = page.total("ruleloop_gateway_output_tokens_total", where={"kind": "wasted"})
    assert wasted is not None and wasted >= sum(c.received for c in via_gateway)
    assert app.budget.in_flight_tokens == 0


async def early_deadline(client: httpx.AsyncClient, engine: EngineInfo) -> float:
    """A deadline early in a long request's stream, from the engine's own clock, now.

    4x (first token + 1024 decode steps) as the engine itself timed a 1025-token request of the
    same shape (its TTFT and decode-time histograms, which a stalled client cannot inflate):
    the first token comes well before it even on a stalling box, and the end of a ``longest``
    request (128x the 1024 steps) long after it.
    """
    before = await engine_page(client, engine)
    response = await client.post(
        f"{engine.base_url}/v1/completions", json=body(engine, max_tokens=1025, seed=99)
    )
    assert response.status_code == 200
    await settled(client, engine)
    after = await engine_page(client, engine)

    def spent(name: str) -> float:
        return (after.total(name) or 0.0) - (before.total(name) or 0.0)

    return 4 * (spent(TTFT[0] + "_sum") + spent("vllm:request_decode_time_seconds_sum"))


def deadline_header(seconds: float) -> dict[str, str]:
    """X-Request-Timeout for ``seconds``, in whole milliseconds."""
    return {"X-Request-Timeout": f"{max(1, math.ceil(seconds * 1000))}ms"}


def deadline_ending(response: httpx.Response) -> int | None:
    """Tokens a deadline-ended stream delivered; None when it ended before any (a 504)."""
    if response.status_code == 504:
        assert response.json()["error"]["code"] == "deadline_exceeded"
        return None
    events = [e for e in response.text.split("\n\n") if e]
    assert response.status_code == 200 and events[-1] == "data: [DONE]"
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert error["code"] == "deadline_exceeded" and error["type"] == "timeout_error"
    return max(tokens_in(e) for e in events[:-2])


async def test_gateway_deadline_drops_a_stream_with_a_final_error_event(
    long_engine, start_gateway, longest: int
) -> None:
    base, app = await start_gateway(long_engine)
    cuts: list[Cut] = []
    mid_stream = 0
    async with httpx.AsyncClient(timeout=None, limits=FRESH_CONNECTIONS) as client:
        deadline_s = await early_deadline(client, long_engine)
        for seed in range(3):
            before = await settled(client, long_engine)
            response = await client.post(
                f"{base}/v1/completions",
                json=body(long_engine, max_tokens=longest, seed=seed),
                headers=deadline_header(deadline_s),
            )
            delivered = deadline_ending(response)
            mid_stream += delivered is not None
            cuts.append(Cut(delivered or 0, await settled(client, long_engine) - before))
        page = Exposition.parse((await client.get(f"{base}/metrics")).text, at=0.0)
    print(f"\ndeadline {deadline_s * 1000:.0f} ms, {mid_stream} of 3 passed mid-stream; tokens the "
          f"client never got ({longest} asked): {[c.extra for c in cuts]}")  # fmt: skip
    # A stall before the first token makes it a 504 instead, which is right too; the stream's
    # final error event has to have been seen.
    assert mid_stream >= 1
    # The engine stopped every request long before its end. How soon after the deadline is
    # vLLM's to say: a client closing its own connection at the same deadline, straight to vLLM,
    # left 1972-3128 tokens behind it on this shared box (docs/gateway.md).
    assert_stopped_early(cuts, longest)
    assert page.total("ruleloop_gateway_requests_total", where={"outcome": "deadline"}) == 3
    assert app.budget.in_flight_tokens == 0


async def test_gateway_budget_429_and_back_to_zero_after_every_ending(
    long_engine, start_gateway, longest: int
) -> None:
    base, app = await start_gateway(long_engine, max_inflight_tokens=longest + 100, retry_after_s=2)
    url = f"{base}/v1/completions"
    long = body(long_engine, max_tokens=longest)

    def drained() -> bool:
        return app.budget.in_flight_tokens == 0 and app.budget.in_flight_requests == 0

    async def released() -> bool:
        # the gateway releases a request's budget right after its last write, which the client
        # may see first (same event loop here): give it a few loop turns, never seconds
        for _ in range(200):
            if drained():
                return True
            await asyncio.sleep(0.005)
        return False

    async with httpx.AsyncClient(timeout=120) as client:
        deadline_s = await early_deadline(client, long_engine)
        ok = await client.post(url, json=body(long_engine, max_tokens=4))
        assert ok.status_code == 200 and await released()
        error = await client.post(
            url, json={**body(long_engine, max_tokens=4), "model": "no-such-model"}
        )
        assert error.status_code == 404 and await released()
        deadline = await client.post(url, json=long, headers=deadline_header(deadline_s))
        assert "deadline_exceeded" in deadline.text and await released()
        async with client.stream("POST", url, json=long) as held:
            first = await anext(held.aiter_lines())
            assert first.startswith("data: ") and app.budget.in_flight_tokens == longest + PROMPT
            refused = await client.post(url, json=body(long_engine, max_tokens=200))
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
    base, _ = await start_gateway(engine)
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


async def test_gateway_metrics_add_up_against_the_engine(
    long_engine, start_gateway, longest: int
) -> None:
    base, _ = await start_gateway(long_engine)
    url = f"{base}/v1/completions"
    long = body(long_engine, max_tokens=longest)
    async with httpx.AsyncClient(timeout=120) as client:
        deadline_s = await early_deadline(client, long_engine)
        before = await settled(client, long_engine)
        done = await asyncio.gather(
            *(client.post(url, json=body(long_engine, max_tokens=6 + i, seed=i)) for i in range(3))
        )
        seen = [content(r.text)[2] for r in done]
        # leaves after its first tokens of a request that cannot end before that: a client_cancel
        left = await leave_after(client, url, long, 5)
        deadline = await client.post(url, json=long, headers=deadline_header(deadline_s))
        generated = (await settled(client, long_engine) - before).generated
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
    # the gateway never counts a token the engine did not make
    assert delivered + wasted <= generated
    assert page.total("ruleloop_gateway_prompt_tokens_total", where={"kind": "admitted"}) == 8 * 5
    assert page.total("ruleloop_gateway_prompt_tokens_total", where={"kind": "wasted"}) == 8 * 2
    # the deadline request has a TTFT only if its first token beat the deadline: then the stream
    # started (200, ended by an error event); else the gateway answered 504 (a stalled box)
    first_token = deadline_ending(deadline) is not None
    assert page.total("ruleloop_gateway_ttft_seconds_count") == 4 + first_token
    assert page.total("ruleloop_gateway_tpot_seconds_count") == 3


async def test_canary_header_deadlines_through_the_gateway_match_its_counts(
    engine, start_gateway
) -> None:
    base, _ = await start_gateway(engine)
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


async def test_gateway_serves_the_engines_metrics_at_engine_metrics(engine, start_gateway) -> None:
    base, _ = await start_gateway(engine)
    async with httpx.AsyncClient(timeout=120) as client:
        direct = await client.get(f"{engine.base_url}/metrics")
        proxied = await client.get(f"{base}/engine/metrics")
        own = await client.get(f"{base}/metrics")
    assert proxied.status_code == 200
    assert proxied.headers["content-type"] == direct.headers["content-type"]
    url = f"{base}/engine/metrics"
    page = parse_page(proxied.text, url=url, at=0.0)  # refuses a page that is not vLLM's
    assert page.has("vllm:generation_tokens_total")
    assert set(page.samples) == set(parse_page(direct.text, url=url, at=0.0).samples)
    with pytest.raises(ProbeError, match="not a vLLM engine's"):  # /metrics is the gateway's
        parse_page(own.text, url=f"{base}/metrics", at=0.0)
