"""`ruleloop workload capture|diff`: the shape of an engine's traffic, and whether it drifted.

Exit codes: capture 0 written, 2 bad usage or an unusable /metrics (or no request finished);
diff 0 the shapes are alike, 1 a dimension drifted, 2 bad input (a missing or invalid file).

The workload modules (pydantic, yaml, httpx) are imported inside the commands: `ruleloop --help`
lists this group without paying for them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from bot.workload.shape import WorkloadShape

GROUP_HELP = """Workload shapes: what the traffic on an engine looks like, from its own /metrics.

\b
Examples:
  # capture a minute of production traffic from the engine's /metrics
  ruleloop workload capture --metrics-url http://vllm-prod-0:8000/metrics \\
      --seconds 60 -o prod.yaml
  # did production drift from the shape the last decision was measured under?
  ruleloop workload diff baseline.yaml prod.yaml

docs/workload.md has the format, field by field, and how diff decides.
"""

CAPTURE_EPILOG = """\b
Examples:
  ruleloop workload capture --metrics-url http://127.0.0.1:8000/metrics --seconds 60 -o now.yaml
  ruleloop workload capture --metrics-url http://vllm-prod-0:8000/metrics \\
      --seconds 600 --interval 5 -o prod.json

\b
The shape is of the requests that *finished* in the window (vLLM records a request's lengths
when it ends): capture over minutes, under traffic, and point at one engine's /metrics (not a
gateway's). A window in which no request finished is refused.
\b
Exit codes: 0 the shape was written, 2 bad usage, an unusable /metrics, or no request finished.
"""

DIFF_EPILOG = """\b
Examples:
  ruleloop workload diff baseline.yaml prod.yaml
  ruleloop workload diff baseline.yaml prod.yaml --json | jq .drifted_dimensions

\b
Prints one line per dimension, e.g.
  prompt tokens p99 512 -> 2,048 (4.0x, limit 2x): DRIFTED
Thresholds: length distributions KS > 0.2; p50/p99 ratio > 2x either way; prefix-cache hit
rate > 20 points; request rate > 50 % (docs/workload.md says why).
\b
Exit codes: 0 alike, 1 a dimension drifted, 2 bad input (missing file, invalid shape).
"""


@click.group(
    "workload",
    help=GROUP_HELP,
    short_help="Workload shapes: capture from an engine's /metrics, diff for drift.",
)
def workload() -> None:
    """Workload shapes (capture, diff)."""


@workload.command("capture", epilog=CAPTURE_EPILOG)
@click.option("--metrics-url", required=True, help="The engine's /metrics URL.")
@click.option(
    "--seconds",
    type=click.FloatRange(min=0, min_open=True),
    required=True,
    help="The window: seconds between the first scrape and the last.",
)
@click.option(
    "--interval",
    "interval_s",
    type=click.FloatRange(min=0, min_open=True),
    default=2.0,
    show_default=True,
    help="Seconds between scrapes (the mean concurrency is averaged over them).",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Where to write the shape: .json, .yaml or .yml.",
)
@click.option("--quiet", is_flag=True, help="No progress on stderr.")
def capture_command(
    metrics_url: str, seconds: float, interval_s: float, output: Path, quiet: bool
) -> None:
    """Capture the shape of an engine's traffic from its /metrics over a window."""
    from bot import loop
    from bot.workload import shape as shapes

    shapes.file_format(output)  # a wrong suffix fails now, not after the window
    result = loop.run(_capture(metrics_url, seconds, interval_s, quiet=quiet))
    shapes.save(result, output)
    click.echo(f"wrote {output}")
    for line in result.summary():
        click.echo(f"  {line}")


async def _capture(url: str, seconds: float, interval_s: float, *, quiet: bool) -> WorkloadShape:
    import httpx

    from bot.probes.vllm_metrics import MetricsScraper
    from bot.probes.workload_capture import CAPTURE_METRICS, CaptureProgress, capture

    interactive = sys.stderr.isatty()

    def progress(p: CaptureProgress) -> None:
        line = (
            f"captured {p.elapsed_s:.0f}/{p.seconds:.0f} s: {p.scrapes} scrapes, "
            f"{p.finished} requests finished"
        )
        click.echo(("\r" + line) if interactive else line, nl=not interactive, err=True)

    async with httpx.AsyncClient(timeout=10.0) as client:
        scraper = MetricsScraper(url, client=client)
        shape = await capture(
            lambda: scraper(only=CAPTURE_METRICS),
            url=url,
            seconds=seconds,
            interval_s=interval_s,
            on_progress=None if quiet else progress,
        )
    if interactive and not quiet:
        click.echo("", err=True)
    return shape


@workload.command("diff", epilog=DIFF_EPILOG)
@click.argument("old", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("new", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the structured result as JSON.")
@click.pass_context
def diff_command(ctx: click.Context, old: Path, new: Path, as_json: bool) -> None:
    """Compare shape NEW against shape OLD: which dimensions drifted."""
    from bot.workload import shape as shapes
    from bot.workload.diff import diff

    result = diff(shapes.load(old), shapes.load(new))
    if as_json:
        click.echo(json.dumps({"old": str(old), "new": str(new), **result.as_dict()}, indent=2))
    else:
        for line in result.lines():
            click.echo(line)
        verdict = "drifted" if result.drifted else "alike"
        click.echo(f"{new} against {old}: {verdict}")
    ctx.exit(1 if result.drifted else 0)


def register(cli: click.Group) -> None:
    """Add `workload` to the ruleloop command line."""
    cli.add_command(workload)
