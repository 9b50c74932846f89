"""A failed delivery, as the outbox's retry rule reads it.

The notifier decides at its boundary (``bot/surfaces/slack/failures.py``) whether trying again can
help and raises ``DeliveryFailed`` with that verdict; the outbox only reads it. Any other error is
permanent: our own advice (a RuleloopError) as it says, anything else as an unexpected error with an
id to find it in the log.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from bot.kernel.errors import EndpointError, RuleloopError
from bot.kernel.runtime.ids import new_error_id

log = logging.getLogger("ruleloop.outbox")


@dataclass(frozen=True)
class Failure:
    """A failed delivery: trying again may help or not, the reason, how long Slack asked."""

    permanent: bool
    reason: str
    retry_after_s: float | None = None
    unreachable: bool = False  # Slack itself is failing: the next message will fail the same


class DeliveryFailed(EndpointError):
    """A message the chat service did not take, with the verdict on trying again."""

    def __init__(self, message: str, failure: Failure) -> None:
        super().__init__(message)
        self.failure = failure


def classify(exc: BaseException) -> Failure:
    """The verdict on one failed delivery."""
    if isinstance(exc, DeliveryFailed):
        return exc.failure
    if isinstance(exc, RuleloopError):
        return Failure(True, str(exc))
    error_id = new_error_id()
    log.error("a Slack message failed unexpectedly (id %s)", error_id, exc_info=exc)
    return Failure(True, f"unexpected error (id {error_id}; details in the bot's log)")
