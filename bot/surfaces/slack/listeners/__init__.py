"""Slack listeners, one per file under their kind; each kind has ``register(app)``."""

from __future__ import annotations

from slack_bolt.async_app import AsyncApp

from bot.surfaces.slack.listeners import actions, commands


def register(app: AsyncApp) -> None:
    """Register every listener kind."""
    commands.register(app)
    actions.register(app)
