"""`/diagnose [target]`: checked, started in the background, acknowledged with one line."""

from __future__ import annotations

from typing import Any

from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.async_context import AsyncBoltContext

from bot.slack.services import services_of


async def handle(ack: AsyncAck, command: dict[str, Any], context: AsyncBoltContext) -> None:
    """Ack (ephemeral) that it started; a refusal is answered by the error handler."""
    text = services_of(context).flows.request_diagnosis(
        user_id=command["user_id"], text=command.get("text", ""), channel_id=command["channel_id"]
    )
    await ack(text=text)
