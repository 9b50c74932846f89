"""The steps on the ``changes`` table that every kind of change shares: one heartbeat, one
"silent for how long" on the database's clock, one conditional-update count.

A remediation (bot.remediation.records) and a tuning session or drift before-run
(bot.tune.records) each add their own steps; these are the ones they must not each write.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable
from typing import Any, cast

from sqlalchemy import ColumnElement, Executable, or_, select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session

from bot.change import exclusion
from bot.kernel.store import ACTIVE, TUNING, Change, Database, db_ago, db_now

# a change in these states has a run working on it (a remediation pending approval has none)
RUNS = frozenset(ACTIVE) | frozenset(TUNING)


def rowcount(session: Session, statement: Executable) -> int:
    """Rows an UPDATE changed."""
    return cast(CursorResult[Any], session.execute(statement)).rowcount


def silent(seconds: float) -> ColumnElement[bool]:
    """No step or heartbeat for ``seconds``, on the database's clock."""
    return or_(Change.heartbeat_at.is_(None), Change.heartbeat_at < db_ago(seconds))


def beat(session: Session, change_id: int, *, runner: str) -> bool:
    """Say the run of a change, of any kind, is alive (database clock); False when it is no
    longer this runner's, or no longer running (``RUNS``)."""
    query = (
        update(Change)
        .where(Change.id == change_id, Change.runner == runner, Change.state.in_(list(RUNS)))
        .values(heartbeat_at=db_now())
    )
    return rowcount(session, query) == 1


def stale(session: Session, *, older_than_s: float) -> list[Change]:
    """Every change, of any kind, whose run was silent longer than the limit (database
    clock): its process died, and the next bot takes it over (bot.change.resume)."""
    query = select(Change).where(Change.state.in_(list(RUNS)), silent(older_than_s))
    return list(session.scalars(query.order_by(Change.id)).all())


class ChangeRecords:
    """What the records of every kind of change share, on one database: who holds a target
    and the one heartbeat (bot.remediation.records and bot.tune.records add their steps)."""

    def __init__(self, *, db: Database, clock: Callable[[], dt.datetime]) -> None:
        self._db = db
        self._clock = clock

    async def in_flight(self, target: str) -> exclusion.Holder | None:
        """The change (of any kind) holding ``target``, if any."""

        def run() -> exclusion.Holder | None:
            with self._db.transaction() as s:
                return exclusion.holder(s, target)

        return await asyncio.to_thread(run)

    async def heartbeat(self, change_id: int, *, runner: str) -> bool:
        """Say the run is alive (on the database's clock); False when it is no longer this
        runner's, or no longer running."""

        def run() -> bool:
            with self._db.transaction() as s:
                return beat(s, change_id, runner=runner)

        return await asyncio.to_thread(run)
