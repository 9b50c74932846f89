"""Store operations on one session: find, create and update incidents; append to the audit log.

Callers open the session with ``Database.transaction()`` so that everything one webhook or one
action changes commits together, or not at all.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from bot.kernel.store.models import (
    AdrDraft,
    Alert,
    AuditEntry,
    CanaryResult,
    Incident,
    MetricSnapshot,
    Remediation,
    SlackMessage,
)
from bot.kernel.store.states import ChangeState
from bot.kernel.store.summary import DiagnosisSummary

FIRING, RESOLVED = "firing", "resolved"


def get(session: Session, incident_id: int) -> Incident | None:
    """The incident with this id, or None."""
    return session.get(Incident, incident_id)


def find_open(session: Session, *, key: str) -> Incident | None:
    """The open incident of a group key, if any."""
    return session.scalars(select(Incident).where(Incident.open_key == key)).one_or_none()


def find_alert(session: Session, *, fingerprint: str, starts_at: str) -> Alert | None:
    """An alert instance already recorded, if any."""
    query = select(Alert).where(Alert.fingerprint == fingerprint, Alert.starts_at == starts_at)
    return session.scalars(query).one_or_none()


def create(
    session: Session,
    *,
    key: str,
    source: str,
    title: str,
    target: str | None,
    labels: Mapping[str, Any],
    at: dt.datetime,
    status: str = FIRING,
) -> Incident:
    """A new incident; open (holding its key) unless created already resolved."""
    incident = Incident(
        key=key,
        open_key=key if status == FIRING else None,
        source=source,
        status=status,
        title=title[:300],
        target=target,
        labels=dict(labels),
        opened_at=at,
        closed_at=None if status == FIRING else at,
    )
    session.add(incident)
    session.flush()
    return incident


def add_alert(
    session: Session,
    incident: Incident,
    *,
    fingerprint: str,
    starts_at: str,
    started_at: dt.datetime,
    status: str,
    ends_at: str | None,
    labels: Mapping[str, Any],
    annotations: Mapping[str, Any],
) -> Alert:
    """Record an alert instance under an incident (``started_at``: ``starts_at`` parsed)."""
    alert = Alert(
        incident=incident,
        fingerprint=fingerprint,
        starts_at=starts_at,
        started_at=started_at,
        status=status,
        ends_at=ends_at,
        labels=dict(labels),
        annotations=dict(annotations),
    )
    session.add(alert)
    session.flush()
    return alert


def close(session: Session, incident: Incident, *, at: dt.datetime) -> None:
    """Mark an incident resolved and free its group key for the next episode."""
    incident.status = RESOLVED
    incident.open_key = None
    incident.closed_at = incident.closed_at or at
    session.flush()


def head(incident: Incident) -> dict[str, Any]:
    """An incident's own fields as plain data (what every view of it starts from)."""
    return {
        "id": incident.id, "title": incident.title, "status": incident.status,
        "source": incident.source, "target": incident.target, "opened_at": incident.opened_at,
        "closed_at": incident.closed_at, "summary": incident.summary,
    }  # fmt: skip


def set_summary(session: Session, incident: Incident, *, summary: DiagnosisSummary) -> None:
    """Keep the last diagnosis's headline numbers, so the root message can be re-rendered."""
    incident.summary = summary
    session.flush()


def add_message(
    session: Session, incident: Incident, *, kind: str, channel: str, ts: str,
    thread_ts: str | None = None,
) -> SlackMessage:  # fmt: skip
    """Remember a Slack message posted for an incident."""
    message = SlackMessage(
        incident=incident, kind=kind, channel=channel, ts=ts, thread_ts=thread_ts
    )
    session.add(message)
    session.flush()
    return message


def root_message(session: Session, incident: Incident) -> SlackMessage | None:
    """The incident's root message (its thread), if one was posted."""
    query = select(SlackMessage).where(
        SlackMessage.incident_id == incident.id, SlackMessage.kind == "root"
    )
    return session.scalars(query).first()


def audit(
    session: Session,
    *,
    at: dt.datetime,
    actor: str,
    action: str,
    incident: Incident | None = None,
    detail: Mapping[str, Any] | None = None,
    note: str = "",
) -> AuditEntry:
    """Append one entry to the audit log."""
    entry = AuditEntry(
        at=at,
        incident_id=None if incident is None else incident.id,
        actor=actor,
        action=action,
        detail=dict(detail or {}),
        note=note,
    )
    session.add(entry)
    session.flush()
    return entry


def last_audit(session: Session, incident_id: int, *, action: str) -> AuditEntry | None:
    """The newest audit entry of ``action`` on the incident, if any."""
    query = (
        select(AuditEntry)
        .where(AuditEntry.incident_id == incident_id, AuditEntry.action == action)
        .order_by(AuditEntry.id.desc())
    )
    return session.scalars(query).first()


def canary_results(session: Session, incident_id: int) -> Sequence[CanaryResult]:
    """An incident's canary runs, in the order they ran."""
    query = (
        select(CanaryResult)
        .where(CanaryResult.incident_id == incident_id)
        .order_by(CanaryResult.id)
    )
    return session.scalars(query).all()


# --- scheduler: snapshots, ADRs in force, draft reminders ---------------------------------
def add_snapshot(
    session: Session,
    *,
    target: str,
    at: dt.datetime,
    source: str,
    numbers: Mapping[str, float | None],
    bounds: Mapping[str, str] | None = None,
    spans: Mapping[str, Sequence[float]] | None = None,
) -> MetricSnapshot:
    """Keep a target's numbers (by the catalogue's keys; None or a non-finite number, which
    JSON cannot hold, is kept as not measured) and how those not known exactly are known: in
    the ``bounds`` column, a bound's sign ('<=') or an estimate's span ([low, high]);
    ``bounds_of`` and ``spans_of`` read it back."""
    known: dict[str, object] = {**(bounds or {}), **{k: list(s) for k, s in (spans or {}).items()}}
    measured = {k: float(v) for k, v in numbers.items() if v is not None and math.isfinite(v)}
    snapshot = MetricSnapshot(
        target=target, at=at, source=source, numbers=measured, bounds=known or None
    )
    session.add(snapshot)
    session.flush()
    return snapshot


def recent_snapshots(session: Session, *, target: str, limit: int) -> Sequence[MetricSnapshot]:
    """A target's newest snapshots, newest first."""
    query = (
        select(MetricSnapshot)
        .where(MetricSnapshot.target == target)
        .order_by(MetricSnapshot.at.desc(), MetricSnapshot.id.desc())
        .limit(limit)
    )
    return session.scalars(query).all()


def prune_snapshots(session: Session, *, target: str, before: dt.datetime) -> int:
    """Forget a target's snapshots older than ``before``; how many went."""
    result = session.execute(
        delete(MetricSnapshot).where(MetricSnapshot.target == target, MetricSnapshot.at < before)
    )
    return int(getattr(result, "rowcount", 0) or 0)


def promoted_change(session: Session, *, target: str) -> Remediation | None:
    """The newest remediation promoted on a target (its ADR is what it runs now), if any."""
    query = (
        select(Remediation)
        .where(Remediation.target == target, Remediation.state == ChangeState.PROMOTED)
        .order_by(Remediation.updated_at.desc(), Remediation.id.desc())
        .limit(1)
    )
    return session.scalars(query).first()


def drafts_to_remind(session: Session, *, created_before: dt.datetime) -> Sequence[AdrDraft]:
    """Drafts still proposed, posted before ``created_before``, never reminded about."""
    query = (
        select(AdrDraft)
        .where(
            AdrDraft.state == "proposed",
            AdrDraft.reminded_at.is_(None),
            AdrDraft.created_at < created_before,
        )
        .order_by(AdrDraft.id)
    )
    return session.scalars(query).all()


def mark_reminded(session: Session, *, draft_id: int, at: dt.datetime) -> bool:
    """Record a draft's reminder, once: False when it was already reminded about."""
    result = session.execute(
        update(AdrDraft)
        .where(AdrDraft.id == draft_id, AdrDraft.reminded_at.is_(None))
        .values(reminded_at=at)
    )
    return bool(getattr(result, "rowcount", 0))
