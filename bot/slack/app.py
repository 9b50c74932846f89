"""The bolt app: one AsyncApp, its listeners (one per file), and its one error handler.

Listeners reach the services through the context (``context["flows"]``, ``["remediation"]``,
``["drafts"]``), put there by a middleware, so
that they stay thin and the services never import slack_bolt.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from slack_bolt.async_app import AsyncApp
from slack_bolt.context.async_context import AsyncBoltContext
from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler
from slack_sdk.web.async_client import AsyncWebClient

from bot.config import SlackSettings
from bot.diagnosis.flows import IncidentFlows
from bot.slack import listeners
from bot.slack.errors import handle_error
from bot.slack.workspace import HomeTeams, workspace_guard

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
    flows: IncidentFlows,
    client: AsyncWebClient,
    services: dict[str, Any] | None = None,
) -> AsyncApp:
    """The bolt app with every listener registered and requests verified by signing secret."""
    secret = settings.signing_secret.get_secret_value() if settings.signing_secret else None
    app = AsyncApp(
        client=client,
        signing_secret=secret,
        request_verification_enabled=secret is not None,
        # Listeners finish before the HTTP answer: they are quick (long work is spawned), and
        # bolt's ack-first mode can lose the ack when a listener fails right after it.
        process_before_response=True,
        logger=log,
    )

    async def inject(context: AsyncBoltContext, next: Callable[[], Awaitable[Any]]) -> Any:
        context["flows"] = flows
        for name, service in (services or {}).items():
            context[name] = service
        return await next()

    app.middleware(workspace_guard(settings, HomeTeams(client)))  # before anything else runs
    app.middleware(inject)
    app.error(handle_error)
    listeners.register(app)
    return app
