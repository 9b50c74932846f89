"""`/apply-adr ADR-ID [target]`: acked at once; checked, then answered with where the card is."""

from __future__ import annotations

from typing import Any

from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.async_context import AsyncBoltContext
from slack_bolt.context.respond.async_respond import AsyncRespond

from bot.kernel import UsageError
from bot.surfaces.slack.deferred import later
from bot.surfaces.slack.services import services_of

USAGE = "Usage: /apply-adr ADR-ID [target], e.g. /apply-adr ADR-20260831-01 prod-a"


async def handle(
    ack: AsyncAck, command: dict[str, Any], context: AsyncBoltContext, respond: AsyncRespond
) -> None:
    """Ack; the policy checks and the card (Slack calls: a 429 made them late) follow."""
    await ack()

    async def work() -> str:
        words = command.get("text", "").split()
        if not 1 <= len(words) <= 2:
            raise UsageError(USAGE)
        text: str = await services_of(context).remediation.request(
            user_id=command["user_id"],
            adr_id=words[0].upper(),
            target=words[1] if len(words) > 1 else None,
            channel_id=command["channel_id"],
        )
        return text

    later(context, respond, work, name="apply-adr")
