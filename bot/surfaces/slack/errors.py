"""The one Slack error handler: known errors read as advice, unknown ones get a correlation id.

The answer is ephemeral (only the person who asked sees it) through the request's response_url.
No stack trace ever reaches Slack; the id is in the bot's log next to the traceback.
"""

from __future__ import annotations

import logging
from typing import Any

from slack_bolt.context.respond.async_respond import AsyncRespond
from slack_bolt.response import BoltResponse

from bot.kernel import RuleloopError, UnknownAdr
from bot.kernel.runtime import new_error_id

log = logging.getLogger("ruleloop.slack")

UNEXPECTED = "Something went wrong on the bot's side (error id `{id}`). Nothing was changed; " \
    "an operator can find the details in the bot's log under that id."  # fmt: skip


def error_text(error: BaseException) -> str:
    """What the person sees for an error."""
    if isinstance(error, UnknownAdr):  # without the server's ADR directory
        return error.chat_text()
    if isinstance(error, RuleloopError):
        return str(error)
    error_id = new_error_id()
    log.error("unexpected error in a Slack listener (id %s)", error_id, exc_info=error)
    return UNEXPECTED.format(id=error_id)


async def handle_error(
    error: Exception, body: dict[str, Any], respond: AsyncRespond | None
) -> BoltResponse:
    """Answer the person whose request failed, ephemerally; Slack itself gets a plain 200."""
    text = error_text(error)
    if respond is None or not _has_response_url(body):
        log.warning("cannot answer a failed Slack request: %s", text)
    else:
        try:
            await respond(text=text, response_type="ephemeral", replace_original=False)
        except Exception:
            log.exception("could not deliver an error answer to Slack")
    return BoltResponse(status=200, body="")


def _has_response_url(body: dict[str, Any]) -> bool:
    return bool(body.get("response_urls")) or bool(body.get("response_url"))
