"""Slack's wire format, shared by every layer that writes to a thread (the Slack app sits above).

messages.py  ``MessageRef``, ``IncidentView`` and the ``Notifier`` role Slack and the console play
mrkdwn.py    escaping and clipping text for mrkdwn (no alert text becomes a live mention)
failures.py  a failed delivery and its verdict on retrying (the Slack notifier decides it)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.kernel import face_of

if TYPE_CHECKING:
    from bot.kernel.chat.failures import DeliveryFailed as DeliveryFailed
    from bot.kernel.chat.failures import Failure as Failure
    from bot.kernel.chat.failures import classify as classify
    from bot.kernel.chat.messages import ACKNOWLEDGE as ACKNOWLEDGE
    from bot.kernel.chat.messages import CAUSE as CAUSE
    from bot.kernel.chat.messages import CAUSE_CONFIRMED as CAUSE_CONFIRMED
    from bot.kernel.chat.messages import CAUSE_WRONG as CAUSE_WRONG
    from bot.kernel.chat.messages import RETUNE as RETUNE
    from bot.kernel.chat.messages import SILENCE as SILENCE
    from bot.kernel.chat.messages import IncidentView as IncidentView
    from bot.kernel.chat.messages import MessageRef as MessageRef
    from bot.kernel.chat.messages import Notifier as Notifier
    from bot.kernel.chat.mrkdwn import clip as clip
    from bot.kernel.chat.mrkdwn import escape as escape
    from bot.kernel.chat.mrkdwn import escape_keeping as escape_keeping
    from bot.kernel.chat.mrkdwn import mention as mention
    from bot.kernel.chat.mrkdwn import plain as plain
    from bot.kernel.chat.mrkdwn import unescape as unescape

__all__ = [
    "ACKNOWLEDGE",
    "CAUSE",
    "CAUSE_CONFIRMED",
    "CAUSE_WRONG",
    "DeliveryFailed",
    "Failure",
    "IncidentView",
    "MessageRef",
    "Notifier",
    "RETUNE",
    "SILENCE",
    "classify",
    "clip",
    "escape",
    "escape_keeping",
    "mention",
    "plain",
    "unescape",
]

if not TYPE_CHECKING:
    __getattr__ = face_of(__name__, __file__)
