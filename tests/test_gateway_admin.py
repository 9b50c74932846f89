"""/admin/limits: bearer token, fail closed, live changes that keep open streams."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from bot.gateway.app import Gateway
from bot.gateway.server import GatewayServer
from tests.gateway_scripted import (
    ADMIN_TOKEN,
    STREAM,
    Gateways,
    ScriptedEngine,
)


@pytest.fixture
async def make_gateway() -> AsyncIterator[Callable[..., Awaitable[tuple[str, Gateway]]]]:
    """Start gateways in front of scripted engines; stop them after the test."""
    async with Gateways() as gateways:
        yield gateways.start


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 401),
        ({"Authorization": "Bearer wrong"}, 401),
        ({"Authorization": f"Basic {ADMIN_TOKEN}"}, 401),
    ],
)
async def test_admin_refuses_requests_without_the_token(
    make_gateway, headers: dict[str, str], status: int
) -> None:
    base, app = await make_gateway(ScriptedEngine())
    async with httpx.AsyncClient() as client:
        response = await client.patch(
            f"{base}/admin/limits", json={"max_inflight_tokens": 5}, headers=headers
        )
    assert response.status_code == status and app.limits.max_inflight_tokens == 0


async def test_admin_without_a_configured_token_is_disabled() -> None:
    app = Gateway(client=httpx.AsyncClient(transport=httpx.MockTransport(ScriptedEngine())))
    async with GatewayServer(app) as server, httpx.AsyncClient() as client:
        response = await client.get(
            f"{server.base_url}/admin/limits", headers={"Authorization": "Bearer x"}
        )
    assert response.status_code == 403 and response.json()["error"]["code"] == "admin_disabled"


async def test_admin_changes_limits_live_without_dropping_open_streams(make_gateway) -> None:
    engine = ScriptedEngine(gated=True)
    base, app = await make_gateway(engine)
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient() as client:
        engine.step.put_nowait(None)
        async with client.stream("POST", f"{base}/v1/completions", json=STREAM) as open_stream:
            lines = open_stream.aiter_lines()
            assert (await anext(lines)).startswith("data: ")
            changed = await client.patch(
                f"{base}/admin/limits",
                json={"max_inflight_tokens": 7, "default_timeout_s": "30s"},
                headers=auth,
            )
            refused = await client.post(f"{base}/v1/completions", json=STREAM)
            for _ in range(3):
                engine.step.put_nowait(None)
            rest = [line async for line in lines if line]
        shown = await client.get(f"{base}/admin/limits", headers=auth)
        bad = await client.patch(
            f"{base}/admin/limits", json={"max_inflight_tokens": "lots"}, headers=auth
        )
    assert changed.status_code == 200 and changed.json()["max_inflight_tokens"] == 7
    assert refused.status_code == 429
    assert rest[-1] == "data: [DONE]"
    assert shown.json()["default_timeout_s"] == 30.0 and app.budget.limit == 7
    assert bad.status_code == 422 and "max_inflight_tokens" in bad.json()["error"]["message"]
    assert bad.json()["error"]["param"] == "max_inflight_tokens"
