"""Which Slack workspace, and which of its people, may drive the bot.

Slack signs every request with the app's one signing secret, whichever workspace it comes from,
so a valid signature does not say "ours". With ``[slack] team_id`` (and ``enterprise_id``) set,
requests from another workspace or org are refused. Changes (apply, approve, review) are also
refused to people whose home workspace is another one (and so are the incident thread's
Silence and Acknowledge), such as Slack Connect members of a
shared incident channel, even where an access list says "*". Their home workspace comes from
the click's payload (``user.team_id``) or, for slash commands, from users.info (cached; a user
who cannot be looked up may not change anything). The bot's own workspace is ``[slack]
team_id`` or, unset, what auth.test says (cached). Those two look-ups are Slack calls, so the
check runs after the ack, first in the deferred work (``bot.surfaces.slack.deferred``). What
counts as a
change is what the listener bolt dispatches to will do, whatever the payload type (bolt's
``app.action(name)`` also matches a legacy attachment or dialog ``callback_id``); payload types
the bot never sends (anything but ``block_actions``) are refused outright.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from slack_bolt.context.async_context import AsyncBoltContext
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

from bot.kernel import EndpointError, NotAllowed, SlackSettings
from bot.surfaces.slack.deferred import MEMBER_CHECK
from bot.surfaces.slack.remediation_views import DECIDE_ACTIONS, REVIEW_ACTIONS
from bot.surfaces.slack.shapes import BUTTONS
from bot.surfaces.slack.views import APPLY_ACTION, THREAD_ACTIONS

log = logging.getLogger("ruleloop.slack")
CACHE_S = 300.0
CHANGE_COMMANDS = frozenset({"/apply-adr"})
CHANGE_ACTIONS = frozenset({APPLY_ACTION, *DECIDE_ACTIONS, *REVIEW_ACTIONS, *THREAD_ACTIONS})
EXTERNAL = (
    "You are not a member of this workspace (your home workspace is {home}): people from other "
    "organisations (Slack Connect) may not apply, approve or review changes here. "
    "Nothing was changed."
)


def request_origin(body: dict[str, Any]) -> tuple[str | None, str | None]:
    """The workspace (team) and Enterprise Grid org a slash command or click came from."""
    team = body.get("team")
    team = team if isinstance(team, dict) else {}
    enterprise = body.get("enterprise")
    enterprise = enterprise if isinstance(enterprise, dict) else {}
    return (
        body.get("team_id") or team.get("id"),
        body.get("enterprise_id") or enterprise.get("id") or team.get("enterprise_id"),
    )


def changes_something(body: dict[str, Any]) -> bool:
    """Whether the request would reach a listener that applies, approves (or cancels) or
    reviews a change: by its command, an action's action_id, or a callback_id (bolt's
    ``app.action(name)`` also matches a legacy ``interactive_message`` or ``dialog_*``
    payload, or a view, by that name), whatever the payload type."""
    command = body.get("command")
    if isinstance(command, str) and command in CHANGE_COMMANDS:
        return True
    actions = body.get("actions")
    named = [a.get("action_id") for a in actions if isinstance(a, dict)] if isinstance(
        actions, list
    ) else []  # fmt: skip
    view = body.get("view")
    named += [body.get("callback_id"), view.get("callback_id") if isinstance(view, dict) else None]
    return any(isinstance(name, str) and name in CHANGE_ACTIONS for name in named)


class HomeTeams:
    """A user's home workspace and org, from users.info, kept for a few minutes."""

    def __init__(
        self, client: AsyncWebClient, *, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self._client = client
        self._monotonic = monotonic
        self._cache: dict[str, tuple[float, set[str]]] = {}
        self._ours: set[str] | None = None

    async def of(self, user_id: str) -> set[str]:
        """The team and enterprise IDs the user belongs to (empty: unknown)."""
        cached = self._cache.get(user_id)
        if cached is not None and self._monotonic() - cached[0] < CACHE_S:
            return cached[1]
        try:
            response = await self._client.users_info(user=user_id)
        except (SlackApiError, SlackClientError) as exc:
            log.warning("cannot look up the workspace of user %s: %s", user_id, exc)
            return set()  # unknown: treated as external (fail closed)
        user = response.get("user") or {}
        grid = user.get("enterprise_user") or {}
        homes = {str(i) for i in (user.get("team_id"), grid.get("enterprise_id")) if i}
        self._cache[user_id] = (self._monotonic(), homes)
        return homes

    async def ours(self) -> set[str]:
        """The bot's own workspace and org, from auth.test (kept once known).

        EndpointError when Slack cannot say now: nobody may change anything until it can.
        """
        if self._ours is None:
            try:
                response = await self._client.auth_test()
            except (SlackApiError, SlackClientError, OSError) as exc:
                raise EndpointError(
                    f"cannot check which Slack workspace this bot serves right now ({exc}); "
                    "nothing was changed: ask again in a minute."
                ) from exc
            ids = (response.get("team_id"), response.get("enterprise_id"))
            self._ours = {str(i) for i in ids if i}
        return self._ours


def workspace_guard(settings: SlackSettings, homes: HomeTeams) -> Callable[..., Awaitable[Any]]:
    """A bolt middleware that refuses other workspaces and external users (NotAllowed)."""

    async def guard(
        body: dict[str, Any], context: AsyncBoltContext, next: Callable[[], Awaitable[Any]]
    ) -> Any:
        if body.get("type", BUTTONS) != BUTTONS:  # legacy attachments, dialogs, modals...
            raise NotAllowed(
                "This bot sends Block Kit buttons only; it does not act on this kind of "
                "request. Nothing was done."
            )
        team, enterprise = request_origin(body)
        if settings.team_id and team != settings.team_id:
            raise NotAllowed(
                f"This bot serves the Slack workspace {settings.team_id} only; this request "
                f"came from {team or 'no workspace'}. Nothing was done."
            )
        if settings.enterprise_id and enterprise != settings.enterprise_id:
            raise NotAllowed(
                f"This bot serves the Slack Enterprise Grid org {settings.enterprise_id} only; "
                f"this request came from {enterprise or 'outside any org'}. Nothing was done."
            )
        if changes_something(body):  # checked after the ack: it may call Slack
            context[MEMBER_CHECK] = functools.partial(_refuse_external, body, settings, homes)
        return await next()

    return guard


async def _refuse_external(body: dict[str, Any], settings: SlackSettings, homes: HomeTeams) -> None:
    """NotAllowed when the user's home workspace is not the bot's own."""
    pinned = {i for i in (settings.team_id, settings.enterprise_id) if i}
    ours = pinned if settings.team_id else await homes.ours() | pinned
    user = body.get("user")
    user = user if isinstance(user, dict) else {}
    user_id = str(body.get("user_id") or user.get("id") or "")
    given = user.get("team_id")  # interactive payloads carry it; slash commands do not
    home = {str(given)} if given else await homes.of(user_id)
    if not home & ours:
        raise NotAllowed(EXTERNAL.format(home=", ".join(sorted(home)) or "unknown"))
