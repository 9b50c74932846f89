"""The gateway's request records in front of a real vLLM engine, captured as a shape.

A known mix goes through the gateway: 8 requests behind one 300-token prefix (token ids, their
own 20-token tails after it) and 4 text prompts, streamed with usage, 12 output tokens each.
The gateway's shape must hold the engine's own counts (usage), find the shared prefix at the
256-token level, and bin the lengths exactly as the engine's own /metrics histograms did over
the same requests: the two shapes agree edge by edge.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator

import httpx
import pytest

from bot.adr.workload.diff import diff
from bot.adr.workload.shape import PrefixGroup
from bot.canary.workload import PROMPT_ID_RANGE
from bot.diagnosis.probes.gateway_capture import capture_from_gateway
from bot.diagnosis.probes.vllm_metrics import MetricsScraper
from bot.diagnosis.probes.workload_capture import CAPTURE_METRICS, shape_from_pages
from bot.engine.process import EngineInfo
from bot.gateway.app import Gateway
from bot.gateway.server import GatewayServer, upstream_client
from tests.workload_pages import CAPTURED_AT

pytestmark = pytest.mark.engine

TOKEN = "engine-test-token"
OUTPUT = 12
USAGE = {"include_usage": True}


@pytest.fixture
async def gateway(engine: EngineInfo) -> AsyncIterator[str]:
    client = upstream_client(engine.base_url)
    async with GatewayServer(Gateway(client=client, admin_token=TOKEN)) as server:
        yield server.base_url
    await client.aclose()


async def test_a_gateway_shape_matches_the_engines_own(engine: EngineInfo, gateway: str) -> None:
    rng = random.Random(7)
    shared = [rng.randrange(*PROMPT_ID_RANGE) for _ in range(300)]
    prompts: list[object] = [shared + [rng.randrange(*PROMPT_ID_RANGE) for _ in range(20)]
                             for _ in range(8)]  # fmt: skip
    prompts += [f"Request {i}: " + "tell me about the sea and its tides. " * (5 + 10 * i)
                for i in range(4)]  # fmt: skip
    async with httpx.AsyncClient(timeout=600) as http:
        scraper = MetricsScraper(f"{engine.base_url}/metrics", client=http)
        before = await scraper(only=CAPTURE_METRICS)
        sent: list[tuple[int, int]] = []
        for prompt in prompts:
            body = {"model": engine.model, "prompt": prompt, "max_tokens": OUTPUT,
                    "ignore_eos": True, "temperature": 0.0, "stream": True,
                    "stream_options": USAGE}  # fmt: skip
            async with http.stream("POST", f"{gateway}/v1/completions", json=body) as response:
                assert response.status_code == 200
                lines = [line async for line in response.aiter_lines() if line]
            assert lines[-1] == "data: [DONE]"
            usage = next((line for line in reversed(lines) if '"prompt_tokens"' in line), None)
            assert usage is not None, lines[-3:]
            sent.append((int(usage.split('"prompt_tokens":')[1].split(",")[0]), OUTPUT))
        after = await scraper(only=CAPTURE_METRICS)
        records = (
            await http.get(
                f"{gateway}/admin/requests", headers={"Authorization": f"Bearer {TOKEN}"}
            )
        ).json()["records"]
        shape = await capture_from_gateway(http, gateway, token=TOKEN)
    assert [(r["prompt_tokens"], r["output_tokens"]) for r in records] == sent
    assert all(r["prompt_tokens_from"] == "usage" for r in records)
    assert [r["prompt_tokens"] for r in records[:8]] == [320] * 8  # token ids: exact
    # the 300 shared ids reach the 256 level; the texts part at their 9th character
    assert shape.prefix.groups == (PrefixGroup(share=0.6666, length=256),)
    engine_shape = shape_from_pages([before, after], url=engine.base_url, captured_at=CAPTURED_AT)
    print("\n" + "\n".join(shape.summary()) + "\n" + "\n".join(engine_shape.summary()))
    for mine, theirs in ((shape.prompt_tokens, engine_shape.prompt_tokens),
                         (shape.output_tokens, engine_shape.output_tokens)):  # fmt: skip
        assert mine.count == theirs.count == len(prompts)
        common = set(mine.buckets) & set(theirs.buckets)
        assert len(common) >= 14
        mine_c, theirs_c = mine.cumulative(), theirs.cumulative()
        for edge in sorted(float(e) if e != "+Inf" else float("inf") for e in common):
            assert mine_c[edge] == pytest.approx(theirs_c[edge], abs=1e-6), edge
        assert mine.mean == theirs.mean
    result = diff(engine_shape, shape)
    lengths = [d for d in result.dimensions if "tokens" in d.name]
    assert lengths and not any(d.drifted for d in lengths), result.lines()
