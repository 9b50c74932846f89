"""Refuses a signed Slack request seen before (bolt refuses stale timestamps, not exact replays)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

WINDOW_S = 60 * 5  # Slack's own tolerance for request timestamps


class ReplayGuard:
    """Remembers (timestamp, signature) pairs for the tolerance window."""

    def __init__(
        self, *, clock: Callable[[], float] = time.time, window_s: float = WINDOW_S
    ) -> None:
        self._clock = clock
        self._window_s = window_s
        self._seen: OrderedDict[tuple[str, str], float] = OrderedDict()

    def first_time(self, *, timestamp: str, signature: str) -> bool:
        """True the first time a pair is seen; False for a replay inside the window."""
        now = self._clock()
        while self._seen and next(iter(self._seen.values())) < now - self._window_s:
            self._seen.popitem(last=False)
        key = (timestamp, signature)
        if key in self._seen:
            return False
        self._seen[key] = now
        return True
