"""`ruleloop agent`: serve this host's NVML snapshot to the bot, read-only, behind a bearer token.

Exit codes: 0 stopped cleanly (or --once read the GPUs), 2 bad usage (no token, bad --listen,
address in use) or --once could not read NVML.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
from pathlib import Path
from typing import Literal

import click

from bot.agent import NvmlSession, NvmlUnavailable
from bot.app.cli import Command
from bot.kernel import UsageError
from bot.kernel.runtime import loop

TOKEN_ENV = "RULELOOP_AGENT_TOKEN"
MIN_TOKEN = 16
LOG_FORMAT_ENV = "RULELOOP_LOG_FORMAT"  # the bot's names ([server] log_format, log_level)
LOG_LEVEL_ENV = "RULELOOP_LOG_LEVEL"
log = logging.getLogger("ruleloop.agent")

EPILOG = """\b
Examples:
  openssl rand -hex 32 > /etc/ruleloop/agent-token      # the shared secret
  ruleloop agent --listen 0.0.0.0:9401 --token-file /etc/ruleloop/agent-token
  curl -H "Authorization: Bearer $(cat /etc/ruleloop/agent-token)" localhost:9401/snapshot
  curl localhost:9401/healthz                           # no token needed
  ruleloop agent --once                                 # print one snapshot and exit
  ruleloop agent --token-file ... --log-format json     # JSON lines on stderr (a collector)

\b
The bot reads it when a target names it (ruleloop.toml):
  [targets.prod-a]
  vllm_url = "http://10.0.0.5:8000"
  gpu_agent_url = "http://10.0.0.5:9401"
  gpu_agent_token_file = "/var/run/secrets/ruleloop-nvml-agent/token"

\b
Run it where the GPUs are: a sidecar in the vLLM pod or a DaemonSet on GPU nodes
(deploy/kubernetes/components/nvml-agent, which mounts the Secret `ruleloop-nvml-agent`
at /var/run/secrets/ruleloop-nvml-agent/token in the agent and in the bot). Docs: docs/agent.md.
"""


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise UsageError(f"--listen {value!r} must be HOST:PORT, e.g. 0.0.0.0:9401")
    return host.strip("[]") or "0.0.0.0", int(port)


def refuse_insecure_off_loopback(host: str) -> None:
    """UsageError unless ``host`` is a loopback address: without a token, anyone who reaches
    the address reads the GPUs (0.0.0.0 is every network of the node)."""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost: it may resolve anywhere
        loopback = False
    if not loopback:
        raise UsageError(
            f"--insecure-no-auth is only allowed on a loopback address (127.0.0.1, ::1), not "
            f"{host}: anyone who reaches it would read the GPUs. Serve with --token-file (or "
            f"${TOKEN_ENV}) there"
        )


def read_token(token_file: Path | None, *, insecure: bool) -> str | None:
    """The bearer token from --token-file or $RULELOOP_AGENT_TOKEN; None only if opted out."""
    token = None
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as exc:
            raise UsageError(f"cannot read --token-file {token_file}: {exc.strerror}") from None
        if not token:
            raise UsageError(f"--token-file {token_file} is empty: write the token into it")
    token = token or os.environ.get(TOKEN_ENV, "").strip() or None
    if insecure:
        if token is not None:
            raise UsageError(
                "--insecure-no-auth and a token were both given: drop one "
                f"(--token-file or ${TOKEN_ENV})"
            )
        return None
    if token is None:
        raise UsageError(
            f"the agent needs a bearer token: --token-file PATH or ${TOKEN_ENV} "
            "(make one with `openssl rand -hex 32`); --insecure-no-auth serves without one"
        )
    if len(token) < MIN_TOKEN:
        raise UsageError(
            f"the token is {len(token)} characters; use at least {MIN_TOKEN} "
            "(`openssl rand -hex 32`)"
        )
    return token


@click.command(
    "agent", cls=Command, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.option(
    "--listen", default="127.0.0.1:9401", show_default=True,
    help="HOST:PORT to serve on (0.0.0.0:9401 in a pod).",
)  # fmt: skip
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help=f"File holding the bearer token clients must send [or ${TOKEN_ENV}].",
)
@click.option(
    "--insecure-no-auth",
    is_flag=True,
    help="Serve /snapshot without a token (only on a loopback --listen address).",
)
@click.option(
    "--watch-xid/--no-watch-xid",
    default=True,
    show_default=True,
    help="Listen for XID error events (NVML reports XIDs only to a process that listens).",
)
@click.option("--once", is_flag=True, help="Print one snapshot as JSON and exit (no server).")
@click.option(
    "--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
    envvar=LOG_FORMAT_ENV, show_envvar=True,
    help="The log on stderr: text (a line for a person) or json (one JSON object per line, "
    "the bot's fields: time, level, logger, message).",
)  # fmt: skip
@click.option(
    "--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
    show_default=True, envvar=LOG_LEVEL_ENV, show_envvar=True,
    help="The agent's own log lines (ruleloop.*); libraries log warnings and errors only "
    "(RULELOOP_DEBUG=1: everything at debug).",
)  # fmt: skip
def agent(
    listen: str, token_file: Path | None, insecure_no_auth: bool, watch_xid: bool, once: bool,
    log_format: Literal["text", "json"], log_level: Literal["debug", "info", "warning", "error"],
) -> None:  # fmt: skip
    """Serve an NVML snapshot of this host's GPUs over HTTP, for the bot's nvml probe.

    GET /snapshot (bearer token) answers per GPU: memory used/total, utilisation, SM clock and
    its maximum, clock-event and throttle reasons by name, ECC errors, XID errors seen since
    the agent started, temperature, power draw and limit, and the processes using it. Without
    an NVIDIA driver it answers 503 with a JSON error saying so; it never writes to the GPU.
    GET /healthz needs no token.
    """
    from bot.kernel.runtime import configured_logs

    debug = bool(os.environ.get("RULELOOP_DEBUG"))
    with configured_logs(log_format, log_level, debug=debug):
        if once:
            _print_once(NvmlSession(watch_xid=False))
            return
        host, port = _listen(listen)
        token = read_token(token_file, insecure=insecure_no_auth)
        if insecure_no_auth:
            refuse_insecure_off_loopback(host)
        loop.run(_serve(NvmlSession(watch_xid=watch_xid), host, port, token))


def _print_once(session: NvmlSession) -> None:
    from bot.agent import DEFAULT_PROCESSES

    try:
        snapshot = session.snapshot(max_processes=DEFAULT_PROCESSES)
    except NvmlUnavailable as exc:
        raise UsageError(f"cannot read NVML on {session.hostname}: {exc}") from None
    finally:
        session.close()
    click.echo(json.dumps(snapshot, indent=2))


async def _serve(session: NvmlSession, host: str, port: int, token: str | None) -> None:
    from bot.agent import create_app, serve
    from bot.kernel import bind

    sock = bind(host, port)
    auth = "bearer token" if token else "NO AUTH (--insecure-no-auth)"

    def started(url: str) -> None:
        log.info("agent on %s (%s); GET /snapshot, /healthz", url, auth)

    try:
        await serve(create_app(session, token=token), sock, on_started=started)
    finally:
        session.close()


def register(cli: click.Group) -> None:
    """Add `agent` to the ruleloop command line."""
    cli.add_command(agent)
