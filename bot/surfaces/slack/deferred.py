"""Ack first, then work: a listener acks at once and hands its work here.

Slack expects the answer to a slash command or a click within 3 seconds; work that calls Slack
(a card, a thread, a users.info look-up) can take longer (one 429 with Retry-After 4 did), and
Slack shows the person an error, who then asks again. So the listener acks, and the work runs
after in a supervised task (drained when the bot stops): first the workspace guard's deferred
check, then the work; its answer, or the error's, goes to the person ephemerally through the
request's response_url. It behaves the same over HTTP and Socket Mode, since both send the ack
when the listener returns.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from slack_bolt.context.async_context import AsyncBoltContext
from slack_bolt.context.respond.async_respond import AsyncRespond

from bot.surfaces.slack.errors import error_text
from bot.surfaces.slack.services import services_of

log = logging.getLogger("ruleloop.slack")
MEMBER_CHECK = "member_check"  # the context key of the workspace guard's deferred check

Work = Callable[[], Awaitable[str | None]]


def later(
    context: AsyncBoltContext, respond: AsyncRespond | None, work: Work, *, name: str
) -> None:
    """Run ``work`` after the ack; answer its text (or its error) to the person, ephemerally."""
    tasks = services_of(context).tasks
    check: Callable[[], Awaitable[None]] | None = context.get(MEMBER_CHECK)

    async def run() -> None:
        try:
            if check is not None:  # may this person change anything here (users.info)?
                await check()
            text = await work()
        except Exception as exc:
            text = error_text(exc)
        if text:
            await _answer(respond, text)

    tasks.spawn(run(), name=name)


async def _answer(respond: AsyncRespond | None, text: str) -> None:
    if respond is None:
        log.warning("cannot answer a Slack request (no response_url): %s", text)
        return
    try:
        await respond(text=text, response_type="ephemeral", replace_original=False)
    except Exception:
        log.exception("could not deliver an answer to Slack")
