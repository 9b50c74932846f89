"""The bolt app: one AsyncApp, its listeners (one per file), and its one error handler.

Listeners reach the services through one typed object (``services_of(context)``, see
``bot.surfaces.slack.services``), put in every request's context by a middleware, so that they
stay thin
and the services never import slack_bolt.

Ack first: Slack gives a request 3 seconds. Nothing before a listener's ack calls Slack (the
request is authorized without auth.test; the workspace guard's users.info look-up runs after
the ack), and listeners whose work calls Slack ack, then hand the work to
``bot.surfaces.slack.deferred``
(its answer goes through the request's response_url). The same holds over HTTP and Socket Mode.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from slack_bolt.async_app import AsyncApp
from slack_bolt.authorization import AuthorizeResult
from slack_bolt.context.async_context import AsyncBoltContext
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler
from slack_sdk.web.async_client import AsyncWebClient

from bot.kernel import SlackSettings
from bot.surfaces.slack import listeners, shapes
from bot.surfaces.slack.errors import handle_error
from bot.surfaces.slack.services import KEY as SERVICES
from bot.surfaces.slack.services import Services
from bot.surfaces.slack.workspace import HomeTeams, workspace_guard

log = logging.getLogger("ruleloop.slack")


def web_client(settings: SlackSettings) -> AsyncWebClient:
    """The Web API client: bot token, API URL, retries on 429 (Slack's Retry-After honoured)."""
    token = settings.bot_token.get_secret_value() if settings.bot_token else None
    client = AsyncWebClient(token=token, base_url=settings.api_url, timeout=15)
    client.retry_handlers.append(AsyncRateLimitErrorRetryHandler(max_retry_count=3))
    return client


def build_app(
    *,
    settings: SlackSettings,
    services: Services,
    client: AsyncWebClient,
) -> AsyncApp:
    """The bolt app with every listener registered (the HTTP route verifies requests first)."""
    secret = settings.signing_secret.get_secret_value() if settings.signing_secret else None
    app = AsyncApp(
        # bolt's client without the token: the token comes from ``authorize`` (bolt ignores,
        # with a warning, a token given next to an authorize function)
        client=AsyncWebClient(
            base_url=client.base_url, timeout=client.timeout, retry_handlers=client.retry_handlers
        ),
        authorize=static_authorize(client.token),
        signing_secret=secret,
        # Checked once, by the HTTP route before bolt sees a request (bot/app/routes/endpoints.py:
        # signature, then replay); Socket Mode's requests carry none to check.
        request_verification_enabled=False,
        # The answer goes when the listener returns, and every listener returns right after
        # its ack (work that calls Slack is deferred): an error before the ack is still
        # answered by the error handler, which bolt's other mode can lose.
        process_before_response=True,
        logger=log,
    )

    async def inject(context: AsyncBoltContext, next: Callable[[], Awaitable[Any]]) -> Any:
        context[SERVICES] = services
        return await next()

    app.middleware(well_formed)  # before anything else runs
    app.middleware(workspace_guard(settings, HomeTeams(client)))
    app.middleware(inject)
    app.error(handle_error)
    listeners.register(app)
    return app


async def well_formed(
    req: AsyncBoltRequest, body: dict[str, Any], next: Callable[[], Awaitable[Any]]
) -> Any:
    """Answer a request whose fields are not what Slack sends (``bot.surfaces.slack.shapes``) with a
    400, or a slash command with a short ephemeral "could not read this request". Socket Mode
    only: the HTTP route checked its request on the raw bytes before bolt (once a request)."""
    if req.mode == "http":
        return await next()
    try:
        shapes.check(body)
    except shapes.Unreadable as exc:
        log.info("refused a Slack request: %s", exc)
        return exc.bolt_response()
    return await next()


def static_authorize(token: str | None) -> Callable[..., Awaitable[AuthorizeResult]]:
    """The one bot token for every request, without asking Slack (bolt's default calls
    auth.test on the first request, before any ack: a slow or rate limited Slack made the
    first command late)."""

    async def authorize(
        enterprise_id: str | None, team_id: str | None, user_id: str | None
    ) -> AuthorizeResult:
        return AuthorizeResult(
            enterprise_id=enterprise_id, team_id=team_id, user_id=user_id, bot_token=token
        )

    return authorize
