"""`/adr-draft [incident-id]`: draft the post-incident ADR from what the incident measured."""

from __future__ import annotations

import re
from typing import Any

from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.async_context import AsyncBoltContext
from slack_bolt.context.respond.async_respond import AsyncRespond

from bot.kernel import UsageError
from bot.surfaces.slack.deferred import later
from bot.surfaces.slack.services import services_of

USAGE = "Usage: /adr-draft [incident-id] (default: the newest incident)"
INCIDENT_ID = re.compile(r"#?[0-9]{1,18}", re.ASCII)  # 18 digits: a 64-bit integer


async def handle(
    ack: AsyncAck, command: dict[str, Any], context: AsyncBoltContext, respond: AsyncRespond
) -> None:
    """Ack; the draft follows (summary and Markdown file in the incident's thread)."""
    await ack()

    async def work() -> str:
        words = str(command.get("text") or "").split()
        # 0-9 only: "²" and "١" pass isdigit(), and int() reads "١" (a store id is ASCII)
        if len(words) > 1 or (words and not INCIDENT_ID.fullmatch(words[0])):
            raise UsageError(USAGE)
        incident_id = int(words[0].lstrip("#")) if words else None
        text: str = await services_of(context).drafts.request(
            user_id=command["user_id"], incident_id=incident_id
        )
        return text

    later(context, respond, work, name="adr-draft")
