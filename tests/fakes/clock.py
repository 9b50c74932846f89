"""A clock that only moves when the code under test sleeps."""

from __future__ import annotations


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
