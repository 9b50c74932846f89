"""Who may do what: access lists of Slack user and user-group IDs, and how to name them."""

from __future__ import annotations

import re
from typing import Protocol

from bot.kernel.config import AccessSettings

GROUP_ID = re.compile(r"^S[A-Z0-9]{6,}$")


def who_may(allowed: list[str]) -> str:
    """'<@U1>, <!subteam^S1>' / 'everyone' / 'nobody yet (set [access] in the bot's config)'."""
    if "*" in allowed:
        return "everyone"
    names = (f"<!subteam^{e}>" if is_group(e) else f"<@{e}>" for e in allowed)
    return ", ".join(names) or "nobody yet (set [access] in the bot's config)"


def is_group(entry: str) -> bool:
    """A Slack user group (subteam) ID such as S0123ABCD, rather than a user ID."""
    return bool(GROUP_ID.match(entry))


class AccessExpander(Protocol):
    """Replaces user-group IDs in access lists by their members (Slack: usergroups.users.list)."""

    async def expand(self, access: AccessSettings) -> AccessSettings:
        """``access`` with groups replaced by their members."""
        ...


class Members:
    """The configured access lists with Slack user groups replaced by their members (read when
    asked, so a group's change counts at the next click)."""

    def __init__(self, access: AccessSettings, groups: AccessExpander | None = None) -> None:
        self._access = access
        self._groups = groups

    async def __call__(self) -> AccessSettings:
        """The access lists, groups expanded."""
        return self._access if self._groups is None else await self._groups.expand(self._access)
