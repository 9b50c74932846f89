"""Slack mrkdwn from text the bot does not control: the one place it is escaped and clipped.

Alert labels and annotations, error bodies and ADR text can hold ``<!channel>`` or
``<https://x|Re-authenticate>``: sent as they are, Slack renders a live broadcast and a disguised
link. Slack's own rule is to escape ``&``, ``<`` and ``>`` in text that is not markup; after
that, no text can open a mention, a link or a broadcast. Every view passes untrusted strings
through ``escape`` (or ``escape_keeping`` for the bot's own notes, which name who acted).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

ELLIPSIS = "…"
_USER_MENTION = re.compile(r"&lt;@([UW][A-Z0-9]+)&gt;")


def escape(text: object) -> str:
    """``text`` as mrkdwn that shows it literally: ``&``, ``<`` and ``>`` as entities."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def unescape(text: str) -> str:
    """The text an escaped mrkdwn string shows (the console prints it)."""
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def escape_keeping(text: object, users: Iterable[str | None]) -> str:
    """``escape``, then the mentions of ``users`` (IDs Slack gave the bot) live again.

    The bot's notes say who approved or cancelled (``<@U012>``) next to error text from
    actuators and canaries; only the IDs given here become mentions, nothing the text adds.
    """
    known = {user for user in users if user}
    return _USER_MENTION.sub(
        lambda m: f"<@{m[1]}>" if m[1] in known else m[0],
        escape(text),
    )


def mention(user_id: object) -> str:
    """``<@U012>``: a Slack user ID as a mention; anything else in it shown literally (an ID is
    Slack's word, but a payload's ``user.id`` is still text the bot did not write)."""
    return f"<@{escape(user_id)}>"


def clip(text: str, limit: int) -> str:
    """At most ``limit`` characters, ending in an ellipsis when cut; never half an entity."""
    if len(text) <= limit:
        return text
    cut = text[: limit - len(ELLIPSIS)]
    amp = cut.rfind("&")
    if amp != -1 and ";" not in cut[amp:]:  # "&am" would show as garbage
        cut = cut[:amp]
    return cut + ELLIPSIS


def plain(text: object, limit: int | None = None) -> str:
    """``escape``, then ``clip`` to ``limit`` when one is given."""
    escaped = escape(text)
    return escaped if limit is None else clip(escaped, limit)
