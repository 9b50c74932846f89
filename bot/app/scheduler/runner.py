"""One tick of a scheduled job: take over orphaned periods, claim the current one, run it.

A job is a name, an interval and an async function of the time (``now``), so tests drive it
with a controlled clock. While it runs a heartbeat renews its lease; a job that loses its lease
is cancelled and its store writes (``JobOutcome.write``) are dropped, so a period's work is kept
once. A job that raises ends its period as failed: the next period runs it again. Each period
run here is counted on the bot's metrics: how late it started, and its result.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from bot.kernel import RuleloopError
from bot.kernel.runtime import BotMetrics, new_error_id
from bot.kernel.store import DONE, FAILED, Claim, LeaseLost, Leases, period_start

log = logging.getLogger("ruleloop.scheduler")


@dataclass(frozen=True)
class JobOutcome:
    """What a job's period did: a JSON-ready detail, and store writes kept with its completion."""

    detail: Mapping[str, Any] = field(default_factory=dict)
    write: Callable[[Session], None] | None = None


Work = Callable[[dt.datetime], Awaitable[JobOutcome | None]]


@dataclass(frozen=True)
class Job:
    """A scheduled job: ``run(now)`` once per ``every_s`` period, on one replica."""

    name: str
    every_s: float
    run: Work


@dataclass(frozen=True)
class RunResult:
    """One period this replica ran (for logs and tests)."""

    job: str
    period: dt.datetime
    attempt: int
    state: str  # done | failed | lost
    detail: Mapping[str, Any]


class JobRunner:
    """Runs job periods under their leases; ``clock`` is the wall clock (aware UTC)."""

    def __init__(
        self,
        *,
        leases: Leases,
        clock: Callable[[], dt.datetime],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        metrics: BotMetrics | None = None,
    ) -> None:
        self.leases = leases
        self._clock = clock
        self._sleep = sleep
        self.metrics = metrics or BotMetrics()

    def expect(self, job: Job) -> None:
        """A job this runner will tick: its series on the metrics start at 0."""
        self.metrics.job_known(job.name)

    async def tick(self, job: Job, *, now: dt.datetime | None = None) -> list[RunResult]:
        """Finish periods dead replicas left, then run the current one if nobody has."""
        now = now or self._clock()
        results = []
        for period in await asyncio.to_thread(self.leases.orphans, job.name, now=now):
            claim = await asyncio.to_thread(self.leases.take_over, job.name, period, now=now)
            if claim is not None:
                log.warning("%s: taking over the period %s from a replica that stopped",
                            job.name, f"{period:%Y-%m-%d %H:%M:%S}")  # fmt: skip
                results.append(await self._run(job, claim, now))
        period = period_start(now, job.every_s)
        claim = await asyncio.to_thread(self.leases.claim, job.name, period, now=now)
        if claim is not None:
            results.append(await self._run(job, claim, now))
        return results

    async def _run(self, job: Job, claim: Claim, now: dt.datetime) -> RunResult:
        started = max(now, self._clock())  # after the periods taken over in the same tick
        self.metrics.job_started(job.name, lag_s=(started - claim.period).total_seconds())
        result = await self._period(job, claim, now)
        self.metrics.job_finished(job.name, result.state)
        log.debug("%s: the period %s %s (attempt %d)", job.name,
                  f"{claim.period:%Y-%m-%d %H:%M:%S}", result.state, claim.attempt)  # fmt: skip
        return result

    async def _period(self, job: Job, claim: Claim, now: dt.datetime) -> RunResult:
        work = asyncio.ensure_future(job.run(now))
        heart = asyncio.create_task(self._heartbeat(claim, work))
        try:
            outcome = await work
            state = DONE
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():  # the bot is stopping
                await asyncio.to_thread(self.leases.release, claim, now=self._clock())
                raise
            return RunResult(job.name, claim.period, claim.attempt, "lost", {})
        except Exception as exc:
            state, outcome = FAILED, JobOutcome(detail=_failure(job.name, exc))
        finally:
            heart.cancel()
        outcome = outcome or JobOutcome()
        detail = json_safe(dict(outcome.detail)) | {"attempt": claim.attempt}
        try:
            await asyncio.to_thread(
                self.leases.finish,
                claim,
                now=self._clock(),
                state=state,
                detail=detail,
                write=outcome.write,
            )
        except LeaseLost:
            log.warning("%s: another replica took over this period; its result is kept instead",
                        job.name)  # fmt: skip
            return RunResult(job.name, claim.period, claim.attempt, "lost", detail)
        return RunResult(job.name, claim.period, claim.attempt, state, detail)

    async def _heartbeat(self, claim: Claim, work: asyncio.Future[Any]) -> None:
        every = self.leases.ttl.total_seconds() / 3
        while True:
            await self._sleep(every)
            if not await asyncio.to_thread(self.leases.renew, claim, now=self._clock()):
                log.warning("%s: lost the lease (this replica stalled); stopping", claim.job)
                work.cancel()
                return


def _failure(job: str, exc: Exception) -> dict[str, Any]:
    if isinstance(exc, RuleloopError):
        log.warning("%s failed: %s", job, exc)
        return {"error": str(exc)}
    error_id = new_error_id()
    log.error("%s failed unexpectedly (id %s)", job, error_id, exc_info=exc)
    return {"error": f"unexpected error (id {error_id}; details in the bot's log)"}


def json_safe(value: Any) -> Any:
    """JSON has no NaN or infinity (PostgreSQL's json refuses them): those become None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value
