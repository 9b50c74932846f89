"""Approve / Cancel on a remediation card: single-use buttons, checked, acted on once."""

from __future__ import annotations

from bot.surfaces.slack.listeners.actions.token_button import token_button
from bot.surfaces.slack.services import Services


async def _decide(services: Services, user_id: str, token: str) -> None:
    await services.remediation.click(user_id=user_id, token=token)


handle = token_button(_decide, name="decide")
