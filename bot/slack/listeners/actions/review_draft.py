"""Accept / Reject on an ADR draft: reviewers only, never the author alone, once."""

from __future__ import annotations

from typing import Any

from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.async_context import AsyncBoltContext


async def handle(
    ack: AsyncAck, body: dict[str, Any], action: dict[str, Any], context: AsyncBoltContext
) -> None:
    """Ack, then review; a refusal is answered (only to the clicker) by the error handler."""
    await ack()
    await context["drafts"].review(user_id=body["user"]["id"], token=str(action["value"]))
