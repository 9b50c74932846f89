"""A few numbers from the shared store that the bot's /metrics serves at each scrape: the
outbox's backlog and the remediations whose rollback failed (``bot.kernel.runtime.metrics`` exposes
them; every replica reports the same store, so alerts take ``max`` over them)."""

from __future__ import annotations

import dataclasses
import datetime as dt

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from bot.kernel.store import outbox
from bot.kernel.store.models import AuditEntry, OutboxItem

ROLLBACK_FAILED = "remediation.rollback_failed"  # written by a change's run or a tuning session


@dataclasses.dataclass(frozen=True)
class StoreReading:
    """What the shared store says at one scrape."""

    pending: int  # Slack messages owed
    failed: int  # Slack messages refused for good (kept two weeks)
    oldest_pending_s: float  # age of the oldest owed message; 0 with none
    rollbacks_failed: int  # remediations whose rollback failed, ever (the audit log's count)


def read_store(session: Session, *, now: dt.datetime) -> StoreReading:
    """The store's numbers for /metrics, in one session."""
    owed = outbox.counts(session)
    oldest = session.scalar(
        select(func.min(OutboxItem.created_at)).where(
            OutboxItem.kind.in_(outbox.MESSAGES), OutboxItem.state == outbox.PENDING
        )
    )
    if oldest is not None and oldest.tzinfo is None:  # SQLite drops the zone in aggregates
        oldest = oldest.replace(tzinfo=dt.UTC)
    rollbacks = session.scalar(
        select(func.count()).select_from(AuditEntry).where(AuditEntry.action == ROLLBACK_FAILED)
    )
    return StoreReading(
        pending=owed["pending"],
        failed=owed["failed"],
        oldest_pending_s=max((now - oldest).total_seconds(), 0.0) if oldest else 0.0,
        rollbacks_failed=int(rollbacks or 0),
    )
