"""The gateway's canary split (bot/gateway/split.py) on a real server in front of two real SSE
engines: the canary engine takes its weight of the inference requests exactly, and an engine
that refuses connections (stopped, or restarting) hands its share to the other one without a
single failed request; the CLI refuses a split that cannot be one."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
from click.testing import CliRunner

from bot.app.cli import cli
from bot.diagnosis.probes.exposition import Exposition
from bot.engine.process import free_port
from bot.gateway.app import Gateway
from bot.gateway.server import GatewayServer, upstream_client
from tests.fakes.sse_engine import MODEL, SseEngine

STREAM = {"model": MODEL, "prompt": "hi", "max_tokens": 3, "stream": True}


@asynccontextmanager
async def split_gateway(engine: str, canary: str, weight: float) -> AsyncIterator[str]:
    """A gateway serving ``engine`` with ``canary`` beside it; its base URL."""
    async with upstream_client(engine) as main, upstream_client(canary) as second:
        app = Gateway(client=main, canary=(second, weight))
        async with GatewayServer(app) as server:
            yield server.base_url


async def send(base: str, n: int) -> tuple[list[int], Exposition]:
    """``n`` streamed completions one after another: their statuses, then the gateway's page."""
    async with httpx.AsyncClient(timeout=30) as client:
        statuses = [(await client.post(f"{base}/v1/completions", json=STREAM)).status_code
                    for _ in range(n)]  # fmt: skip
        page = Exposition.parse((await client.get(f"{base}/metrics")).text, at=0.0)
    return statuses, page


def stage(page: Exposition, name: str, stage: str) -> float:
    return page.total(f"ruleloop_gateway_stage_{name}_total", where={"stage": stage}) or 0.0


async def test_the_canary_engine_takes_exactly_its_weight_of_the_requests() -> None:
    async with (
        SseEngine() as engine,
        SseEngine() as canary,
        split_gateway(engine.base_url, canary.base_url, 0.25) as base,
    ):
        statuses, page = await send(base, 20)
    assert statuses == [200] * 20
    assert (engine.completed, canary.completed) == (15, 5)  # every fourth request
    assert (stage(page, "requests", "engine"), stage(page, "requests", "canary")) == (15, 5)
    assert stage(page, "failovers", "engine") == stage(page, "failovers", "canary") == 0


async def test_a_canary_engine_that_is_down_hands_its_share_to_the_engine() -> None:
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens: the connection is refused
    async with SseEngine() as engine, split_gateway(engine.base_url, down, 0.5) as base:
        statuses, page = await send(base, 8)
    assert statuses == [200] * 8 and engine.completed == 8
    assert stage(page, "failovers", "canary") == 4  # its turns, taken by the engine
    assert stage(page, "requests", "engine") == 8 and stage(page, "requests", "canary") == 0
    assert page.total("ruleloop_gateway_requests_total", where={"outcome": "upstream_error"}) == 0


async def test_an_engine_that_restarts_hands_its_share_to_the_canary_engine() -> None:
    down = f"http://127.0.0.1:{free_port()}"
    async with SseEngine() as canary, split_gateway(down, canary.base_url, 0.5) as base:
        statuses, page = await send(base, 6)
    assert statuses == [200] * 6 and canary.completed == 6
    assert stage(page, "failovers", "engine") == 3


async def test_without_a_split_an_engine_that_is_down_is_an_error_the_client_sees() -> None:
    """The fail-over is the split's: one engine alone still answers 502 when it is down."""
    down = f"http://127.0.0.1:{free_port()}"
    async with upstream_client(down) as client, GatewayServer(Gateway(client=client)) as server:
        statuses, page = await send(server.base_url, 2)
    assert statuses == [502, 502]
    assert page.total("ruleloop_gateway_stage_requests_total") is None  # no split, no counts


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--canary-upstream", "http://127.0.0.1:8000/"], "--canary-upstream is --upstream"),
        (["--canary-upstream", "127.0.0.1:8001"], "--canary-upstream '127.0.0.1:8001' must be"),
        (["--canary-upstream", "http://127.0.0.1:8001", "--canary-weight", "1"], "0<x<1"),
    ],
)
def test_the_cli_refuses_a_split_that_is_not_one(args: list[str], said: str) -> None:
    result = CliRunner().invoke(cli, ["gateway", "--upstream", "http://127.0.0.1:8000", *args])
    assert result.exit_code == 2, result.output
    assert said in result.output
