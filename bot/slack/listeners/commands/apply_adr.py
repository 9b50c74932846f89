"""`/apply-adr ADR-ID [target]`: checked at once, answered with where the confirmation card is."""

from __future__ import annotations

from typing import Any

from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.async_context import AsyncBoltContext

from bot.errors import UsageError

USAGE = "Usage: /apply-adr ADR-ID [target], e.g. /apply-adr ADR-20260831-01 prod-a"


async def handle(ack: AsyncAck, command: dict[str, Any], context: AsyncBoltContext) -> None:
    """Policy checks and the card are quick (reading flags, one message); the run is spawned."""
    words = command.get("text", "").split()
    if not 1 <= len(words) <= 2:
        raise UsageError(USAGE)
    text = await context["remediation"].request(
        user_id=command["user_id"],
        adr_id=words[0].upper(),
        target=words[1] if len(words) > 1 else None,
        channel_id=command["channel_id"],
    )
    await ack(text=text)
