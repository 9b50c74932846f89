"""Reads of the store only tests make: the whole audit log, every incident and every owed
Slack item, in order."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from bot.kernel.store.models import ActionToken, AuditEntry, Incident, OutboxItem


def audit_trail(session: Session, *, incident_id: int | None = None) -> Sequence[AuditEntry]:
    """Audit entries in the order written, optionally those of one incident."""
    query = select(AuditEntry).order_by(AuditEntry.id)
    if incident_id is not None:
        query = query.where(AuditEntry.incident_id == incident_id)
    return session.scalars(query).all()


def incidents(session: Session) -> Sequence[Incident]:
    """All incidents, oldest first."""
    return session.scalars(select(Incident).order_by(Incident.id)).all()


def outbox(session: Session) -> Sequence[OutboxItem]:
    """Every Slack item owed, oldest first."""
    return session.scalars(select(OutboxItem).order_by(OutboxItem.id)).all()


def tokens(session: Session) -> Sequence[ActionToken]:
    """Every button the bot issued, in the order issued."""
    return session.scalars(select(ActionToken).order_by(ActionToken.id)).all()
