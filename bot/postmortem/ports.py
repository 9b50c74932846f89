"""What the post-incident draft shows in a thread, and the role that shows it (Slack or console)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from bot.kernel.chat import MessageRef


@dataclass(frozen=True)
class DraftView:
    """A post-incident ADR draft posted for review."""

    adr_id: str
    title: str
    incident_id: int
    path: str
    state: str  # proposed | accepted | rejected
    matrix: list[dict[str, Any]]
    reviewers: list[str]
    author: str
    tokens: dict[str, str] = field(default_factory=dict)  # accept/reject -> token
    reviewed_by: str | None = None
    note: str = ""


class DraftNotifier(Protocol):
    """Posts and updates an ADR draft's summary in an incident's thread."""

    async def post_draft(
        self, thread: MessageRef, *, view: DraftView, markdown: str, filename: str
    ) -> MessageRef:
        """Post the draft's summary (with review buttons) and its Markdown file in the thread."""
        ...

    async def update_draft(self, ref: MessageRef, *, view: DraftView) -> None:
        """Re-render the draft's summary in place (after review)."""
        ...

    async def post_reply(self, ref: MessageRef, *, text: str) -> None:
        """A plain message in the thread."""
        ...
