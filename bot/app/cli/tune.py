"""`ruleloop tune`: measure vLLM configurations with the canary (in turn, or searching a space)
on local engines or on a real target, and write the ADR draft.

Exit codes: 0 a configuration passed and is recommended (or, with --restore, the target serves
its flags again), 1 none passed the gates (the draft is still written), 2 bad usage.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from bot.adr import AdrStore, parse_flags
from bot.app.cli.adr import adr_dir_option, date_option, today
from bot.app.cli.engine import state_dir_option
from bot.app.cli.options import config_option
from bot.app.cli.tune_target import TargetRun, restore_target, tune_target
from bot.engine import START_TIMEOUT_S, EngineManager
from bot.kernel import GateFailed, UsageError
from bot.tune import (
    METRICS,
    Experiment,
    TunePlan,
    TuneResult,
    WorkloadSpec,
    load_plan,
    parse_dimension,
    run_tune,
)

EPILOG = """\b
Examples:
  # search, not a grid: TPE picks 8 of the 24 flag sets to measure, each on a fresh engine
  ruleloop tune --baseline "--enforce-eager" \\
      --space max-num-seqs=2,4,8,16 --space max-num-batched-tokens=512..2048/768 \\
      --space enable-prefix-caching=true,false --maximize goodput_rps --trials 8 \\
      --workload prod.yaml --max-ttft-p99-ms 2000 --max-tpot-p99-ms 150
  # the same search on production's canary stage: approved like an apply (two people),
  # each trial rolled back before the next, the flags it found restored at the end
  ruleloop tune --plan search.yaml --target prod-a --gates-from ADR-20260831-01 \\
      --requested-by U012ABCDEF --approved-by U034GHIJKL --config ruleloop.toml
  # its process was killed mid-trial: put the target's flags back now
  ruleloop tune --target prod-a --restore --config ruleloop.toml
  # does a smaller step budget help chats next to long prompts?
  ruleloop tune --baseline "--enforce-eager --max-num-batched-tokens 8192" \\
      --exp mnbt-2048="--max-num-batched-tokens 2048" \\
      --exp mnbt-512="--max-num-batched-tokens 512" \\
      --prompt-length 1024 --prefix-length 768 --concurrency 8 --num-requests 32 \\
      --max-ttft-p99-ms 2000 --max-tpot-p99-ms 150
  # every configuration under production's traffic, captured from its engine
  ruleloop workload capture --metrics-url http://vllm-prod-0:8000/metrics --seconds 60 -o prod.yaml
  ruleloop tune --baseline "--enforce-eager" --exp mnbt-512="--max-num-batched-tokens 512" \\
      --workload prod.yaml --num-requests 48 --max-tpot-p99-ms 150
  # everything in a file, background load included (see docs/adr.md)
  ruleloop tune --plan bench/tune-mixed.yaml

\b
A search's space and objective (docs/tune.md has the plan syntax):
  --space FLAG=V1,V2,...       values of one tunable flag (bot/adr/flags.py allowlist)
  --space FLAG=LOW..HIGH/STEP  an integer range
  --maximize goodput_rps | requests_per_s | output_tokens_per_s
  --minimize ttft_p99_ms | tpot_p99_ms | e2e_p99_ms
The gates are the constraints: a trial that misses one is marked infeasible, one that
could not be measured is marked failed, and no flag set is ever measured twice.

\b
On a target (--target NAME, from the bot's config): the workload is --workload SHAPE, the
plan's workload:, or else the target's own traffic captured for --capture-seconds first.

\b
Exit codes: 0 a configuration passed and is recommended (--restore: the flags serve again),
1 none passed the gates (the draft is written anyway), 2 bad usage.
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
    help="A YAML plan (baseline, experiments or space/objective/search, workload, background, "
    "gates, title, context).",
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
@click.option(
    "--space",
    "space",
    multiple=True,
    metavar="FLAG=VALUES",
    help="Search this flag over V1,V2,... or LOW..HIGH/STEP (repeat per flag).",
)
@click.option(
    "--maximize", type=click.Choice(sorted(k for k, v in METRICS.items() if v[0] == "maximize"))
)
@click.option(
    "--minimize", type=click.Choice(sorted(k for k, v in METRICS.items() if v[0] == "minimize"))
)
@click.option(
    "--trials", type=click.IntRange(min=1), default=None,
    help="Flag sets a search measures [default: half the space, at most 30].",
)  # fmt: skip
@click.option("--sampler", type=click.Choice(["tpe", "grid"]), default=None)
@click.option("--search-seed", type=int, default=None, help="The sampler's seed [default: 0].")
@click.option(
    "--target",
    default=None,
    metavar="NAME",
    help="Tune this target of the bot's config through its actuator (its canary stage).",
)
@click.option("--requested-by", default=None, metavar="USER", help="Who asks (in [access] apply).")
@click.option(
    "--approved-by",
    multiple=True,
    metavar="USER",
    help="Who approved (in [access] approve; another person under the two-person rule).",
)
@click.option(
    "--restore",
    is_flag=True,
    help="With --target: put back the flags of a session whose process died (kill -9).",
)
@click.option(
    "--capture-seconds",
    type=click.FloatRange(min=0, min_open=True),
    default=60.0,
    show_default=True,
    help="With --target and no workload given: capture its traffic this long first.",
)
@config_option("The bot's TOML settings for --target [default: $RULELOOP_CONFIG].")
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
    space: tuple[str, ...],
    maximize: str | None,
    minimize: str | None,
    trials: int | None,
    sampler: str | None,
    search_seed: int | None,
    target: str | None,
    requested_by: str | None,
    approved_by: tuple[str, ...],
    restore: bool,
    capture_seconds: float,
    config_path: Path | None,
    title: str | None,
    context: str | None,
    gates_from: str | None,
    start_timeout_s: float,
    day: dt.datetime | None,
    adr_dir: Path,
    state_dir: Path | None,
    **options: object,
) -> None:
    """Measure vLLM configurations with the same canary and draft the ADR: each experiment in
    turn, or a search over a space (Optuna's TPE, fewer trials than the grid), on freshly
    started local engines or on a real target through its actuator.

    An experiment is the baseline plus its flag changes; a trial is the baseline plus one
    point of the space. Rows get the four metrics and a verdict against the gates. Experiments:
    the passing row with the most headroom is recommended. A search: the passing trial with
    the best objective. Its flags become the draft's fix. A configuration vLLM refuses becomes
    a row with vLLM's reason.
    """
    echo = _echo
    if restore:
        _restore(target, config_path=config_path, state_dir=state_dir)
        return
    if maximize and minimize:
        raise UsageError("give --maximize or --minimize, not both: a search has one objective")
    search = SearchOptions(space=space, objective=_objective(maximize, minimize),
                           trials=trials, sampler=sampler, seed=search_seed)  # fmt: skip
    store = AdrStore(root=adr_dir)
    plan = _gated(_plan(plan_path, baseline, experiments, title, context, options, search),
                  store, gates_from)  # fmt: skip
    if target is not None:
        result = _on_target(plan, TargetRun(
            target=target, requested_by=requested_by, approved_by=list(approved_by), echo=echo,
            capture_seconds=capture_seconds, config_path=config_path, state_dir=state_dir,
            store=store, day=today(day), workload_given=plan_workload_given(plan_path, options),
        ))  # fmt: skip
    elif requested_by or approved_by:
        raise UsageError(
            "--requested-by and --approved-by are for --target: local engines need no approval"
        )
    else:
        result = run_tune(plan, manager=EngineManager(state_dir=state_dir), store=store,
                          day=today(day), echo=echo, start_timeout_s=start_timeout_s)  # fmt: skip
    _report(result)


def _restore(target: str | None, *, config_path: Path | None, state_dir: Path | None) -> None:
    """``--restore``: put back the flags of a session whose process died."""
    if target is None:
        raise UsageError("--restore needs --target NAME: the target whose flags to put back")
    restore_target(target, config_path=config_path, state_dir=state_dir, echo=_echo)


def _on_target(plan: TunePlan, run: TargetRun) -> TuneResult:
    """A search on a real target, through its actuator (bot/app/cli/tune_target.py)."""
    if not plan.searches:
        raise UsageError(
            "--target runs a search: give --space and --maximize/--minimize (or space: and "
            "objective: in --plan); experiments are measured on local engines"
        )
    return tune_target(plan, run)


def _gated(plan: TunePlan, store: AdrStore, gates_from: str | None) -> TunePlan:
    """The plan with ``--gates-from``'s gates, its flags checked before any engine starts."""
    if gates_from:
        gates = store.get_or_raise(gates_from).gates
        if gates is None:
            raise UsageError(f"{gates_from} has no gates")
        plan = plan.model_copy(update={"gates": gates})
    if plan.searches:  # refuse bad flags before any engine starts
        plan.search_space()
    else:
        plan.configs()
    return plan


def _echo(line: str) -> None:
    click.echo(line, err=True)


def _report(result: TuneResult) -> None:
    click.echo("")
    click.echo(_matrix_text(result.draft_path))
    click.echo(f"\ndraft: {result.draft_path}")
    click.echo(f"canary JSON per row: {result.runs_dir}/")
    if result.pick is None:
        raise GateFailed("no configuration passed the gates; the draft says so")
    click.echo(f"recommended: {result.pick.config.name} ({' '.join(result.pick.config.argv)})")


def plan_workload_given(plan_path: Path | None, options: dict[str, object]) -> bool:
    """Whether the workload was given (--workload, a workload option, or the plan's
    ``workload:``); on a target without one, its own traffic is captured instead."""
    if any(options.get(k) is not None for k in WORKLOAD_OPTIONS):
        return True
    return plan_path is not None and "workload" in load_plan(plan_path).model_fields_set


def _plan(
    plan_path: Path | None,
    baseline: str | None,
    experiments: tuple[str, ...],
    title: str | None,
    context: str | None,
    options: dict[str, object],
    search: SearchOptions,
) -> TunePlan:
    data = load_plan(plan_path).model_dump(exclude_unset=True) if plan_path else {}
    if baseline is not None:
        data["baseline"] = parse_flags(baseline)
    if experiments:
        data["experiments"] = [_experiment(text).model_dump() for text in experiments]
    _merge_search(data, search)
    if not data.get("experiments") and not data.get("space"):
        raise UsageError(
            "give at least one experiment: --exp NAME=FLAGS, or experiments: in --plan; or a "
            "space to search: --space FLAG=V1,V2,... with --maximize METRIC (space: and "
            "objective: in --plan)"
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
        plan = TunePlan.model_validate(
            data | {"workload": WorkloadSpec.model_validate(data["workload"])}
        )
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"])
        raise UsageError(f"tune: {field + ': ' if field else ''}{error['msg']}") from exc
    except ValueError as exc:
        raise UsageError(f"tune: {exc}") from exc
    plan.check_kind(source="tune")
    return plan


@dataclass(frozen=True)
class SearchOptions:
    """The command line's say in a search, over the plan file's."""

    space: tuple[str, ...]
    objective: dict[str, str] | None
    trials: int | None
    sampler: str | None
    seed: int | None


def _objective(maximize: str | None, minimize: str | None) -> dict[str, str] | None:
    if maximize:
        return {"maximize": maximize}
    return {"minimize": minimize} if minimize else None


def _merge_search(data: dict[str, Any], search: SearchOptions) -> None:
    """The command line's --space, --maximize/--minimize and search options over the plan's."""
    space = dict(data.get("space") or {})
    for text in search.space:
        flag, dimension = parse_dimension(text)
        space[flag] = dimension.model_dump(exclude_none=True)
    if space:
        data["space"] = space
    if search.objective is not None:
        data["objective"] = search.objective
    settings = dict(data.get("search") or {})
    for key, value in (("trials", search.trials), ("sampler", search.sampler),
                       ("seed", search.seed)):  # fmt: skip
        if value is not None:
            settings[key] = value
    if settings:
        data["search"] = settings


def _matrix_text(draft_path: Path) -> str:
    lines = draft_path.read_text(encoding="utf-8").splitlines()
    return "\n".join(line for line in lines if line.startswith("|"))


def register(cli: click.Group) -> None:
    """Add `tune` to the ruleloop command line."""
    cli.add_command(tune)
