"""`ruleloop serve`'s ASGI app: /slack/events, /alertmanager, /livez, /readyz, /healthz, /metrics,
/incidents.

``create_bot`` wires the parts from one ``Settings``; every outside seam (Slack's Web API client,
the HTTP client for probes, clocks, the NVML module, the console stream) can be passed in.
Errors become HTTP answers in one place per route family: webhooks answer JSON with a reason;
anything unexpected answers 500 with an id that is also in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TextIO

import httpx
from slack_bolt.adapter.starlette.async_handler import AsyncSlackRequestHandler
from slack_bolt.async_app import AsyncApp
from slack_sdk.signature import Clock, SignatureVerifier
from slack_sdk.web.async_client import AsyncWebClient
from sqlalchemy import text
from sqlalchemy.exc import DataError, SQLAlchemyError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bot.adr.shared import SharedAdrStore
from bot.chat.messages import Notifier
from bot.config import Settings
from bot.defaults import with_defaults
from bot.diagnosis.service import Diagnoser
from bot.errors import RequestRejected
from bot.incidents.flows import IncidentFlows
from bot.intake.models import parse_webhook
from bot.intake.service import Intake, Outcome
from bot.postmortem.service import DraftService
from bot.probes.context import ProbeContext
from bot.remediation import actuators
from bot.remediation.gate import GateRunner, run_gate
from bot.remediation.ports import RemediationNotifier
from bot.remediation.service import ActuatorFactory, RemediationService
from bot.request_body import read_body, replay
from bot.runbooks.builtin import default_registry
from bot.runbooks.loader import load_dir
from bot.runbooks.runner import RunbookRunner
from bot.runtime.access import Members
from bot.runtime.ids import new_error_id, replica_id
from bot.runtime.metrics import BotMetrics
from bot.scheduler.jobs import build_jobs, create_scheduler
from bot.scheduler.scheduler import Scheduler
from bot.scheduler.snapshots import NormalReader
from bot.slack import shapes
from bot.slack.app import build_app, web_client
from bot.slack.console import ConsoleNotifier
from bot.slack.notifier import SlackNotifier
from bot.slack.replay import ReplayGuard
from bot.slack.services import Services
from bot.slack.usergroups import SlackUserGroups
from bot.store.db import Database
from bot.store.readings import StoreReading, read_store
from bot.web.links import PageLinks, page_links
from bot.web.routes import IncidentPages

log = logging.getLogger("ruleloop.server")
STATUS = {Outcome.OPENED: 202, Outcome.RESOLVED: 202, Outcome.UPDATED: 200, Outcome.DUPLICATE: 200}


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
    scheduler: Scheduler | None = None


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
) -> Bot:
    """Load runbooks (refusing bad ones now), open the store, and wire Slack or the console."""
    settings = with_defaults(settings, state_dir=state_dir)  # started outside the checkout
    db = Database(settings.database_url(fallback_dir=state_dir))
    db.create_schema()
    http = http or httpx.AsyncClient(timeout=httpx.Timeout(10.0))
    adrs = _adrs(settings, db=db, clock=clock)
    normal = NormalReader(db=db, last=settings.scheduler.normal_of_last)
    probe_clock = probe_clock or monotonic

    def probe_context() -> ProbeContext:
        return ProbeContext(
            http=http, clock=probe_clock, wall_clock=wall_clock, sleep=sleep, nvml=nvml
        )

    diagnoser = _diagnoser(settings, adrs=adrs, normal=normal, context=probe_context, clock=clock)
    links = page_links(settings.web, clock=wall_clock)  # None: the incident page is off
    charts = (settings.paths.state or state_dir) / "charts"  # next to the store, as documented
    client, notifier = _notifier(settings, slack_client, console, charts, links)
    owner = replica_id()  # this replica, in job leases and outbox claims
    flows = IncidentFlows(
        settings=settings,
        db=db,
        notifier=notifier,
        diagnoser=diagnoser,
        clock=clock,
        monotonic=monotonic,
        metrics=BotMetrics(),
        adrs=adrs,  # a diagnosis names the ADR files it had to skip
        owner=owner,
    )
    services = _services(
        settings,
        db=db,
        flows=flows,
        notifier=notifier,
        members=Members(settings.access, SlackUserGroups(client) if client is not None else None),
        clock=clock,
        actuator_for=actuator_for,
        gate=gate,
    )
    slack_app = (
        build_app(settings=settings.slack, services=services, client=client)
        if client is not None
        else None
    )
    jobs = build_jobs(
        settings,
        db=db,
        flows=flows,
        notifier=notifier,
        http=http,
        gate=gate,
        remediation=services.remediation,
        probe_clock=probe_clock,
        sleep=sleep,
        monotonic=monotonic,
    )
    scheduler = create_scheduler(settings, db=db, jobs=jobs, clock=clock, owner=owner)
    routes = Routes(
        settings=settings,
        intake=Intake(db=db, targets=settings.targets, clock=clock),
        flows=flows,
        db=db,
        slack=slack_app,
        monotonic=monotonic,
        wall_clock=wall_clock,
    )
    pages = IncidentPages(db=db, links=links, adrs=adrs)
    app = _http_app(routes, pages, lifespan=_lifespan(services, scheduler, http=http, db=db))
    return Bot(
        app=app,
        flows=flows,
        db=db,
        slack=slack_app,
        http=http,
        remediation=services.remediation,
        drafts=services.drafts,
        scheduler=scheduler,
    )


def _adrs(settings: Settings, *, db: Database, clock: Callable[[], dt.datetime]) -> SharedAdrStore:
    """The ADRs in the store, with adr/ imported (shared by every replica: bot.adr.sync)."""
    adrs = SharedAdrStore(root=settings.paths.adr, db=db, clock=clock)
    imported = adrs.sync()
    if imported is not None:
        log.info("ADRs imported from %s: %s", settings.paths.adr, imported.summary())
    return adrs


def _diagnoser(
    settings: Settings,
    *,
    adrs: SharedAdrStore,
    normal: NormalReader,
    context: Callable[[], ProbeContext],
    clock: Callable[[], dt.datetime],
) -> Diagnoser:
    """Runbooks loaded (a bad one refuses the start), the probes, the ADRs to match."""
    registry = default_registry()
    return Diagnoser(
        runbooks=load_dir(settings.paths.runbooks, registry),
        runner=RunbookRunner(registry=registry),
        adrs=adrs,
        context=context,
        clock=clock,
        normal=normal.read,
    )


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
    flows: IncidentFlows,
    notifier: BotNotifier,
    members: Members,
    clock: Callable[[], dt.datetime],
    actuator_for: ActuatorFactory,
    gate: GateRunner,
) -> Services:
    """The incident flows, the remediation flow and the post-incident drafts."""
    drafts = DraftService(
        settings=settings,
        db=db,
        notifier=notifier,
        threads=flows.ensure_thread,
        clock=clock,
        members=members,
    )
    remediation = RemediationService(
        settings=settings,
        db=db,
        notifier=notifier,
        threads=flows.ensure_thread,
        clock=clock,
        tasks=flows.tasks,
        actuator_for=actuator_for,
        gate=gate,
        after_change=drafts.after_change,  # a change that ended leaves its ADR draft
        members=members,
    )
    return Services(flows=flows, remediation=remediation, drafts=drafts)


Lifespan = Callable[[Starlette], contextlib.AbstractAsyncContextManager[None]]


def _lifespan(
    services: Services, scheduler: Scheduler | None, *, http: httpx.AsyncClient, db: Database
) -> Lifespan:
    """Start: resume half-done changes, start the scheduler. Stop: hand back, drain, close."""

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

    return lifespan


def _http_app(routes: Routes, pages: IncidentPages, *, lifespan: Lifespan) -> Starlette:
    """The routes, and one handler for whatever nothing else caught."""
    return Starlette(
        routes=[
            Route("/slack/events", routes.slack_events, methods=["POST"]),
            Route("/alertmanager", routes.alertmanager, methods=["POST"]),
            Route("/livez", routes.livez, methods=["GET"]),
            Route("/readyz", routes.readyz, methods=["GET"]),
            Route("/healthz", routes.healthz, methods=["GET"]),
            Route("/metrics", routes.metrics, methods=["GET"]),
            *pages.routes(),
        ],
        exception_handlers={Exception: _unexpected},
        lifespan=lifespan,
    )


class BotNotifier(Notifier, RemediationNotifier, Protocol):
    """Everything the bot posts: incidents, diagnoses, remediation cards, drafts."""


class _Clock(Clock):
    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now

    def now(self) -> float:
        return self._now()


class Routes:
    """The HTTP endpoints."""

    def __init__(
        self,
        *,
        settings: Settings,
        intake: Intake,
        flows: IncidentFlows,
        db: Database,
        slack: AsyncApp | None,
        monotonic: Callable[[], float],
        wall_clock: Callable[[], float],
    ) -> None:
        self._settings = settings
        self._intake = intake
        self._flows = flows
        self._db = db
        self._monotonic = monotonic
        self._slack = AsyncSlackRequestHandler(slack) if slack is not None else None
        secret = settings.slack.signing_secret
        self._verifier = (
            SignatureVerifier(secret.get_secret_value(), clock=_Clock(wall_clock))
            if secret
            else None
        )
        self._replays = ReplayGuard(db=db, clock=wall_clock)  # shared by replicas

    async def slack_events(self, request: Request) -> Response:
        """Slash commands and button clicks: signature and replay checks, then bolt."""
        metrics = self._flows.metrics.slack_requests
        if self._slack is None or self._verifier is None:
            metrics.labels("no_slack").inc()
            return _reason(
                404,
                "Slack events over HTTP are off: no SLACK_BOT_TOKEN and "
                "SLACK_SIGNING_SECRET (console transport, or Socket Mode)",
            )
        try:  # capped: the signature can only be checked once the body is read
            body = await read_body(request, limit=self._settings.server.max_body_bytes)
        except RequestRejected as exc:
            metrics.labels("too_large").inc()
            return _reason(exc.status, str(exc))
        timestamp = request.headers.get("x-slack-request-timestamp", "")
        signature = request.headers.get("x-slack-signature", "")
        try:
            valid = self._verifier.is_valid(body=body, timestamp=timestamp, signature=signature)
        except ValueError:  # a timestamp that is not a number
            valid = False
        if not valid:
            metrics.labels("bad_signature").inc()
            return _reason(401, "missing, stale or wrong Slack signature")
        seen = self._replays.first_time
        if not await asyncio.to_thread(seen, timestamp=timestamp, signature=signature):
            metrics.labels("replayed").inc()
            return _reason(401, "this signed request was already received (replay)")
        if not await asyncio.to_thread(self._replays.first_delivery, body):
            # Slack delivering again (X-Slack-Retry-Num): acked, not acted on twice
            metrics.labels("retried").inc()
            log.info("Slack retried a request (%s): acknowledged, already handled",
                     request.headers.get("x-slack-retry-reason", "no reason given"))  # fmt: skip
            return Response(status_code=200)
        try:  # what bolt and the listeners will read, checked first (bot.slack.shapes)
            shapes.read(body, request.headers)
        except shapes.Unreadable as exc:
            metrics.labels("malformed").inc()
            log.info("refused a Slack request: %s", exc)
            status, answer = exc.answer()
            return JSONResponse(answer, status_code=status)
        metrics.labels("accepted").inc()
        return await self._slack.handle(replay(request, body))

    async def alertmanager(self, request: Request) -> Response:
        """Alertmanager webhook v4: bearer token, then parse, dedupe, store, then act."""
        received = self._monotonic()
        token = self._settings.alertmanager.token
        if token is None:
            return _reason(503, "the webhook token is not configured (RULELOOP_ALERTMANAGER_TOKEN)")
        given = request.headers.get("authorization", "")
        expected = f"Bearer {token.get_secret_value()}"
        if not hmac.compare_digest(given.encode(), expected.encode()):
            self._flows.metrics.webhooks.labels("unauthorized").inc()
            return _reason(
                401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"}
            )
        try:
            body = await read_body(request, limit=self._settings.server.max_body_bytes)
            webhook = parse_webhook(body)
            result = await asyncio.to_thread(self._intake.receive, webhook)
        except RequestRejected as exc:
            self._flows.metrics.webhooks.labels("rejected").inc()
            return _reason(exc.status, str(exc))
        except DataError:  # the input's fault (SQLSTATE 22): a retry gets the same, never a 503
            error_id = new_error_id()
            self._flows.metrics.webhooks.labels("rejected").inc()
            log.warning("the store refused a notification's value (id %s)", error_id, exc_info=True)
            return _reason(
                422, f"the incident store refused a value of this notification (id {error_id}; "
                "details in the bot's log): fix the alert, a retry gets the same answer",
            )  # fmt: skip
        except SQLAlchemyError:
            error_id = new_error_id()
            log.error("incident store unavailable (id %s)", error_id, exc_info=True)
            return _reason(503, f"the incident store is unavailable (id {error_id}); retry later")
        self._flows.after_intake(result, received=received)
        return JSONResponse(
            {
                "outcome": result.outcome.value,
                "incident": result.incident_id,
                "reason": result.reason,
            },
            status_code=STATUS[result.outcome],
        )

    async def livez(self, request: Request) -> Response:
        """Liveness: the process serves HTTP. Asks nothing else (no store, no Slack), so that a
        PostgreSQL or Slack outage takes the pods out of the Service, never restarts them."""
        return JSONResponse({"status": "ok"})

    async def healthz(self, request: Request) -> Response:
        """Kept for what already asks it (Docker's HEALTHCHECK, scripts): the same as /readyz."""
        return await self.readyz(request)

    async def readyz(self, request: Request) -> Response:
        """Readiness: the store answers (503 if not); the Slack transport and its owed messages.

        Slack being unreachable does not make the pod unready: webhooks are still taken and the
        outbox holds the messages until Slack answers again (``slack_messages`` shows them).
        """
        try:
            await asyncio.to_thread(self._ping)
            owed = await asyncio.to_thread(self._flows.outbox.counts)
        except SQLAlchemyError:
            return _reason(503, "the incident store does not answer")
        mode = "slack" if self._slack is not None else "console"
        # failed: messages Slack refused for good (why: `ruleloop db deliveries`); pending: owed
        return JSONResponse(
            {"status": "ok", "transport": mode, "background": self._flows.tasks.pending,
             "slack_messages": owed}
        )  # fmt: skip

    def _store_reading(self) -> StoreReading:
        with self._db.transaction() as session:
            return read_store(session, now=dt.datetime.now(dt.UTC))

    def _ping(self) -> None:
        with self._db.engine.connect() as connection:
            connection.execute(text("SELECT 1"))

    async def metrics(self, request: Request) -> Response:
        """The bot's own metrics, with the store's backlog numbers when the store answers."""
        try:
            reading = await asyncio.wait_for(asyncio.to_thread(self._store_reading), timeout=2.0)
        except (SQLAlchemyError, TimeoutError):
            reading = None  # ruleloop_store_up 0: the scrape itself still succeeds
        self._flows.metrics.observe_store(reading)
        return Response(self._flows.metrics.exposition(), media_type="text/plain; version=0.0.4")


def _reason(status: int, why: str, *, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": why}, status_code=status, headers=headers)


async def _unexpected(request: Request, exc: Exception) -> Response:
    error_id = new_error_id()
    log.error("unexpected error on %s (id %s)", request.url.path, error_id, exc_info=exc)
    return _reason(500, f"unexpected error (id {error_id}; details in the bot's log)")
