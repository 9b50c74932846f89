"""`ruleloop canary` and `python -m latency_checker`: one command, two names.

Exit codes: 0 every gate passed, 1 a gate failed, 2 bad usage or an unusable endpoint.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
from click.core import ParameterSource

from bot.adr import AdrGates
from bot.app.cli import Command
from bot.canary import (
    DEFAULT_LOOKS,
    DEFAULT_MAX_ERROR_RATE,
    METRICS_PATHS,
    CanaryReport,
    CanaryRun,
    CancelMode,
    Gates,
    Progress,
    Workload,
    check,
    default_cap,
    progress_line,
    summary_table,
)
from bot.kernel import GateFailed, UsageError
from bot.kernel.runtime import loop

if TYPE_CHECKING:
    from bot.adr.workload import WorkloadShape

EPILOG = """\b
Examples:
  # the seed's CI gate (a ruleloop gateway or vLLM itself at the endpoint)
  python -m latency_checker --endpoint http://canary-inference-gateway:8000/v1/completions \\
      --concurrency 150 --prompt-length 2048 \\
      --max-ttft-p99-ms 350 --max-tpot-p99-ms 35 --min-goodput-ratio 0.95
  # the seed's 10-minute pulse: 38 streams always, all 150 for 10 s of every minute
  python -m latency_checker --endpoint http://canary:8000/v1/completions \\
      --concurrency 150 --duration 600 --pulse --max-ttft-p99-ms 350
  # impatient clients: 20% abandon their stream after 300 ms
  ruleloop canary --endpoint http://127.0.0.1:8000/v1/completions \\
      --cancel-share 0.2 --cancel-after-ms 300 --output-json canary.json
  # replay production's shape (from `ruleloop workload capture`): lengths, prefixes, rate
  ruleloop canary --endpoint http://canary:8000/v1/completions --workload prod.yaml \\
      --num-requests 300 --max-ttft-p99-ms 350

\b
Failed requests fail the gate: --max-error-rate is always on (default 1 %), and a failed
request counts as infinitely slow in TTFT/TPOT p99, so failures never make a run look faster.
\b
A p99 gate is decided at 99 %, with its interval: met or missed only when the interval lies on
one side of the limit, else "not decided", which fails. The run sizes itself (a p99 needs 528
requests) and, while a gate is undecided, goes on once more (--looks).
\b
Exit codes: 0 all gates passed, 1 a gate failed, 2 bad usage or endpoint unusable.
"""

REQUESTS_PER_STREAM = 5  # default count: every stream sends several, so concurrency holds
# Seconds between in-flight /metrics samples: each makes the engine render its page. 2 s cost
# the engine least of 0.5/1/2 s in bench/canary_vs_vllm_bench.py (docs/canary.md).
DEFAULT_SAMPLE_INTERVAL_S = 2.0
# Flags a --workload shape decides instead (the option's name, what of the shape decides it).
SHAPE_DECIDES = {
    "prompt_length": ("--prompt-length", "prompt_tokens"),
    "prefix_length": ("--prefix-length", "prefix"),
    "output_length": ("--output-length", "output_tokens"),
    "request_rate": ("--request-rate", "arrivals.request_rate"),
    "pulse": ("--pulse", "arrivals"),
    "pulse_period_s": ("--pulse-period", "arrivals"),
    "pulse_width_s": ("--pulse-width", "arrivals"),
    "pulse_base_share": ("--pulse-base", "arrivals"),
}


def default_num_requests(concurrency: int) -> int:
    """100, or enough for every stream to send several requests at high concurrency."""
    return max(100, REQUESTS_PER_STREAM * concurrency)


def run_canary(
    workload: Workload,
    *,
    gates: Gates,
    metrics_url: str | None,
    discover_metrics: bool = False,
    replicas: tuple[str, ...] = (),
    sample_interval_s: float = DEFAULT_SAMPLE_INTERVAL_S,
    progress: bool = False,
    size: bool = True,
) -> CanaryReport:
    """Run one canary and return its report (raises on usage or endpoint errors); ``size``:
    take at least as many requests as the gates can be decided on (``CanaryRun``)."""
    problems = check(workload)
    if problems:
        raise UsageError("; ".join(problems))
    interactive = sys.stderr.isatty()

    def show(p: Progress) -> None:
        line = progress_line(p)
        if interactive:
            click.echo("\r" + line, nl=False, err=True)
        else:
            click.echo(line, err=True)

    run = CanaryRun(
        workload,
        gates=gates,
        metrics_url=metrics_url,
        discover_metrics=discover_metrics,
        replicas=replicas,
        sample_interval_s=sample_interval_s,
        on_progress=show if progress else None,
        progress_interval_s=1.0 if interactive else 5.0,
        size=size,
    )
    said = len(run.warnings)  # the run's size, said before it starts
    for warning in run.warnings:
        click.echo(f"warning: {warning}", err=True)
    report = loop.run(run.run())
    if progress and interactive:
        click.echo("", err=True)
    for warning in run.warnings[said:]:
        click.echo(f"warning: {warning}", err=True)
    return report.report()


@click.command(
    "canary", cls=Command, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.option(
    "--endpoint",
    required=True,
    help="OpenAI-compatible URL ending in /v1/completions or /v1/chat/completions.",
)
@click.option("--model", default=None, help="Model name [default: the first one /v1/models lists].")
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="Streams in flight (fixed-concurrency mode), or the cap with --request-rate or"
    " --workload: in all, to the endpoint given, so for the whole fleet when it is a Service"
    " (not per replica).",
)
@click.option(
    "--request-rate",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Poisson arrivals at this many requests/s instead of fixed concurrency.",
)
@click.option(
    "--num-requests",
    type=click.IntRange(min=1),
    default=None,
    help=f"Requests to send [default: 100 or {REQUESTS_PER_STREAM} per stream, whichever is more;"
    " none with --duration].",
)
@click.option(
    "--duration",
    "duration_s",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Stop sending after this many seconds.",
)
@click.option(
    "--pulse",
    is_flag=True,
    help="Pulse load: --pulse-base of the streams send all the time, all of them in bursts.",
)
@click.option(
    "--pulse-period",
    "pulse_period_s",
    type=click.FloatRange(min=0, min_open=True),
    default=60.0,
    show_default=True,
    help="Seconds from one burst's start to the next (with --pulse).",
)
@click.option(
    "--pulse-width",
    "pulse_width_s",
    type=click.FloatRange(min=0, min_open=True),
    default=10.0,
    show_default=True,
    help="Seconds each burst lasts (with --pulse).",
)
@click.option(
    "--pulse-base",
    "pulse_base_share",
    type=click.FloatRange(0, 1, max_open=True),
    default=0.25,
    show_default=True,
    help="Share of --concurrency that sends between bursts (with --pulse).",
)
@click.option(
    "--workload",
    "workload_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Replay this workload shape (JSON/YAML, `ruleloop workload capture`): prompt and output"
    " lengths, shared prefixes and arrivals from it; --concurrency caps what is in flight"
    " [default cap: 4x the shape's concurrency, at least 10]. See docs/workload.md, Replay.",
)
@click.option(
    "--prompt-length",
    type=click.IntRange(min=1),
    default=128,
    show_default=True,
    help="Prompt tokens per request (exact on /v1/completions).",
)
@click.option(
    "--prefix-length",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Of those, tokens of a system-prompt prefix shared by all requests.",
)
@click.option(
    "--output-length",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="Output tokens per request (max_tokens).",
)
@click.option(
    "--ignore-eos/--no-ignore-eos",
    default=True,
    show_default=True,
    help="Ask vLLM to generate exactly --output-length tokens.",
)
@click.option(
    "--cancel-share",
    type=click.FloatRange(0, 1),
    default=0.0,
    show_default=True,
    help="Share of requests whose client gives up.",
)
@click.option(
    "--cancel-after-ms",
    type=click.FloatRange(min=0, min_open=True),
    default=500.0,
    show_default=True,
    help="When they give up.",
)
@click.option(
    "--cancel-after-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="Give up after receiving this many tokens instead (1: right after the first token).",
)
@click.option(
    "--cancel-mode",
    type=click.Choice([m.value for m in CancelMode]),
    default=CancelMode.ABANDON.value,
    show_default=True,
    help="abandon: close the stream; header: send X-Request-Timeout for a gateway to enforce.",
)
@click.option(
    "--warmup",
    "warmup_requests",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Unmeasured requests sent first.",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--max-ttft-p99-ms",
    type=click.FloatRange(min=0, min_open=True),  # a latency limit is above 0
    default=None,
    help="Gate: TTFT p99 at most this.",
)
@click.option(
    "--max-tpot-p99-ms",
    type=click.FloatRange(min=0, min_open=True),  # a latency limit is above 0
    default=None,
    help="Gate: TPOT p99 at most this.",
)
@click.option(
    "--max-itl-p99-ms",
    type=click.FloatRange(min=0, min_open=True),  # a latency limit is above 0
    default=None,
    help="Gate: inter-token latency p99 at most this.",
)
@click.option(
    "--min-goodput-ratio",
    type=click.FloatRange(0, 1),
    default=None,
    help="Gate: goodput ratio at least this (cannot judge, so fails, when the engine page is"
    " not the whole fleet: pass --replica).",
)
@click.option(
    "--max-kv-fragmentation",
    type=click.FloatRange(0, 1),
    default=None,
    help="Gate: observed KV block fragmentation at most this.",
)
@click.option(
    "--max-error-rate",
    type=click.FloatRange(0, 1),
    default=DEFAULT_MAX_ERROR_RATE,
    show_default=True,
    help="Gate, always on: share of requests that may fail (HTTP error, timeout, transport).",
)
@click.option(
    "--looks",
    type=click.IntRange(1, 4),
    default=DEFAULT_LOOKS,
    show_default=True,
    help="Looks a sized run may take: it stops at the first where every p99 gate is decided,"
    " else sends as many requests again; each look is judged at its share of the error, so the"
    " run stays at 99 %. A --num-requests you give is one look.",
)
@click.option(
    "--metrics-url",
    default=None,
    help="The engine's /metrics (behind a Service: one pod's; see --replica) [default: found"
    " beside the endpoint at " + " or ".join(METRICS_PATHS) + "]; 'none' to skip.",
)
@click.option(
    "--replica",
    "replicas",
    multiple=True,
    metavar="URL",
    help="A replica behind the endpoint (base URL, e.g. http://10.0.0.5:8000); repeat for each."
    " The engine column is then every replica's /metrics merged (the fleet), not one pod's."
    " Instead of --metrics-url.",
)
@click.option(
    "--sample-interval",
    "sample_interval_s",
    type=click.FloatRange(min=0.05),
    default=DEFAULT_SAMPLE_INTERVAL_S,
    show_default=True,
    help="Seconds between in-flight /metrics samples (each costs the engine a page render).",
)
@click.option(
    "--output-json",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the full report here.",
)
@click.option("--quiet", is_flag=True, help="No progress line.")
def canary(
    endpoint: str,
    model: str | None,
    concurrency: int,
    request_rate: float | None,
    num_requests: int | None,
    duration_s: float | None,
    pulse: bool,
    pulse_period_s: float,
    pulse_width_s: float,
    pulse_base_share: float,
    prompt_length: int,
    prefix_length: int,
    output_length: int,
    ignore_eos: bool,
    cancel_share: float,
    cancel_after_ms: float,
    cancel_after_tokens: int | None,
    cancel_mode: str,
    warmup_requests: int,
    seed: int,
    max_ttft_p99_ms: float | None,
    max_tpot_p99_ms: float | None,
    min_goodput_ratio: float | None,
    max_kv_fragmentation: float | None,
    max_itl_p99_ms: float | None,
    max_error_rate: float,
    looks: int,
    metrics_url: str | None,
    replicas: tuple[str, ...],
    sample_interval_s: float,
    output_json: Path | None,
    quiet: bool,
    workload_file: Path | None,
) -> None:
    """Load an inference endpoint with streaming requests and check the four metrics.

    Measures TTFT, TPOT, ITL, goodput and KV fragmentation client side, checks them against the
    engine's /metrics over the same window and against each gate you give; prints a progress line
    while it runs and a summary table at the end."""
    shape = None if workload_file is None else _load_shape(workload_file, ignore_eos=ignore_eos)
    concurrency, num_requests = _sized(shape, concurrency, num_requests, duration_s)
    workload = Workload(
        endpoint=endpoint, model=model, concurrency=concurrency, request_rate=request_rate,
        num_requests=num_requests, duration_s=duration_s,
        pulse_period_s=pulse_period_s if pulse else None, pulse_width_s=pulse_width_s,
        pulse_base_share=pulse_base_share, prompt_length=prompt_length,
        prefix_length=prefix_length, output_length=output_length, ignore_eos=ignore_eos,
        cancel_share=cancel_share, cancel_after_ms=cancel_after_ms,
        cancel_after_tokens=cancel_after_tokens, cancel_mode=CancelMode(cancel_mode),
        warmup_requests=warmup_requests, seed=seed, shape=shape,
    )  # fmt: skip
    gates = Gates(AdrGates(max_ttft_p99_ms=max_ttft_p99_ms, max_tpot_p99_ms=max_tpot_p99_ms,
        min_goodput_ratio=min_goodput_ratio, max_kv_fragmentation=max_kv_fragmentation,
        max_itl_p99_ms=max_itl_p99_ms), max_error_rate=max_error_rate, looks=looks)  # fmt: skip
    _report(run_canary(  # a count you give is a bound, kept as given: not sized
        workload, gates=gates, sample_interval_s=sample_interval_s, progress=not quiet,
        metrics_url=_metrics_url(metrics_url, replicas), replicas=replicas,
        discover_metrics=metrics_url is None and not replicas, size=not _given("num_requests"),
    ), output_json)  # fmt: skip


def _sized(
    shape: WorkloadShape | None,
    concurrency: int,
    num_requests: int | None,
    duration_s: float | None,
) -> tuple[int, int | None]:
    """The in-flight cap and request count the run uses: a replayed shape's default cap where
    --concurrency was not given, and the default count where neither --num-requests nor
    --duration was."""
    if shape is not None and _given("concurrency") is None:
        concurrency = default_cap(shape)
    if num_requests is None and duration_s is None:
        num_requests = default_num_requests(concurrency)
    return concurrency, num_requests


def _metrics_url(metrics_url: str | None, replicas: tuple[str, ...]) -> str | None:
    """The engine's /metrics the run scrapes: --metrics-url, where 'none' means none (and not
    given, none either: the run looks for one beside the endpoint, or reads the replicas)."""
    if replicas and metrics_url is not None:
        raise UsageError("--replica and --metrics-url contradict: the replicas' pages are read")
    if metrics_url is not None and metrics_url.lower() == "none":
        return None
    return metrics_url


def _report(report: CanaryReport, output_json: Path | None) -> None:
    """Write the report where --output-json says, print its summary, and fail on a gate."""
    if output_json is not None:
        output_json.parent.mkdir(parents=True, exist_ok=True)
        output_json.write_text(report.model_dump_json(indent=2))
    click.echo(summary_table(report))
    if not report.passed:
        failed = [g.name for g in report.gates if not g.passed]
        raise GateFailed(f"gate failed: {', '.join(failed)}")


def _given(name: str) -> str | None:
    """The flag's name when the user gave the option (command line or environment)."""
    source = click.get_current_context().get_parameter_source(name)
    if source in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
        return name
    return None


def _load_shape(path: Path, *, ignore_eos: bool) -> WorkloadShape:
    """The --workload shape; UsageError for a flag it contradicts or a bad file."""
    from bot.adr.workload import load

    given = [flag for name, flag in SHAPE_DECIDES.items() if _given(name)]
    if given:
        flags = ", ".join(flag for flag, _ in given)
        decides = ", ".join(dict.fromkeys(field for _, field in given))
        raise UsageError(
            f"{flags} contradict{'s' if len(given) == 1 else ''} --workload: the shape's "
            f"{decides} decide{'s' if len(given) == 1 else ''} that; drop "
            f"{'it' if len(given) == 1 else 'them'}"
        )
    if not ignore_eos:
        raise UsageError(
            "--no-ignore-eos contradicts --workload: the shape's output lengths are sent as "
            "max_tokens with ignore_eos, so the engine generates exactly that many"
        )
    return load(path)


@click.command("canary-schema", cls=Command)
def canary_schema() -> None:
    """Print the JSON Schema of the canary report (`--output-json`), as
    docs/canary-report.schema.json holds it:

        ruleloop canary-schema > docs/canary-report.schema.json
    """
    click.echo(json.dumps(CanaryReport.model_json_schema(mode="serialization"), indent=2))


def register(cli: click.Group) -> None:
    """Add `canary` and `canary-schema` to the ruleloop command line."""
    cli.add_command(canary)
    cli.add_command(canary_schema)
