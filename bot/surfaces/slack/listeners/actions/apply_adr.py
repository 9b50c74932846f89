"""The Apply button under a matching ADR: the same request as `/apply-adr`, in that incident."""

from __future__ import annotations

import json
from typing import Any

from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.async_context import AsyncBoltContext
from slack_bolt.context.respond.async_respond import AsyncRespond

from bot.kernel import UsageError
from bot.surfaces.slack.deferred import later
from bot.surfaces.slack.services import services_of


async def handle(
    ack: AsyncAck,
    body: dict[str, Any],
    action: dict[str, Any],
    context: AsyncBoltContext,
    respond: AsyncRespond,
) -> None:
    """Ack, then request the change; the confirmation card appears in the thread."""
    await ack()

    async def work() -> None:
        try:
            value = json.loads(action["value"])
            adr_id, incident_id = str(value["adr"]), value["incident"]
            target = value.get("target")
        except (KeyError, TypeError, ValueError, AttributeError):
            incident_id = None
        if type(incident_id) is not int or not 0 < incident_id < 2**63:  # a store id
            raise UsageError("this button carries no ADR; it may be from an older bot version")
        await services_of(context).remediation.request(
            user_id=body["user"]["id"],
            adr_id=adr_id,
            target=str(target) if target else None,
            incident_id=incident_id,
            channel_id=(body.get("channel") or {}).get("id"),
            offered=True,
        )

    later(context, respond, work, name="apply-button")
