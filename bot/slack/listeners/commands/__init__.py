"""Slash commands."""

from __future__ import annotations

from slack_bolt.async_app import AsyncApp

from bot.slack.listeners.commands import diagnose


def register(app: AsyncApp) -> None:
    """Register the slash commands."""
    app.command("/diagnose")(diagnose.handle)
