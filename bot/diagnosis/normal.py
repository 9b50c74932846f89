"""A target's "normal": the median of each number over its newest snapshots.

The scheduler's snapshot job (``bot.app.scheduler.snapshots``) takes the snapshots; the diagnosis
shows normal beside "now" and ADR conditions written ``3x normal`` multiply it. Both read it
here, below them, through one reader.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Awaitable, Callable

from bot.kernel.numbers import Bound, Measured, Reading, bounds_of, catalogue, spans_of
from bot.kernel.store import Database
from bot.kernel.store import service as store

KEYS = catalogue.NORMAL_KEYS  # the numbers a snapshot keeps
# What reads a target's normal: the target's name in, its numbers with bounds and spans out.
ReadNormal = Callable[[str], Awaitable[Measured]]


class NormalReader:
    """ "Normal" for a target: the median of each number over its newest snapshots."""

    def __init__(self, *, db: Database, last: int) -> None:
        self._db = db
        self._last = last

    async def read(self, target: str) -> Measured:
        """The medians, which of them are only bounds (a bound in the middle makes one), and
        the spans of estimates (the medians of their ends: the median of values that each lie
        within their span lies within them)."""

        def read() -> Measured:
            with self._db.transaction() as s:
                snapshots = store.recent_snapshots(s, target=target, limit=self._last)
                normal: dict[str, Reading | None] = {}
                for key in KEYS if snapshots else ():
                    # a snapshot keeps only what it measured (``store.add_snapshot``)
                    taken = [(x.numbers[key], x.bounds) for x in snapshots if key in x.numbers]
                    value, bound = median([(v, bounds_of(b).get(key)) for v, b in taken])
                    span = median_span([(v, spans_of(b).get(key)) for v, b in taken])
                    normal[key] = None if value is None else Reading(value, bound, span)
                return Measured(normal)

        return await asyncio.to_thread(read)


def median_span(
    values: list[tuple[float, tuple[float, float] | None]],
) -> tuple[float, float] | None:
    """The span of the median of numbers some of which are estimates: the medians of their low
    and high ends, a known number counting as its own span (None: none was an estimate)."""
    if all(span is None for _, span in values):
        return None
    ends = [span or (value, value) for value, span in values]
    return statistics.median(lo for lo, _ in ends), statistics.median(hi for _, hi in ends)


def median(values: list[tuple[float, Bound | None]]) -> tuple[float | None, Bound | None]:
    """The median of numbers some of which are bounds: a bound when a middle one is (both
    ways at once: unknown)."""
    if not values:
        return None, None
    ordered = sorted(values, key=lambda pair: pair[0])
    n = len(ordered)
    middle = ordered[(n - 1) // 2 : n // 2 + 1]
    kinds = {bound for _, bound in middle if bound is not None}
    if len(kinds) > 1:
        return None, None
    return statistics.median(v for v, _ in ordered), next(iter(kinds), None)
