"""Refuses a signed Slack request seen before (bolt refuses stale timestamps, not exact replays),
and lets a request Slack delivers again (``X-Slack-Retry-Num``) act once.

What was seen is kept in the store (``slack_replays``), not in the process: with several
replicas behind one Service, a request replayed to another replica is refused there too. The
key is unique, so of two replicas receiving the same request at once exactly one inserts it.

A retried delivery is signed anew (a new timestamp) but carries the very same body; every
slash command and click body is unique (``trigger_id``, ``action_ts``), so the body's hash
names the delivery, and the retry is acknowledged without acting twice.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import time
from collections.abc import Callable

from sqlalchemy import delete
from sqlalchemy.exc import IntegrityError

from bot.store.db import Database
from bot.store.models import SlackReplay

WINDOW_S = 60 * 5  # Slack's own tolerance for request timestamps
DELIVERY_WINDOW_S = 60 * 30  # Slack retries a delivery 3 times, the last about 5 minutes on


class ReplayGuard:
    """Remembers (timestamp, signature) pairs for the tolerance window, in the store."""

    def __init__(
        self, *, db: Database, clock: Callable[[], float] = time.time, window_s: float = WINDOW_S
    ) -> None:
        self._db = db
        self._clock = clock
        self._window = dt.timedelta(seconds=window_s)

    def first_time(self, *, timestamp: str, signature: str) -> bool:
        """True the first time a pair is seen by any replica; False for a replay in the window."""
        key = hashlib.sha256(f"{timestamp}\n{signature}".encode()).hexdigest()
        return self._first(key, self._window)

    def first_delivery(self, body: bytes) -> bool:
        """True the first time a request body is seen; False for Slack's retry of it."""
        key = hashlib.sha256(b"delivery\n" + body).hexdigest()
        return self._first(key, dt.timedelta(seconds=DELIVERY_WINDOW_S))

    def _first(self, key: str, window: dt.timedelta) -> bool:
        now = dt.datetime.fromtimestamp(self._clock(), dt.UTC)
        try:
            with self._db.transaction() as session:
                # pairs older than the window can only come with a stale timestamp (refused)
                session.execute(delete(SlackReplay).where(SlackReplay.expires_at < now))
                session.add(SlackReplay(key=key, expires_at=now + window))
        except IntegrityError:
            return False
        return True
