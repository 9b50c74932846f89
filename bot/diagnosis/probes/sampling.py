"""A sampled engine window: scrapes of vLLM's /metrics every few seconds over a window (one
engine's pages, or a fleet's merged ones: bot/diagnosis/probes/fleet_window.py).

The first and last scrapes bracket the window (counters and histograms as deltas, via the
foundation's ``read_window``); the ones between give a timeline: TTFT p99 per interval, queue
depth, running requests and KV usage, for the chart and for peaks that a single scrape misses.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from bot.diagnosis.probes.engine_identity import IDENTITY_METRICS
from bot.diagnosis.probes.engine_signals import SIGNAL_METRICS
from bot.diagnosis.probes.engine_steps import STEP_METRICS
from bot.diagnosis.probes.exposition import Exposition
from bot.diagnosis.probes.fragmentation import (
    ESTIMATE_ASSUMPTION,
    estimate_fragmentation,
)
from bot.diagnosis.probes.vllm_metrics import (
    OUTPUT_LENGTHS,
    PROMPT_LENGTHS,
    RUNNING,
    TTFT,
    WAITING,
    WINDOW_METRICS,
    EngineWindow,
    Quantiles,
    cache_config,
    gauge,
    kv_blocks_used,
    kv_usage,
    read_window,
)
from bot.kernel.numbers import Estimate

TPOT = ("vllm:request_time_per_output_token_seconds",)
# the identity metrics name the process that answered (deltas only within one)
SAMPLED_METRICS = (
    WINDOW_METRICS
    | IDENTITY_METRICS
    | STEP_METRICS
    | SIGNAL_METRICS
    | {*TPOT, *PROMPT_LENGTHS, *OUTPUT_LENGTHS}
)


@dataclass(frozen=True)
class SamplePoint:
    """One scrape inside the window: seconds from its start and what the gauges said."""

    t: float
    ttft_p99_ms: float | None  # over the interval since the previous scrape
    requests_waiting: float | None
    requests_running: float | None
    kv_cache_usage: float | None


@dataclass(frozen=True)
class SampledWindow:
    """All scrapes of one window, first and last bracketing it."""

    pages: Sequence[Exposition]

    @cached_property
    def engine(self) -> EngineWindow:
        """The foundation's engine-side reading of the whole window."""
        return read_window(self.pages[0], self.pages[-1])

    @cached_property
    def tpot_ms(self) -> Quantiles:
        """Per-request time per output token (vLLM's own TPOT histogram), ITL when absent.

        vLLM observes a TPOT of 0 for a request of one output token (``vllm/v1/metrics/
        stats.py``: no gap to time), so a flood of one-token requests would pull the p99 into
        the first bucket while the requests that decode stall. Those requests are counted by the
        output-length histogram's first bucket (le=1) and left out."""
        first, last = self.pages[0], self.pages[-1]
        one_token = _bucket_delta(first, last, OUTPUT_LENGTHS[0], 1.0)
        tpot = Quantiles.from_histogram(first, last, TPOT, zeros=one_token)
        return tpot if tpot.count else self.engine.itl_ms

    @cached_property
    def points(self) -> list[SamplePoint]:
        """The timeline: one point per scrape after the first."""
        start = self.pages[0].at
        return [
            SamplePoint(
                t=page.at - start,
                ttft_p99_ms=Quantiles.from_histogram(prev, page, TTFT).p99,
                requests_waiting=gauge(page, WAITING),
                requests_running=gauge(page, RUNNING),
                kv_cache_usage=kv_usage(page),
            )
            for prev, page in zip(self.pages, self.pages[1:], strict=False)
        ]

    def peak(self, field: str) -> float | None:
        """The largest value a gauge took at any scrape of the window."""
        values = [getattr(p, field) for p in self.points if getattr(p, field) is not None]
        return max(values) if values else None

    def kv_fragmentation(self) -> Estimate | str:
        """KV fragmentation from the gauges alone (``estimate_fragmentation``), or why unknown.

        Each scrape with requests running gives bounds from its running count and used blocks;
        the window's value and bounds are the medians over those scrapes (the median of values
        that each lie within their bounds lies within the medians of the bounds).
        """
        cache = cache_config(self.pages[-1])
        if cache is None:
            return "unknown: the engine exposes no vllm:cache_config_info (block size)"
        estimates, disagreeing = [], 0
        for point, page in zip(self.points, self.pages[1:], strict=True):
            blocks = kv_blocks_used(page)  # summed over engines, each its own pool
            if not point.requests_running or blocks is None:
                continue
            estimate = estimate_fragmentation(
                running=round(point.requests_running), blocks=blocks, block_size=cache.block_size
            )
            if estimate is None:
                disagreeing += 1  # more sequences running than blocks in use
            else:
                estimates.append(estimate)
        if disagreeing and not estimates:
            return "unknown: every scrape showed more requests running than KV blocks in use"
        if not estimates:
            return "unknown: no scrape of the window had requests running"
        return Estimate(
            value=statistics.median(e.value for e in estimates if e.value is not None),
            low=statistics.median(e.low for e in estimates if e.low is not None),
            high=statistics.median(e.high for e in estimates if e.high is not None),
            basis=f"{ESTIMATE_ASSUMPTION}; median over {len(estimates)} scrape(s) "
            f"with requests running, block size {cache.block_size}",
        )


def _bucket_delta(before: Exposition, after: Exposition, histogram: str, le: float) -> float:
    """What a histogram's ``le`` bucket gained in the window (0 without the bucket)."""
    gained = after.buckets(histogram).get(le)
    return 0.0 if gained is None else max(gained - before.buckets(histogram).get(le, 0.0), 0.0)
