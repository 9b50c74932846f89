"""What probes get besides their parameters: the target, HTTP client, clocks, and shared windows.

Several probes of one runbook read the same engine window; the context samples it once and
hands every probe the same result.
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
from bot.probes.sampling import SampledWindow, sample_window
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
    _windows: dict[tuple[str, float, float], asyncio.Task[SampledWindow]] = field(
        default_factory=dict, repr=False
    )

    async def window(self, url: str, *, seconds: float, interval_s: float) -> SampledWindow:
        """The sampled window of one /metrics URL; probes asking for the same one share it."""
        key = (url, seconds, interval_s)
        if key not in self._windows:
            scraper = MetricsScraper(url, client=self.http, clock=self.monotonic)
            self._windows[key] = asyncio.ensure_future(
                sample_window(scraper, seconds=seconds, interval_s=interval_s, sleep=self.sleep)
            )
        return await asyncio.shield(self._windows[key])
