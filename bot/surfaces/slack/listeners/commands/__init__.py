"""Slash commands: ``COMMANDS`` maps each name to its handler (the Slack manifest must agree)."""

from __future__ import annotations

from slack_bolt.async_app import AsyncApp

from bot.surfaces.slack.listeners.commands import adr_draft, apply_adr, diagnose

COMMANDS = {
    "/diagnose": diagnose.handle,
    "/apply-adr": apply_adr.handle,
    "/adr-draft": adr_draft.handle,
}


def register(app: AsyncApp) -> None:
    """Register the slash commands."""
    for name, handler in COMMANDS.items():
        app.command(name)(handler)
