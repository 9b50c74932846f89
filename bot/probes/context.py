"""What probes get besides their parameters: the target, HTTP client, clocks, and shared windows.

Several probes of one runbook read the same window of the target's engines; the context
samples it once and hands every probe the same result.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import httpx

from bot.config import Target
from bot.probes.exposition import Exposition
from bot.probes.fleet_window import FleetWindow, sample_fleet
from bot.probes.replicas import Replica, replicas_of
from bot.probes.sampling import SAMPLED_METRICS
from bot.probes.vllm_metrics import MetricsScraper


@dataclass(frozen=True)
class TargetRef:
    """A configured target and its name."""

    name: str
    target: Target


@dataclass
class ProbeContext:
    """Injected seams for probes: nothing here reads the real clock or network unless given it."""

    http: httpx.AsyncClient
    monotonic: Callable[[], float] = time.monotonic  # seconds, for windows and intervals
    wall_clock: Callable[[], float] = time.time  # seconds since the epoch, as Prometheus has
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    nvml: ModuleType | Any | None = None  # None: import pynvml when the nvml probe runs
    hostname: str = field(default_factory=socket.gethostname)
    _windows: dict[tuple[tuple[str, ...], float, float], asyncio.Task[FleetWindow]] = field(
        default_factory=dict, repr=False
    )

    async def window(self, target: Target, *, seconds: float, interval_s: float) -> FleetWindow:
        """The sampled window of the target's replicas, merged; probes asking for the same one
        share it."""
        replicas = replicas_of(target)
        key = (tuple(r.url for r in replicas), seconds, interval_s)
        if key not in self._windows:
            scrapers = {
                r: MetricsScraper(r.metrics_url, client=self.http, clock=self.monotonic)
                for r in replicas
            }

            def scrape(replica: Replica) -> Awaitable[Exposition]:
                return scrapers[replica](only=SAMPLED_METRICS)

            self._windows[key] = asyncio.ensure_future(
                sample_fleet(
                    replicas,
                    scrape,
                    seconds=seconds,
                    interval_s=interval_s,
                    sleep=self.sleep,
                    clock=self.monotonic,
                )  # fmt: skip
            )
        return await asyncio.shield(self._windows[key])
