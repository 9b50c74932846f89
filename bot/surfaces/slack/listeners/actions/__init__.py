"""Block actions (buttons): ``ACTIONS`` maps each action_id to its handler."""

from __future__ import annotations

from slack_bolt.async_app import AsyncApp

from bot.surfaces.slack.listeners.actions import apply_adr, decide, review_draft, thread_buttons
from bot.surfaces.slack.remediation_views import DECIDE_ACTIONS, REVIEW_ACTIONS
from bot.surfaces.slack.views import APPLY_ACTION, THREAD_ACTIONS

ACTIONS = {
    APPLY_ACTION: apply_adr.handle,
    **dict.fromkeys(DECIDE_ACTIONS, decide.handle),
    **dict.fromkeys(REVIEW_ACTIONS, review_draft.handle),
    **dict.fromkeys(THREAD_ACTIONS, thread_buttons.handle),
}


def register(app: AsyncApp) -> None:
    """Register the button handlers."""
    for action_id, handler in ACTIONS.items():
        app.action(action_id)(handler)
