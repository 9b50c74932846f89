"""The one shape of a single-use button's listener: ack at once, then hand the clicker and the
button's token to a service, which checks, claims and audits it; a refusal is answered
ephemerally (``bot.surfaces.slack.deferred``). The workspace guard's check runs first for every
action
in ``bot.surfaces.slack.workspace.CHANGE_ACTIONS``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.async_context import AsyncBoltContext
from slack_bolt.context.respond.async_respond import AsyncRespond

from bot.surfaces.slack.deferred import later
from bot.surfaces.slack.services import Services, services_of

# what a press does: (services, user_id, token) -> the answer to the presser, if any
Press = Callable[[Services, str, str], Awaitable[str | None]]
Handler = Callable[[AsyncAck, dict[str, Any], dict[str, Any], AsyncBoltContext, AsyncRespond],
                   Awaitable[None]]  # fmt: skip


def token_button(press: Press, *, name: str) -> Handler:
    """A bolt action listener for a single-use button whose value is its token."""

    async def handle(
        ack: AsyncAck,
        body: dict[str, Any],
        action: dict[str, Any],
        context: AsyncBoltContext,
        respond: AsyncRespond,
    ) -> None:
        await ack()

        async def work() -> str | None:
            return await press(services_of(context), body["user"]["id"], str(action["value"]))

        later(context, respond, work, name=name)

    return handle
