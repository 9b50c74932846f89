"""The Apply button under a matching ADR: says in the thread what applying would do."""

from __future__ import annotations

import json
from typing import Any

from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.async_context import AsyncBoltContext

from bot.errors import UsageError


async def handle(
    ack: AsyncAck, body: dict[str, Any], action: dict[str, Any], context: AsyncBoltContext
) -> None:
    """Ack, then check the clicker and explain the fix (errors go to the error handler)."""
    await ack()
    try:
        value = json.loads(action["value"])
        adr_id, incident_id = str(value["adr"]), int(value["incident"])
    except (KeyError, TypeError, ValueError):
        raise UsageError(
            "this button carries no ADR; it may be from an older bot version"
        ) from None
    await context["flows"].explain_apply(
        user_id=body["user"]["id"], adr_id=adr_id, incident_id=incident_id
    )
