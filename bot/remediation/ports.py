"""What the remediation flow shows, and the role that shows it (Slack or the console)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Protocol

from bot.kernel.chat import MessageRef
from bot.kernel.store import ChangeState
from bot.postmortem import DraftNotifier

# state -> what the card says it is doing (one message, updated in place); keyed by the members,
# which are the stored strings, so a state read back from the store finds its text
STATES: dict[str, str] = {
    ChangeState.PENDING: "waiting for approval",
    ChangeState.APPROVED: "approved, starting",
    ChangeState.APPLYING: "applying the flags (restarting the engine)…",
    ChangeState.CANARY: "canary running against the ADR's gates…",
    ChangeState.PROMOTING: "canary passed, rolling out…",
    ChangeState.PROMOTED: "applied: the canary met every gate",
    ChangeState.ROLLING_BACK: "rolling back to the previous flags…",
    ChangeState.ROLLED_BACK: "rolled back: the previous flags serve again",
    ChangeState.HELD: "HELD: the canary could not decide; keep it or roll it back",
    ChangeState.FAILED: "FAILED: manual action needed",
    ChangeState.CANCELLED: "cancelled, nothing was changed",
    ChangeState.EXPIRED: "expired, nothing was changed",
    ChangeState.INTERRUPTED: "interrupted by a bot restart",
    ChangeState.DRY_RUN: "dry run: nothing was changed",
}


@dataclass(frozen=True)
class RemediationView:
    """The confirmation card and, later, the progress and outcome of one change."""

    id: int
    adr_id: str
    adr_title: str
    target: str
    actuator: str
    requested_by: str
    state: str
    diff: list[tuple[str, Any, Any]]
    gates: dict[str, float]
    two_person: bool
    approved_by: list[str] = field(default_factory=list)
    expires_at: dt.datetime | None = None
    tokens: dict[str, str] = field(default_factory=dict)  # approve/deny -> token, while pending
    note: str = ""  # the latest step, or why it ended
    gateway: dict[str, Any] = field(default_factory=dict)  # ADR gateway rules to set
    numbers: dict[str, float | None] = field(default_factory=dict)  # canary matrix values
    before_numbers: dict[str, float | None] = field(default_factory=dict)  # the before-run's
    failures: list[str] = field(default_factory=list)
    relative_gates: dict[str, str] = field(default_factory=dict)  # gate -> '0.5x before'
    silence: str = ""  # the change's Alertmanager silence, in words ("": none configured)
    how_sure: list[str] = field(default_factory=list)  # the p99 gates on their statistics
    watched: list[str] = field(default_factory=list)  # ungated numbers the change made worse
    live: list[str] = field(default_factory=list)  # the live stage's steps, each its verdict


class RemediationNotifier(DraftNotifier, Protocol):
    """Posts and updates the remediation card (and, as a DraftNotifier, the draft) in a thread."""

    async def post_remediation(self, thread: MessageRef, *, view: RemediationView) -> MessageRef:
        """Post the card in the thread; its ref is where progress is shown."""
        ...

    async def update_remediation(self, ref: MessageRef, *, view: RemediationView) -> None:
        """Re-render the card in place."""
        ...

    async def permalink(self, ref: MessageRef) -> str | None:
        """A link to a posted message (None when there is none to give)."""
        ...

    async def post_reply(self, ref: MessageRef, *, text: str) -> None:
        """A plain message in the thread."""
        ...
