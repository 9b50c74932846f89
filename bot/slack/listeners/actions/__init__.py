"""Block actions (buttons)."""

from __future__ import annotations

from slack_bolt.async_app import AsyncApp

from bot.slack.listeners.actions import apply_adr
from bot.slack.views import APPLY_ACTION


def register(app: AsyncApp) -> None:
    """Register the button handlers."""
    app.action(APPLY_ACTION)(apply_adr.handle)
