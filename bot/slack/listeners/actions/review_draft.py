"""Accept / Reject on an ADR draft: reviewers only, never the author alone, once."""

from __future__ import annotations

from typing import Any

from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.async_context import AsyncBoltContext
from slack_bolt.context.respond.async_respond import AsyncRespond

from bot.slack.deferred import later
from bot.slack.services import services_of


async def handle(
    ack: AsyncAck,
    body: dict[str, Any],
    action: dict[str, Any],
    context: AsyncBoltContext,
    respond: AsyncRespond,
) -> None:
    """Ack, then review; a refusal is answered (only to the clicker)."""
    await ack()

    async def work() -> None:
        await services_of(context).drafts.review(
            user_id=body["user"]["id"], token=str(action["value"])
        )

    later(context, respond, work, name="review-draft")
