"""A clock that only moves when the code under test sleeps."""

from __future__ import annotations

import datetime as dt


class FakeTime:
    """``clock()`` returns the fake time; ``await sleep(d)`` advances it by d at once."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class WallClock:
    """An aware UTC wall clock that moves only when told (``advance``)."""

    def __init__(self, start: dt.datetime | None = None) -> None:
        self.at = start or dt.datetime(2026, 11, 29, 2, 0, tzinfo=dt.UTC)

    def now(self) -> dt.datetime:
        return self.at

    def advance(self, seconds: float) -> None:
        self.at += dt.timedelta(seconds=seconds)
