"""What probes get besides their parameters: the target, HTTP client, clocks, and shared windows.

Several probes of one runbook read the same window of the target's engines; the context
samples it once and hands every probe the same result. A target whose replicas come from a
Kubernetes Service or a vllm-router has them read once, when its window starts (docs/fleet.md
"Discovery", "Behind vllm-router").
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

from bot.diagnosis.probes.exposition import Exposition
from bot.diagnosis.probes.fleet_window import FleetWindow, sample_fleet
from bot.diagnosis.probes.inference_pool import discover_pool
from bot.diagnosis.probes.kube_endpoints import discover
from bot.diagnosis.probes.replicas import Replica, replicas_of, source_of
from bot.diagnosis.probes.router_workers import discover_workers
from bot.diagnosis.probes.sampling import SAMPLED_METRICS
from bot.diagnosis.probes.vllm_metrics import MetricsScraper
from bot.kernel import Target


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
    _replicas: dict[tuple[str, ...], asyncio.Task[list[Replica]]] = field(
        default_factory=dict, repr=False
    )

    async def replicas(self, target: Target) -> list[Replica]:
        """The target's replicas, resolved once per context: its windows and the probes that
        name its replicas (the prometheus probe's ``$instances``) see the same list."""
        key = _source_key(target)
        if key not in self._replicas:
            self._replicas[key] = asyncio.ensure_future(resolve_replicas(target))
        return list(await asyncio.shield(self._replicas[key]))

    async def window(self, target: Target, *, seconds: float, interval_s: float) -> FleetWindow:
        """The sampled window of the target's replicas, merged; probes asking for the same one
        share it (and one discovery of its replicas)."""
        key = (_source_key(target), seconds, interval_s)
        if key not in self._windows:
            self._windows[key] = asyncio.ensure_future(
                self._sample(target, seconds=seconds, interval_s=interval_s)
            )
        return await asyncio.shield(self._windows[key])

    async def _sample(self, target: Target, *, seconds: float, interval_s: float) -> FleetWindow:
        # The list is read once, before the first round: every round must scrape the same
        # replicas for their deltas to line up, and a pod that leaves mid-window is said by
        # the window (it stops answering), while one that joins has no start to count from.
        replicas = await self.replicas(target)
        scrapers = {
            r: MetricsScraper(r.metrics_url, client=self.http, clock=self.monotonic)
            for r in replicas
        }

        def scrape(replica: Replica) -> Awaitable[Exposition]:
            return scrapers[replica](only=SAMPLED_METRICS)

        return await sample_fleet(
            replicas,
            scrape,
            seconds=seconds,
            interval_s=interval_s,
            sleep=self.sleep,
            clock=self.monotonic,
        )


async def resolve_replicas(target: Target) -> list[Replica]:
    """The target's replicas now: configured ones at once, a Service's or an InferencePool's
    from the Kubernetes API, a vllm-router's from its GET /workers (ProbeError when it cannot
    say: never an empty fleet)."""
    source = source_of(target)
    if source == "inference_pool":
        assert target.inference_pool is not None
        return await discover_pool(
            target.inference_pool,
            api=target.kubernetes_api,
            networks=target.kubernetes_networks,
            max_replicas=target.kubernetes_max_replicas,
        )
    if source == "router_url":
        assert target.router_url is not None
        return await discover_workers(
            target.router_url,
            networks=target.kubernetes_networks,
            max_replicas=target.kubernetes_max_replicas,
        )
    if source != "kubernetes_service":
        return replicas_of(target)
    assert target.kubernetes_service is not None
    return await discover(
        target.kubernetes_service,
        port=target.kubernetes_port,
        api=target.kubernetes_api,
        networks=target.kubernetes_networks,
        max_replicas=target.kubernetes_max_replicas,
    )


def _source_key(target: Target) -> tuple[str, ...]:
    """What names the target's replicas, as a key: windows of one fleet are one window."""
    if source_of(target) == "kubernetes_service":
        api = target.kubernetes_api
        return ("kubernetes_service", api.api_url, str(target.kubernetes_service),
                target.kubernetes_port or "")  # fmt: skip
    if source_of(target) == "inference_pool":
        return ("inference_pool", target.kubernetes_api.api_url, str(target.inference_pool))
    if source_of(target) == "router_url":
        return ("router_url", str(target.router_url))
    return tuple(r.url for r in replicas_of(target))
