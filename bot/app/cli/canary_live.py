"""`ruleloop canary-live`: judge a target's canary replicas against its baseline, on live traffic.

The analysis is bot/canary/live.py's; this module reads the target from the bot's settings,
runs one window and prints the verdict. Exit codes: 0 keep, 1 roll back, 2 cannot judge or
bad usage.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from bot.app.cli import Command
from bot.app.cli.options import config_option
from bot.canary import ALPHA, INTERVAL_S, MIN_REQUESTS, MIN_WORSE

EPILOG = f"""\b
The target lists its canary Deployment's pods beside its baseline replicas:
  [targets.prod]
  vllm_url = "http://vllm.inference:8000"
  replicas = ["http://10.0.0.5:8000", "http://10.0.0.6:8000"]   # baseline
  canary_replicas = ["http://10.0.0.9:8000"]                     # the new flags
(or kubernetes_service: its endpoints other than the canary's are the baseline).

\b
Both groups take the same traffic over the same minutes. Each group's TTFT and TPOT
histograms are merged, and the canary is rolled back when a one-sided Mann-Whitney U test
on the buckets says it is slower (p < {ALPHA:g}) AND its p50 or p99 is at least
{MIN_WORSE:.0%} worse. Fewer than {MIN_REQUESTS} requests in either group, or a replica that
stops answering or restarts, cannot be judged (docs/fleet.md "Live canary").

\b
Examples:
  ruleloop canary-live --target prod --minutes 10
  ruleloop canary-live --target prod --minutes 2 --interval 5 --config ruleloop.toml

\b
Exit codes: 0 keep, 1 roll back, 2 cannot judge or bad usage.
"""


@click.command(
    "canary-live",
    cls=Command,
    epilog=EPILOG,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.option("--target", "target_name", help="A configured target (default: the default one).")
@click.option(
    "--minutes",
    type=click.FloatRange(min=0, min_open=True),
    required=True,
    help="The window: long enough for 50 requests on the canary replicas at today's traffic.",
)
@click.option(
    "--interval",
    "interval_s",
    type=click.FloatRange(min=0.1),
    default=INTERVAL_S,
    show_default=True,
    help="Seconds between scrapes (only the first and last count; the rest catch restarts).",
)
@config_option()
@click.pass_context
def canary_live(
    ctx: click.Context,
    target_name: str | None,
    minutes: float,
    interval_s: float,
    config_path: Path | None,
) -> None:
    """Judge the canary replicas against the baseline on live traffic: keep or roll back."""
    import httpx

    from bot.canary import LiveVerdict, analyse
    from bot.diagnosis.probes import ProbeContext
    from bot.kernel import Settings
    from bot.kernel.runtime import loop

    name, target = Settings.load(os.environ, path=config_path).target(target_name)

    async def run() -> LiveVerdict:
        async with httpx.AsyncClient(timeout=30) as http:
            return await analyse(
                name, target, ProbeContext(http=http), seconds=minutes * 60, interval_s=interval_s
            )

    verdict = loop.run(run())
    click.echo(verdict.text())
    ctx.exit(verdict.exit_code)


def register(cli: click.Group) -> None:
    """Add `canary-live` to the ruleloop command line."""
    cli.add_command(canary_live)
