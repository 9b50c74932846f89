"""Silence 1h / Acknowledge in an incident's thread: single-use buttons, checked, acted on once
(``bot.remediation.thread_buttons``)."""

from __future__ import annotations

from bot.surfaces.slack.listeners.actions.token_button import token_button
from bot.surfaces.slack.services import Services


async def _press(services: Services, user_id: str, token: str) -> str | None:
    return await services.thread.press(user_id=user_id, token=token)


handle = token_button(_press, name="thread-button")
