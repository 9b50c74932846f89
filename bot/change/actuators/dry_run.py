"""The dry-run actuator: changes nothing; the flow says exactly what would change and stops."""

from __future__ import annotations

from bot.change.actuators.base import Deployed
from bot.change.argv import FlagValues


class DryRunActuator:
    """Reports the flags it was given as if applied; nothing runs, so there is no canary."""

    kind = "dry-run"
    changes_flags = False

    def __init__(self, *, vllm_url: str) -> None:
        self._url = vllm_url
        self._flags: FlagValues = {}

    async def aclose(self) -> None:
        """Nothing to close."""

    async def current(self) -> Deployed:
        """Unknown flags (a dry run reads nothing): an empty set."""
        return Deployed(flags=dict(self._flags), base_url=self._url, detail={"dry_run": True})

    async def apply(self, flags: FlagValues) -> Deployed:
        """Remember the flags only."""
        self._flags = dict(flags)
        return await self.current()

    async def promote(self, flags: FlagValues) -> Deployed:
        """Nothing to promote."""
        return await self.current()

    async def rollback(self, before: Deployed) -> Deployed:
        """Forget the flags."""
        self._flags = dict(before.flags)
        return await self.current()

    async def stage(self, recorded: Deployed) -> Deployed:
        """Remember the recorded flags only."""
        self._flags = dict(recorded.flags)
        return await self.current()
