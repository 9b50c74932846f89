"""The bot's HTTP endpoints: /slack/events, /alertmanager, /livez, /readyz, /healthz, /metrics.

Each endpoint checks what it is sent (a cap on the body, the signature or the bearer token,
the body's shape) before anything acts on it. Errors become HTTP answers in one place per
route family: webhooks answer JSON with a reason; anything unexpected answers 500 with an id
that is also in the log. ``bot.app.server`` composes the bot and hands the parts in.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import hmac
import logging
from collections.abc import Callable

from slack_bolt.adapter.starlette.async_handler import AsyncSlackRequestHandler
from slack_bolt.async_app import AsyncApp
from slack_sdk.signature import Clock, SignatureVerifier
from sqlalchemy import text
from sqlalchemy.exc import DataError, SQLAlchemyError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bot.app.routes.request_body import read_body, replay
from bot.incidents import IncidentFlows
from bot.incidents.intake import Intake, IntakeOutcome, parse_webhook
from bot.kernel import RequestRejected, Settings
from bot.kernel.runtime import BotMetrics, TaskSupervisor, log_ids, new_error_id, span
from bot.kernel.store import Database, StoreReading, read_store
from bot.surfaces.slack import ReplayGuard, Seen, shapes
from bot.surfaces.web import IncidentPages

log = logging.getLogger("ruleloop.server")
# Webhook bodies parsed at once: a parsed 1 MiB notification holds several times its size in
# objects, so a flood of them (16 at once: +80 MiB measured, bench/hostile_bodies.py) waits
# its turn instead of multiplying the bot's memory; Alertmanager's own deadline is minutes.
PARSE_AT_ONCE = 2
STATUS = {
    IntakeOutcome.OPENED: 202,
    IntakeOutcome.RESOLVED: 202,
    IntakeOutcome.UPDATED: 200,
    IntakeOutcome.DUPLICATE: 200,
}
Lifespan = Callable[[Starlette], contextlib.AbstractAsyncContextManager[None]]


def http_app(routes: Routes, pages: IncidentPages, *, lifespan: Lifespan) -> Starlette:
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


class _SlackClock(Clock):
    """slack_sdk's signature clock, read from the bot's wall clock (seconds since the epoch)."""

    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now

    def now(self) -> float:
        return self._now()


class _BytesVerifier(SignatureVerifier):
    """slack_sdk's verifier, signing the body's bytes: slack_sdk decodes them as UTF-8 first, so
    a signed body that is not UTF-8 read as a bad signature (401) instead of a bad body (400)."""

    def generate_signature(self, *, timestamp: str, body: str | bytes) -> str | None:
        raw = body.encode() if isinstance(body, str) else body
        signed = b"v0:%s:%s" % (timestamp.encode(), raw)
        digest = hmac.new(self.signing_secret.encode(), signed, hashlib.sha256).hexdigest()
        return f"v0={digest}"


class Routes:
    """The HTTP endpoints."""

    def __init__(
        self,
        *,
        settings: Settings,
        intake: Intake,
        flows: IncidentFlows,
        metrics: BotMetrics,
        tasks: TaskSupervisor,
        db: Database,
        slack: AsyncApp | None,
        monotonic: Callable[[], float],
        wall_clock: Callable[[], float],
    ) -> None:
        self._settings = settings
        self._intake = intake
        self._flows = flows
        self._metrics = metrics
        self._tasks = tasks
        self._db = db
        self._monotonic = monotonic
        self._parsing = asyncio.Semaphore(PARSE_AT_ONCE)
        self._slack = AsyncSlackRequestHandler(slack) if slack is not None else None
        secret = settings.slack.signing_secret
        self._verifier = (
            _BytesVerifier(secret.get_secret_value(), clock=_SlackClock(wall_clock))
            if secret
            else None
        )
        self._replays = ReplayGuard(db=db, clock=wall_clock)  # shared by replicas

    async def slack_events(self, request: Request) -> Response:
        """Slash commands and button clicks: signature and replay checks, then bolt."""
        metrics = self._metrics.slack_requests
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
        seen = await asyncio.to_thread(
            self._replays.check, timestamp=timestamp, signature=signature, body=body
        )
        if seen == Seen.REPLAYED:
            metrics.labels("replayed").inc()
            return _reason(401, "this signed request was already received (replay)")
        if seen == Seen.RETRIED:
            # Slack delivering again (X-Slack-Retry-Num): acked, not acted on twice
            metrics.labels("retried").inc()
            log.info("Slack retried a request (%s): acknowledged, already handled",
                     request.headers.get("x-slack-retry-reason", "no reason given"))  # fmt: skip
            return Response(status_code=200)
        try:  # what bolt and the listeners will read, checked first (bot.surfaces.slack.shapes)
            shapes.read(body, request.headers)
        except shapes.Unreadable as exc:
            metrics.labels("malformed").inc()
            log.info("refused a Slack request: %s", exc)
            status, answer = exc.answer()
            return JSONResponse(answer, status_code=status)
        metrics.labels("accepted").inc()
        return await self._slack.handle(replay(request, body))

    async def alertmanager(self, request: Request) -> Response:
        """Alertmanager webhook v4: bearer token, then parse, dedupe, store, then act; in a
        span of its own, the root of the trace of what the alert starts ([tracing])."""
        with span("alertmanager.webhook") as current:
            response = await self._alertmanager(request)
            current.set(**{"http.response.status_code": response.status_code})
            return response

    async def _alertmanager(self, request: Request) -> Response:
        received = self._monotonic()
        token = self._settings.alertmanager.token
        if token is None:
            return _reason(503, "the webhook token is not configured (RULELOOP_ALERTMANAGER_TOKEN)")
        given = request.headers.get("authorization", "")
        expected = f"Bearer {token.get_secret_value()}"
        if not hmac.compare_digest(given.encode(), expected.encode()):
            self._metrics.webhooks.labels("unauthorized").inc()
            return _reason(
                401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"}
            )
        try:
            body = await read_body(request, limit=self._settings.server.max_body_bytes)
            with span("intake", bytes=len(body)) as intake:
                async with self._parsing:  # a 1 MiB body: off the loop, and few at a time
                    webhook = await asyncio.to_thread(parse_webhook, body)
                results = await asyncio.to_thread(self._intake.receive_all, webhook)
                intake.set(incidents=len(results), outcome=results[0].outcome.value,
                           incident_id=results[0].incident_id)  # fmt: skip
        except RequestRejected as exc:
            self._metrics.webhooks.labels("rejected").inc()
            return _reason(exc.status, str(exc))
        except DataError:  # the input's fault (SQLSTATE 22): a retry gets the same, never a 503
            error_id = new_error_id()
            self._metrics.webhooks.labels("rejected").inc()
            log.warning("the store refused a notification's value (id %s)", error_id, exc_info=True)
            return _reason(
                422, f"the incident store refused a value of this notification (id {error_id}; "
                "details in the bot's log): fix the alert, a retry gets the same answer",
            )  # fmt: skip
        except SQLAlchemyError:
            error_id = new_error_id()
            log.error("incident store unavailable (id %s)", error_id, exc_info=True)
            return _reason(503, f"the incident store is unavailable (id {error_id}); retry later")
        for result in results:  # one per target the group's alerts are about
            with log_ids(incident_id=result.incident_id):  # the work it starts logs with it
                log.info("alertmanager: %s", result.reason,
                         extra={"outcome": result.outcome.value})  # fmt: skip
                self._flows.after_intake(result, received=received)
        result = results[0]
        answer: dict[str, object] = {
            "outcome": result.outcome.value, "incident": result.incident_id,
            "reason": result.reason,
        }  # fmt: skip
        if len(results) > 1:
            answer["incidents"] = [
                {"outcome": r.outcome.value, "incident": r.incident_id, "reason": r.reason}
                for r in results
            ]
        return JSONResponse(answer, status_code=STATUS[result.outcome])

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
            {"status": "ok", "transport": mode, "background": self._tasks.pending,
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
        self._metrics.observe_store(reading)
        return Response(self._metrics.exposition(), media_type="text/plain; version=0.0.4")


def _reason(status: int, why: str, *, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": why}, status_code=status, headers=headers)


async def _unexpected(request: Request, exc: Exception) -> Response:
    error_id = new_error_id()
    log.error("unexpected error on %s (id %s)", request.url.path, error_id, exc_info=exc)
    return _reason(500, f"unexpected error (id {error_id}; details in the bot's log)")
