"""The seed's CI gate, as written, through a real ruleloop gateway in front of a real engine."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from bot.engine.process import EngineInfo
from bot.gateway.app import Gateway
from bot.gateway.limits import Limits
from bot.gateway.server import GatewayServer, upstream_client

pytestmark = pytest.mark.engine

StartGateway = Callable[..., Awaitable[str]]
SEED_GATES = ["--max-ttft-p99-ms", "350", "--max-tpot-p99-ms", "35", "--min-goodput-ratio", "0.95"]


@pytest.fixture
async def gateway(engine: EngineInfo) -> AsyncIterator[StartGateway]:
    """Start a gateway (real uvicorn, this event loop) in front of the test engine."""
    opened: list[tuple[GatewayServer, httpx.AsyncClient]] = []

    async def start(**limits: Any) -> str:
        client = upstream_client(engine.base_url)
        server = GatewayServer(Gateway(client=client, limits=Limits(**limits)))
        await server.__aenter__()
        opened.append((server, client))
        return server.base_url

    yield start
    for server, client in reversed(opened):
        await server.__aexit__(None, None, None)
        await client.aclose()


async def latency_checker(*args: str) -> tuple[int, str]:
    """`python -m latency_checker ARGS` in a child process (the gateway keeps serving here)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "latency_checker", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    output, _ = await process.communicate()
    assert process.returncode is not None
    return process.returncode, output.decode()


async def test_the_gate_fails_a_release_whose_requests_are_mostly_429(
    gateway: StartGateway, engine: EngineInfo, tmp_path: Path
) -> None:
    # A token budget of exactly one request (128 prompt + 256 output tokens): while one long
    # answer streams, every other stream's request is refused at once with a 429.
    base = await gateway(max_inflight_tokens=128 + 256)
    report = tmp_path / "canary.json"
    code, output = await latency_checker(
        "--endpoint", f"{base}/v1/completions", "--concurrency", "8", "--num-requests", "100",
        "--prompt-length", "128", "--output-length", "256",
        "--metrics-url", f"{engine.base_url}/metrics", *SEED_GATES,
        "--output-json", str(report), "--quiet",
    )  # fmt: skip
    data = json.loads(report.read_text())
    refused = data["requests"]["failed_by_cause"].get("HTTP 429", 0)
    assert refused >= 50, output
    assert code == 1, output
    assert "FAIL  max_error_rate: error rate" in output
    assert "gate failed: " in output and "max_error_rate" in output.splitlines()[-1]
    assert data["passed"] is False
    assert data["ttft_ms"]["p99"] is None and data["ttft_ms"]["infinite"] == refused
    assert data["engine"] is not None  # the engine's own numbers were read


async def test_the_seeds_command_as_written_reads_the_engine_behind_the_gateway(
    gateway: StartGateway, tmp_path: Path
) -> None:
    # The seed's flags as written, one request per stream: all 150 streams in flight at once
    # through the gateway. Its default count (750, five per stream) is test_canary_cli's; five
    # rounds of 2048-token prefills here cost 15 minutes on a slow machine and prove no more.
    base = await gateway()
    report = tmp_path / "canary.json"
    code, output = await latency_checker(
        "--endpoint", f"{base}/v1/completions", "--concurrency", "150", "--prompt-length", "2048",
        *SEED_GATES, "--num-requests", "150", "--output-json", str(report), "--quiet",
    )  # fmt: skip
    assert code in (0, 1), output
    data = json.loads(report.read_text())
    assert data["workload"]["metrics_url"] == f"{base}/engine/metrics"
    assert data["engine"]["generation_tokens"] > 0
    assert data["goodput_source"] == "engine"
    assert data["requests"]["total"] == 150  # a count given is a bound: not sized up to 528
    # said on stderr before the run and in the summary table after it (one stream here)
    warnings = {line for line in output.splitlines() if line.startswith("warning:")}
    assert warnings == {
        "warning: 150 requests cannot decide the gates at 99% (528 can): a gate not missed will"
        " be inconclusive, and fail"
    }, warnings
