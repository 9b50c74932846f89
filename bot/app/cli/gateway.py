"""`ruleloop gateway`: the inference gateway in front of an OpenAI-compatible engine.

Exit codes: 0 stopped cleanly, 2 bad usage (flags, limits file, tokenizer, address in use).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import click

from bot.app.cli import Command
from bot.gateway import (
    BadTimeout,
    Costing,
    Gateway,
    GatewayServer,
    Limits,
    LimitsError,
    parse_timeout,
    read_limits_file,
    tokenizer_counter,
    updated,
    upstream_client,
)
from bot.kernel import UsageError
from bot.kernel.runtime import loop

ADMIN_TOKEN_ENV = "RULELOOP_GATEWAY_ADMIN_TOKEN"

EPILOG = """\b
Examples:
  ruleloop gateway --upstream http://127.0.0.1:8000 --listen 0.0.0.0:9000 \\
      --max-inflight-tokens 65536 --default-timeout 30s
  # change limits live (no stream is dropped)
  curl -X PATCH -H "Authorization: Bearer $TOKEN" localhost:9000/admin/limits \\
      -d '{"max_inflight_tokens": 32768}'
  kill -HUP <pid>      # re-read --limits-file
  # a canary stage: a quarter of the inference requests to a second engine (while it runs)
  ruleloop gateway --upstream http://127.0.0.1:8000 \
      --canary-upstream http://127.0.0.1:8001 --canary-weight 0.25

\b
X-Request-Timeout and durations: 5 or 2.5 = seconds, 500ms = milliseconds, 2s = seconds.
"""


def _duration(value: str, flag: str) -> float:
    try:
        return parse_timeout(value)
    except BadTimeout as exc:
        raise UsageError(str(exc).replace("X-Request-Timeout", flag)) from None


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise UsageError(f"--listen {value!r} must be HOST:PORT, e.g. 127.0.0.1:9000")
    return host.strip("[]") or "0.0.0.0", int(port)


def build_limits(
    *, max_inflight_tokens: int, default_timeout: str, max_timeout: str, max_body_bytes: int,
    limits_file: Path | None,
) -> Limits:  # fmt: skip
    """Limits from the flags, then the limits file on top (the file wins, as on SIGHUP)."""
    limits = Limits(
        max_inflight_tokens=max_inflight_tokens,
        default_timeout_s=_duration(default_timeout, "--default-timeout"),
        max_timeout_s=_duration(max_timeout, "--max-timeout"),
        max_body_bytes=max_body_bytes,
    )
    try:
        if limits.default_timeout_s > limits.max_timeout_s:
            raise LimitsError("--default-timeout is above --max-timeout")
        if limits_file is not None:
            limits = updated(limits, read_limits_file(limits_file))
    except LimitsError as exc:
        raise UsageError(str(exc)) from None
    return limits


@click.command(
    "gateway", cls=Command, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.option(
    "--upstream",
    required=True,
    help="The engine's HTTP root, e.g. http://127.0.0.1:8000. Start vLLM with "
    "VLLM_HTTP_TIMEOUT_KEEP_ALIVE=75: at its default of 5 s it closes the connections the "
    "gateway keeps, and a burst after a quiet moment opens a new one per request.",
)
@click.option(
    "--canary-upstream",
    default=None,
    help="A second engine, the canary stage of a change (the local actuator's canary_url): "
    "--canary-weight of the inference requests go to it. Either engine may be down: a request "
    "whose engine refuses the connection goes to the other.",
)
@click.option(
    "--canary-weight",
    type=click.FloatRange(min=0, max=1, min_open=True, max_open=True),
    default=0.5,
    show_default=True,
    help="The canary engine's share of the inference requests (with --canary-upstream).",
)
@click.option(
    "--listen", default="127.0.0.1:9000", show_default=True, help="HOST:PORT to serve on."
)
@click.option(
    "--max-inflight-tokens",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Token budget: prompt + max_tokens of admitted requests in flight; 0 = no budget.",
)
@click.option(
    "--default-timeout",
    default="600s",
    show_default=True,
    help="Deadline for requests without X-Request-Timeout.",
)
@click.option(
    "--max-timeout",
    default="3600s",
    show_default=True,
    help="Longest deadline a client may ask for.",
)
@click.option(
    "--max-body-bytes",
    type=click.IntRange(min=1024),
    default=8 * 1024 * 1024,
    show_default=True,
    help="Larger request bodies get 413.",
)
@click.option(
    "--tokenizer",
    "tokenizer_path",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="tokenizer.json to count text prompts exactly [default: ~4 bytes per token].",
)
@click.option(
    "--limits-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="YAML/JSON limits, applied at start and re-read on SIGHUP.",
)
@click.option(
    "--admin-token-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help=f"Bearer token for /admin/limits [or ${ADMIN_TOKEN_ENV}]; none: admin disabled.",
)
def gateway(
    upstream: str, canary_upstream: str | None, canary_weight: float, listen: str,
    max_inflight_tokens: int, default_timeout: str, max_timeout: str, max_body_bytes: int,
    tokenizer_path: str | None, limits_file: Path | None, admin_token_file: Path | None,
) -> None:  # fmt: skip
    """Serve an inference gateway: deadlines, cancel drain, token-budget backpressure, metrics.

    Proxies /v1/completions and /v1/chat/completions, passes the engine's read and tokenizer
    paths through as sent (/v1/models, /health, /ping, /version, /tokenize, /detokenize) and
    answers 404 to any other path (never forwarded: it would bypass the limits), admits
    requests against an in-flight token budget (429 + Retry-After when spent), enforces
    X-Request-Timeout, closes the upstream request the moment a client goes away, and exports
    its own /metrics (ruleloop_gateway_*).
    """
    for flag, url in (("--upstream", upstream), ("--canary-upstream", canary_upstream)):
        if url is not None and not url.startswith(("http://", "https://")):
            raise UsageError(f"{flag} {url!r} must be an http(s) URL, e.g. http://127.0.0.1:8000")
    if canary_upstream is not None and canary_upstream.rstrip("/") == upstream.rstrip("/"):
        raise UsageError("--canary-upstream is --upstream: give the canary engine's own URL")
    host, port = _listen(listen)
    limits = build_limits(
        max_inflight_tokens=max_inflight_tokens, default_timeout=default_timeout,
        max_timeout=max_timeout, max_body_bytes=max_body_bytes, limits_file=limits_file,
    )  # fmt: skip
    token = None
    if admin_token_file is not None:
        token = admin_token_file.read_text().strip() or None
    token = token or os.environ.get(ADMIN_TOKEN_ENV) or None
    costing = Costing()
    if tokenizer_path is not None:
        try:
            costing = Costing(count_tokens=tokenizer_counter(tokenizer_path))
        except Exception as exc:  # tokenizers raises its own exception types
            raise UsageError(f"cannot load --tokenizer {tokenizer_path}: {exc}") from exc
    canary = None if canary_upstream is None else (canary_upstream, canary_weight)
    loop.run(_serve(upstream, canary, host, port, limits, costing, token, limits_file))


async def _serve(
    upstream: str, canary: tuple[str, float] | None, host: str, port: int, limits: Limits,
    costing: Costing, token: str | None, limits_file: Path | None,
) -> None:  # fmt: skip
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(upstream_client(upstream))
        split = None
        if canary is not None:
            split = (await stack.enter_async_context(upstream_client(canary[0])), canary[1])
        app = Gateway(client=client, canary=split, limits=limits, costing=costing,
                      admin_token=token)  # fmt: skip
        to = upstream if canary is None else f"{upstream} + canary {canary[0]} ({canary[1]:.0%})"
        try:
            server = GatewayServer(
                app, host=host, port=port, limits_file=limits_file, handle_signals=True
            )
            async with server:
                click.echo(f"gateway on {server.base_url} -> {to} "
                           f"(budget {limits.max_inflight_tokens or 'off'})", err=True)  # fmt: skip
                await server.wait()
        except OSError as exc:
            raise UsageError(f"cannot listen on {host}:{port}: {exc}") from exc


def register(cli: click.Group) -> None:
    """Add `gateway` to the ruleloop command line."""
    cli.add_command(gateway)
