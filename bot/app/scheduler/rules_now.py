"""The rules in force on a target, as the diagnosis judges causes against them.

The diagnosis sits below the scheduler's layer; it gets this reader through its constructor
(bot/app/server.py), like the target's "normal" numbers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from bot.adr import AdrStore
from bot.change import adrs_in_force
from bot.diagnosis import DriftCheck, RulesInForce
from bot.kernel.store import Database, JobRun


class RulesNow:
    """Reads the accepted ADRs in force on a target (``bot.change.in_force``) and the
    workload drift job's latest check there."""

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
            with self._db.transaction() as s:
                drift = last_drift_check(s, target)
            return RulesInForce(adrs=tuple(found.adrs), drift=drift)

        return await asyncio.to_thread(read)


def last_drift_check(s: Session, target: str, *, look_at: int = 20) -> DriftCheck | None:
    """The workload job's latest period on ``target`` that compared shapes (its job run's
    detail; a period skipped for want of a live shape compared nothing)."""
    runs = s.scalars(
        select(JobRun)
        .where(JobRun.job == f"workload:{target}", JobRun.state == "done")
        .order_by(JobRun.period.desc())
        .limit(look_at)
    )
    for run in runs:
        detail = run.detail or {}
        if "drifted" not in detail:
            continue
        lines = detail.get("dimensions") or {}
        drifted = {str(i): [str(line) for line in lines.get(i) or []] for i in detail["drifted"]}
        at = run.finished_at or run.period
        return DriftCheck(at, tuple(str(i) for i in detail.get("adrs") or ()), drifted)
    return None
