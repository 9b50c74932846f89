"""Outbox store operations, each on the caller's session so it commits with what made it owed.

An incident's messages (root, update, reply, chart) go out in ``id`` order: one may be claimed
only while no earlier message of its incident is still pending, and a claim is one conditional
UPDATE, so of several replicas exactly one sends each message, in order. A diagnosis item is
claimed the same way but waits for nothing: the numbers are measured while Slack is down.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, and_, delete, exists, func, or_, select, update
from sqlalchemy.orm import Session, aliased

from bot.kernel.store.models import Incident, OutboxItem, SlackMessage

PENDING, SENT, FAILED, SUPERSEDED = "pending", "sent", "failed", "superseded"
ROOT, UPDATE, REPLY, CHART, DIAGNOSE = "root", "update", "reply", "chart", "diagnose"
MESSAGES = (ROOT, UPDATE, REPLY, CHART)
KEEP_SENT = dt.timedelta(days=2)
KEEP_FAILED = dt.timedelta(days=14)
ROOT_REFUSED = "the incident's root message was refused"  # why its thread messages failed


@dataclass(frozen=True)
class Claimed:
    """An item this replica holds now (a detached copy of its row)."""

    id: int
    incident_id: int
    kind: str
    key: str | None
    payload: Mapping[str, Any]
    data: bytes | None
    attempts: int
    created_at: dt.datetime


def owe(
    session: Session,
    incident_id: int,
    *,
    kind: str,
    at: dt.datetime,
    key: str | None = None,
    payload: Mapping[str, Any] | None = None,
    data: bytes | None = None,
) -> OutboxItem | None:
    """Owe one item; None when the incident already has one with this ``key``."""
    payload = dict(payload or {})
    if key is not None and find(session, incident_id, key) is not None:
        return None
    if kind == UPDATE:
        # an update shows the incident as it is when sent: one waiting is enough (an update
        # being sent right now is left alone; this one follows it)
        for old in session.scalars(_waiting_updates(incident_id, at)).all():
            old.state, old.done_at = SUPERSEDED, at
            payload = {**old.payload, **payload}
    item = OutboxItem(
        incident_id=incident_id,
        kind=kind,
        key=key,
        payload=payload,
        data=data,
        state=PENDING,
        attempts=0,
        next_at=at,
        created_at=at,
    )
    root = None if kind in (ROOT, DIAGNOSE) else find(session, incident_id, ROOT)
    if root is not None and root.state == FAILED:  # no thread to go into (a repeat re-arms it)
        item.state, item.done_at = FAILED, at
        item.last_error = f"{ROOT_REFUSED}: {root.last_error}"
    session.add(item)
    session.flush()
    return item


def owe_root(session: Session, incident_id: int, *, at: dt.datetime, channel: str | None) -> None:
    """Owe the root message (once per incident), in ``channel`` or the configured one."""
    if _posted_before_the_outbox(session, incident_id):
        return
    payload = {"channel": channel} if channel else {}
    owe(session, incident_id, kind=ROOT, key=ROOT, at=at, payload=payload)


def owe_diagnosis(session: Session, incident_id: int, *, at: dt.datetime) -> None:
    """Owe the incident a diagnosis (once)."""
    owe(session, incident_id, kind=DIAGNOSE, key=DIAGNOSE, at=at)


def owe_root_change(session: Session, incident_id: int, *, at: dt.datetime) -> None:
    """Show the incident's new state: an update of its root, or the root when none is owed."""
    if find(session, incident_id, ROOT) is None and not _posted_before_the_outbox(
        session, incident_id
    ):
        owe_root(session, incident_id, at=at, channel=None)
    else:
        owe(session, incident_id, kind=UPDATE, at=at)


def find(session: Session, incident_id: int, key: str) -> OutboxItem | None:
    """The incident's item with this key, if any."""
    query = select(OutboxItem).where(OutboxItem.incident_id == incident_id, OutboxItem.key == key)
    return session.scalars(query).first()


def head(session: Session, incident_id: int) -> OutboxItem | None:
    """The incident's first message still pending: the only one that may be sent now."""
    query = (
        select(OutboxItem)
        .where(
            OutboxItem.incident_id == incident_id,
            OutboxItem.state == PENDING,
            OutboxItem.kind.in_(MESSAGES),
        )
        .order_by(OutboxItem.id)
        .limit(1)
    )
    return session.scalars(query).first()


def claim(
    session: Session,
    item_id: int,
    *,
    owner: str,
    now: dt.datetime,
    ttl: dt.timedelta,
    force: bool = False,
) -> Claimed | None:
    """Take an item for ``ttl`` (due, unclaimed or its claim expired, in its turn); None if not.

    ``force``: a person is waiting for it (a thread for /apply-adr): the backoff is skipped.
    """
    conditions: list[ColumnElement[bool]] = [
        OutboxItem.id == item_id,
        OutboxItem.state == PENDING,
        or_(OutboxItem.claimed_until.is_(None), OutboxItem.claimed_until < now),
        or_(OutboxItem.kind == DIAGNOSE, ~_earlier_pending()),
    ]
    if not force:
        conditions.append(OutboxItem.next_at <= now)
    taken = session.execute(
        update(OutboxItem)
        .where(*conditions)
        .values(claimed_by=owner, claimed_until=now + ttl, attempts=OutboxItem.attempts + 1)
    )
    if not getattr(taken, "rowcount", 0):
        return None
    row = session.get(OutboxItem, item_id, populate_existing=True)
    assert row is not None
    return Claimed(
        row.id,
        row.incident_id,
        row.kind,
        row.key,
        dict(row.payload),
        row.data,
        row.attempts,
        row.created_at,
    )


def finish(session: Session, item: Claimed, *, owner: str, now: dt.datetime, **values: Any) -> bool:
    """End or reschedule a claimed item (still ours, still pending); False when it was not."""
    values.setdefault("claimed_by", None)
    values.setdefault("claimed_until", None)
    if values.get("state", PENDING) != PENDING:
        values.setdefault("done_at", now)
    if values.get("state") == SENT:
        values.setdefault("data", None)  # a chart's bytes are not kept once it is posted
    done = session.execute(
        update(OutboxItem)
        .where(
            OutboxItem.id == item.id,
            OutboxItem.state == PENDING,
            OutboxItem.claimed_by == owner,
            OutboxItem.attempts == item.attempts,
        )
        .values(**values)
    )
    return bool(getattr(done, "rowcount", 0))


def fail_rest(session: Session, incident_id: int, *, now: dt.datetime, why: str) -> int:
    """Fail every message of the incident still pending (they had no thread to go into)."""
    failed = session.execute(
        update(OutboxItem)
        .where(
            OutboxItem.incident_id == incident_id,
            OutboxItem.state == PENDING,
            OutboxItem.kind.in_(MESSAGES),
        )
        .values(state=FAILED, done_at=now, last_error=why, claimed_by=None, claimed_until=None)
    )
    return int(getattr(failed, "rowcount", 0) or 0)


def rearm(session: Session, incident_id: int, *, now: dt.datetime) -> int:
    """Make the incident's undelivered messages due now, when Slack already did not take one
    of them; how many (Alertmanager repeated the incident: the moment to try again).

    Failed ones too: the repeat may come after the channel or the token was fixed, and it
    comes at Alertmanager's repeat interval, so a refusal is tried once per repeat, not forever.
    """
    mine = (OutboxItem.incident_id == incident_id, OutboxItem.kind.in_(MESSAGES))
    missed = or_(
        OutboxItem.state == FAILED,
        and_(OutboxItem.state == PENDING, OutboxItem.last_error.is_not(None)),
    )
    if not session.scalar(select(exists().where(*mine, missed))):
        return 0  # nothing was refused yet: what is owed is on its way
    undelivered = (*mine, OutboxItem.state.in_((PENDING, FAILED)), _unclaimed(now))
    count = session.scalar(select(func.count()).select_from(OutboxItem).where(*undelivered))
    session.execute(
        update(OutboxItem).where(*undelivered).values(state=PENDING, next_at=now, done_at=None)
    )
    return int(count or 0)


def wake(session: Session, *, now: dt.datetime) -> int:
    """Make the messages waiting out a backoff due now (Slack took one again); how many."""
    woken = session.execute(
        update(OutboxItem)
        .where(
            OutboxItem.state == PENDING,
            OutboxItem.kind.in_(MESSAGES),
            OutboxItem.last_error.is_not(None),
            OutboxItem.next_at > now,
            _unclaimed(now),
        )
        .values(next_at=now)
    )
    return int(getattr(woken, "rowcount", 0) or 0)


def due_incidents(session: Session, *, now: dt.datetime, limit: int = 200) -> list[int]:
    """Incidents with a message due and unclaimed, the longest-waiting first."""
    query = (
        select(OutboxItem.incident_id)
        .where(
            OutboxItem.state == PENDING,
            OutboxItem.kind.in_(MESSAGES),
            OutboxItem.next_at <= now,
            _unclaimed(now),
        )
        .group_by(OutboxItem.incident_id)
        .order_by(func.min(OutboxItem.next_at), OutboxItem.incident_id)
        .limit(limit)
    )
    return list(session.scalars(query).all())


def due_diagnoses(session: Session, *, now: dt.datetime, owed_before: dt.datetime) -> list[int]:
    """Open incidents whose owed diagnosis nobody runs: never started, or its replica stopped.

    A closed incident's is dropped instead: a diagnosis after the alert resolved measures a
    healthy engine, and would only mislead.
    """
    query = (
        select(OutboxItem, Incident.closed_at)
        .join(Incident, Incident.id == OutboxItem.incident_id)
        .where(
            OutboxItem.state == PENDING,
            OutboxItem.kind == DIAGNOSE,
            _unclaimed(now),
            OutboxItem.created_at < owed_before,
        )
        .order_by(OutboxItem.id)
    )
    due = []
    for item, closed_at in session.execute(query).all():
        if closed_at is None:
            due.append(item.incident_id)
        else:
            item.state, item.done_at = SUPERSEDED, now
    return due


def display_state(session: Session, incident: Incident) -> str:
    """What the root message says of the diagnosis: diagnosed, failed, diagnosing or waiting."""
    if incident.summary.diagnosed:
        return "diagnosed"
    if incident.summary.failed:
        return "failed"
    owed = find(session, incident.id, DIAGNOSE)
    return "diagnosing" if owed is not None and owed.state == PENDING else "waiting"


def counts(session: Session) -> dict[str, int]:
    """Messages pending and failed, over every incident."""
    query = (
        select(OutboxItem.state, func.count())
        .where(OutboxItem.kind.in_(MESSAGES), OutboxItem.state.in_((PENDING, FAILED)))
        .group_by(OutboxItem.state)
    )
    found = {str(state): int(n) for state, n in session.execute(query).all()}
    return {"pending": found.get(PENDING, 0), "failed": found.get(FAILED, 0)}


def failed(session: Session, *, limit: int = 20) -> list[OutboxItem]:
    """The newest failed messages, with their reasons."""
    query = (
        select(OutboxItem)
        .where(OutboxItem.state == FAILED, OutboxItem.kind.in_(MESSAGES))
        .order_by(OutboxItem.done_at.desc(), OutboxItem.id.desc())
        .limit(limit)
    )
    return list(session.scalars(query).all())


def resend(session: Session, chosen: list[OutboxItem], *, now: dt.datetime) -> list[OutboxItem]:
    """Make failed messages due again (a person fixed what their reason said); those made due.

    Each goes pending, due since it failed (so, now), with a fresh give-up clock and no
    tries; the outbox job of a running bot sends them in their incident's order. A thread
    message whose incident's root was refused takes the root with it: it has no thread to go
    into otherwise; a root takes the thread messages that failed only because it was refused.
    """
    again = {item.id: item for item in chosen if item.state == FAILED and item.kind in MESSAGES}
    for item in list(again.values()):
        root = item if item.kind == ROOT else find(session, item.incident_id, ROOT)
        if root is None or root.state != FAILED:
            continue
        again.setdefault(root.id, root)
        behind = select(OutboxItem).where(
            OutboxItem.incident_id == item.incident_id,
            OutboxItem.state == FAILED,
            OutboxItem.kind.in_(MESSAGES),
            OutboxItem.last_error.startswith(ROOT_REFUSED),
        )
        for follower in session.scalars(behind).all():
            again.setdefault(follower.id, follower)
    for item in again.values():
        item.state, item.next_at, item.created_at = PENDING, min(item.done_at or now, now), now
        item.done_at = item.last_error = item.claimed_by = item.claimed_until = None
        item.attempts = 0
    session.flush()
    return sorted(again.values(), key=lambda item: item.id)


def all_failed(session: Session) -> list[OutboxItem]:
    """Every failed message, oldest first."""
    query = select(OutboxItem).where(OutboxItem.state == FAILED, OutboxItem.kind.in_(MESSAGES))
    return list(session.scalars(query.order_by(OutboxItem.id)).all())


def prune(session: Session, *, now: dt.datetime) -> None:
    """Forget delivered items after two days and failed ones after two weeks."""
    session.execute(
        delete(OutboxItem).where(
            or_(
                and_(
                    OutboxItem.state.in_((SENT, SUPERSEDED)), OutboxItem.done_at < now - KEEP_SENT
                ),
                and_(OutboxItem.state == FAILED, OutboxItem.done_at < now - KEEP_FAILED),
            )
        )
    )


def _posted_before_the_outbox(session: Session, incident_id: int) -> bool:
    """Whether the incident's root message was posted before it had outbox rows (an upgrade)."""
    if find(session, incident_id, ROOT) is not None:
        return False
    query = select(SlackMessage.id).where(
        SlackMessage.incident_id == incident_id, SlackMessage.kind == "root"
    )
    return session.scalars(query).first() is not None


def _unclaimed(now: dt.datetime) -> ColumnElement[bool]:
    return or_(OutboxItem.claimed_until.is_(None), OutboxItem.claimed_until < now)


def _earlier_pending() -> ColumnElement[bool]:
    earlier = aliased(OutboxItem)
    return exists().where(
        earlier.incident_id == OutboxItem.incident_id,
        earlier.id < OutboxItem.id,
        earlier.state == PENDING,
        earlier.kind.in_(MESSAGES),
    )


def _waiting_updates(incident_id: int, at: dt.datetime) -> Any:
    return select(OutboxItem).where(
        OutboxItem.incident_id == incident_id,
        OutboxItem.kind == UPDATE,
        OutboxItem.state == PENDING,
        _unclaimed(at),
    )
