"""The gateway app on a real uvicorn server, in front of a scripted engine (tests/gateway_scripted.py)."""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest
import uvicorn

from bot.engine.process import free_port
from bot.gateway.app import Gateway
from bot.gateway.server import GatewayServer, upstream_client
from tests.gateway_scripted import (
    ENGINE_METRICS,
    METRICS_TYPE,
    STREAM,
    Gateways,
    ScriptedEngine,
    event,
    outcome,
    scrape,
)


@pytest.fixture
async def make_gateway() -> AsyncIterator[Callable[..., Awaitable[tuple[str, Gateway]]]]:
    """Start gateways in front of scripted engines; stop them after the test."""
    async with Gateways() as gateways:
        yield gateways.start


async def test_gateway_streams_the_engines_bytes_unchanged(make_gateway) -> None:
    base, _ = await make_gateway(ScriptedEngine())
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{base}/v1/completions", json=STREAM)
        page = await scrape(client, base)
    assert response.status_code == 200
    assert response.content == b"".join(event(i) for i in range(4)) + b"data: [DONE]\n\n"
    assert outcome(page, "ok") == 1
    assert page.total("ruleloop_gateway_output_tokens_total", where={"kind": "delivered"}) == 4
    assert page.total("ruleloop_gateway_prompt_tokens_total", where={"kind": "admitted"}) == 3
    assert page.total("ruleloop_gateway_ttft_seconds_count") == 1
    assert page.total("ruleloop_gateway_tpot_seconds_count") == 1


async def test_gateway_passes_other_paths_through(make_gateway) -> None:
    engine = ScriptedEngine()
    base, _ = await make_gateway(engine)
    async with httpx.AsyncClient() as client:
        response = await client.get(f"{base}/v1/models?x=1")
        page = await scrape(client, base)
    assert response.json()["data"][0]["id"] == "m"
    assert str(engine.requests[0].url) == "http://engine/v1/models?x=1"
    assert sum(outcome(page, o) for o in ("ok", "invalid", "rejected")) == 0


@pytest.mark.parametrize(
    ("content", "headers", "param"),
    [
        (b"{not json", {}, None),
        (b"[1, 2]", {}, None),
        (json.dumps({"prompt": [1], "max_tokens": 2}).encode(), {}, "model"),
        (json.dumps({"model": "m", "max_tokens": 2}).encode(), {}, "prompt"),
        (json.dumps(STREAM).encode(), {"X-Request-Timeout": "soon"}, "X-Request-Timeout"),
        (json.dumps(STREAM).encode(), {"X-Request-Timeout": "-5"}, "X-Request-Timeout"),
    ],
)
async def test_gateway_refuses_bad_input_with_400_and_admits_nothing(
    make_gateway, content: bytes, headers: dict[str, str], param: str | None
) -> None:
    engine = ScriptedEngine()
    base, app = await make_gateway(engine)
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{base}/v1/completions",
            content=content,
            headers={"content-type": "application/json", **headers},
        )
        page = await scrape(client, base)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]
    assert engine.requests == [] and app.budget.in_flight_tokens == 0
    assert outcome(page, "invalid") == 1
    assert page.total("ruleloop_gateway_prompt_tokens_total", where={"kind": "admitted"}) == 0


async def test_gateway_can_require_the_timeout_header(make_gateway) -> None:
    engine = ScriptedEngine()
    base, _ = await make_gateway(engine, require_timeout_header=True)
    async with httpx.AsyncClient() as client:
        without = await client.post(f"{base}/v1/completions", json=STREAM)
        with_it = await client.post(
            f"{base}/v1/completions", json=STREAM, headers={"X-Request-Timeout": "30s"}
        )
    assert without.status_code == 400 and without.json()["error"]["param"] == "X-Request-Timeout"
    assert with_it.status_code == 200 and len(engine.requests) == 1


@pytest.mark.parametrize("declared", [True, False])
async def test_gateway_refuses_huge_bodies_with_413(make_gateway, declared: bool) -> None:
    engine = ScriptedEngine()
    base, _ = await make_gateway(engine, max_body_bytes=4096)
    huge = json.dumps({"model": "m", "prompt": "x" * 10_000}).encode()

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(huge), 1000):
            yield huge[i : i + 1000]

    async with httpx.AsyncClient() as client:
        content = huge if declared else chunks()
        response = await client.post(f"{base}/v1/completions", content=content)
        page = await scrape(client, base)
    assert response.status_code == 413
    assert "4096 bytes" in response.json()["error"]["message"]
    assert engine.requests == [] and outcome(page, "invalid") == 1


async def test_gateway_answers_429_with_retry_after_when_the_budget_is_spent(make_gateway) -> None:
    engine = ScriptedEngine(gated=True)
    base, app = await make_gateway(engine, max_inflight_tokens=10, retry_after_s=3)
    body = {"model": "m", "prompt": [1, 2], "max_tokens": 5, "stream": True}  # costs 7
    async with httpx.AsyncClient() as client:
        engine.step.put_nowait(None)  # headers go out with the first event
        async with client.stream("POST", f"{base}/v1/completions", json=body) as first:
            lines = first.aiter_lines()
            assert (await anext(lines)).startswith("data: ")
            assert app.budget.in_flight_tokens == 7
            refused = await client.post(f"{base}/v1/completions", json=body)
            for _ in range(4):
                engine.step.put_nowait(None)
            rest = [line async for line in lines if line]
        page = await scrape(client, base)
    assert rest[-1] == "data: [DONE]"
    assert refused.status_code == 429 and refused.headers["retry-after"] == "3"
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert len(engine.requests) == 1
    assert outcome(page, "rejected") == 1 and outcome(page, "ok") == 1
    assert page.total("ruleloop_gateway_inflight_tokens") == 0


async def test_gateway_refuses_a_request_larger_than_the_whole_budget_with_413(
    make_gateway,
) -> None:
    engine = ScriptedEngine()
    base, _ = await make_gateway(engine, max_inflight_tokens=10)
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{base}/v1/completions", json={"model": "m", "prompt": [1], "max_tokens": 50}
        )
    assert response.status_code == 413 and response.json()["error"]["param"] == "max_tokens"
    assert engine.requests == []


@pytest.mark.parametrize(
    "extra",
    [
        {"max_tokens": 1, "max_completion_tokens": 100_000},
        {
            "max_tokens": 1,
            "tools": [{"type": "function", "function": {"name": "f", "description": "x" * 54_000}}],
        },
    ],
    ids=["max_completion_tokens", "tools"],
)
async def test_gateway_budget_counts_what_the_engine_renders_and_generates(
    make_gateway, extra: dict[str, object]
) -> None:
    engine = ScriptedEngine()
    base, _ = await make_gateway(engine, max_inflight_tokens=4_096)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{base}/v1/chat/completions", json=body)
    assert response.status_code == 413
    assert engine.requests == []


async def test_gateway_deadline_before_output_is_a_504_and_closes_upstream(make_gateway) -> None:
    engine = ScriptedEngine(stall=True)
    base, app = await make_gateway(engine)
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{base}/v1/completions", json=STREAM, headers={"X-Request-Timeout": "50ms"}
        )
        page = await scrape(client, base)
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "deadline_exceeded"
    assert "x-request-timeout" not in engine.requests[0].headers
    assert outcome(page, "deadline") == 1 and app.budget.in_flight_tokens == 0
    assert page.total("ruleloop_gateway_prompt_tokens_total", where={"kind": "wasted"}) == 3


async def test_gateway_deadline_mid_stream_ends_with_an_sse_error_event(make_gateway) -> None:
    engine = ScriptedEngine(gated=True)
    base, app = await make_gateway(engine)
    body = {**STREAM, "max_tokens": 100}
    async with httpx.AsyncClient() as client:
        engine.step.put_nowait(None)
        engine.step.put_nowait(None)
        response = await client.post(
            f"{base}/v1/completions", json=body, headers={"X-Request-Timeout": "0.2s"}
        )
        page = await scrape(client, base)
    events = [e for e in response.text.split("\n\n") if e]
    assert events[:2] == [event(0).decode().strip(), event(1).decode().strip()]
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert error["code"] == "deadline_exceeded" and events[-1] == "data: [DONE]"
    assert engine.closed == 1 and app.budget.in_flight_tokens == 0
    assert outcome(page, "deadline") == 1
    assert page.total("ruleloop_gateway_output_tokens_total", where={"kind": "wasted"}) == 2


async def test_gateway_deadline_between_two_halves_of_an_event_relays_whole_events_only(
    make_gateway,
) -> None:
    # The engine's event 1 arrives in two reads and the deadline fires between them: the client
    # must get event 0, then the gateway's error event, never half of event 1 glued to it.
    engine = ScriptedEngine(gated=True, split=True)
    base, _ = await make_gateway(engine)
    async with httpx.AsyncClient() as client:
        for _ in range(3):  # event 0: its gate and second half; event 1: its gate (first half)
            engine.step.put_nowait(None)
        response = await client.post(
            f"{base}/v1/completions", json={**STREAM, "max_tokens": 100},
            headers={"X-Request-Timeout": "0.2s"},
        )  # fmt: skip
    events = [e for e in response.text.split("\n\n") if e]
    assert events[0] == event(0).decode().strip() and events[-1] == "data: [DONE]"
    assert len(events) == 3, events
    error = json.loads(events[1].removeprefix("data: "))["error"]  # parses: nothing glued to it
    assert error["code"] == "deadline_exceeded"
    assert engine.closed == 1


async def test_gateway_client_disconnect_closes_the_upstream_stream(make_gateway) -> None:
    engine = ScriptedEngine(gated=True)
    base, app = await make_gateway(engine)
    async with httpx.AsyncClient() as client:
        engine.step.put_nowait(None)
        async with client.stream(
            "POST", f"{base}/v1/completions", json={**STREAM, "max_tokens": 100}
        ) as r:
            assert (await anext(r.aiter_lines())).startswith("data: ")
        # the client is gone; the gateway must notice without the engine sending anything more
        while engine.closed == 0:
            await asyncio.sleep(0.01)
        page = await scrape(client, base)
    assert outcome(page, "client_cancel") == 1 and app.budget.in_flight_tokens == 0
    assert page.total("ruleloop_gateway_output_tokens_total", where={"kind": "wasted"}) == 1


async def test_gateway_client_that_leaves_after_the_end_marker_was_served_in_full(
    make_gateway,
) -> None:
    # The client has "data: [DONE]" and leaves before the engine's HTTP body has ended (a loaded
    # box widens that moment): it got everything, so it is an ok, not a client_cancel.
    engine = ScriptedEngine(linger=True)
    base, app = await make_gateway(engine)
    async with httpx.AsyncClient() as client:
        async with client.stream("POST", f"{base}/v1/completions", json=STREAM) as r:
            lines = [line async for line in _until_done(r.aiter_lines())]
        page = await scrape(client, base)
        while outcome(page, "ok") + outcome(page, "client_cancel") == 0:
            await asyncio.sleep(0.01)
            page = await scrape(client, base)
    engine.body_end.set()
    assert lines[-1] == "data: [DONE]"
    assert outcome(page, "ok") == 1 and outcome(page, "client_cancel") == 0
    assert page.total("ruleloop_gateway_output_tokens_total", where={"kind": "delivered"}) == 4
    assert app.budget.in_flight_tokens == 0


async def _until_done(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    async for line in lines:
        yield line
        if line == "data: [DONE]":
            return


async def test_gateway_client_disconnect_before_first_token_closes_upstream(make_gateway) -> None:
    engine = ScriptedEngine(stall=True)
    base, app = await make_gateway(engine)
    async with httpx.AsyncClient() as client:
        task = asyncio.create_task(client.post(f"{base}/v1/completions", json=STREAM))
        while not engine.requests:
            await asyncio.sleep(0.01)
        task.cancel()
        while outcome(await scrape(client, base), "client_cancel") == 0:
            await asyncio.sleep(0.01)
    assert app.budget.in_flight_tokens == 0 and app.budget.in_flight_requests == 0


async def test_gateway_upstream_errors_are_counted_and_passed_on(make_gateway) -> None:
    base, app = await make_gateway(ScriptedEngine())
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{base}/v1/completions", json={**STREAM, "model": "other"})
        page = await scrape(client, base)
    assert response.status_code == 404 and response.json()["error"]["message"] == "no such model"
    assert outcome(page, "upstream_error") == 1 and app.budget.in_flight_tokens == 0


async def test_gateway_unreachable_upstream_is_a_502() -> None:
    async with upstream_client(f"http://127.0.0.1:{free_port()}") as upstream:
        app = Gateway(client=upstream)
        async with GatewayServer(app) as server, httpx.AsyncClient() as client:
            response = await client.post(f"{server.base_url}/v1/completions", json=STREAM)
    assert response.status_code == 502 and response.json()["error"]["type"] == "upstream_error"
    assert app.budget.in_flight_tokens == 0


async def test_gateway_metrics_add_up_over_mixed_endings(make_gateway) -> None:
    engine = ScriptedEngine()
    base, _ = await make_gateway(engine, max_inflight_tokens=1000)
    async with httpx.AsyncClient() as client:
        for body in (
            STREAM,
            {**STREAM, "stream": False},
            {**STREAM, "model": "other"},
            {"model": "m"},
        ):
            await client.post(f"{base}/v1/completions", json=body)
        await client.post(f"{base}/v1/completions", json={**STREAM, "max_tokens": 5000})
        page = await scrape(client, base)
    counts = {
        o: outcome(page, o)
        for o in ("ok", "upstream_error", "invalid", "rejected", "deadline", "client_cancel")
    }
    assert counts == {
        "ok": 2,
        "upstream_error": 1,
        "invalid": 1,
        "rejected": 1,
        "deadline": 0,
        "client_cancel": 0,
    }
    admitted = counts["ok"] + counts["upstream_error"]
    assert (
        page.total("ruleloop_gateway_prompt_tokens_total", where={"kind": "admitted"})
        == 3 * admitted
    )
    assert page.total("ruleloop_gateway_prompt_tokens_total", where={"kind": "wasted"}) == 3
    assert page.total("ruleloop_gateway_output_tokens_total", where={"kind": "delivered"}) == 8
    assert page.total("ruleloop_gateway_inflight_tokens") == 0
    assert page.total("ruleloop_gateway_max_inflight_tokens") == 1000


ENDINGS = ("ok", "upstream_error", "invalid", "rejected", "deadline", "client_cancel")


async def test_gateway_serves_the_engines_metrics_verbatim_at_engine_metrics(make_gateway) -> None:
    engine = ScriptedEngine()
    base, _ = await make_gateway(engine)
    async with httpx.AsyncClient() as client:
        response = await client.get(f"{base}/engine/metrics?name=vllm")
        page = await scrape(client, base)
    assert response.status_code == 200
    assert response.content == ENGINE_METRICS
    assert response.headers["content-type"] == METRICS_TYPE
    assert [(r.method, str(r.url)) for r in engine.requests] == [
        ("GET", "http://engine/metrics?name=vllm")
    ]
    # /metrics stays the gateway's own, and a scrape is not an inference request
    assert not page.has("vllm:generation_tokens_total")
    assert page.has("ruleloop_gateway_inflight_tokens")
    assert sum(outcome(page, o) for o in ENDINGS) == 0


async def test_gateway_passes_on_the_engines_metrics_status(make_gateway) -> None:
    engine = ScriptedEngine()
    engine.metrics_status = 503
    base, _ = await make_gateway(engine)
    async with httpx.AsyncClient() as client:
        response = await client.get(f"{base}/engine/metrics")
    assert response.status_code == 503 and response.content == ENGINE_METRICS


async def test_gateway_engine_metrics_is_a_502_with_a_reason_when_the_engine_is_away() -> None:
    port = free_port()
    upstream = upstream_client(f"http://127.0.0.1:{port}")
    async with (
        upstream,
        GatewayServer(Gateway(client=upstream)) as server,
        httpx.AsyncClient() as c,
    ):
        response = await c.get(f"{server.base_url}/engine/metrics")
    assert response.status_code == 502
    assert response.headers["content-type"].startswith("text/plain")
    assert f"could not reach the engine's metrics page http://127.0.0.1:{port}/metrics" in (
        response.text
    )


async def test_a_gateway_that_owns_its_process_freezes_its_start_up_objects_out_of_the_gc() -> None:
    # A full collection during a 200-stream burst walked every module and start-up object:
    # 24-59 ms of the gateway stopped while the burst's requests were on their way to vLLM.
    gc.unfreeze()
    upstream = upstream_client("http://127.0.0.1:9")
    try:
        async with upstream:
            async with GatewayServer(Gateway(client=upstream)):  # a test's or an embedder's
                embedded = gc.get_freeze_count()
            async with GatewayServer(Gateway(client=upstream), handle_signals=True):  # the CLI's
                owned = gc.get_freeze_count()
    finally:
        gc.unfreeze()
    assert embedded == 0
    assert owned > 1000  # the modules' objects at least


class MetricsEngine:
    """A real local upstream whose /metrics page is large and sent in many writes."""

    page = b"".join(b'vllm:x_total{i="%d"} %d.0\n' % (i, i) for i in range(20_000))

    async def __call__(self, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return
        status = 200 if scope["path"] == "/metrics" else 404
        headers = [(b"content-type", METRICS_TYPE.encode()),
                   (b"content-length", str(len(self.page)).encode())]  # fmt: skip
        await send({"type": "http.response.start", "status": status, "headers": headers})
        for i in range(0, len(self.page), 50_000):
            piece = self.page[i : i + 50_000]
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


async def test_gateway_streams_a_large_engine_metrics_page_through_unchanged() -> None:
    engine = MetricsEngine()
    port = free_port()
    config = uvicorn.Config(engine, port=port, lifespan="off", log_level="warning")
    upstream_server = uvicorn.Server(config)
    task = asyncio.create_task(upstream_server.serve())
    while not upstream_server.started:
        await asyncio.sleep(0.01)
    try:
        async with upstream_client(f"http://127.0.0.1:{port}") as upstream:
            app = Gateway(client=upstream)
            async with GatewayServer(app) as server, httpx.AsyncClient() as client:
                response = await client.get(f"{server.base_url}/engine/metrics")
                again = await client.get(f"{server.base_url}/engine/metrics")
    finally:
        upstream_server.should_exit = True
        await task
    assert response.status_code == 200 and response.content == engine.page
    assert again.content == engine.page  # the kept-alive upstream connection is reusable
