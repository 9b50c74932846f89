"""Read-only queries for the incident page: plain copies of what the store holds.

Nothing here writes; each function is one read transaction that returns frozen data, so the
page never holds a session (or a lazy relationship) while it renders.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from bot.canary import CanaryReport
from bot.incidents import memory
from bot.kernel.store import AdrDraft, AuditEntry, Database, DiagnosisSummary, Incident, Remediation
from bot.kernel.store import service as store


@dataclass(frozen=True)
class AlertRow:
    """One alert instance of the incident."""

    name: str
    status: str
    starts_at: str
    summary: str


@dataclass(frozen=True)
class AuditRow:
    """One audit entry."""

    at: dt.datetime
    actor: str
    action: str
    detail: Mapping[str, Any]


@dataclass(frozen=True)
class RemediationRow:
    """One /apply-adr request and where it ended."""

    id: int
    adr_id: str
    target: str
    state: str
    requested_by: str
    approved_by: Sequence[str]
    change: Mapping[str, Any]
    before: Mapping[str, Any]
    after: Mapping[str, Any]
    result: Mapping[str, Any]
    created_at: dt.datetime
    updated_at: dt.datetime


@dataclass(frozen=True)
class CanaryRow:
    """One canary run (its full JSON report)."""

    remediation_id: int | None
    label: str
    passed: bool
    report: CanaryReport
    at: dt.datetime


@dataclass(frozen=True)
class DraftRow:
    """A post-incident ADR draft and its review."""

    adr_id: str
    state: str
    author: str
    created_at: dt.datetime
    reviewed_by: str | None
    reviewed_at: dt.datetime | None


@dataclass(frozen=True)
class IncidentRecord:
    """Everything the page shows of one incident, as the store has it."""

    id: int
    title: str
    status: str
    source: str
    target: str | None
    labels: Mapping[str, Any]
    opened_at: dt.datetime
    closed_at: dt.datetime | None
    summary: DiagnosisSummary
    alerts: Sequence[AlertRow] = field(default_factory=tuple)
    audit: Sequence[AuditRow] = field(default_factory=tuple)
    remediations: Sequence[RemediationRow] = field(default_factory=tuple)
    canaries: Sequence[CanaryRow] = field(default_factory=tuple)
    drafts: Sequence[DraftRow] = field(default_factory=tuple)
    # what the store remembers of its supported causes on the target (the thread says it too)
    memories: Sequence[memory.Memory] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        # a summary given as its stored JSON is parsed here, once
        object.__setattr__(self, "summary", DiagnosisSummary.of(self.summary))


@dataclass(frozen=True)
class IndexRow:
    """One incident in the index."""

    id: int
    title: str
    status: str
    source: str
    target: str | None
    opened_at: dt.datetime
    closed_at: dt.datetime | None
    summary: DiagnosisSummary

    def __post_init__(self) -> None:
        # a summary given as its stored JSON is parsed here, once
        object.__setattr__(self, "summary", DiagnosisSummary.of(self.summary))


def incident(db: Database, incident_id: int) -> IncidentRecord | None:
    """The incident with its alerts, audit trail, remediations, canary runs and drafts."""
    with db.transaction() as s:
        row = store.get(s, incident_id)
        if row is None:
            return None
        alerts = tuple(
            AlertRow(
                name=str(a.labels.get("alertname", "alert")),
                status=a.status,
                starts_at=a.starts_at,
                summary=str(a.annotations.get("summary") or a.annotations.get("description") or ""),
            )
            for a in row.alerts
        )
        audit = tuple(
            AuditRow(e.at, e.actor, e.action, dict(e.detail or {}))
            for e in s.scalars(
                select(AuditEntry)
                .where(AuditEntry.incident_id == incident_id)
                .order_by(AuditEntry.at, AuditEntry.id)
            )
        )
        remediations = tuple(
            RemediationRow(
                id=r.id,
                adr_id=r.adr_id,
                target=r.target,
                state=r.state,
                requested_by=r.requested_by,
                approved_by=tuple(r.approved_by or ()),
                change=dict(r.change or {}),
                before=dict(r.before or {}),
                after=dict(r.after or {}),
                result=dict(r.result or {}),
                created_at=r.created_at,
                updated_at=r.updated_at,
            )  # fmt: skip
            for r in s.scalars(
                select(Remediation)
                .where(Remediation.incident_id == incident_id)
                .order_by(Remediation.id)
            )
        )
        canaries = tuple(
            CanaryRow(c.remediation_id, c.label, c.passed, CanaryReport.of(c.report), c.at)
            for c in store.canary_results(s, incident_id)
        )
        drafts = tuple(
            DraftRow(d.adr_id, d.state, d.author, d.created_at, d.reviewed_by, d.reviewed_at)
            for d in s.scalars(
                select(AdrDraft).where(AdrDraft.incident_id == incident_id).order_by(AdrDraft.id)
            )
        )
        remembered = tuple(memory.recall(s, row, row.summary))
        return IncidentRecord(
            **store.head(row), labels=dict(row.labels or {}), alerts=alerts, audit=audit,
            remediations=remediations, canaries=canaries, drafts=drafts, memories=remembered,
        )  # fmt: skip


def summary(db: Database, incident_id: int) -> DiagnosisSummary | None:
    """Only the incident's diagnosis summary (what the chart is drawn from)."""
    with db.transaction() as s:
        return s.scalar(select(Incident.summary).where(Incident.id == incident_id))


def recent(db: Database, *, limit: int = 200) -> list[IndexRow]:
    """The newest incidents first."""
    with db.transaction() as s:
        rows = s.scalars(select(Incident).order_by(Incident.id.desc()).limit(limit)).all()
        return [IndexRow(**store.head(r)) for r in rows]
