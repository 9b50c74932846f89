"""`ruleloop serve`'s bot, composed: ``create_bot`` wires the parts from one ``Settings``.

Every outside seam (Slack's Web API client, the HTTP client for probes, clocks, the NVML
module, the console stream) can be passed in. The HTTP endpoints are ``bot.app.routes``; the
incident pages ``bot.surfaces.web``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TextIO

import httpx
from slack_bolt.async_app import AsyncApp
from slack_sdk.web.async_client import AsyncWebClient
from starlette.applications import Starlette

from bot.adr import SharedAdrStore
from bot.app.routes.endpoints import Lifespan, Routes, http_app
from bot.app.scheduler.jobs import build_jobs, create_scheduler
from bot.app.scheduler.rules_now import RulesNow
from bot.app.scheduler.scheduler import Scheduler
from bot.change import Sleep, actuators
from bot.change.actuators import ActuatorFactory
from bot.diagnosis import Diagnoser, NormalReader
from bot.diagnosis.probes import ProbeContext
from bot.diagnosis.runbooks import RunbookRunner, default_registry, load_dir
from bot.incidents import IncidentFlows
from bot.incidents.intake import Intake
from bot.kernel import Settings
from bot.kernel.chat import Notifier
from bot.kernel.runtime import (
    BotMetrics,
    Members,
    TaskSupervisor,
    Tracing,
    replica_id,
    start_tracing,
    with_defaults,
)
from bot.kernel.store import Database
from bot.postmortem import DraftService
from bot.remediation import (
    GateRunner,
    LiveJudge,
    RemediationNotifier,
    RemediationService,
    ThreadButtons,
    live_judge,
    run_gate,
)
from bot.surfaces.slack import (
    ConsoleNotifier,
    Services,
    SlackNotifier,
    SlackUserGroups,
    build_app,
    web_client,
)
from bot.surfaces.web import IncidentPages, PageLinks, page_links
from bot.tune import Retune

log = logging.getLogger("ruleloop.server")


def utcnow() -> dt.datetime:
    """The wall clock, as an aware UTC datetime."""
    return dt.datetime.now(dt.UTC)


@dataclass
class Bot:
    """The wired bot: the ASGI app and the parts tests and the CLI reach for."""

    app: Starlette
    flows: IncidentFlows
    db: Database
    slack: AsyncApp | None
    http: httpx.AsyncClient
    remediation: RemediationService
    drafts: DraftService
    tasks: TaskSupervisor  # every background task of the bot, drained when it stops
    metrics: BotMetrics
    retune: Retune  # a drift thread's re-tune of a rule that failed on the live workload
    scheduler: Scheduler | None = None
    tracing: Tracing | None = None  # [tracing] otlp_endpoint set: the traces' provider


@dataclass(frozen=True)
class Seams:
    """The outside world the bot reads and waits on: injected whole, so a test controls it."""

    http: httpx.AsyncClient
    clock: Callable[[], dt.datetime]  # the wall clock, as an aware UTC datetime
    monotonic: Callable[[], float]
    wall_clock: Callable[[], float]  # seconds since the epoch
    probe_clock: Callable[[], float]  # the probes' monotonic clock
    sleep: Callable[[float], Awaitable[None]]
    nvml: Any | None

    def probe_context(self) -> ProbeContext:
        """A fresh context for one diagnosis's probes."""
        return ProbeContext(
            http=self.http, monotonic=self.probe_clock, wall_clock=self.wall_clock,
            sleep=self.sleep, nvml=self.nvml,
        )  # fmt: skip


def create_bot(
    settings: Settings,
    *,
    state_dir: Path,
    slack_client: AsyncWebClient | None = None,
    http: httpx.AsyncClient | None = None,
    clock: Callable[[], dt.datetime] = utcnow,
    monotonic: Callable[[], float] = time.monotonic,
    wall_clock: Callable[[], float] = time.time,
    probe_clock: Callable[[], float] | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    nvml: Any | None = None,
    console: TextIO | None = None,
    actuator_for: ActuatorFactory = actuators.build,
    gate: GateRunner = run_gate,
    live: LiveJudge | None = None,  # the live stage's judge (None: it reads replicas as probes)
    heartbeat_sleep: Sleep = asyncio.sleep,  # a change's heartbeats wait with it (a test seam)
) -> Bot:
    """Load runbooks (refusing bad ones now), open the store, and wire Slack or the console."""
    settings = with_defaults(settings, state_dir=state_dir)  # started outside the checkout
    db = _database(settings, state_dir)
    seams = Seams(
        http=http or httpx.AsyncClient(timeout=httpx.Timeout(10.0)), clock=clock,
        monotonic=monotonic, wall_clock=wall_clock, probe_clock=probe_clock or monotonic,
        sleep=sleep, nvml=nvml,
    )  # fmt: skip
    adrs = _adrs(settings, db=db, clock=clock)
    links = page_links(settings.web, clock=wall_clock)  # None: the incident page is off
    state = settings.paths.state or state_dir  # charts and re-tunes' runs beside the store
    client, notifier = _notifier(settings, slack_client, console, state / "charts", links)
    metrics, owner = BotMetrics(), replica_id()
    tracing = start_tracing(settings.tracing, instance=owner)  # None: off ([tracing])
    tasks = TaskSupervisor(on_shed=metrics.shed)
    flows = IncidentFlows(
        settings=settings, db=db, notifier=notifier, clock=clock, monotonic=monotonic,
        diagnoser=_diagnoser(settings, db=db, adrs=adrs, seams=seams),
        metrics=metrics, tasks=tasks, owner=owner, adrs=adrs,  # names the ADR files it skipped
    )  # fmt: skip
    members = Members(settings.access, SlackUserGroups(client) if client is not None else None)
    services = _services(
        settings, db=db, adrs=adrs, flows=flows, notifier=notifier, members=members, seams=seams,
        clock=clock, tasks=tasks, actuator_for=actuator_for, gate=gate, sleep=heartbeat_sleep,
        live=live, runs_dir=state / "retune", metrics=metrics,
    )  # fmt: skip
    slack_app = (
        build_app(settings=settings.slack, services=services, client=client) if client else None
    )
    scheduler = _scheduler(
        settings, db, flows, services, seams, adrs=adrs, notifier=notifier, gate=gate,
        actuator_for=actuator_for, metrics=metrics)  # fmt: skip
    routes = Routes(settings=settings, intake=Intake(db=db, targets=settings.targets, clock=clock),
                    flows=flows, metrics=metrics, tasks=tasks, db=db, slack=slack_app,
                    monotonic=monotonic, wall_clock=wall_clock)  # fmt: skip
    lifespan = _lifespan(services, scheduler, http=seams.http, db=db, tracing=tracing)
    app = http_app(routes, IncidentPages(db=db, links=links, adrs=adrs), lifespan=lifespan)
    return Bot(
        app=app, flows=flows, db=db, slack=slack_app, http=seams.http, tasks=tasks, metrics=metrics,
        remediation=services.remediation, drafts=services.drafts, scheduler=scheduler,
        retune=services.retune, tracing=tracing,
    )  # fmt: skip


def _scheduler(
    settings: Settings,
    db: Database,
    flows: IncidentFlows,
    services: Services,
    seams: Seams,
    *,
    adrs: SharedAdrStore,
    notifier: BotNotifier,
    gate: GateRunner,
    actuator_for: ActuatorFactory,
    metrics: BotMetrics,
) -> Scheduler | None:
    """The scheduled jobs (snapshots, baseline canary, workload drift, outbox...), leased per
    period under this replica's id (the flows')."""
    jobs = build_jobs(
        settings, db=db, adrs=adrs, flows=flows, notifier=notifier, http=seams.http, gate=gate,
        remediation=services.remediation, actuator_for=actuator_for, clock=seams.clock,
        probe_clock=seams.probe_clock, sleep=seams.sleep, monotonic=seams.monotonic,
        retune=services.retune,
    )  # fmt: skip
    return create_scheduler(
        settings, db=db, jobs=jobs, clock=seams.clock, owner=flows.owner, metrics=metrics
    )


def _database(settings: Settings, state_dir: Path) -> Database:
    """The store, its schema brought up to date (migrations, bot.kernel.store.db)."""
    db = Database(settings.database_url(fallback_dir=state_dir))
    db.create_schema()
    return db


def _adrs(settings: Settings, *, db: Database, clock: Callable[[], dt.datetime]) -> SharedAdrStore:
    """The ADRs in the store, with adr/ imported (shared by every replica: bot.adr.sync)."""
    adrs = SharedAdrStore(root=settings.paths.adr, db=db, clock=clock)
    imported = adrs.sync()
    if imported is not None:
        log.info("ADRs imported from %s: %s", settings.paths.adr, imported.summary())
    return adrs


def _diagnoser(
    settings: Settings, *, db: Database, adrs: SharedAdrStore, seams: Seams
) -> Diagnoser:
    """Runbooks loaded (a bad one refuses the start), the probes, the ADRs to match, and the
    target's normal to show beside the numbers."""
    registry = default_registry()
    return Diagnoser(
        runbooks=load_dir(settings.paths.runbooks, registry),
        runner=RunbookRunner(registry=registry),
        adrs=adrs,
        context=seams.probe_context,
        clock=seams.clock,
        normal=NormalReader(db=db, last=settings.scheduler.normal_of_last).read,
        rules=RulesNow(db=db, adrs=adrs, listed=_listed_adrs(settings)).read,
    )


def _listed_adrs(settings: Settings) -> dict[str, list[str]]:
    """Each target's `[scheduler.targets.X] adrs`: in force while none was promoted there."""
    return {name: own.adrs for name, own in settings.scheduler.targets.items()}


def _notifier(
    settings: Settings,
    slack_client: AsyncWebClient | None,
    console: TextIO | None,
    chart_dir: Path,
    links: PageLinks | None,
) -> tuple[AsyncWebClient | None, BotNotifier]:
    """Slack's Web API client and notifier, or (no Slack configured) the console's."""
    if not settings.slack.enabled:  # the page's link, relative without [web] public_url
        page = links.incident_url if links else None
        return None, ConsoleNotifier(stream=console, chart_dir=chart_dir, page_url=page)
    client = slack_client or web_client(settings.slack)
    linked = links.incident_url if links and settings.web.public_url else None
    return client, SlackNotifier(client, page_url=linked)


def _services(
    settings: Settings,
    *,
    db: Database,
    adrs: SharedAdrStore,
    flows: IncidentFlows,
    notifier: BotNotifier,
    members: Members,
    clock: Callable[[], dt.datetime],
    tasks: TaskSupervisor,
    actuator_for: ActuatorFactory,
    gate: GateRunner,
    sleep: Sleep,
    seams: Seams,
    live: LiveJudge | None,
    runs_dir: Path,
    metrics: BotMetrics,
) -> Services:
    """The incident flows, the remediation flow and the post-incident drafts."""
    drafts = DraftService(
        settings=settings,
        db=db,
        adrs=adrs,
        notifier=notifier,
        threads=flows.ensure_thread,
        clock=clock,
        members=members,
    )
    remediation = RemediationService(
        settings=settings,
        db=db,
        adrs=adrs,
        notifier=notifier,
        threads=flows.ensure_thread,
        clock=clock,
        tasks=tasks,
        actuator_for=actuator_for,
        gate=gate,
        live=live or live_judge(seams.probe_context),  # it reads replicas as probes do
        after_change=drafts.after_change,  # a change that ended leaves its ADR draft
        members=members,
        sleep=sleep,
        metrics=metrics,  # the bot's: outcomes and canary verdicts on its /metrics
    )
    retune = Retune(
        settings=settings, db=db, adrs=adrs, clock=clock, members=members, tasks=tasks,
        deliver=flows.outbox.deliver, render=notifier.render_thread_buttons,
        propose=drafts.propose, actuator_for=actuator_for, runs_dir=runs_dir,
    )  # fmt: skip
    thread = ThreadButtons(
        settings=settings, db=db, clock=clock, members=members, deliver=flows.outbox.deliver,
        render=notifier.render_thread_buttons, retune=retune,
    )  # fmt: skip
    return Services(flows=flows, remediation=remediation, drafts=drafts, thread=thread,
                    tasks=tasks, retune=retune)  # fmt: skip


def _lifespan(
    services: Services, scheduler: Scheduler | None, *, http: httpx.AsyncClient, db: Database,
    tracing: Tracing | None,
) -> Lifespan:  # fmt: skip
    """Start: resume half-done changes, start the scheduler. Stop: hand back, drain, close
    (the spans still buffered are sent)."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        tasks = services.tasks
        # a change a previous run of the bot left half done is rolled back now
        tasks.spawn(services.remediation.resume(), name="remediation-resume")
        if scheduler is not None:
            scheduler.start()
        try:
            yield
        finally:
            if scheduler is not None:  # a period running here is handed back to the others
                await scheduler.stop()
            await tasks.drain()
            await http.aclose()
            db.dispose()
            if tracing is not None:
                await asyncio.to_thread(tracing.shutdown)

    return lifespan


class BotNotifier(Notifier, RemediationNotifier, Protocol):
    """Everything the bot posts: incidents, diagnoses, remediation cards, drafts."""
