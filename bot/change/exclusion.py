"""One change at a time per target: which change (a remediation, a tuning session, a drift
before-run) holds a target, and the refusal naming it.

The guarantee is the store's: every change is a row of one table, ``changes``, with one unique
index on the target of the changes that hold it (``bot.kernel.store.states.HOLDS``). Of requests
racing on one target, whatever their kinds, one insert wins and the others fail with an
IntegrityError, which the flows turn into ``TargetBusy`` naming the winner. This module says
who holds a target and turns a lost race into an answer the person can act on.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from bot.kernel import UsageError
from bot.kernel.store import HOLDS, Change, ChangeKind, ChangeState, Remediation

# what a change holding a target is doing there, in a refusal's words (else "running")
DOING: dict[str, str] = {
    ChangeState.PENDING: "waiting for approval",
    ChangeState.HELD: "held for a person to keep or roll back (its canary could not decide)",
}


@dataclass(frozen=True)
class Holder:
    """What a refusal says about the change in flight on a target."""

    id: int
    adr_id: str
    target: str
    state: str
    requested_by: str
    channel: str | None
    ts: str | None
    kind: str = "change"  # or "tuning": a tuning session or a drift before-run


class TargetBusy(UsageError):
    """Another change (a remediation, or a tuning session) is pending or running on the
    target; ``holder`` is that one."""

    def __init__(self, holder: Holder) -> None:
        what = "tuning session" if holder.kind == "tuning" else "change"
        super().__init__(f"{what} #{holder.id} is in flight on {holder.target}")
        self.holder = holder


def holder(session: Session, target: str) -> Holder | None:
    """The change pending or running on ``target``, of any kind, if any."""
    query = select(Change).where(Change.target == target, Change.state.in_(HOLDS))
    row = session.scalars(query.order_by(Change.id)).first()
    if row is None:
        return None
    if isinstance(row, Remediation):
        return Holder(
            id=row.id, adr_id=row.adr_id, target=row.target, state=row.state,
            requested_by=row.requested_by, channel=row.channel, ts=row.ts,
        )  # fmt: skip
    assert row.kind in (ChangeKind.TUNING, ChangeKind.DRIFT_BEFORE_RUN), row.kind
    return Holder(
        id=row.id, adr_id="tuning", target=row.target, state=row.state,
        requested_by=row.requested_by, channel=None, ts=None, kind="tuning",
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
    doing = DOING.get(busy.state, "running")
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
        doing = DOING.get(busy.state, "running")
        what = (
            f"change #{busy.id} ({busy.adr_id}, {busy.state}, requested by {busy.requested_by}) "
            f"is {doing} there"
        )
        after = "wait until it ends, or cancel it on its card"
    return (
        f"tuning {target} was not started: {what}. One change at a time per target: {after}. "
        "Nothing was changed."
    )
