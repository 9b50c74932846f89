"""Which engine process answered a scrape, and what one URL's answers over a window say.

A vLLM /metrics page carries prometheus_client's process collector
(``process_start_time_seconds``, to 10 ms) and, for each engine it serves (the ``engine`` label
of data-parallel engines in one server), the creation time of its counters
(``vllm:generation_tokens_created``, to the microsecond). Together they name the process: a
page with other values came from another process, a restart or another engine behind the URL.
Counter deltas are only taken between pages of the same process (docs/fleet.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from bot.diagnosis.probes.exposition import Exposition

PROCESS_START = "process_start_time_seconds"
ENGINE_CREATED = "vllm:generation_tokens_created"
IDENTITY_METRICS = frozenset({PROCESS_START, ENGINE_CREATED})


@dataclass(frozen=True)
class EngineIdentity:
    """One server process: when it started, and when each of its engines' counters were made."""

    started: float  # seconds since the epoch (the earliest engine's counters without a process)
    engines: tuple[float, ...]

    def __str__(self) -> str:
        return f"process started at {self.started:.2f}"


def identity_of(page: Exposition) -> EngineIdentity | None:
    """The process that served the page; None when the page exposes neither metric."""
    starts = [value for _, value in page.samples.get(PROCESS_START, [])]
    engines = tuple(sorted(value for _, value in page.samples.get(ENGINE_CREATED, [])))
    if not starts and not engines:
        return None
    return EngineIdentity(started=min(starts) if starts else engines[0], engines=engines)


@dataclass(frozen=True)
class Processes:
    """The processes one URL answered from over a window, in the order they first answered."""

    order: tuple[EngineIdentity | None, ...]
    interleaved: bool  # one answered again after another had: both were serving

    @property
    def several_engines(self) -> bool:
        """Whether more than one engine serves the URL: their answers interleave, or a later
        one started before the one it followed (a restart starts a newer process)."""
        return self.interleaved or any(
            a is not None and b is not None and b.started <= a.started
            for a, b in pairwise(self.order)
        )

    @property
    def restarted(self) -> bool:
        """Whether the URL's one engine was replaced inside the window."""
        return len(self.order) > 1 and not self.several_engines


def processes(identities: Sequence[EngineIdentity | None]) -> Processes:
    """What a URL's consecutive answers say about the processes behind it."""
    order: list[EngineIdentity | None] = []
    interleaved = False
    for previous, current in zip([None, *identities], identities, strict=False):
        if order and current == previous:
            continue
        interleaved = interleaved or current in order
        if current not in order:
            order.append(current)
    return Processes(order=tuple(order), interleaved=interleaved)


def several_engines_message(url: str, count: int) -> str:
    """What is said when one URL answers from more than one engine."""
    return (
        f"{url} answers from {count} engines (its scrapes came from {count} different "
        "processes), so no number of its /metrics is the target's: list the replicas "
        "(replicas = [...]) or give each replica's URL (docs/fleet.md)"
    )
