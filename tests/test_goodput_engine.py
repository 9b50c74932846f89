"""Goodput and wasted prefill on the real vLLM engine: what is still running is not waste.

Two long requests (2048-token prompts, answers longer than the window) run through the whole
window while short ones come and go inside it. Without cancellations goodput is 100 % and no
prefill is wasted, though most tokens the engine generated in the window belong to the long
requests still in flight (the old formula read that as waste). With clients that hang up
mid-stream, the aborted answers and their prompts show as waste beside the same long requests.

Everything is sized from what the engine is measured to do here (a wave of short requests, its
steps per second), and the long requests are waited for through the engine's own running gauge
and first-token count: a machine 10-30x slower gets a longer window, not a different test.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import httpx
import pytest

from bot.canary.client import Outcome, RequestRecord, stream_request
from bot.canary.workload import PROMPT_ID_RANGE
from bot.diagnosis.probes.context import ProbeContext, TargetRef
from bot.diagnosis.probes.exposition import Exposition
from bot.diagnosis.probes.queue_cancel import QueueCancelProbe
from bot.diagnosis.probes.types import ProbeResult
from bot.diagnosis.probes.vllm_metrics import (
    RUNNING,
    TTFT,
    WAITING,
    EngineWindow,
    gauge,
    parse_page,
)
from bot.diagnosis.probes.vllm_window import VllmMetricsProbe, WindowParams
from bot.engine.process import EngineInfo
from bot.kernel.config import Target

pytestmark = pytest.mark.engine

LONG = 2  # long requests in flight through the window
LONG_PROMPT = 2048
SHORT_PROMPT, SHORT_OUTPUT = 64, 64
SHORTS = 64  # short requests inside the window, WAVE at a time
WAVE = 4
CANCEL_AFTER = 32  # tokens an impatient client takes before it hangs up
GUARD_S = 900.0  # a wait that never ends fails, however slow the machine


class Engine:
    """The engine under test: its /metrics, and streaming requests with distinct prompts."""

    def __init__(self, info: EngineInfo, session: aiohttp.ClientSession, http: httpx.AsyncClient):
        self.info, self.session, self.http = info, session, http
        self.rng = random.Random(20260901)

    async def page(self) -> Exposition:
        response = await self.http.get(f"{self.info.base_url}/metrics")
        return parse_page(response.text, url="metrics", at=time.monotonic())

    async def until(self, what: str, ok: Callable[[Exposition], bool]) -> Exposition:
        """Scrape until ``ok`` holds (the engine's own gauges and counters say so)."""
        deadline = time.monotonic() + GUARD_S
        while time.monotonic() < deadline:
            page = await self.page()
            if ok(page):
                return page
            await asyncio.sleep(0.05)
        raise AssertionError(f"the engine never showed {what} in {GUARD_S:g} s")

    async def max_model_len(self) -> int:
        models = (await self.http.get(f"{self.info.base_url}/v1/models")).json()
        return int(models["data"][0]["max_model_len"])

    async def request(
        self, prompt: int, output: int, *, cancel_after: int | None = None
    ) -> RequestRecord:
        """One streaming completion; a distinct random prompt, so no prefix-cache sharing."""
        body = {
            "model": self.info.model,
            "prompt": self.rng.choices(range(*PROMPT_ID_RANGE), k=prompt),
            "max_tokens": output,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        record = RequestRecord(sent_at=time.perf_counter())
        url = f"{self.info.base_url}/v1/completions"
        await stream_request(self.session, url, body, record, cancel_after_tokens=cancel_after)
        return record

    async def wave(self, cancel: bool) -> list[RequestRecord]:
        """WAVE short requests at once; with ``cancel``, every other one hangs up early."""
        return list(
            await asyncio.gather(
                *(
                    self.request(
                        SHORT_PROMPT,
                        SHORT_OUTPUT,
                        cancel_after=CANCEL_AFTER if cancel and i % 2 == 0 else None,
                    )  # fmt: skip
                    for i in range(WAVE)
                )
            )
        )


def first_tokens(page: Exposition) -> float:
    return page.total(f"{TTFT[0]}_count") or 0.0


def counter(page: Exposition, name: str) -> float:
    return page.total(name) or 0.0


async def measure(info: EngineInfo, *, cancel: bool) -> dict[str, Any]:
    """Long requests in flight, short waves inside a probe window; the probes' readings."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session,
        httpx.AsyncClient(timeout=60) as http,
    ):
        engine = Engine(info, session, http)
        idle = await engine.until(
            "no request left from earlier tests",
            lambda p: (gauge(p, RUNNING) or 0) + (gauge(p, WAITING) or 0) == 0,
        )
        long_output = await engine.max_model_len() - LONG_PROMPT - 8
        longs = [asyncio.create_task(engine.request(LONG_PROMPT, long_output)) for _ in range(LONG)]
        try:
            # Both long requests are decoding: running, each with its first token.
            await engine.until(
                f"{LONG} long requests running with their first token",
                lambda p: (
                    (gauge(p, RUNNING) or 0) >= LONG
                    and first_tokens(p) >= first_tokens(idle) + LONG
                ),
            )
            # Calibrate: one wave of short requests (the long ones decoding beside it), and how
            # fast the long ones advance (one token a step).
            before, started = await engine.page(), time.monotonic()
            await engine.wave(cancel=False)
            after = await engine.page()
            wave_s = time.monotonic() - started
            steps = "vllm:iteration_tokens_total_count"
            steps_per_s = (counter(after, steps) - counter(before, steps)) / (after.at - before.at)
            waves = SHORTS // WAVE
            # The waves are sent in the window's first two thirds and take two thirds of that
            # here (room for a machine that slows down under them): they have ended before its
            # last scrape. The long requests must outlast it (their answers are as long as the
            # engine's max_model_len allows).
            window_s = min(1.5 * waves * wave_s + 1.0, 600.0)
            generated = "vllm:generation_tokens_total"
            per_long = (counter(after, generated) - counter(idle, generated)) / LONG
            # per_long counts the calibration wave too, so left_s errs short (the safe side).
            left_s = (long_output - per_long) / steps_per_s
            assert left_s > 1.5 * window_s, (
                f"the long requests would end within the window ({left_s:.0f} s left, window "
                f"{window_s:.0f} s): the engine's max_model_len is too small for this test"
            )

            scraped = asyncio.Event()

            async def on_response(response: httpx.Response) -> None:
                scraped.set()

            ctx = ProbeContext(
                http=httpx.AsyncClient(timeout=60, event_hooks={"response": [on_response]})
            )
            target = TargetRef("engine", Target(vllm_url=info.base_url))
            params = WindowParams(window_s=window_s, interval_s=min(max(window_s / 10, 0.5), 60))
            probes = asyncio.gather(
                VllmMetricsProbe().run(target=target, params=params, ctx=ctx),
                QueueCancelProbe().run(target=target, params=params, ctx=ctx),
            )
            await asyncio.wait_for(scraped.wait(), GUARD_S)  # the window's first page is taken
            shorts: list[RequestRecord] = []
            window_started = time.monotonic()
            while len(shorts) < SHORTS and time.monotonic() - window_started < window_s * 2 / 3:
                shorts += await engine.wave(cancel=cancel)
            metrics, queue = await probes
            await ctx.http.aclose()
            assert not any(task.done() for task in longs), "a long request ended in the window"
        finally:
            for task in longs:
                task.cancel()
            await asyncio.gather(*longs, return_exceptions=True)
        window = metrics.window
        assert window is not None
        return {
            "metrics": metrics,
            "queue": queue,
            "engine": window.engine,
            "shorts": shorts,
            "window_s": window_s,
            "last_running": gauge(window.pages[-1], RUNNING),
        }


def summary(run: dict[str, Any]) -> str:
    engine: EngineWindow = run["engine"]
    metrics: ProbeResult = run["metrics"]
    queue: ProbeResult = run["queue"]
    old = (engine.finished_generation_tokens or 0) / (engine.generation_tokens or 1)
    return (
        f"window {run['window_s']:.1f} s, {len(run['shorts'])} short requests; goodput "
        f"{metrics.readings.value('goodput_ratio')} {metrics.details['goodput_bounds']}; wasted prefill "
        f"share {queue.readings.value('wasted_prefill_share')} "
        f"{queue.details['wasted_prefill_share_bounds']}, tokens "
        f"{queue.readings.value('wasted_prefill_tokens')}; aborted {engine.aborted_requests}; the old "
        f"formula's goodput {old:.2f}; basis: {engine.goodput.basis}"
    )


async def test_long_requests_in_flight_without_cancellations_waste_nothing(
    engine: EngineInfo,
) -> None:
    run = await measure(engine, cancel=False)
    print(summary(run))
    window: EngineWindow = run["engine"]
    metrics: ProbeResult = run["metrics"]
    queue: ProbeResult = run["queue"]
    assert run["last_running"] >= LONG  # the long requests were in flight at the window's end
    assert all(r.outcome is Outcome.OK for r in run["shorts"])
    # Most of what the engine generated in the window went to the long requests in flight.
    assert (window.finished_generation_tokens or 0) < 0.8 * (window.generation_tokens or 0)
    assert metrics.readings.value("goodput_ratio") is not None
    assert metrics.readings.value("goodput_ratio") >= 0.95
    share = queue.readings.value("wasted_prefill_share")
    assert share is not None and share <= 0.05
    assert (queue.readings.value("wasted_prefill_tokens") or 0) <= 0.05 * (window.prompt_tokens or 0)


async def test_clients_that_hang_up_show_as_waste_beside_long_requests(
    engine: EngineInfo,
) -> None:
    run = await measure(engine, cancel=True)
    print(summary(run))
    window: EngineWindow = run["engine"]
    metrics: ProbeResult = run["metrics"]
    queue: ProbeResult = run["queue"]
    # Every other request of a wave was from a client that hangs up (gather keeps the order).
    impatient = [r for i, r in enumerate(run["shorts"]) if i % WAVE % 2 == 0]
    patient = [r for i, r in enumerate(run["shorts"]) if i % WAVE % 2 == 1]
    cancelled = [r for r in impatient if r.outcome is Outcome.CANCELLED]
    assert run["last_running"] >= LONG
    assert all(r.outcome is Outcome.OK for r in patient)
    # An impatient client whose answer came whole, its last tokens packed into the chunk that
    # crossed the cancel point (a busy client reads late), did not hang up: that is finished work.
    whole = [r for r in impatient if r.outcome is Outcome.OK and r.output_tokens == SHORT_OUTPUT]
    assert len(cancelled) + len(whole) == len(impatient), [r.outcome for r in impatient]
    assert len(cancelled) > len(impatient) // 2  # most hung up mid-stream: the case under test
    # The engine aborted what it had not finished when the client hung up (a fast engine may
    # complete an answer before the disconnect reaches it: that one is finished, not waste).
    assert window.requests_finished is not None
    aborted = len(run["shorts"]) - window.requests_finished
    assert 0 < aborted <= len(cancelled) and window.aborted_requests == aborted
    goodput = metrics.readings.value("goodput_ratio")
    assert goodput is not None and goodput < 0.9, metrics.details["goodput_basis"]
    bounds = metrics.details["goodput_bounds"]
    assert bounds[1] < 0.9  # the bound says so too, not only the estimate
    # The engine generated at least what the aborted clients received before hanging up. Which
    # of the cancelled were aborted the client cannot tell (the rest finished: counted work), so
    # the least it knows is what the `aborted` fewest-token cancelled ones received.
    assert window.wasted_generation.high is not None
    received = sorted(r.output_tokens for r in cancelled)[: int(aborted)]
    assert window.wasted_generation.high >= sum(received), (received, summary(run))
    share = queue.readings.value("wasted_prefill_share")
    assert share is not None and share > 0.05
    # Each aborted request's prompt was prefilled for nothing.
    assert queue.readings.value("wasted_prefill_tokens") == pytest.approx(SHORT_PROMPT * aborted)
