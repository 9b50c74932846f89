"""Slack user groups in access lists: an ``S...`` entry stands for the group's members.

Members are read with usergroups.users.list (scope ``usergroups:read``) and kept for a few
minutes. A group that cannot be read grants nothing (fail closed); the reason is logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

from bot.kernel import AccessSettings
from bot.kernel.runtime import is_group

log = logging.getLogger("ruleloop.slack")
CACHE_S = 300.0


class SlackUserGroups:
    """Expands user-group IDs in access lists into their members."""

    def __init__(
        self, client: AsyncWebClient, *, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self._client = client
        self._monotonic = monotonic
        self._cache: dict[str, tuple[float, list[str]]] = {}

    async def expand(self, access: AccessSettings) -> AccessSettings:
        """``access`` with every group ID replaced by the group's members."""
        lists = access.model_dump()
        out = {}
        for action, entries in lists.items():
            expanded: list[str] = []
            for entry in entries:
                expanded += await self._members(entry) if is_group(entry) else [entry]
            out[action] = expanded
        return AccessSettings(**out)

    async def _members(self, group: str) -> list[str]:
        cached = self._cache.get(group)
        if cached is not None and self._monotonic() - cached[0] < CACHE_S:
            return cached[1]
        try:
            response = await self._client.usergroups_users_list(usergroup=group)
        except (SlackApiError, SlackClientError) as exc:
            log.warning("cannot read the members of user group %s: %s", group, exc)
            return []  # unreadable: nobody (fail closed)
        users: list[str] = response.get("users") or []
        members = [str(user) for user in users]
        self._cache[group] = (self._monotonic(), members)
        return members
