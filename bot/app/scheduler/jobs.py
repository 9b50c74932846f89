"""The jobs a bot's settings ask for, and the scheduler that runs them.

``create_bot`` calls ``build_jobs`` and ``create_scheduler``; a part of the bot with periodic
work of its own appends a ``Job`` to the list before the scheduler is created (or calls
``Scheduler.add`` before it starts).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

import httpx

from bot.adr import SharedAdrStore
from bot.app.scheduler.baseline import BaselineCanary
from bot.app.scheduler.before_run import BeforeRuns
from bot.app.scheduler.reminders import DraftReminders
from bot.app.scheduler.runner import Job, JobOutcome, JobRunner
from bot.app.scheduler.scheduler import Scheduler
from bot.app.scheduler.snapshots import MetricsSampler, Sampler, SnapshotJob
from bot.app.scheduler.workload_drift import LiveShape, ShapeReader, WorkloadDrift
from bot.change.actuators import ActuatorFactory
from bot.incidents import IncidentFlows
from bot.kernel import ScheduledTarget, Settings, UsageError
from bot.kernel.chat import Notifier
from bot.kernel.runtime import BotMetrics, replica_id
from bot.kernel.store import Database, Leases
from bot.remediation import GateRunner
from bot.tune import Retune, TuneRecords


class ExpiresApprovals(Protocol):
    """What the approval-expiry job needs (``RemediationService`` has it)."""

    async def expire_due(self) -> int:
        """Expire requests whose approval buttons expired; how many."""
        ...

    async def resume(self) -> int:
        """Roll back changes whose replica died mid-flow; how many."""
        ...


def approval_expiry(service: ExpiresApprovals, *, every_s: float) -> Job:
    """Expires approval requests nobody approved in time, and rolls back changes a dead
    replica left half done (their heartbeat went stale)."""

    async def run(now: dt.datetime) -> JobOutcome:
        return JobOutcome(
            {"expired": await service.expire_due(), "resumed": await service.resume()}
        )

    return Job("approval_expiry", every_s, run)


def outbox(flows: IncidentFlows, *, every_s: float) -> Job:
    """Sends again the Slack messages incidents are still owed (Slack was down, or refused them
    with a 5xx or a 429), and runs the diagnoses a stopped replica left."""

    async def run(now: dt.datetime) -> JobOutcome:
        return JobOutcome(await flows.sweep())

    return Job("outbox", every_s, run)


def build_jobs(
    settings: Settings,
    *,
    db: Database,
    adrs: SharedAdrStore,
    flows: IncidentFlows,
    notifier: Notifier,
    http: httpx.AsyncClient,
    gate: GateRunner,
    remediation: ExpiresApprovals | None = None,
    sampler: Sampler | None = None,
    read_shape: ShapeReader | None = None,
    actuator_for: ActuatorFactory | None = None,
    clock: Callable[[], dt.datetime] | None = None,
    probe_clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    monotonic: Callable[[], float] = time.monotonic,
    retune: Retune | None = None,
) -> list[Job]:
    """Snapshot, baseline and workload-drift jobs per target, the draft reminder, approval
    expiry, the outbox."""
    config = settings.scheduler
    _known_targets(settings)
    window = config.snapshot_window_s
    sample = sampler or MetricsSampler(http=http, window_s=window, clock=probe_clock, sleep=sleep)
    live_shape = read_shape or LiveShape(
        http=http, window_s=config.workload_window_s, sleep=sleep, clock=probe_clock
    )
    jobs = []
    for name, target in settings.targets.items():
        own = config.targets.get(name, ScheduledTarget())
        every = _either(own.snapshot_every_s, config.snapshot_every_s)
        if every:
            source = f"vllm_metrics {window:g}s"
            run = SnapshotJob(name=name, target=target, sample=sample, source=source)
            jobs.append(Job(f"snapshot:{name}", every, run))
        every = _either(own.baseline_every_s, config.baseline_every_s)
        if every:
            baseline = BaselineCanary(name=name, target=target, listed=own.adrs, db=db, adrs=adrs,
                                      gate=gate, flows=flows, notifier=notifier,
                                      monotonic=monotonic)  # fmt: skip
            jobs.append(Job(f"baseline:{name}", every, baseline))
        every = _either(own.workload_every_s, config.workload_every_s)
        if every:
            before = before_runs_for(settings, name, db=db, gate=gate, actuator_for=actuator_for,
                                  clock=clock)  # fmt: skip
            drift = WorkloadDrift(name=name, target=target, listed=own.adrs, db=db, adrs=adrs,
                                  gate=gate, flows=flows, read_shape=live_shape,
                                  before_runs=before, retune=retune)  # fmt: skip
            jobs.append(Job(f"workload:{name}", every, drift))
    if config.draft_reminder_every_s:
        reminders = DraftReminders(db=db, notifier=notifier, after_s=config.draft_reminder_after_s,
                                   reviewers=settings.access.review)  # fmt: skip
        jobs.append(Job("draft_reminder", config.draft_reminder_every_s, reminders))
    if remediation is not None and config.approval_sweep_every_s:
        jobs.append(approval_expiry(remediation, every_s=config.approval_sweep_every_s))
    if config.outbox_every_s:
        jobs.append(outbox(flows, every_s=config.outbox_every_s))
    return jobs


def create_scheduler(
    settings: Settings,
    *,
    db: Database,
    jobs: Iterable[Job],
    clock: Callable[[], dt.datetime],
    owner: str | None = None,
    metrics: BotMetrics | None = None,
) -> Scheduler | None:
    """The scheduler of this replica (None when ``[scheduler] enabled = false``); ``metrics``:
    the bot's, where each period's lag and result are counted."""
    if not settings.scheduler.enabled:
        return None
    leases = Leases(db=db, owner=owner or replica_id(), ttl_s=settings.scheduler.lease_ttl_s)
    runner = JobRunner(leases=leases, clock=clock, metrics=metrics)
    return Scheduler(runner=runner, jobs=jobs, clock=clock)


def _known_targets(settings: Settings) -> None:
    """UsageError when [scheduler.targets] names a target that is not configured."""
    unknown = sorted(set(settings.scheduler.targets) - set(settings.targets))
    if unknown:
        known = ", ".join(sorted(settings.targets)) or "none configured"
        raise UsageError(f"[scheduler.targets] names unknown targets {unknown}; targets: {known}")


def before_runs_for(
    settings: Settings,
    name: str,
    *,
    db: Database,
    gate: GateRunner,
    actuator_for: ActuatorFactory | None,
    clock: Callable[[], dt.datetime] | None,
) -> BeforeRuns | None:
    """The drift job's before-runs on a target that allows them (None: it does not)."""
    target = settings.targets[name]
    if not target.canary.drift_before_run or actuator_for is None:
        return None
    return BeforeRuns(
        name=name, target=target, actuator_for=actuator_for, gate=gate,
        records=TuneRecords(db=db, clock=clock or _utcnow),
        heartbeat_s=settings.remediation.heartbeat_s,
    )  # fmt: skip


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _either(own: float | None, default: float) -> float:
    return default if own is None else own
