"""Store operations of a tuning session on a target, each one transaction with its audit entry.

A session is written before its first change (with ``before``, what served), every trial is
written before it changes the target and after it was put back, and its end is written once
the target serves ``before`` again. Steps are conditional updates (the session's state and its
runner), as a remediation's are: a process that lost the session to a restore started
elsewhere changes nothing more.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from bot.change import exclusion, rows
from bot.kernel.store import TUNING, ChangeKind, ChangeState, DriftBeforeRun, TuneSession, db_now
from bot.kernel.store import service as store


class TuneRecords(rows.ChangeRecords):
    """Tuning sessions on one database."""

    async def begin(
        self,
        *,
        target: str,
        requested_by: str,
        approved_by: Sequence[str],
        plan: Mapping[str, Any],
        before: Mapping[str, Any],
        runner: str,
        detail: Mapping[str, Any],
        kind: ChangeKind = ChangeKind.TUNING,
    ) -> TuneSession:
        """A running session on ``target`` (a tuning session, or with ``kind`` a drift
        before-run), audited as started; TargetBusy when any change holds the target (the
        store's one index on holding changes decides a race)."""
        model = DriftBeforeRun if kind == ChangeKind.DRIFT_BEFORE_RUN else TuneSession

        def run() -> TuneSession:
            now = self._clock()
            try:
                with self._db.transaction() as s:
                    busy = exclusion.holder(s, target)
                    if busy is None:
                        row = model(
                            target=target, state=ChangeState.RUNNING, requested_by=requested_by,
                            approved_by=list(approved_by), plan=dict(plan), before=dict(before),
                            trial={}, result={}, created_at=now, updated_at=now, runner=runner,
                            heartbeat_at=db_now(),
                        )  # fmt: skip
                        s.add(row)
                        s.flush()
                        store.audit(
                            s, at=now, actor=requested_by, action="tune.started",
                            detail={"tune_session": row.id, "target": target,
                                    "state": ChangeState.RUNNING, "kind": kind,
                                    "approved_by": list(approved_by), "before": dict(before),
                                    **detail},
                        )  # fmt: skip
                        s.refresh(row)
                        return row
            except IntegrityError:
                with self._db.transaction() as s:  # another session won the race on the index
                    busy = exclusion.holder(s, target)
                if busy is None:
                    raise
            raise exclusion.TargetBusy(busy)

        return await asyncio.to_thread(run)

    async def in_flight(self, target: str) -> exclusion.Holder | None:
        """The remediation or session holding ``target``, if any."""

        def run() -> exclusion.Holder | None:
            with self._db.transaction() as s:
                return exclusion.holder(s, target)

        return await asyncio.to_thread(run)

    async def get(self, session_id: int) -> TuneSession:
        """One session (it must exist)."""

        def run() -> TuneSession:
            with self._db.transaction() as s:
                row = s.get(TuneSession, session_id)
                assert row is not None, session_id
                return row

        return await asyncio.to_thread(run)

    async def latest(self, target: str) -> TuneSession | None:
        """The newest session on ``target``, in flight or not."""

        def run() -> TuneSession | None:
            with self._db.transaction() as s:
                query = select(TuneSession).where(TuneSession.target == target)
                return s.scalars(query.order_by(TuneSession.id.desc())).first()

        return await asyncio.to_thread(run)

    async def step(
        self,
        session_id: int,
        *,
        action: str,
        detail: Mapping[str, Any],
        owner: str,
        from_states: Iterable[str] = TUNING,
        **fields: Any,
    ) -> bool:
        """Audit a step and write ``fields`` (state, trial, result) in one transaction; False,
        changing nothing, unless the session is in ``from_states`` and run by ``owner``."""

        def run() -> bool:
            now = self._clock()
            with self._db.transaction() as s:
                query = update(TuneSession).where(
                    TuneSession.id == session_id,
                    TuneSession.state.in_(list(from_states)),
                    TuneSession.runner == owner,
                )
                values = {"updated_at": now, "heartbeat_at": db_now(), **fields}
                if rows.rowcount(s, query.values(**values)) != 1:
                    return False
                row = s.get(TuneSession, session_id)
                assert row is not None
                store.audit(
                    s, at=now, actor="ruleloop", action=action,
                    detail={"tune_session": session_id, "target": row.target, "state": row.state,
                            **detail},
                )  # fmt: skip
                return True

        return await asyncio.to_thread(run)

    async def heartbeat(self, session_id: int, *, runner: str) -> bool:
        """Say the run is alive (database clock); False when it is no longer this runner's."""

        def run() -> bool:
            with self._db.transaction() as s:
                return rows.beat(s, session_id, runner=runner)

        return await asyncio.to_thread(run)

    async def take_over(
        self, session_id: int, *, runner: str, stale_s: float | None, was_run_by: str | None
    ) -> bool:
        """Become the run that restores a session: one conditional UPDATE (still in flight,
        still run by ``was_run_by``, and silent ``stale_s`` unless None: its runner is known
        dead), audited as resumed. False when another process took it, or its run beat again."""

        def run() -> bool:
            now = self._clock()
            with self._db.transaction() as s:
                query = update(TuneSession).where(
                    TuneSession.id == session_id, TuneSession.state.in_(list(TUNING))
                )
                query = query.where(
                    TuneSession.runner.is_(None)
                    if was_run_by is None
                    else TuneSession.runner == was_run_by
                )
                if stale_s is not None:
                    query = query.where(rows.silent(stale_s))
                moved = rows.rowcount(
                    s,
                    query.values(
                        state="restoring", runner=runner, updated_at=now, heartbeat_at=db_now()
                    ),
                )
                if moved != 1:
                    return False
                row = s.get(TuneSession, session_id)
                assert row is not None
                store.audit(
                    s, at=now, actor="ruleloop", action="tune.resumed",
                    detail={"tune_session": session_id, "target": row.target, "state": "restoring",
                            "was_run_by": was_run_by, "trial": dict(row.trial)},
                )  # fmt: skip
                return True

        return await asyncio.to_thread(run)
