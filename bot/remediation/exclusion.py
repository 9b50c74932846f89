"""One change at a time per target: which remediation holds a target, and the refusal naming it.

The guarantee is the store's (a unique index on the target of in-flight remediations,
``bot.store.models.IN_FLIGHT``): of requests racing on one target, one insert wins and the
others fail. This module turns that failure into an answer the person can act on.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from bot.errors import UsageError
from bot.store.models import IN_FLIGHT, Remediation


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


class TargetBusy(UsageError):
    """Another remediation is pending or running on the target; ``holder`` is that one."""

    def __init__(self, holder: Holder) -> None:
        super().__init__(f"change #{holder.id} is in flight on {holder.target}")
        self.holder = holder


def holder(session: Session, target: str) -> Holder | None:
    """The remediation pending or running on ``target``, if any."""
    query = select(Remediation).where(
        Remediation.target == target, Remediation.state.in_(IN_FLIGHT)
    )
    rem = session.scalars(query.order_by(Remediation.id)).first()
    if rem is None:
        return None
    return Holder(
        id=rem.id, adr_id=rem.adr_id, target=rem.target, state=rem.state,
        requested_by=rem.requested_by, channel=rem.channel, ts=rem.ts,
    )  # fmt: skip


def refusal(adr_id: str, target: str, busy: Holder, link: str | None) -> str:
    """The ephemeral answer to a request refused because ``busy`` holds the target."""
    doing = "waiting for approval" if busy.state == "pending" else "running"
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
