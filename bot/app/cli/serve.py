"""`ruleloop serve`: the bot (Slack app, Alertmanager webhook, incident pages, /healthz, /metrics)
in one process; `ruleloop page-link`: a signed link to an incident's page.

Exit codes: 0 stopped cleanly, 2 bad configuration, bad runbook, unusable store, or busy port.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import click

from bot.app.cli import Command
from bot.app.cli.options import config_option
from bot.kernel import UsageError

if TYPE_CHECKING:
    from bot.kernel import Settings

log = logging.getLogger(__name__)

# the reviewer the shipped example configs carry until a team puts its own there
PLACEHOLDER_REVIEWER = "S0REVIEWERS"


def reviewer_warning(settings: Settings) -> str | None:
    """Why no draft ADR can be accepted with these settings, or None."""
    review = settings.access.review
    if not review:
        return (
            "nobody can accept a draft ADR: set [access] review = [...] (Slack user or group IDs)"
        )
    if PLACEHOLDER_REVIEWER in review:
        return (
            f"[access] review still holds the example's placeholder {PLACEHOLDER_REVIEWER}: "
            "put your reviewers' Slack user group or user IDs there"
        )
    return None


# what every placeholder of the shipped Secret example (deploy/kubernetes/base) holds
PLACEHOLDER_SECRET = "replace-me"


def placeholder_warnings(env: Mapping[str, str]) -> list[str]:
    """One warning per setting that still holds the example Secret's placeholder (it starts,
    so that a first install can be tried, but anyone who read the example knows the value)."""
    from bot.kernel import ENV_KEYS

    return [
        f"{key} still holds the example Secret's placeholder: anyone who read the example "
        "knows it; put your own value in the Secret ruleloop"
        for key in sorted(ENV_KEYS)
        if PLACEHOLDER_SECRET in env.get(key, "")
    ]


EPILOG = """\b
Configuration: a TOML file (--config or $RULELOOP_CONFIG) plus the environment:
  SLACK_BOT_TOKEN, SLACK_SIGNING_SECRET   Slack over HTTP (events at /slack/events)
  SLACK_APP_TOKEN                         Slack over Socket Mode too (only, without the secret)
  RULELOOP_ALERTMANAGER_TOKEN             bearer token Alertmanager must send to /alertmanager
  RULELOOP_DATABASE_URL                   incident store (default: SQLite in the state dir)
  RULELOOP_WEB_SECRET                     signs incident page links (docs/incident-page.md)
  RULELOOP_PUBLIC_URL                     the bot's address: Slack messages link its pages
  RULELOOP_LOG_FORMAT                     text (default) or json: one JSON object per line
  OTEL_EXPORTER_OTLP_ENDPOINT             traces to this OTLP/HTTP collector (default: none)
With no Slack tokens, messages are printed on stdout (console transport).

\b
Example:
  export RULELOOP_ALERTMANAGER_TOKEN=$(openssl rand -hex 24)
  ruleloop serve --config ruleloop.toml --port 3000
"""


async def run(settings: Settings, *, state_dir: Path, sock: socket.socket) -> None:
    """Serve until SIGINT/SIGTERM; Socket Mode runs beside HTTP when an app token is set."""
    import uvicorn

    from bot.app.server import create_bot
    from bot.kernel import QuietServer
    from bot.kernel.runtime import GuardedHttpToolsProtocol

    bot = create_bot(settings, state_dir=state_dir)
    # Heads over 64 KiB or 100 lines are a 431, unfinished after 10 s a 408
    # (bot/kernel/runtime/heads.py).
    # log_config=None: uvicorn's own lines go through the bot's handler ([server] log_format)
    config = uvicorn.Config(
        bot.app, log_level="warning", log_config=None, lifespan="on",
        http=GuardedHttpToolsProtocol,
    )  # fmt: skip
    server = QuietServer(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):  # stop cleanly: drain diagnoses, exit 0
        loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
    socket_mode = None
    if settings.slack.app_token is not None and bot.slack is not None:
        from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler

        socket_mode = AsyncSocketModeHandler(bot.slack, settings.slack.app_token.get_secret_value())
        await socket_mode.connect_async()
    host, port = sock.getsockname()[:2]
    transport = "Socket Mode" if socket_mode else ("Slack" if bot.slack else "console")
    targets = ", ".join(sorted(settings.targets)) or "none"
    click.echo(f"ruleloop serve: http://{host}:{port} (transport: {transport}; targets: {targets})")
    try:
        await server.serve(sockets=[sock])
    finally:
        if socket_mode is not None:
            await socket_mode.close_async()


@click.command(
    "serve", cls=Command, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]}
)
@config_option()
@click.option(
    "--host", default=None, help="Address to listen on (default: [server] host, 127.0.0.1)."
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Port, 0-65535 (0: any free port; default: [server] port, 3000).",
)
@click.option(
    "--state-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Where the SQLite store and console charts go when [paths] state is unset "
    "(default: ~/.local/state/ruleloop).",
)
def serve(
    config_path: Path | None, host: str | None, port: int | None, state_dir: Path | None
) -> None:
    """Run the bot: Slack app, Alertmanager intake, runbooks, diagnosis, incident pages."""
    from bot.engine import default_state_dir
    from bot.kernel import Settings, bind
    from bot.kernel.runtime import configured_logs

    settings = Settings.load(os.environ, path=config_path)
    server = settings.server
    debug = bool(os.environ.get("RULELOOP_DEBUG"))
    with configured_logs(server.log_format, server.log_level, debug=debug):
        # an empty list fails closed: drafts pile up unreviewed unless someone is told at start
        for warning in [reviewer_warning(settings), *placeholder_warnings(os.environ)]:
            if warning is not None:
                log.warning(warning)
        sock = bind(host or server.host, server.port if port is None else port)
        try:
            asyncio.run(run(settings, state_dir=state_dir or default_state_dir(), sock=sock))
        finally:
            sock.close()


@click.command("page-link", cls=Command, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("incident_id", type=int, required=False)
@config_option()
def page_link(incident_id: int | None, config_path: Path | None) -> None:
    """Print a signed link to an incident's page (no INCIDENT_ID: to the index of incidents).

    \b
    It is valid for [web] link_ttl_s, signed with [web] link_secret (RULELOOP_WEB_SECRET, the
    same as the bot's); absolute when [web] public_url is set.
    """
    import time

    from bot.kernel import Settings
    from bot.surfaces.web import page_links

    settings = Settings.load(os.environ, path=config_path)
    links = page_links(settings.web, clock=time.time)
    if links is None:
        raise UsageError(
            "no [web] link_secret: set RULELOOP_WEB_SECRET to the secret the bot uses "
            "(at least 32 characters)"
        )
    click.echo(links.index_url() if incident_id is None else links.incident_url(incident_id))


def register(group: click.Group) -> None:
    """Add `serve` and `page-link` to the CLI."""
    group.add_command(serve)
    group.add_command(page_link)
