"""APScheduler 3.x wiring: one interval trigger per job, its first fire on a period boundary.

APScheduler only decides *when* this replica ticks; the lease decides *who* works (APScheduler
3.x refuses to share a job store between schedulers, and it would not survive a dead replica
anyway). Every replica ticks every job; the first to claim a period runs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Callable, Iterable

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.interval import IntervalTrigger

from bot.app.scheduler.runner import Job, JobRunner
from bot.kernel.store import period_start

log = logging.getLogger("ruleloop.scheduler")


class Scheduler:
    """The jobs of one bot process; ``start`` inside the event loop, ``stop`` before it ends."""

    def __init__(
        self, *, runner: JobRunner, jobs: Iterable[Job], clock: Callable[[], dt.datetime]
    ) -> None:
        self.runner = runner
        self.jobs: list[Job] = []
        self._clock = clock
        self._aps: AsyncIOScheduler | None = None
        self._running: set[asyncio.Task[None]] = set()
        for job in jobs:
            self.add(job)

    def add(self, job: Job) -> None:
        """Schedule one more job (before ``start``); names are unique."""
        if self._aps is not None:
            raise RuntimeError("add jobs before the scheduler starts")
        if any(j.name == job.name for j in self.jobs):
            raise ValueError(f"a job named {job.name!r} is already scheduled")
        if job.every_s <= 0:
            raise ValueError(f"{job.name}: the interval must be positive, not {job.every_s}")
        self.jobs.append(job)
        self.runner.expect(job)

    def start(self) -> AsyncIOScheduler:
        """Start ticking (in the running event loop); returns the APScheduler instance."""
        aps = AsyncIOScheduler(event_loop=asyncio.get_running_loop(), timezone=dt.UTC)
        now = self._clock()
        for job in self.jobs:
            first = period_start(now, job.every_s) + dt.timedelta(seconds=job.every_s)
            aps.add_job(
                self._tick,
                IntervalTrigger(seconds=job.every_s, start_date=first, timezone=dt.UTC),
                args=[job],
                id=job.name,
                name=job.name,
                max_instances=1,  # a period still running here: the next tick waits its turn
                coalesce=True,
                misfire_grace_time=max(1, int(job.every_s / 2)),
            )
        aps.start()
        self._aps = aps
        log.info("scheduler: %s", ", ".join(f"{j.name} every {j.every_s:g}s" for j in self.jobs))
        return aps

    async def stop(self) -> None:
        """Stop ticking; periods running here are cancelled and their leases handed back."""
        if self._aps is not None and self._aps.running:
            self._aps.shutdown(wait=False)
        running = list(self._running)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    async def _tick(self, job: Job) -> None:
        # The work runs in a task of its own: stopping cancels it here (and hands its lease
        # back), while APScheduler's own task, which would log a cancellation as a crash, ends
        # quietly.
        task = asyncio.create_task(self._guarded(job), name=f"tick-{job.name}")
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(task)

    async def _guarded(self, job: Job) -> None:
        try:
            await self.runner.tick(job)
        except Exception:
            log.exception("%s: the tick failed (is the store reachable?)", job.name)
