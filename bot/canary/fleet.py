"""The canary's engine column over a fleet: every replica's /metrics scraped at once, merged.

A Service's /metrics answers from one pod, which sees about 1/N of the canary's tokens; with
the replicas listed (``--replica``) each is scraped in the same rounds and the window is read
with the fleet code the bot diagnoses with (bot/diagnosis/probes/fleet_window.py), so restarts and
unanswered scrapes are said, never read as zero work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import httpx

from bot.diagnosis.probes import (
    IDENTITY_METRICS,
    WINDOW_METRICS,
    Answer,
    Exposition,
    FleetWindow,
    Member,
    MetricsScraper,
    Replica,
    fleet_of,
    merge_rounds,
)
from bot.kernel import EndpointError, RuleloopError

Round = tuple[list[Answer], float]  # every replica's answer, and when


class FleetScraper:
    """Called like a MetricsScraper: scrapes every replica and returns their pages merged;
    ``last`` keeps that round's answers, so a window can be read per process (``window``)."""

    def __init__(self, urls: Sequence[str], *, client: httpx.AsyncClient) -> None:
        self.replicas = [Replica(url.rstrip("/")) for url in urls]
        self._scrapers = [MetricsScraper(r.metrics_url, client=client) for r in self.replicas]
        self.url = ", ".join(r.metrics_url for r in self.replicas)
        self.last: Round | None = None

    async def __call__(self, *, only: frozenset[str] | None = WINDOW_METRICS) -> Exposition:
        """All replicas' pages of one round, merged; EndpointError when none answered."""

        # Which process answered: deltas are never taken across a restart.
        wanted = None if only is None else only | IDENTITY_METRICS

        async def one(scrape: MetricsScraper) -> Answer:
            try:
                return await scrape(only=wanted)
            except RuleloopError as exc:
                return exc

        answers = list(await asyncio.gather(*(one(s) for s in self._scrapers)))
        pages = [a for a in answers if isinstance(a, Exposition)]
        if not pages:
            raise EndpointError("no replica answered: " + "; ".join(str(a) for a in answers))
        at = max(p.at for p in pages)
        self.last = (answers, at)
        members = [
            Member(labels={"replica": r.address}, pages={0: a})
            for r, a in zip(self.replicas, answers, strict=True)
            if isinstance(a, Exposition)
        ]
        return merge_rounds(members, [at])[0]

    def window(self, before: Round, after: Round) -> FleetWindow:
        """The fleet's window between two rounds (deltas within each process, then summed)."""
        return fleet_of(self.replicas, [before[0], after[0]], [before[1], after[1]])
