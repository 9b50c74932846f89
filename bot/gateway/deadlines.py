"""Request deadlines: the `X-Request-Timeout` header and how its value is read.

Units (the contract clients rely on):
  ``5`` or ``2.5``   a plain number is seconds
  ``500ms``          milliseconds
  ``2s``             seconds
Whitespace around the value and the unit's case are ignored. Zero, negative, non-finite and
non-numeric values are refused (the client gets a 400, nothing is admitted). A value above the
gateway's ``max_timeout_s`` is lowered to it, so no client can hold budget forever.
"""

from __future__ import annotations

import math

HEADER = b"x-request-timeout"


class BadTimeout(ValueError):
    """A timeout value that is not a positive number of seconds or milliseconds."""


def parse_timeout(value: str) -> float:
    """Seconds from a timeout value (`5`, `2.5`, `500ms`, `2s`); raise BadTimeout otherwise."""
    text = value.strip().lower()
    scale = 1.0
    if text.endswith("ms"):
        text, scale = text[:-2], 0.001
    elif text.endswith("s"):
        text = text[:-1]
    try:
        number = float(text.strip())
    except ValueError:
        raise BadTimeout(
            f"X-Request-Timeout {value!r} is not a number; send seconds ('5', '2.5s') "
            "or milliseconds ('500ms')"
        ) from None
    if not math.isfinite(number) or number <= 0:
        raise BadTimeout(f"X-Request-Timeout {value!r} must be a positive, finite duration")
    return number * scale


def request_timeout(header: str | None, *, default_s: float, max_s: float) -> float:
    """The timeout a request gets: its header's value (capped at ``max_s``) or the default."""
    if header is None:
        return min(default_s, max_s)
    return min(parse_timeout(header), max_s)
