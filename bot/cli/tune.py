"""`ruleloop tune`: measure vLLM configurations with the canary and write the ADR draft.

Exit codes: 0 a configuration passed and is recommended, 1 none passed the gates (the draft is
still written), 2 bad usage.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import click

from bot.adr.flags import parse_flags
from bot.adr.store import AdrStore
from bot.cli.adr import adr_dir_option, date_option, today
from bot.cli.engine import state_dir_option
from bot.engine.process import START_TIMEOUT_S, EngineManager
from bot.errors import GateFailed, UsageError
from bot.tune.plan import Experiment, TunePlan, WorkloadSpec, load_plan
from bot.tune.service import run_tune

EPILOG = """\b
Examples:
  # does a smaller step budget help chats next to long prompts?
  ruleloop tune --baseline "--enforce-eager --max-num-batched-tokens 8192" \\
      --exp mnbt-2048="--max-num-batched-tokens 2048" \\
      --exp mnbt-512="--max-num-batched-tokens 512" \\
      --prompt-length 1024 --prefix-length 768 --concurrency 8 --num-requests 32 \\
      --max-ttft-p99-ms 2000 --max-tpot-p99-ms 150
  # every configuration under production's traffic, captured from its engine
  ruleloop workload capture --metrics-url http://vllm-prod-0:8000/metrics --seconds 60 -o prod.yaml
  ruleloop tune --baseline "--enforce-eager" --exp mnbt-512="--max-num-batched-tokens 512" \
      --workload prod.yaml --num-requests 48 --max-tpot-p99-ms 150
  # everything in a file, background load included (see docs/adr.md)
  ruleloop tune --plan bench/tune-mixed.yaml

\b
Exit codes: 0 a configuration passed and is recommended, 1 none passed the gates
(the draft is written anyway), 2 bad usage.
"""

WORKLOAD_OPTIONS = (
    "api",
    "concurrency",
    "num_requests",
    "prompt_length",
    "prefix_length",
    "output_length",
    "warmup_requests",
    "cancel_share",
    "seed",
    "shape",
)


def _experiment(text: str) -> Experiment:
    name, sep, flags = text.partition("=")
    if not sep or not name:
        raise UsageError(
            f'--exp {text!r}: write NAME=FLAGS, e.g. mnbt-512="--max-num-batched-tokens 512"'
        )
    return Experiment(name=name.strip(), engine_args=dict(parse_flags(flags)))


@click.command("tune", epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--plan",
    "plan_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A YAML plan (baseline, experiments, workload, background, gates, title, context).",
)
@click.option(
    "--baseline", default=None, help='Baseline vLLM flags, e.g. "--enforce-eager --block-size 128".'
)
@click.option(
    "--exp",
    "experiments",
    multiple=True,
    metavar="NAME=FLAGS",
    help="An experiment: flag changes to the baseline (repeat).",
)
@click.option("--title", default=None, help="The draft ADR's title.")
@click.option(
    "--context", default=None, help="Why this experiment: the incident, in a sentence or two."
)
@click.option("--api", type=click.Choice(["completions", "chat"]), default=None)
@click.option("--concurrency", type=click.IntRange(min=1), default=None)
@click.option("--num-requests", type=click.IntRange(min=1), default=None)
@click.option("--prompt-length", type=click.IntRange(min=1), default=None)
@click.option("--prefix-length", type=click.IntRange(min=0), default=None)
@click.option("--output-length", type=click.IntRange(min=1), default=None)
@click.option("--warmup", "warmup_requests", type=click.IntRange(min=0), default=None)
@click.option("--cancel-share", type=click.FloatRange(0, 1), default=None)
@click.option("--seed", type=int, default=None)
@click.option(
    "--workload",
    "shape",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="Replay this workload shape (`ruleloop workload capture -o`) instead of fixed lengths.",
)
@click.option("--max-ttft-p99-ms", type=click.FloatRange(min=0, min_open=True), default=None)
@click.option("--max-tpot-p99-ms", type=click.FloatRange(min=0, min_open=True), default=None)
@click.option("--min-goodput-ratio", type=click.FloatRange(0, 1), default=None)
@click.option("--max-kv-fragmentation", type=click.FloatRange(0, 1), default=None)
@click.option("--gates-from", default=None, metavar="ADR-ID", help="Use an ADR's gates.")
@click.option(
    "--start-timeout",
    "start_timeout_s",
    type=click.FloatRange(min=1),
    default=START_TIMEOUT_S,
    show_default=True,
    help="Seconds to wait for each engine.",
)
@date_option
@adr_dir_option
@state_dir_option
def tune(
    plan_path: Path | None,
    baseline: str | None,
    experiments: tuple[str, ...],
    title: str | None,
    context: str | None,
    gates_from: str | None,
    start_timeout_s: float,
    day: dt.datetime | None,
    adr_dir: Path,
    state_dir: Path | None,
    **options: object,
) -> None:
    """Start vLLM with each configuration in turn, run the same canary, draft the ADR.

    Each configuration is the baseline plus one experiment's flag changes. Rows get the four
    metrics and a verdict against the gates; the best passing row is recommended and its flags
    become the draft's fix. A configuration vLLM refuses becomes a row with vLLM's reason.
    """
    plan = _plan(plan_path, baseline, experiments, title, context, options)
    store = AdrStore(root=adr_dir)
    if gates_from:
        gates = store.get_or_raise(gates_from).gates
        if gates is None:
            raise UsageError(f"{gates_from} has no gates")
        plan = plan.model_copy(update={"gates": gates})
    plan.configs()  # refuse bad flags before any engine starts
    result = run_tune(
        plan,
        manager=EngineManager(state_dir=state_dir),
        store=store,
        day=today(day),
        echo=lambda line: click.echo(line, err=True),
        start_timeout_s=start_timeout_s,
    )
    click.echo("")
    click.echo(_matrix_text(result.draft_path))
    click.echo(f"\ndraft: {result.draft_path}")
    click.echo(f"canary JSON per row: {result.runs_dir}/")
    if result.pick is None:
        raise GateFailed("no configuration passed the gates; the draft says so")
    click.echo(f"recommended: {result.pick.config.name} ({' '.join(result.pick.config.argv)})")


def _plan(
    plan_path: Path | None,
    baseline: str | None,
    experiments: tuple[str, ...],
    title: str | None,
    context: str | None,
    options: dict[str, object],
) -> TunePlan:
    data = load_plan(plan_path).model_dump(exclude_unset=True) if plan_path else {}
    if baseline is not None:
        data["baseline"] = parse_flags(baseline)
    if experiments:
        data["experiments"] = [_experiment(text).model_dump() for text in experiments]
    if not data.get("experiments"):
        raise UsageError(
            "give at least one experiment: --exp NAME=FLAGS, or experiments: in --plan"
        )
    for key, value in (("title", title), ("context", context)):
        if value is not None:
            data[key] = value
    workload = {k: v for k, v in options.items() if k in WORKLOAD_OPTIONS and v is not None}
    data["workload"] = {**data.get("workload", {}), **workload}
    gates = {k: v for k, v in options.items() if k not in WORKLOAD_OPTIONS and v is not None}
    if gates:
        data["gates"] = {**(data.get("gates") or {}), **gates}
    try:
        return TunePlan.model_validate(
            data | {"workload": WorkloadSpec.model_validate(data["workload"])}
        )
    except ValueError as exc:
        raise UsageError(f"tune: {exc}") from exc


def _matrix_text(draft_path: Path) -> str:
    lines = draft_path.read_text(encoding="utf-8").splitlines()
    return "\n".join(line for line in lines if line.startswith("|"))


def register(cli: click.Group) -> None:
    """Add `tune` to the ruleloop command line."""
    cli.add_command(tune)
