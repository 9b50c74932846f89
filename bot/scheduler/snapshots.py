"""Four-metric snapshots: a target's TTFT, TPOT, goodput and KV fragmentation every few minutes.

The numbers come from the engine's own /metrics over a short window, read by the runbooks'
``vllm_metrics`` probe, so a snapshot and a diagnosis measure the same way. Diagnoses show the
median of the newest snapshots as "normal" next to "now".
"""

from __future__ import annotations

import asyncio
import datetime as dt
import statistics
import time
from collections.abc import Awaitable, Callable, Mapping

import httpx
from sqlalchemy.orm import Session

from bot.config import Target
from bot.diagnosis.models import FOUR
from bot.probes.context import ProbeContext, TargetRef
from bot.probes.vllm_window import VllmMetricsProbe, WindowParams
from bot.scheduler.runner import Outcome
from bot.store import service as store
from bot.store.db import Database

KEYS = tuple(key for key, *_ in FOUR)
KEEP = dt.timedelta(days=14)  # older snapshots are forgotten

Numbers = Mapping[str, float | None]
Sampler = Callable[[str, Target], Awaitable[Numbers]]


class MetricsSampler:
    """Reads the four numbers of a target from its /metrics over ``window_s`` seconds."""

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

    async def __call__(self, name: str, target: Target) -> Numbers:
        """Sample the window and read the four numbers (None where not measured)."""
        ctx = ProbeContext(http=self._http, clock=self._clock, sleep=self._sleep)
        result = await VllmMetricsProbe().run(
            target=TargetRef(name, target), params=self._params, ctx=ctx
        )
        return {key: result.readings.get(key) for key in KEYS}


class SnapshotJob:
    """The snapshot job of one target: the snapshot is kept with the period's completion."""

    def __init__(self, *, name: str, target: Target, sample: Sampler, source: str) -> None:
        self.name = name
        self._target = target
        self._sample = sample
        self._source = source

    async def __call__(self, now: dt.datetime) -> Outcome:
        """Measure, and hand the runner the write that keeps the snapshot."""
        numbers = dict(await self._sample(self.name, self._target))

        def write(session: Session) -> None:
            store.add_snapshot(
                session, target=self.name, at=now, source=self._source, numbers=numbers
            )
            store.prune_snapshots(session, target=self.name, before=now - KEEP)

        return Outcome(detail={"numbers": numbers}, write=write)


class NormalReader:
    """ "Normal" for a target: the median of each number over its newest snapshots."""

    def __init__(self, *, db: Database, last: int) -> None:
        self._db = db
        self._last = last

    async def __call__(self, target: str) -> dict[str, float | None]:
        """Median per number over the newest ``last`` snapshots (empty: no snapshot yet)."""

        def read() -> dict[str, float | None]:
            with self._db.transaction() as s:
                snapshots = store.recent_snapshots(s, target=target, limit=self._last)
                if not snapshots:
                    return {}
                normal: dict[str, float | None] = {}
                for key in KEYS:
                    values = [v for v in (getattr(x, key) for x in snapshots) if v is not None]
                    normal[key] = statistics.median(values) if values else None
                return normal

        return await asyncio.to_thread(read)
