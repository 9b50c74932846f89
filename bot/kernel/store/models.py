"""Tables of the incident store (SQLAlchemy 2.x declarative models).

An incident is one Alertmanager group episode (or one /diagnose run). ``open_key`` holds the
group key while the incident is open and NULL once closed: its unique constraint is what keeps
two replicas, or two racing webhooks, from opening the same group twice. An alert instance is
(fingerprint, startsAt): unique, so a retried or repeated notification can never add it twice.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from bot.kernel.store.states import HOLDS, ChangeKind
from bot.kernel.store.summary import DiagnosisSummary, SummaryColumn


class UTCDateTime(TypeDecorator[dt.datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite drops the zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        """Refuse naive datetimes; store UTC."""
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store; pass an aware UTC time")
        return value.astimezone(dt.UTC)

    def process_result_value(
        self, value: dt.datetime | None, dialect: Dialect
    ) -> dt.datetime | None:
        """Read back as aware UTC (SQLite returns naive values)."""
        if value is None:
            return None
        return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


class Base(DeclarativeBase):
    """Declarative base of the store's tables."""

    type_annotation_map = {dt.datetime: UTCDateTime, dict[str, Any]: JSON}


class Incident(Base):
    """One incident: an alert group's firing episode, or a manual /diagnose."""

    __tablename__ = "incidents"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(512), index=True)
    open_key: Mapped[str | None] = mapped_column(String(512), unique=True)
    source: Mapped[str] = mapped_column(String(32))  # alertmanager | slash
    status: Mapped[str] = mapped_column(String(16))  # firing | resolved
    title: Mapped[str] = mapped_column(String(300))
    target: Mapped[str | None] = mapped_column(String(200))
    labels: Mapped[dict[str, Any]] = mapped_column(default=dict)
    opened_at: Mapped[dt.datetime]
    closed_at: Mapped[dt.datetime | None]
    summary: Mapped[DiagnosisSummary] = mapped_column(
        SummaryColumn, default=DiagnosisSummary
    )  # the last diagnosis, for re-renders
    acknowledged_by: Mapped[str | None] = mapped_column(String(64))  # the thread's button
    acknowledged_at: Mapped[dt.datetime | None]

    alerts: Mapped[list[Alert]] = relationship(back_populates="incident", order_by="Alert.id")
    messages: Mapped[list[SlackMessage]] = relationship(
        back_populates="incident", order_by="SlackMessage.id"
    )


class Alert(Base):
    """One alert instance of an incident, as Alertmanager identifies it."""

    __tablename__ = "alerts"
    __table_args__ = (UniqueConstraint("fingerprint", "starts_at", name="uq_alert_instance"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    incident_id: Mapped[int] = mapped_column(ForeignKey("incidents.id"), index=True)
    fingerprint: Mapped[str] = mapped_column(String(64))
    starts_at: Mapped[str] = mapped_column(String(64))  # exactly as Alertmanager sent it
    # the time it says, parsed at intake; None for alerts stored before migration 0013
    started_at: Mapped[dt.datetime | None]
    status: Mapped[str] = mapped_column(String(16))
    ends_at: Mapped[str | None] = mapped_column(String(64))
    labels: Mapped[dict[str, Any]] = mapped_column(default=dict)
    annotations: Mapped[dict[str, Any]] = mapped_column(default=dict)

    incident: Mapped[Incident] = relationship(back_populates="alerts")


class SlackMessage(Base):
    """A message the bot posted for an incident; the root one carries the thread."""

    __tablename__ = "slack_messages"
    __table_args__ = (UniqueConstraint("channel", "ts", name="uq_slack_message"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    incident_id: Mapped[int] = mapped_column(ForeignKey("incidents.id"), index=True)
    kind: Mapped[str] = mapped_column(String(16))  # root | reply | chart
    channel: Mapped[str] = mapped_column(String(64))
    ts: Mapped[str] = mapped_column(String(32))
    thread_ts: Mapped[str | None] = mapped_column(String(32))

    incident: Mapped[Incident] = relationship(back_populates="messages")


class AuditEntry(Base):
    """One action, written before the next step starts; rows are never updated or deleted."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[dt.datetime]
    incident_id: Mapped[int | None] = mapped_column(ForeignKey("incidents.id"), index=True)
    actor: Mapped[str] = mapped_column(String(200))
    action: Mapped[str] = mapped_column(String(64))
    detail: Mapped[dict[str, Any]] = mapped_column(default=dict)
    note: Mapped[str] = mapped_column(Text, default="")


# A change in one of the HOLDS states (bot.kernel.store.states) holds its target: no second change
# of any kind may be pending or running there (the partial unique index below is what two racing
# requests run into, whatever their kinds).
_HOLDS_SQL = "state IN (" + ", ".join(f"'{state}'" for state in HOLDS) + ")"


class Change(Base):
    """One change to a target, of any kind (``kind``: bot.kernel.store.states.ChangeKind), and
    where it stands; the audit log holds each step's history.

    ``before`` is what served before the change (the actuator's record, enough to restore it
    exactly). ``runner`` is the run that works on it and ``heartbeat_at`` when that run last
    said so, on the database's clock: a change whose heartbeat is stale is taken over (a
    remediation rolled back, a tuning session restored) by the next bot. One table for every
    kind (single-table inheritance: Remediation, TuneSession, DriftBeforeRun), so one unique
    index holds a target and one query says who holds it (bot.change.exclusion).
    """

    __tablename__ = "changes"
    __table_args__ = (
        Index(
            "uq_changes_holding_target",
            "target",
            unique=True,
            sqlite_where=text(_HOLDS_SQL),
            postgresql_where=text(_HOLDS_SQL),
        ),
    )
    # every kind's columns loaded with the row, so a change read as Change is whole when detached
    __mapper_args__ = {"polymorphic_on": "kind", "with_polymorphic": "*"}

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(24), index=True)
    target: Mapped[str] = mapped_column(String(200))
    state: Mapped[str] = mapped_column(String(16), index=True)
    requested_by: Mapped[str] = mapped_column(String(64))
    approved_by: Mapped[list[str]] = mapped_column(JSON, default=list)
    before: Mapped[dict[str, Any]] = mapped_column(default=dict)
    result: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[dt.datetime]
    updated_at: Mapped[dt.datetime]
    # the run working on it (host:pid:random): every step it writes is conditional on still
    # being this runner, so a run another replica took over stops at its next step
    runner: Mapped[str | None] = mapped_column(String(200))
    heartbeat_at: Mapped[dt.datetime | None]  # the database's clock (bot.kernel.store.dbtime)


class Remediation(Change):
    """One /apply-adr request (``kind`` remediation).

    ``state`` moves pending -> approved -> applying -> canary -> (promoted | rolling_back ->
    rolled_back) or ends refused / expired / failed. ``after`` holds the flags it asked for.
    Its own columns are nullable in ``changes`` (other kinds leave them empty); a remediation
    always sets them.
    """

    __mapper_args__ = {"polymorphic_identity": ChangeKind.REMEDIATION.value}

    incident_id: Mapped[int] = mapped_column(ForeignKey("incidents.id"), index=True, nullable=True)
    adr_id: Mapped[str] = mapped_column(String(32), nullable=True)
    approvals_needed: Mapped[int] = mapped_column(Integer, nullable=True)
    change: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict, nullable=True)
    after: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict, nullable=True)
    channel: Mapped[str | None] = mapped_column(String(64))  # the progress message
    ts: Mapped[str | None] = mapped_column(String(32))
    # the Alertmanager silence of the change (bot.remediation.silences): id, URL, end, and
    # "expired" once it was; kept so a run that died leaves no silence behind (the sweep)
    silence: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))


class TuneSession(Change):
    """One `ruleloop tune --target` session (``kind`` tuning): who asked and approved it and
    the plan it searches.

    ``state`` moves running -> restoring -> restored, or ends failed (the restore did not
    work: manual action). ``trial`` is the trial in progress (its number, flags and phase), so
    a bot that finds the session silent knows what it is restoring from. A session silent past
    ``[remediation] stale_after_s`` is restored by the next bot or `ruleloop tune --restore`,
    as a stopped remediation is rolled back.
    """

    __mapper_args__ = {"polymorphic_identity": ChangeKind.TUNING.value}

    plan: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict, nullable=True)
    trial: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict, nullable=True)


class DriftBeforeRun(TuneSession):
    """The drift job's before-run of an in-force ADR (``kind`` drift_before_run): the flags its
    change replaced put back on the canary stage for one canary run, then restored. Held,
    heartbeaten and restored exactly as a tuning session is (bot.app.scheduler.before_run)."""

    __mapper_args__ = {"polymorphic_identity": ChangeKind.DRIFT_BEFORE_RUN.value}


class ActionToken(Base):
    """A single-use button: approve, deny, accept or reject; used at most once, until it expires.

    Claiming is one conditional UPDATE (``used_at IS NULL AND expires_at > now``), so a double
    click, or the same click delivered to two replicas, acts once.
    """

    __tablename__ = "action_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    token: Mapped[str] = mapped_column(String(64), unique=True)
    kind: Mapped[str] = mapped_column(String(16))  # approve | deny | accept | reject
    subject: Mapped[str] = mapped_column(String(64))  # "remediation:12" | "draft:ADR-..."
    incident_id: Mapped[int | None] = mapped_column(ForeignKey("incidents.id"), index=True)
    created_at: Mapped[dt.datetime]
    expires_at: Mapped[dt.datetime | None]
    used_at: Mapped[dt.datetime | None]
    used_by: Mapped[str | None] = mapped_column(String(64))


class CanaryResult(Base):
    """One canary run of an incident (baseline or after a change): its full JSON report."""

    __tablename__ = "canary_results"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    incident_id: Mapped[int] = mapped_column(ForeignKey("incidents.id"), index=True)
    remediation_id: Mapped[int | None] = mapped_column(ForeignKey("changes.id"))
    label: Mapped[str] = mapped_column(String(200))  # the matrix row's config cell
    passed: Mapped[bool]
    report: Mapped[dict[str, Any]] = mapped_column(default=dict)
    at: Mapped[dt.datetime]


class AdrDraft(Base):
    """A post-incident ADR draft posted for review; ``state`` proposed -> accepted | rejected."""

    __tablename__ = "adr_drafts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    adr_id: Mapped[str] = mapped_column(String(32), unique=True)
    incident_id: Mapped[int] = mapped_column(ForeignKey("incidents.id"), index=True)
    path: Mapped[str] = mapped_column(String(500))
    author: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16), index=True)
    created_at: Mapped[dt.datetime]
    reviewed_at: Mapped[dt.datetime | None]
    reviewed_by: Mapped[str | None] = mapped_column(String(64))
    reminded_at: Mapped[dt.datetime | None]
    channel: Mapped[str | None] = mapped_column(String(64))  # the posted summary
    ts: Mapped[str | None] = mapped_column(String(32))


class AdrRecord(Base):
    """One decision record as every replica sees it: its Markdown text and where it belongs.

    ``name`` is its file name and ``draft`` whether it lives in ``drafts/`` when written out
    (``ruleloop adr export``). ``version`` grows with each change, so a change made on a stale
    read changes nothing. ``synced_sha`` is the text the store and the ADR directory last agreed
    on: the file wins while the store has not changed since (bot.adr.sync says when).
    """

    __tablename__ = "adr_records"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    adr_id: Mapped[str] = mapped_column(String(32), unique=True)
    name: Mapped[str] = mapped_column(String(200))
    draft: Mapped[bool]
    status: Mapped[str] = mapped_column(String(16), index=True)
    text: Mapped[str] = mapped_column(Text)
    sha: Mapped[str] = mapped_column(String(64))
    version: Mapped[int] = mapped_column(Integer)
    synced_sha: Mapped[str | None] = mapped_column(String(64))
    source: Mapped[str] = mapped_column(String(16))  # file | slack | bot: who wrote this version
    updated_by: Mapped[str] = mapped_column(String(200))
    updated_at: Mapped[dt.datetime]


class AdrRevision(Base):
    """Every version a decision record has had (imported, drafted, reviewed); never changed."""

    __tablename__ = "adr_revisions"
    __table_args__ = (UniqueConstraint("adr_id", "version", name="uq_adr_revision"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    adr_id: Mapped[str] = mapped_column(String(32), index=True)
    version: Mapped[int] = mapped_column(Integer)
    sha: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))
    source: Mapped[str] = mapped_column(String(16))
    actor: Mapped[str] = mapped_column(String(200))
    at: Mapped[dt.datetime]
    note: Mapped[str] = mapped_column(Text, default="")
    text: Mapped[str] = mapped_column(Text)


class MetricSnapshot(Base):
    """A target's numbers at one time, taken by the scheduler ("normal" in diagnoses)."""

    __tablename__ = "metric_snapshots"
    __table_args__ = (Index("ix_metric_snapshots_target_at", "target", "at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    target: Mapped[str] = mapped_column(String(200))
    at: Mapped[dt.datetime]
    # by the catalogue's keys: {"ttft_p99_ms": 41.3} (a key missing: not measured), so a new
    # number needs no migration
    numbers: Mapped[dict[str, float]] = mapped_column(JSON, default=dict)
    source: Mapped[str] = mapped_column(String(64))  # what measured it: "vllm_metrics 10s"
    # the numbers that are only bounds: {"tpot_p99_ms": "<="} (null: all known)
    bounds: Mapped[dict[str, str] | None] = mapped_column(JSON, nullable=True)


class JobRun(Base):
    """One period of one scheduled job, and the replica that holds (or held) its lease.

    (job, period) is unique, so only one replica can claim a period. A running row whose
    ``expires_at`` passed belongs to a replica that died (or stalled): another takes it over.
    ``finished_at`` set means the period is done and is never run again.
    """

    __tablename__ = "job_runs"
    __table_args__ = (UniqueConstraint("job", "period", name="uq_job_run_period"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job: Mapped[str] = mapped_column(String(200))
    period: Mapped[dt.datetime]
    owner: Mapped[str] = mapped_column(String(200))
    state: Mapped[str] = mapped_column(String(16))  # running | done | failed | abandoned
    attempts: Mapped[int] = mapped_column(Integer, default=1)
    claimed_at: Mapped[dt.datetime]
    expires_at: Mapped[dt.datetime]
    finished_at: Mapped[dt.datetime | None]
    detail: Mapped[dict[str, Any]] = mapped_column(default=dict)


class SlackReplay(Base):
    """A signed Slack request already received: refused if it comes again, by any replica.

    ``key`` (a hash of the request's timestamp and signature) is unique, so of two replicas that
    receive the same request, one inserts and the other is refused. Rows outlive Slack's
    five-minute timestamp tolerance only until the next request clears them.
    """

    __tablename__ = "slack_replays"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    expires_at: Mapped[dt.datetime] = mapped_column(index=True)


class OutboxItem(Base):
    """Something the bot owes an incident: a Slack message, or the diagnosis that makes some.

    Written in the transaction that makes it owed (the webhook's, the diagnosis's), so nothing
    owed is lost when Slack is down or the process stops. Messages of one incident go out in
    ``id`` order, each by the one replica that claims it (``claimed_by`` until
    ``claimed_until``), retried with backoff until Slack takes it; a permanent refusal ends it
    ``failed`` with the reason. ``key`` makes an item once per incident (the root message, the
    diagnosis, each diagnosis message, the chart).
    """

    __tablename__ = "outbox"
    __table_args__ = (
        UniqueConstraint("incident_id", "key", name="uq_outbox_incident_key"),
        Index("ix_outbox_state_next_at", "state", "next_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    incident_id: Mapped[int] = mapped_column(ForeignKey("incidents.id"), index=True)
    kind: Mapped[str] = mapped_column(String(16))  # root | update | reply | chart | diagnose
    key: Mapped[str | None] = mapped_column(String(32))
    payload: Mapped[dict[str, Any]] = mapped_column(default=dict)  # what the notifier is given
    data: Mapped[bytes | None] = mapped_column(LargeBinary)  # a chart's PNG, until it is sent
    state: Mapped[str] = mapped_column(String(16))  # pending | sent | failed | superseded
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_at: Mapped[dt.datetime]  # not tried again before
    claimed_by: Mapped[str | None] = mapped_column(String(200))
    claimed_until: Mapped[dt.datetime | None]
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime]
    done_at: Mapped[dt.datetime | None]
    channel: Mapped[str | None] = mapped_column(String(64))  # where it landed
    ts: Mapped[str | None] = mapped_column(String(32))


class CauseFeedback(Base):
    """On-call's word on a diagnosis's supported cause, from the thread's "Cause confirmed" /
    "Wrong cause" buttons: counted in `ruleloop adr stats`, and the next time the cause is
    proposed on the target, the thread says it was marked wrong (``bot.incidents.memory``)."""

    __tablename__ = "cause_feedback"
    __table_args__ = (Index("ix_cause_feedback_target_cause", "target", "cause"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    incident_id: Mapped[int] = mapped_column(ForeignKey("incidents.id"), index=True)
    target: Mapped[str] = mapped_column(String(200))
    cause: Mapped[str] = mapped_column(String(64))
    verdict: Mapped[str] = mapped_column(String(16))  # confirmed | wrong
    adr_ids: Mapped[list[str]] = mapped_column(JSON, default=list)  # offered in that thread
    actor: Mapped[str] = mapped_column(String(64))
    at: Mapped[dt.datetime]
