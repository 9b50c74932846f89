"""The role the diagnosis flows talk to Slack (or the console) through, and what it is given."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from bot.kernel.store.summary import DiagnosisSummary

if TYPE_CHECKING:
    from bot.diagnosis import Diagnosis


# The incident thread's own buttons: each kind is a button (and a subject, so pressing one
# leaves the other usable); bot.remediation.thread_buttons acts on them.
SILENCE, ACKNOWLEDGE = "silence", "acknowledge"
# On-call's word on the diagnosis's cause: one subject ("cause:<incident>"); one press spends
# both.
CAUSE, CAUSE_CONFIRMED, CAUSE_WRONG = "cause", "cause_confirmed", "cause_wrong"
# A drift thread's offer of a tuning search on the live traffic (bot.tune.retune).
RETUNE = "retune"


@dataclass(frozen=True)
class MessageRef:
    """A posted message: its channel (an ID once posted) and timestamp (its thread)."""

    channel: str
    ts: str


@dataclass(frozen=True)
class IncidentView:
    """What the root message shows: the incident, its state, the last diagnosis's numbers."""

    id: int
    title: str
    status: str  # firing | resolved
    source: str  # alertmanager | slash
    target: str | None
    opened_at: dt.datetime
    closed_at: dt.datetime | None
    state: str  # diagnosing | diagnosed | failed | waiting
    summary: DiagnosisSummary = field(default_factory=DiagnosisSummary)
    requested_by: str | None = None
    acknowledged_by: str | None = None  # a Slack user ID (the thread's Acknowledge button)

    def __post_init__(self) -> None:
        # a summary given as its stored JSON is parsed here, once
        object.__setattr__(self, "summary", DiagnosisSummary.of(self.summary))


class Notifier(Protocol):
    """Posts an incident's root message and thread; Slack and the console implement it."""

    async def post_root(self, *, channel: str, view: IncidentView) -> MessageRef:
        """Post the root message of an incident; its ts is the thread."""
        ...

    async def update_root(self, ref: MessageRef, *, view: IncidentView) -> None:
        """Re-render the root message in place (chat.update)."""
        ...

    def render_diagnosis(self, diagnosis: Diagnosis, *, incident_id: int) -> list[dict[str, Any]]:
        """The findings and the matching ADRs as thread messages, ready to keep in the outbox."""
        ...

    def render_thread_buttons(
        self, tokens: dict[str, str], *, note: str | None = None
    ) -> dict[str, Any]:
        """The incident's Silence / Acknowledge buttons (kind -> token; ``note``: a line
        above them) as one thread message, ready to keep in the outbox."""
        ...

    async def post_rendered(self, ref: MessageRef, *, message: dict[str, Any]) -> MessageRef:
        """Post one message ``render_diagnosis`` made (or ``{"text": mrkdwn}``) in the thread."""
        ...

    async def post_chart(self, ref: MessageRef, *, png: bytes, title: str, filename: str) -> None:
        """Upload a chart into the incident's thread."""
        ...

    async def post_reply(self, ref: MessageRef, *, text: str) -> None:
        """Post one message in the incident's thread (mrkdwn: escape what the bot did not write)."""
        ...
