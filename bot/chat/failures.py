"""Why a Slack call failed, and whether trying again can help (the outbox's retry rule).

Transient: Slack did not answer (refused or dropped connections, timeouts), answered 5xx, or
rate limited the call (429, honouring Retry-After): the message is tried again later, and the
outbox job stops its round, since the next message would meet the same Slack. Permanent: Slack
answered and refused this message (``channel_not_found``, ``not_in_channel``, ``invalid_auth``,
``invalid_blocks``...): trying again cannot help, so it ends ``failed`` with the reason. So does
a message slack_sdk refuses to build before sending anything (``SlackObjectFormationError``: a
block over Slack's limits; ``SlackRequestError``: a request it cannot make): it is this
message's fault, not Slack's, and the incident's later messages go on.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import aiohttp
from slack_sdk.errors import (
    SlackApiError,
    SlackClientError,
    SlackObjectFormationError,
    SlackRequestError,
)

from bot.errors import RuleloopError
from bot.runtime.ids import new_error_id

log = logging.getLogger("ruleloop.outbox")
# ok=false errors Slack documents as passing (its side is failing, or the call was throttled)
TRANSIENT = frozenset(
    {"ratelimited", "internal_error", "fatal_error", "service_unavailable", "request_timeout",
     "team_added_to_org"}
)  # fmt: skip


@dataclass(frozen=True)
class Failure:
    """A failed delivery: trying again may help or not, the reason, how long Slack asked."""

    permanent: bool
    reason: str
    retry_after_s: float | None = None
    unreachable: bool = False  # Slack itself is failing: the next message will fail the same


def classify(exc: BaseException) -> Failure:
    """The verdict on one failed Slack call (the notifiers' errors keep Slack's as the cause)."""
    api = _cause(exc, SlackApiError)
    advice = str(exc) if isinstance(exc, RuleloopError) else None
    if isinstance(api, SlackApiError):
        status = int(api.response.status_code)
        error = str(api.response.get("error") or "") if _is_json(api) else ""
        said = error or f"HTTP {status}"
        if status == 429 or error == "ratelimited":
            wait = _retry_after(api)
            return Failure(False, f"rate limited by Slack ({said})", wait, True)
        if status >= 500 or error in TRANSIENT:
            return Failure(False, f"Slack is failing ({said})", None, True)
        return Failure(True, advice or f"Slack refused it: {said}")
    built = _cause(exc, SlackObjectFormationError, SlackRequestError)
    if built is not None:  # refused here, before Slack saw it: the same every time
        return Failure(True, f"the message could not be built ({type(built).__name__}: {built})")
    if _cause(exc, aiohttp.ClientError, asyncio.TimeoutError, OSError, SlackClientError):
        return Failure(False, f"Slack unreachable: {type(exc).__name__}: {exc}", None, True)
    if advice is not None:
        return Failure(True, advice)
    error_id = new_error_id()
    log.error("a Slack message failed unexpectedly (id %s)", error_id, exc_info=exc)
    return Failure(True, f"unexpected error (id {error_id}; details in the bot's log)")


def _cause(exc: BaseException, *kinds: type[BaseException]) -> BaseException | None:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kinds):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _is_json(error: SlackApiError) -> bool:
    return isinstance(error.response.data, dict)


def _retry_after(error: SlackApiError) -> float | None:
    headers = {k.lower(): v for k, v in (error.response.headers or {}).items()}
    value = headers.get("retry-after")
    if isinstance(value, list):
        value = value[0] if value else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
