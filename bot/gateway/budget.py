"""The in-flight token budget: admit a request only while its cost fits under the limit.

State lives on the instance and changes only on the event loop's thread, so no lock is needed.
Every admitted cost must be released exactly once; the app does it in a ``finally``.
"""

from __future__ import annotations


class TokenBudget:
    """Tokens admitted and not yet released, against a limit (0 means unlimited)."""

    def __init__(self, limit: int = 0) -> None:
        self.limit = limit
        self.in_flight_tokens = 0
        self.in_flight_requests = 0

    def fits_at_all(self, cost: int) -> bool:
        """Whether ``cost`` could ever be admitted under the current limit."""
        return self.limit <= 0 or cost <= self.limit

    def try_admit(self, cost: int) -> bool:
        """Admit ``cost`` if it fits now; return whether it was admitted."""
        if self.limit > 0 and self.in_flight_tokens + cost > self.limit:
            return False
        self.in_flight_tokens += cost
        self.in_flight_requests += 1
        return True

    def release(self, cost: int) -> None:
        """Give back what ``try_admit`` took."""
        self.in_flight_tokens -= cost
        self.in_flight_requests -= 1
