"""`/adr-draft [incident-id]`: draft the post-incident ADR from what the incident measured."""

from __future__ import annotations

from typing import Any

from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.async_context import AsyncBoltContext

from bot.errors import UsageError

USAGE = "Usage: /adr-draft [incident-id] (default: the newest incident)"


async def handle(ack: AsyncAck, command: dict[str, Any], context: AsyncBoltContext) -> None:
    """Draft now; the summary and the Markdown file are posted in the incident's thread."""
    words = command.get("text", "").split()
    if len(words) > 1 or (words and not words[0].lstrip("#").isdigit()):
        raise UsageError(USAGE)
    incident_id = int(words[0].lstrip("#")) if words else None
    text = await context["drafts"].request(user_id=command["user_id"], incident_id=incident_id)
    await ack(text=text)
