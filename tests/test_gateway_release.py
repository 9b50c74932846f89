"""The budget a request holds is free before the client has its last byte.

A client that got its whole answer may send the next request at once; if the gateway still held
the previous one's tokens then, a budget sized for one request would answer that next request
429 (seen as a race in the engine test: a 200 arrived while its tokens were still in flight).
The app is driven over ASGI directly, so each message the client would get is seen with what
the budget held when it was sent.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from bot.gateway.app import Gateway
from bot.gateway.limits import Limits
from tests.gateway_scripted import STREAM, ScriptedEngine

Sent = list[tuple[dict[str, Any], int]]


async def exchange(engine: ScriptedEngine, body: dict[str, Any], **headers: str) -> Sent:
    """One request through the app; every message sent back, with the tokens in flight then."""
    upstream = httpx.AsyncClient(transport=httpx.MockTransport(engine), base_url="http://engine")
    app = Gateway(client=upstream, limits=Limits(max_inflight_tokens=1000))  # type: ignore[arg-type]
    raw = json.dumps(body).encode()
    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
        "method": "POST", "scheme": "http", "path": "/v1/completions",
        "raw_path": b"/v1/completions", "query_string": b"", "root_path": "",
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(len(raw)).encode()),
                    *((k.replace("_", "-").encode(), v.encode()) for k, v in headers.items())],
        "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8080),
    }  # fmt: skip
    asked = False

    async def receive() -> dict[str, Any]:
        nonlocal asked
        if not asked:
            asked = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await asyncio.Event().wait()  # the client stays
        raise AssertionError("unreachable")

    sent: Sent = []

    async def send(message: dict[str, Any]) -> None:
        sent.append((message, app.budget.in_flight_tokens))

    try:
        await app(scope, receive, send)
    finally:
        await upstream.aclose()
    assert app.budget.in_flight_tokens == 0 and app.budget.in_flight_requests == 0
    return sent


def last_body(sent: Sent) -> tuple[dict[str, Any], int]:
    (last,) = [
        m for m in sent if m[0]["type"] == "http.response.body" and not m[0].get("more_body")
    ]
    return last


@pytest.mark.parametrize(
    ("body", "headers", "status"),
    [
        (STREAM, {}, 200),  # the stream's end marker
        ({**STREAM, "stream": False}, {}, 200),  # a whole JSON answer
        ({**STREAM, "model": "other"}, {}, 404),  # the engine's error, passed on
    ],
    ids=["stream", "whole", "engine-error"],
)
async def test_the_budget_is_free_when_the_last_byte_goes_out(body, headers, status) -> None:
    sent = await exchange(ScriptedEngine(), body, **headers)
    start = next(m for m, _ in sent if m["type"] == "http.response.start")
    assert start["status"] == status
    _, held = last_body(sent)
    assert held == 0, f"the last byte went out with {held} tokens still held"


async def test_the_budget_is_free_when_a_deadline_answers_504() -> None:
    sent = await exchange(ScriptedEngine(stall=True), STREAM, x_request_timeout="50ms")
    message, held = last_body(sent)
    assert json.loads(message["body"])["error"]["code"] == "deadline_exceeded" and held == 0


async def test_the_budget_is_held_while_a_stream_is_still_going() -> None:
    sent = await exchange(ScriptedEngine(), STREAM)
    middle = [held for m, held in sent if m.get("more_body")]
    assert middle and all(held > 0 for held in middle)
