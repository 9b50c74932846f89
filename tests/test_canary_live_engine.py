"""The live canary on two real vLLM engines behind a real nginx round-robin: the first engine is
the baseline, the second the canary, both taking the same traffic through nginx.

Both engines run on one CPU (every thread pinned to it), so they share it fairly
whatever else the box runs: two healthy engines are alike by construction, and the canary is
kept. Then the canary engine's core is held by a cgroup CPU quota
sized from the speeds measured here until it decodes several times slower (a slower machine
gets a smaller quota, not a different test): the canary is rolled back on TPOT. Each window is
sized from the measured speed of the slower engine, starts before the load (the load waits for
its first scrape) and must hold every request of it.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import httpx
import pytest

from bot.canary.live import MIN_REQUESTS, LiveVerdict, analyse
from bot.diagnosis.probes.context import ProbeContext
from bot.engine.process import EngineInfo
from bot.kernel.config import Target
from tests.fleet_engines import (  # noqa: F401 (engines, nginx: the fixtures)
    alone,
    engines,
    load,
    make_sick,
    nginx,
    one_cpu,
)

pytestmark = [pytest.mark.engine, pytest.mark.usefixtures("box_alone")]

# round-robin splits the requests evenly: each group gets MIN_REQUESTS and a margin
REQUESTS = 2 * (MIN_REQUESTS + 10)
CONCURRENCY = 4  # two at a time on each engine: the box has 2 cores
SLOWDOWN = 4.0  # "several times slower": the canary decodes at least this much slower
INTERVAL_S = 0.5


async def live_window(
    session: aiohttp.ClientSession, target: Target, slowest_e2e_s: float
) -> tuple[LiveVerdict, float, float]:
    """The verdict over REQUESTS through nginx; the load's and the window's seconds. The window
    holds every request sent one at a time at the slower engine's measured e2e (the engines
    share the box's cores, two at a time on each), and the load starts once the first scrape
    is in."""
    window_s = REQUESTS * slowest_e2e_s + 10
    first_scrape = asyncio.Event()

    async def sleep(seconds: float) -> None:
        first_scrape.set()  # sample_fleet sleeps only after a round
        await asyncio.sleep(seconds)

    async with httpx.AsyncClient(timeout=30) as http:
        ctx = ProbeContext(http=http, sleep=sleep)
        window = asyncio.ensure_future(
            analyse("live", target, ctx, seconds=window_s, interval_s=INTERVAL_S)
        )
        await first_scrape.wait()
        started = time.monotonic()
        records = await load(session, target.vllm_url, REQUESTS, CONCURRENCY)
        load_s = time.monotonic() - started
        assert len(records) == REQUESTS
        return await window, load_s, window_s


async def test_live_canary_on_real_engines(
    engines: list[EngineInfo],  # noqa: F811
    nginx: str,  # noqa: F811
) -> None:
    baseline, canary = engines
    target = Target(vllm_url=nginx, replicas=[baseline.base_url], canary_replicas=[canary.base_url])
    with one_cpu(engines):
        async with aiohttp.ClientSession() as session:
            _, healthy_e2e = await alone(session, canary.base_url)
            _, other_e2e = await alone(session, baseline.base_url)
            kept, kept_load_s, kept_window_s = await live_window(
                session, target, max(healthy_e2e, other_e2e)
            )

            measured = await make_sick(session, engines, SLOWDOWN)
            rolled, sick_load_s, sick_window_s = await live_window(
                session, target, measured["sick_e2e_s"]
            )

    summary = (
        f"measured {measured}, healthy e2e {healthy_e2e:.3f}/{other_e2e:.3f} s; both healthy: "
        f"load {kept_load_s:.1f} s in a {kept_window_s:.1f} s window:\n{kept.text()}\n"
        f"canary {SLOWDOWN:g}x slower: load {sick_load_s:.1f} s in a {sick_window_s:.1f} s "
        f"window:\n{rolled.text()}"
    )
    print(summary)
    # each window held its whole load, and every request was counted once, in its group
    assert kept_load_s < kept_window_s and sick_load_s < sick_window_s, summary
    for verdict in (kept, rolled):
        ttft = verdict.metrics[0]
        assert ttft.canary.count + ttft.baseline.count == REQUESTS, summary
        assert min(ttft.canary.count, ttft.baseline.count) >= MIN_REQUESTS, summary
    assert kept.decision == "keep" and kept.exit_code == 0, summary
    assert rolled.decision == "roll back" and rolled.exit_code == 1, summary
    decode = rolled.metrics[1]
    assert decode.worse and decode.test is not None, summary
    # the means (sums over counts: exact, where a p50 in the first bucket is only a bound)
    assert decode.canary.mean is not None and decode.baseline.mean is not None
    assert decode.canary.mean > 2 * decode.baseline.mean, summary
