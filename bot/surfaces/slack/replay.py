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
from enum import StrEnum

from sqlalchemy import delete
from sqlalchemy.exc import IntegrityError

from bot.kernel.store import Database, SlackReplay

WINDOW_S = 60 * 5  # Slack's own tolerance for request timestamps
DELIVERY_WINDOW_S = 60 * 30  # Slack retries a delivery 3 times, the last about 5 minutes on


class Seen(StrEnum):
    """What a signed Slack request is to the store: new, replayed, or delivered again."""

    FIRST = "first"
    REPLAYED = "replayed"
    RETRIED = "retried"


class ReplayGuard:
    """Remembers (timestamp, signature) pairs for the tolerance window, in the store."""

    def __init__(
        self, *, db: Database, clock: Callable[[], float] = time.time, window_s: float = WINDOW_S
    ) -> None:
        self._db = db
        self._clock = clock
        self._window = dt.timedelta(seconds=window_s)

    def check(self, *, timestamp: str, signature: str, body: bytes) -> Seen:
        """Whether a signed request is new (FIRST), a replay of a signed request in the window
        (REPLAYED), or Slack delivering a body again (RETRIED); both remembered at once, in
        one transaction. Of two replicas racing on one request the loser's insert fails, and
        it asks again key by key, as the winner left them."""
        signed = (_key(f"{timestamp}\n{signature}".encode()), self._window)
        delivery = (_key(b"delivery\n" + body), dt.timedelta(seconds=DELIVERY_WINDOW_S))
        try:
            if self._first(signed, delivery):
                return Seen.FIRST
        except IntegrityError:
            pass
        if not self._first(signed):
            return Seen.REPLAYED
        return Seen.FIRST if self._first(delivery) else Seen.RETRIED

    def _first(self, *keys: tuple[str, dt.timedelta]) -> bool:
        """Remember every key (with its window) when none is known yet; False when one is."""
        now = dt.datetime.fromtimestamp(self._clock(), dt.UTC)
        try:
            with self._db.transaction() as session:
                # pairs older than the window can only come with a stale timestamp (refused)
                session.execute(delete(SlackReplay).where(SlackReplay.expires_at < now))
                session.add_all(SlackReplay(key=k, expires_at=now + w) for k, w in keys)
        except IntegrityError:
            if len(keys) > 1:
                raise
            return False
        return True


def _key(text: bytes) -> str:
    return hashlib.sha256(text).hexdigest()
