"""Why a Slack call failed, decided where it failed: the notifier's one error boundary.

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
from collections.abc import Iterator
from contextlib import contextmanager

import aiohttp
from slack_sdk.errors import (
    SlackApiError,
    SlackClientError,
    SlackObjectFormationError,
    SlackRequestError,
)

from bot.kernel import RuleloopError
from bot.kernel.chat import DeliveryFailed, Failure

# ok=false errors Slack documents as passing (its side is failing, or the call was throttled)
TRANSIENT = frozenset(
    {"ratelimited", "internal_error", "fatal_error", "service_unavailable", "request_timeout",
     "team_added_to_org"}
)  # fmt: skip
# what a Slack Web API call can raise: slack_sdk's errors and its aiohttp transport's
SLACK_ERRORS = (SlackClientError, aiohttp.ClientError, asyncio.TimeoutError, OSError)


@contextmanager
def slack_boundary(what: str) -> Iterator[None]:
    """Turn any Slack failure inside into one ``DeliveryFailed`` saying ``what`` failed and
    whether trying again can help; advice raised inside (a RuleloopError) stays permanent."""
    try:
        yield
    except DeliveryFailed:
        raise
    except RuleloopError as exc:  # our own advice (invite the bot): this message's fault
        raise DeliveryFailed(str(exc), Failure(True, str(exc))) from exc
    except SLACK_ERRORS as exc:
        said = (
            str(exc.response.get("error", exc.response.status_code))
            if isinstance(exc, SlackApiError)
            else str(exc)
        )
        raise DeliveryFailed(f"{what}: {said}", slack_failure(exc, what)) from exc


def slack_failure(exc: BaseException, what: str = "Slack refused it") -> Failure:
    """The verdict on one failed Slack call (``what``: the call, for a refusal's reason)."""
    if isinstance(exc, SlackApiError):
        status = int(exc.response.status_code)
        error = str(exc.response.get("error") or "") if _is_json(exc) else ""
        said = error or f"HTTP {status}"
        if status == 429 or error == "ratelimited":
            return Failure(False, f"rate limited by Slack ({said})", _retry_after(exc), True)
        if status >= 500 or error in TRANSIENT:
            return Failure(False, f"Slack is failing ({said})", None, True)
        return Failure(True, f"{what}: {said}")
    if isinstance(exc, SlackObjectFormationError | SlackRequestError):
        # refused here, before Slack saw it: the same every time
        return Failure(True, f"the message could not be built ({type(exc).__name__}: {exc})")
    return Failure(False, f"Slack unreachable: {type(exc).__name__}: {exc}", None, True)


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
