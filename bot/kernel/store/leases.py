"""Leases on job periods, kept in the store (``job_runs``), so replicas share scheduled work.

Why a lease row and not a PostgreSQL advisory lock: a lock says who runs a job *now*, not
whether a period was already *done*, so a replica whose tick comes after another's finished
would run the period again; it exists only on PostgreSQL; and it dies with its connection,
leaving no record to take over from. The row does all three on SQLite and PostgreSQL alike:

- claim: ``INSERT ... ON CONFLICT DO NOTHING`` on the unique (job, period): one replica wins;
- heartbeat: the holder pushes ``expires_at`` forward while it works;
- take over: a row still running past ``expires_at`` belongs to a replica that died; another
  claims it with a conditional UPDATE (one wins) and does the period's work;
- finish: a conditional UPDATE (still the holder, not finished) in the same transaction as the
  job's own store writes, so a finished period is never run again and a holder that lost its
  lease writes nothing.

Periods are aligned to the Unix epoch, so every replica computes the same one. Replica clocks
must agree to well within the lease's time to live (NTP does).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from bot.kernel.store.db import Database
from bot.kernel.store.models import JobRun

RUNNING, DONE, FAILED, ABANDONED = "running", "done", "failed", "abandoned"
KEEP_RUNS = dt.timedelta(days=2)  # finished periods older than this are forgotten


def period_start(now: dt.datetime, every_s: float) -> dt.datetime:
    """The start of the period ``now`` falls in (periods are aligned to the Unix epoch)."""
    start = math.floor(round(now.timestamp(), 6) / every_s) * every_s
    return dt.datetime.fromtimestamp(start, dt.UTC)


class LeaseLost(RuntimeError):
    """Another replica took the period over; this one's work must not be kept."""


@dataclass(frozen=True)
class Claim:
    """A period this replica holds."""

    job: str
    period: dt.datetime
    attempt: int  # above 1: a replica before this one started the period and died


class Leases:
    """Lease operations of one replica (``owner``); each method is one transaction."""

    def __init__(self, *, db: Database, owner: str, ttl_s: float, max_attempts: int = 3) -> None:
        self._db = db
        self.owner = owner
        self.ttl = dt.timedelta(seconds=ttl_s)
        self._max_attempts = max_attempts

    def claim(self, job: str, period: dt.datetime, *, now: dt.datetime) -> Claim | None:
        """Claim a period nobody claimed yet; None when another replica has (or had) it."""
        table = JobRun.__table__
        dialect = postgresql if self._db.engine.dialect.name == "postgresql" else sqlite
        insert = (
            dialect.insert(table)
            .values(job=job, period=period, owner=self.owner, state=RUNNING, attempts=1,
                    claimed_at=now, expires_at=now + self.ttl, finished_at=None, detail={})
            .on_conflict_do_nothing(index_elements=["job", "period"])
            .returning(table.c.id)
        )  # fmt: skip
        with self._db.transaction() as s:
            won = s.execute(insert).scalar_one_or_none() is not None
        return Claim(job, period, 1) if won else None

    def orphans(self, job: str, *, now: dt.datetime) -> list[dt.datetime]:
        """Periods of ``job`` left running by a replica whose lease expired, oldest first."""
        query = (
            select(JobRun.period)
            .where(JobRun.job == job, JobRun.finished_at.is_(None), JobRun.expires_at < now)
            .order_by(JobRun.period)
        )
        with self._db.transaction() as s:
            return list(s.scalars(query).all())

    def take_over(self, job: str, period: dt.datetime, *, now: dt.datetime) -> Claim | None:
        """Claim an orphaned period; after ``max_attempts`` holders died, give it up instead."""
        orphaned = (
            JobRun.job == job,
            JobRun.period == period,
            JobRun.finished_at.is_(None),
            JobRun.expires_at < now,
        )
        with self._db.transaction() as s:
            taken = s.execute(
                update(JobRun)
                .where(*orphaned, JobRun.attempts < self._max_attempts)
                .values(owner=self.owner, attempts=JobRun.attempts + 1, claimed_at=now,
                        expires_at=now + self.ttl)
            )  # fmt: skip
            if _rows(taken):
                attempt = s.scalars(
                    select(JobRun.attempts).where(JobRun.job == job, JobRun.period == period)
                ).one()
                return Claim(job, period, attempt)
            s.execute(
                update(JobRun)
                .where(*orphaned)
                .values(state=ABANDONED, finished_at=now, owner=self.owner,
                        detail={"error": f"given up: {self._max_attempts} replicas died on it"})
            )  # fmt: skip
        return None

    def renew(self, claim: Claim, *, now: dt.datetime) -> bool:
        """Push the lease's expiry forward; False when this replica no longer holds it."""
        with self._db.transaction() as s:
            return _rows(
                s.execute(
                    update(JobRun).where(*self._held(claim)).values(expires_at=now + self.ttl)
                )
            )

    def finish(
        self,
        claim: Claim,
        *,
        now: dt.datetime,
        state: str,
        detail: Mapping[str, Any],
        write: Callable[[Session], None] | None = None,
    ) -> None:
        """Mark the period finished, with the job's own writes in the same transaction.

        LeaseLost (and nothing written) when another replica took the period over.
        """
        with self._db.transaction() as s:
            if write is not None:
                write(s)
            finished = s.execute(
                update(JobRun)
                .where(*self._held(claim))
                .values(state=state, finished_at=now, expires_at=now, detail=dict(detail))
            )
            if not _rows(finished):
                raise LeaseLost(f"{claim.job} {claim.period:%H:%M:%S} was taken over")
            s.execute(
                delete(JobRun).where(
                    JobRun.job == claim.job,
                    JobRun.period < now - KEEP_RUNS,
                    JobRun.finished_at.is_not(None),
                )
            )

    def release(self, claim: Claim, *, now: dt.datetime) -> None:
        """Let another replica take the period over at once (this one is stopping)."""
        with self._db.transaction() as s:
            s.execute(update(JobRun).where(*self._held(claim)).values(expires_at=now))

    def _held(self, claim: Claim) -> tuple[Any, ...]:
        return (
            JobRun.job == claim.job,
            JobRun.period == claim.period,
            JobRun.owner == self.owner,
            JobRun.attempts == claim.attempt,
            JobRun.finished_at.is_(None),
        )


def _rows(result: Any) -> bool:
    return bool(getattr(result, "rowcount", 0))
