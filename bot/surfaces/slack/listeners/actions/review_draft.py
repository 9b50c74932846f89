"""Accept / Reject on an ADR draft: reviewers only, never the author alone, once."""

from __future__ import annotations

from bot.surfaces.slack.listeners.actions.token_button import token_button
from bot.surfaces.slack.services import Services


async def _review(services: Services, user_id: str, token: str) -> None:
    await services.drafts.review(user_id=user_id, token=token)


handle = token_button(_review, name="review-draft")
