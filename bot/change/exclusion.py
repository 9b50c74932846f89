"""One change at a time per target: which remediation (or tuning session) holds a target, and
the refusal naming it.

The guarantee is the store's (a unique index on the target of in-flight remediations,
``bot.store.states.IN_FLIGHT``, and one on in-flight tuning sessions, ``TUNING``): of requests
racing on one target, one insert wins and the others fail. A remediation and a tuning session
live in two tables, so each checks the other's in the same transaction, after ``lock``: SQLite
serializes writing transactions anyway (BEGIN IMMEDIATE), PostgreSQL takes a transaction-scoped
advisory lock per target. This module turns a lost race into an answer the person can act on.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from bot.errors import UsageError
from bot.store.models import TUNING, Remediation, TuneSession
from bot.store.states import IN_FLIGHT, RemediationState


@dataclass(frozen=True)
class Holder:
    """What a refusal says about the remediation in flight on a target."""

    id: int
    adr_id: str
    target: str
    state: str
    requested_by: str
    channel: str | None
    ts: str | None
    kind: str = "change"  # or "tuning": a `ruleloop tune --target` session


class TargetBusy(UsageError):
    """Another remediation (or a tuning session) is pending or running on the target;
    ``holder`` is that one."""

    def __init__(self, holder: Holder) -> None:
        what = "tuning session" if holder.kind == "tuning" else "change"
        super().__init__(f"{what} #{holder.id} is in flight on {holder.target}")
        self.holder = holder


def lock(session: Session, target: str) -> None:
    """Serialize, per target, the transactions that check and then take it (PostgreSQL: an
    advisory lock held until the transaction ends; SQLite's writers are serialized already)."""
    if session.get_bind().dialect.name != "postgresql":
        return
    digest = hashlib.sha256(f"target:{target}".encode()).digest()
    key = int.from_bytes(digest[:8], "big", signed=True)
    session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})


def holder(session: Session, target: str) -> Holder | None:
    """The remediation pending or running on ``target``, else the tuning session running
    there, if any."""
    query = select(Remediation).where(
        Remediation.target == target, Remediation.state.in_(IN_FLIGHT)
    )
    rem = session.scalars(query.order_by(Remediation.id)).first()
    if rem is None:
        return tuning(session, target)
    return Holder(
        id=rem.id, adr_id=rem.adr_id, target=rem.target, state=rem.state,
        requested_by=rem.requested_by, channel=rem.channel, ts=rem.ts,
    )  # fmt: skip


def tuning(session: Session, target: str) -> Holder | None:
    """The tuning session running (or restoring) on ``target``, if any."""
    query = select(TuneSession).where(TuneSession.target == target, TuneSession.state.in_(TUNING))
    found = session.scalars(query.order_by(TuneSession.id)).first()
    if found is None:
        return None
    return Holder(
        id=found.id, adr_id="tuning", target=found.target, state=found.state,
        requested_by=found.requested_by, channel=None, ts=None, kind="tuning",
    )  # fmt: skip


def refusal(adr_id: str, target: str, busy: Holder, link: str | None) -> str:
    """The ephemeral answer to a request refused because ``busy`` holds the target."""
    if busy.kind == "tuning":
        return (
            f"{adr_id} on {target} was not requested: tuning session #{busy.id} (requested by "
            f"<@{busy.requested_by}>) is {busy.state} there; it measures flag sets one after "
            "another and puts back the flags it found when it ends. One change at a time per "
            "target: wait until it ends (if its process died, `ruleloop tune --target "
            f"{target} --restore` finishes it). Nothing was changed."
        )
    doing = "waiting for approval" if busy.state == RemediationState.PENDING else "running"
    if link:
        card = f"; its card: <{link}|change #{busy.id}>"
    elif busy.channel:
        card = f"; its card is in <#{busy.channel}>"
    else:  # it won the race a moment ago: its card is not posted yet
        card = "; its card is being posted in the incident's thread"
    return (
        f"{adr_id} on {target} was not requested: change #{busy.id} ({busy.adr_id}, "
        f"{busy.state}, requested by <@{busy.requested_by}>) is {doing} there{card}. "
        "One change at a time per target: wait until it ends, or cancel it on its card. "
        "Nothing was changed."
    )


def tuning_refusal(target: str, busy: Holder) -> str:
    """Why a tuning session may not start on ``target``: ``busy`` holds it."""
    if busy.kind == "tuning":
        what = f"tuning session #{busy.id} (requested by {busy.requested_by}) is {busy.state} there"
        after = (
            "wait until it ends; if its process died, `ruleloop tune --target "
            f"{target} --restore` puts the flags it found back"
        )
    else:
        doing = "waiting for approval" if busy.state == RemediationState.PENDING else "running"
        what = (
            f"change #{busy.id} ({busy.adr_id}, {busy.state}, requested by {busy.requested_by}) "
            f"is {doing} there"
        )
        after = "wait until it ends, or cancel it on its card"
    return (
        f"tuning {target} was not started: {what}. One change at a time per target: {after}. "
        "Nothing was changed."
    )
