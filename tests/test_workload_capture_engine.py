"""A shape captured from a real vLLM engine's /metrics matches the traffic that was sent.

A known mix goes to the engine inside a capture's window: 20 requests of 90 prompt tokens and 20
of 900 (token-id prompts, so the engine counts exactly these), 16 output tokens each. The
captured prompt p50 and p99 must land within one of vLLM's histogram buckets of the sent ones
(nearest rank, as the histogram ranks them), and the request count must match.

The window is sized from a measured wave of the same requests, so a slower machine gets a
longer window, not a different test; the test fails if the traffic outlasted the window.
"""

from __future__ import annotations

import asyncio
import bisect
import math
import random
import time
from collections.abc import Sequence

import httpx
import pytest

from bot.canary.workload import PROMPT_ID_RANGE
from bot.diagnosis.probes.exposition import Exposition
from bot.diagnosis.probes.vllm_metrics import MetricsScraper
from bot.diagnosis.probes.workload_capture import CAPTURE_METRICS, PROMPT_LENGTHS, capture
from bot.engine.process import EngineInfo
from tests.workload_pages import VLLM_EDGES

pytestmark = pytest.mark.engine

SHORT, LONG, EACH, OUTPUT = 90, 900, 20, 16
CONCURRENCY = 4
INTERVAL_S = 0.5
GUARD_S = 600.0


def bucket(value: float) -> int:
    """The index of vLLM's bucket (previous edge, edge] that holds ``value``."""
    return bisect.bisect_left(VLLM_EDGES, value)


def nearest_rank(values: Sequence[int], q: float) -> int:
    """The q-quantile as a histogram ranks it: the ceil(q * n)-th smallest value."""
    ordered = sorted(values)
    return ordered[math.ceil(q * len(ordered)) - 1]


async def test_captured_lengths_match_the_sent_mix(engine: EngineInfo) -> None:
    rng = random.Random(20260901)
    async with httpx.AsyncClient(timeout=GUARD_S) as http:
        url = f"{engine.base_url}/metrics"
        scraper = MetricsScraper(url, client=http)

        async def send(prompt: int) -> None:
            body = {
                "model": engine.model,
                "prompt": rng.choices(range(*PROMPT_ID_RANGE), k=prompt),
                "max_tokens": OUTPUT,
                "ignore_eos": True,
                "temperature": 0.0,
            }
            response = await http.post(f"{engine.base_url}/v1/completions", json=body)
            response.raise_for_status()
            usage = response.json()["usage"]
            assert (usage["prompt_tokens"], usage["completion_tokens"]) == (prompt, OUTPUT)

        async def run(prompts: Sequence[int]) -> None:
            gate = asyncio.Semaphore(CONCURRENCY)

            async def one(prompt: int) -> None:
                async with gate:
                    await send(prompt)

            await asyncio.gather(*(one(p) for p in prompts))

        async def finished() -> float:
            return (await scraper(only=CAPTURE_METRICS)).total(f"{PROMPT_LENGTHS}_count") or 0.0

        async def settled(count: float) -> None:
            """Wait until the engine's histogram has counted ``count`` requests."""
            deadline = time.monotonic() + GUARD_S
            while await finished() < count:
                assert time.monotonic() < deadline, "the engine never counted the requests"
                await asyncio.sleep(0.1)

        # One wave of the same requests outside the window: warms up, and sizes the window.
        start_count = await finished()
        started = time.monotonic()
        await run([SHORT, LONG] * (CONCURRENCY // 2))
        wave_s = time.monotonic() - started
        await settled(start_count + CONCURRENCY)
        window_s = max(10.0, 3.0 * wave_s * (2 * EACH / CONCURRENCY))

        sent = [SHORT] * EACH + [LONG] * EACH
        rng.shuffle(sent)
        ats: list[float] = []
        first_scrape = asyncio.Event()

        async def scrape() -> Exposition:
            page = await scraper(only=CAPTURE_METRICS)
            ats.append(page.at)
            first_scrape.set()
            return page

        capturing = asyncio.create_task(
            capture(scrape, url=url, seconds=window_s, interval_s=INTERVAL_S)
        )
        await first_scrape.wait()
        await run(sent)
        traffic_done = time.monotonic()
        shape = await capturing

    print(
        f"\nwave {wave_s:.2f} s, window {ats[-1] - ats[0]:.1f} s over {len(ats)} scrapes; "
        f"traffic ended {traffic_done - ats[0]:.1f} s in\n" + "\n".join(shape.summary())
    )
    assert traffic_done < ats[-1], f"the traffic outlasted the {window_s:.0f} s window"
    prompts = shape.prompt_tokens
    assert prompts.count == shape.output_tokens.count == 2 * EACH
    assert prompts.mean == pytest.approx((SHORT + LONG) / 2, abs=0.05)
    assert prompts.bounds == {}
    for name, q in (("p50", 0.5), ("p99", 0.99)):
        want, got = nearest_rank(sent, q), getattr(prompts, name)
        assert abs(bucket(got) - bucket(want)) <= 1, f"prompt {name}: sent {want}, captured {got}"
    assert bucket(shape.output_tokens.p50) == bucket(OUTPUT) == bucket(shape.output_tokens.p99)
    assert shape.arrivals.request_rate == pytest.approx(2 * EACH / (ats[-1] - ats[0]), rel=1e-3)
    # averaged over the scrapes, most of which see an idle engine (the traffic is short)
    assert shape.arrivals.concurrency is not None and 0 <= shape.arrivals.concurrency <= CONCURRENCY
    assert shape.prefix.hit_rate is not None and shape.prefix.hit_rate < 0.05  # random prompts
    assert shape.api == "completions"
