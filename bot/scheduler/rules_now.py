"""The rules in force on a target, as the diagnosis judges causes against them.

The diagnosis sits below the scheduler's layer; it gets this reader through its constructor
(bot/server.py), like the target's "normal" numbers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from bot.adr.store import AdrStore
from bot.diagnosis.causes import RulesInForce
from bot.scheduler.in_force import adrs_in_force
from bot.store.db import Database


class RulesNow:
    """Reads the accepted ADRs in force on a target (``bot.scheduler.in_force``)."""

    def __init__(
        self, *, db: Database, adrs: AdrStore, listed: Mapping[str, Sequence[str]]
    ) -> None:
        self._db = db
        self._adrs = adrs
        self._listed = listed

    async def read(self, target: str) -> RulesInForce:
        """The rules in force on ``target`` (reads the store in a worker thread)."""

        def read() -> RulesInForce:
            listed = self._listed.get(target, ())
            found = adrs_in_force(self._db, self._adrs, target=target, listed=listed)
            return RulesInForce(adrs=tuple(found.adrs))

        return await asyncio.to_thread(read)
