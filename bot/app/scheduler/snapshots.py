"""Snapshots: a target's numbers (the catalogue's that have a normal) every few minutes.

The numbers come from the engine's own /metrics over a short window, read by the runbooks'
``vllm_metrics`` probe, so a snapshot and a diagnosis measure the same way. Diagnoses show the
median of the newest snapshots as "normal" next to "now".

Normal is never taken from a cold engine: an engine's first requests pay for its warm-up
(allocations, caches), so a window is a snapshot only if the engine had finished at least
``WARM_REQUESTS`` requests before it began (``vllm:request_success_total`` at its first
scrape); otherwise the period is skipped and says why.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Awaitable, Callable, Mapping

import httpx
from sqlalchemy.orm import Session

from bot.app.scheduler.runner import JobOutcome
from bot.diagnosis import KEYS
from bot.diagnosis.probes import (
    REQUEST_SUCCESS,
    ProbeContext,
    TargetRef,
    VllmMetricsProbe,
    WindowParams,
)
from bot.kernel import RuleloopError, Target
from bot.kernel.numbers import Measured
from bot.kernel.store import service as store

KEEP = dt.timedelta(days=14)  # older snapshots are forgotten
WARM_REQUESTS = 10  # requests an engine must have finished before its numbers can be normal

Numbers = Mapping[str, float | None]


Sampler = Callable[[str, Target], Awaitable[Measured]]


class ColdEngine(RuleloopError):
    """The engine has not served enough requests yet for its numbers to be its normal."""


class MetricsSampler:
    """Reads a target's numbers from its /metrics over ``window_s`` seconds."""

    def __init__(
        self,
        *,
        http: httpx.AsyncClient,
        window_s: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._http = http
        self._params = WindowParams(window_s=window_s, interval_s=min(1.0, window_s / 2))
        self._clock = clock
        self._sleep = sleep
        self.source = f"vllm_metrics {window_s:g}s"

    async def __call__(self, name: str, target: Target) -> Measured:
        """Measured the window and read the numbers (None where not measured)."""
        ctx = ProbeContext(http=self._http, monotonic=self._clock, sleep=self._sleep)
        result = await VllmMetricsProbe().run(
            target=TargetRef(name, target), params=self._params, ctx=ctx
        )
        assert result.window is not None  # the probe reads one window, or raises
        served = result.window.pages[0].total(REQUEST_SUCCESS[0]) or 0.0
        if served < WARM_REQUESTS:
            raise ColdEngine(
                f"{name} had finished {served:.0f} requests before the window: still warming "
                f"up (normal is taken once it has finished {WARM_REQUESTS})"
            )
        return Measured({key: result.readings.reading(key) for key in KEYS})


class SnapshotJob:
    """The snapshot job of one target: the snapshot is kept with the period's completion."""

    def __init__(self, *, name: str, target: Target, sample: Sampler, source: str) -> None:
        self.name = name
        self._target = target
        self._sample = sample
        self._source = source

    async def __call__(self, now: dt.datetime) -> JobOutcome:
        """Measure, and hand the runner the write that keeps the snapshot (none while the
        engine warms up)."""
        try:
            sample = await self._sample(self.name, self._target)
        except ColdEngine as cold:
            return JobOutcome(detail={"skipped": str(cold)})
        kept = sample.json()
        numbers, bounds, spans = kept["numbers"], kept["bounds"], kept["spans"]

        def write(session: Session) -> None:
            store.add_snapshot(
                session, target=self.name, at=now, source=self._source, numbers=numbers,
                bounds=bounds, spans=spans,
            )  # fmt: skip
            store.prune_snapshots(session, target=self.name, before=now - KEEP)

        detail = {"numbers": numbers, "bounds": bounds, "spans": spans}
        return JobOutcome(detail=detail, write=write)
