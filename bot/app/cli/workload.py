"""`ruleloop workload capture|diff`: the shape of an engine's traffic, and whether it drifted.

Exit codes: capture 0 written, 2 bad usage or an unusable source (/metrics, Prometheus, the
gateway; or no request finished);
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

from bot.app.cli.options import config_option

if TYPE_CHECKING:
    from bot.adr.workload import WorkloadShape

GROUP_HELP = """Workload shapes: what the traffic on an engine looks like, in a few numbers.

\b
Examples:
  # capture a minute of production traffic from the engine's /metrics
  ruleloop workload capture --metrics-url http://vllm-prod-0:8000/metrics \\
      --seconds 60 -o prod.yaml
  # or the last hour from Prometheus, or the gateway's records (see capture --help)
  ruleloop workload capture --prometheus http://prometheus:9090 --target prod-a \\
      --since 1h -o prod.yaml
  # did production drift from the shape the last decision was measured under?
  ruleloop workload diff baseline.yaml prod.yaml

docs/workload.md has the format, field by field, and how diff decides.
"""

CAPTURE_EPILOG = """\b
Sources (exactly one per call):
  --metrics-url URL   an engine's /metrics, scraped now for --seconds (the window to come);
                      give it once per replica to read a fleet (every replica scraped in the
                      same rounds, summed: the fleet's rate, over its replicas)
  --prometheus URL    Prometheus's history of an engine, over the past --since (--target or
                      --selector names the engine; --until ends the window, default now)
  --gateway URL       the gateway's own records of its last requests (/admin/requests,
                      bearer token): lengths, arrivals, burstiness and shared-prefix groups

\b
Examples:
  ruleloop workload capture --metrics-url http://vllm-prod-0:8000/metrics \\
      --seconds 600 --interval 5 -o prod.yaml
  ruleloop workload capture --prometheus http://prometheus:9090 --target prod-a \\
      --since 1h -o prod.yaml
  ruleloop workload capture --prometheus http://prometheus:9090 \\
      --selector '{job="vllm",instance="10.0.0.5:8000"}' --since 6h \\
      --until 2026-09-01T14:00:00Z -o peak.json
  RULELOOP_GATEWAY_ADMIN_TOKEN=... ruleloop workload capture \\
      --gateway http://gw:9000 --since 30m -o prod.yaml

\b
/metrics and Prometheus count the requests that *finished* in the window (vLLM records a
request's lengths when it ends): take minutes, under traffic, each engine's /metrics (not a
gateway's). One /metrics URL gives a rate per replica; several, or Prometheus summing over
engines, the fleet's, with the replicas it was read over (arrivals.replicas, arrivals.per).
A replica that restarted or stopped answering is named in the shape's source. The gateway's
records are per request: its shape also has prefix.groups and arrivals.burstiness. A window
in which no request finished is refused.
\b
Exit codes: 0 the shape was written, 2 bad usage, an unusable source, or no request finished.
"""

DIFF_EPILOG = """\b
Examples:
  ruleloop workload diff baseline.yaml prod.yaml
  ruleloop workload diff baseline.yaml prod.yaml --json | jq .drifted_dimensions

\b
Prints one line per dimension, e.g.
  prompt tokens p99 200–500 -> 2,000–5,000 tokens (more than 4.0x bigger, limit 2x): DRIFTED
Thresholds: length distributions KS > 0.2; p50/p99 > 2x either way, bounded by the nearest
bucket edges (a change inside one bucket is not drift); prefix-cache hit rate > 20 points;
request rate > 50 % (docs/workload.md says why).
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


SOURCE_FLAGS = {
    "--metrics-url": ("--seconds", "--interval"),
    "--prometheus": ("--since", "--until", "--selector", "--target", "--config"),
    "--gateway": ("--since", "--token-file"),
}


@workload.command("capture", epilog=CAPTURE_EPILOG)
@click.option(
    "--metrics-url",
    "metrics_urls",
    metavar="URL",
    multiple=True,
    help="Source: an engine's /metrics URL, scraped for --seconds; once per replica of a fleet.",
)
@click.option(
    "--prometheus", "prometheus_url", metavar="URL", help="Source: a Prometheus's base URL."
)
@click.option("--gateway", "gateway_url", metavar="URL", help="Source: the gateway's base URL.")
@click.option(
    "--seconds",
    type=click.FloatRange(min=0, min_open=True),
    help="--metrics-url: the window, seconds between the first scrape and the last.",
)
@click.option(
    "--interval",
    "interval_s",
    type=click.FloatRange(min=0, min_open=True),
    help="--metrics-url: seconds between scrapes (default 2; concurrency is averaged over them).",
)
@click.option(
    "--since",
    help="--prometheus: the window, back from --until (1h, 30m, 600s). "
    "--gateway: only the requests of this last stretch (default: all it holds).",
)
@click.option("--until", help="--prometheus: the window's end (ISO 8601 or unix s; default now).")
@click.option("--selector", help="--prometheus: the engine's series, e.g. '{instance=\"h:8000\"}'.")
@click.option("--target", "target_name", help="--prometheus: a configured target (its vllm_url).")
@config_option("--target: the ruleloop config file (default $RULELOOP_CONFIG).")
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="--gateway: file holding the admin token (default $RULELOOP_GATEWAY_ADMIN_TOKEN).",
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
    metrics_urls: tuple[str, ...], prometheus_url: str | None, gateway_url: str | None,
    seconds: float | None, interval_s: float | None, since: str | None, until: str | None,
    selector: str | None, target_name: str | None, config_path: Path | None,
    token_file: Path | None, output: Path, quiet: bool,
) -> None:  # fmt: skip
    """Capture the shape of an engine's traffic: from /metrics, Prometheus or the gateway."""
    from bot.adr.workload import shape as shapes
    from bot.kernel import UsageError
    from bot.kernel.runtime import loop

    given = {"--metrics-url": metrics_urls, "--prometheus": prometheus_url,
             "--gateway": gateway_url}  # fmt: skip
    sources = [flag for flag, value in given.items() if value]
    if len(sources) != 1:
        raise UsageError(
            "give exactly one source: --metrics-url (scrape now), --prometheus (its history) "
            "or --gateway (its request records)"
            + (f"; got {' and '.join(sources)}" if sources else "")
        )
    (source,) = sources
    flags = {"--seconds": seconds, "--interval": interval_s, "--since": since, "--until": until,
             "--selector": selector, "--target": target_name, "--config": config_path,
             "--token-file": token_file}  # fmt: skip
    for flag, value in flags.items():
        if value is not None and flag not in SOURCE_FLAGS[source]:
            owners = [s for s, allowed in SOURCE_FLAGS.items() if flag in allowed]
            raise UsageError(f"{flag} belongs to {' or '.join(owners)}, not to {source}")
    shapes.file_format(output)  # a wrong suffix fails now, not after the window
    if metrics_urls:
        if seconds is None:
            raise UsageError("--metrics-url needs --seconds: the window to scrape over")
        result = loop.run(_capture(metrics_urls, seconds, interval_s or 2.0, quiet=quiet))
    elif prometheus_url:
        result = loop.run(
            _from_prometheus(prometheus_url, since=since, until=until, selector=selector,
                             target_name=target_name, config_path=config_path)
        )  # fmt: skip
    else:
        assert gateway_url is not None
        result = loop.run(_from_gateway(gateway_url, since=since, token_file=token_file))
    shapes.save(result, output)
    click.echo(f"wrote {output}")
    for line in result.summary():
        click.echo(f"  {line}")
    if result.prefix.groups:
        shown = ", ".join(
            f"{group.share:.1%} behind {group.length:,} tokens" for group in result.prefix.groups
        )
        click.echo(f"  prefix groups: {shown}")
    if result.arrivals.burstiness is not None:
        click.echo(f"  burstiness: {result.arrivals.burstiness:g} (gamma shape; 1 is Poisson)")


async def _from_prometheus(
    url: str, *, since: str | None, until: str | None, selector: str | None,
    target_name: str | None, config_path: Path | None,
) -> WorkloadShape:  # fmt: skip
    import time

    import httpx

    from bot.diagnosis.probes import prometheus_capture as pc
    from bot.kernel import UsageError

    if since is None:
        raise UsageError("--prometheus needs --since: how far back the window reaches (e.g. 1h)")
    if (selector is None) == (target_name is None):
        raise UsageError(
            "--prometheus needs the engine: --target NAME (a configured target) or "
            "--selector '{instance=\"10.0.0.5:8000\"}' (one of them)"
        )
    if target_name is not None:
        import os

        from bot.kernel import Settings

        _, target = Settings.load(os.environ, path=config_path).target(target_name)
        selector = pc.instance_selector(target.hostport)
    assert selector is not None
    pc.matchers(selector)  # a malformed selector fails before any request
    seconds = pc.parse_since(since)
    end = pc.parse_until(until, time.time())
    async with httpx.AsyncClient(timeout=60.0) as client:
        return await pc.capture_from_prometheus(
            client, url, selector=selector, seconds=seconds, end=end
        )


async def _from_gateway(url: str, *, since: str | None, token_file: Path | None) -> WorkloadShape:
    import os

    import httpx

    from bot.diagnosis.probes import gateway_capture as gc
    from bot.diagnosis.probes import parse_since
    from bot.kernel import UsageError

    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as exc:
            raise UsageError(f"cannot read --token-file {token_file}: {exc.strerror}") from None
    else:
        token = os.environ.get(gc.TOKEN_ENV, "").strip()
    if not token:
        raise UsageError(
            f"--gateway needs the gateway's admin token: --token-file FILE or ${gc.TOKEN_ENV}"
        )
    seconds = None if since is None else parse_since(since, minimum_s=0.0)
    async with httpx.AsyncClient(timeout=60.0) as client:
        return await gc.capture_from_gateway(client, url, token=token, since_s=seconds)


async def _capture(
    urls: tuple[str, ...], seconds: float, interval_s: float, *, quiet: bool
) -> WorkloadShape:
    import httpx

    from bot.diagnosis.probes import (
        CAPTURE_METRICS,
        CaptureProgress,
        Exposition,
        MetricsScraper,
        Replica,
        capture_fleet,
    )

    interactive = sys.stderr.isatty()

    def progress(p: CaptureProgress) -> None:
        line = (
            f"captured {p.elapsed_s:.0f}/{p.seconds:.0f} s: {p.scrapes} scrapes, "
            f"{p.finished} requests finished"
        )
        click.echo(("\r" + line) if interactive else line, nl=not interactive, err=True)

    async with httpx.AsyncClient(timeout=10.0) as client:
        # A replica by its base URL (how the fleet's details name it), scraped at the URL given.
        scrapers = {
            Replica(url.rstrip("/").removesuffix("/metrics")): MetricsScraper(url, client=client)
            for url in urls
        }

        async def scrape(replica: Replica) -> Exposition:
            return await scrapers[replica](only=CAPTURE_METRICS)

        shape = await capture_fleet(
            list(scrapers),
            scrape,
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
    from bot.adr.workload import shape as shapes
    from bot.adr.workload.diff import diff

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
