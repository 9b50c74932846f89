"""`/diagnose [target]`: checked, started in the background, acknowledged with one line."""

from __future__ import annotations

from typing import Any

from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.async_context import AsyncBoltContext

from bot.kernel import UsageError
from bot.surfaces.slack.services import services_of


async def handle(ack: AsyncAck, command: dict[str, Any], context: AsyncBoltContext) -> None:
    """Ack (ephemeral) that it started; a refusal is answered by the error handler."""
    services = services_of(context)
    words = command.get("text", "").split()
    if len(words) > 1:
        known = ", ".join(sorted(services.flows.settings.targets))
        raise UsageError(f"Usage: /diagnose [target]. Known targets: {known}")
    text = services.flows.request_diagnosis(
        user_id=command["user_id"],
        target=words[0] if words else None,
        channel_id=command["channel_id"],
    )
    await ack(text=text)
