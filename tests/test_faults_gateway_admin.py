"""The gateway's admin endpoint and inference bodies: a bad value or a body it cannot read is a 4xx.

The real gateway (uvicorn) in front of the scripted engine (tests/gateway_scripted.py).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from bot.gateway.app import Gateway
from bot.gateway.limits import Limits, LimitsError, read_limits_file, updated
from tests.gateway_scripted import ADMIN_TOKEN, Gateways, ScriptedEngine

pytestmark = pytest.mark.faults

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}", "content-type": "application/json"}
DEEP = b"[" * 30_000 + b"]" * 30_000  # 60 KB: under the admin endpoint's 64 KiB body limit


@pytest.fixture
async def make_gateway() -> AsyncIterator[Callable[..., Awaitable[tuple[str, Gateway]]]]:
    """Start gateways in front of scripted engines; stop them after the test."""
    async with Gateways() as gateways:
        yield gateways.start


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_inflight_tokens", True),
        ("max_inflight_tokens", False),
        ("max_body_bytes", True),
        ("retry_after_s", True),
        ("default_max_tokens", True),
        ("default_timeout_s", True),
        ("max_timeout_s", True),
        ("require_timeout_header", 1),
        ("require_timeout_header", "yes"),
    ],
)
async def test_a_limit_of_the_wrong_type_is_a_422_naming_the_field_not_coerced(
    make_gateway, field: str, value: object
) -> None:
    base, app = await make_gateway(ScriptedEngine())
    before = app.limits
    async with httpx.AsyncClient() as client:
        response = await client.patch(
            f"{base}/admin/limits", content=json.dumps({field: value}), headers=AUTH
        )
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == field and field in error["message"]
    assert app.limits == before


async def test_a_deeply_nested_admin_body_is_a_400_not_a_500(make_gateway) -> None:
    base, app = await make_gateway(ScriptedEngine())
    before = app.limits
    async with httpx.AsyncClient() as client:
        response = await client.patch(f"{base}/admin/limits", content=DEEP, headers=AUTH)
        again = await client.get(f"{base}/admin/limits", headers=AUTH)
    assert (
        response.status_code == 400 and "nested too deeply" in response.json()["error"]["message"]
    )
    assert again.status_code == 200 and app.limits == before


async def test_a_deeply_nested_inference_body_is_a_400_not_a_500(make_gateway) -> None:
    engine = ScriptedEngine()
    base, app = await make_gateway(engine)
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{base}/v1/completions", content=DEEP, headers={"content-type": "application/json"}
        )
    assert (
        response.status_code == 400 and "nested too deeply" in response.json()["error"]["message"]
    )
    assert engine.requests == [] and app.budget.in_flight_tokens == 0


def test_a_deeply_nested_limits_file_is_a_limits_error(tmp_path: Path) -> None:
    path = tmp_path / "limits.json"
    path.write_bytes(b'{"max_inflight_tokens": ' + DEEP + b"}")
    with pytest.raises(LimitsError, match="nested too deeply"):
        read_limits_file(path)


def test_a_limits_file_with_a_bool_for_a_number_is_refused() -> None:
    with pytest.raises(LimitsError, match="max_inflight_tokens") as caught:
        updated(Limits(), {"max_inflight_tokens": True})
    assert caught.value.fields == ["max_inflight_tokens"]
