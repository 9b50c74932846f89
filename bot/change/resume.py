"""One resume path for every kind of change: after a restart (and on the approval sweep's
schedule) the changes whose run went silent, whatever their kind, are found by one query on the
changes table and each is handed to the restorer of its kind, which takes it over with one
conditional UPDATE (a run that beat meanwhile keeps its change) and puts the target back.

A remediation is rolled back (bot.remediation.service), a tuning session or a drift before-run
restored (bot.tune.on_target); the restorers are handed in by whoever wires them, so this layer
knows no flow.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Protocol

from bot.change import rows
from bot.kernel.store import Change, Database

log = logging.getLogger("ruleloop.change")


class Restorer(Protocol):
    """Takes over one silent change of its kind and puts its target back."""

    async def take_over(self, change: Change, *, stale_s: float) -> bool:
        """True when this process took it over (False: another did, or its run beat again)."""
        ...


async def resume(db: Database, restorers: Mapping[str, Restorer], *, stale_s: float) -> int:
    """Take over every change silent ``stale_s``, each by its kind's restorer; how many."""

    def find() -> list[Change]:
        with db.transaction() as s:
            return rows.stale(s, older_than_s=stale_s)

    taken = 0
    for change in await asyncio.to_thread(find):
        restorer = restorers.get(change.kind)
        if restorer is None:  # a kind this bot does not know (a newer version wrote it)
            log.error("change %s of kind %r has no restorer here: left", change.id, change.kind)
            continue
        taken += await restorer.take_over(change, stale_s=stale_s)
    return taken
