"""What `ruleloop tune` runs: a baseline flag set, then named experiments or a search, one
canary workload.

A plan comes from a YAML file or from command-line options. It lists ``experiments`` (each
measured in turn) or declares a ``space`` to search with an ``objective`` (bot/tune/space.py,
bot/tune/objective.py). Every configuration's flags are checked against the tunable-flag
allowlist before any engine starts, so a typo fails the run in the first second, not after the
baseline has been measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from bot.adr import (
    AdrGates,
    Condition,
    EngineValue,
    GatewayRules,
    canonical,
    check_engine_args,
    to_argv,
)
from bot.adr.workload import shape as shapes
from bot.canary import Gates, Samples, Workload, check, gates_from
from bot.kernel import UsageError
from bot.tune.objective import Objective
from bot.tune.search import Sampler
from bot.tune.space import Flags, SearchDimension, Space, build_space

BASELINE = "baseline"
# What a replayed shape decides, so a plan may not also write it.
SHAPE_DECIDES = ("request_rate", "prompt_length", "prefix_length", "output_length")
# Background load runs until the measured canary is done, then it is cancelled.
BACKGROUND_DURATION_S = 24 * 3600.0
MAX_DEFAULT_TRIALS = 30  # without `trials:` a search measures half the space, at most this


class WorkloadSpec(BaseModel):
    """One canary workload (the measured one, or a background class competing with it)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="canary", pattern=r"^[A-Za-z0-9._-]+$")
    api: Literal["completions", "chat"] = "completions"
    concurrency: int = Field(default=8, ge=1)
    num_requests: int = Field(default=32, ge=1)
    request_rate: float | None = Field(default=None, gt=0)
    prompt_length: int = Field(default=128, ge=1)
    prefix_length: int = Field(default=0, ge=0)
    output_length: int = Field(default=32, ge=1)
    warmup_requests: int = Field(default=0, ge=0)
    cancel_share: float = Field(default=0.0, ge=0, le=1)
    cancel_after_ms: float = Field(default=500.0, gt=0)
    seed: int = 0
    # a workload shape file (bot/adr/workload/shape.py) to replay instead of the fixed lengths:
    # every configuration is measured under production's traffic (docs/workload.md)
    shape: Path | None = None
    # a replayed shape for this long at its rate instead of num_requests (None: the count)
    duration_s: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _shape_or_lengths(self) -> WorkloadSpec:
        fixed = self.model_fields_set & set(SHAPE_DECIDES)
        if self.shape is not None and fixed:
            raise ValueError(
                f"{', '.join(sorted(fixed))} contradict the workload shape {self.shape}: the "
                "shape's lengths and arrivals decide them; drop them"
            )
        if self.shape is not None:
            try:
                shapes.load(self.shape)  # a bad file is refused before any engine starts
            except UsageError as exc:
                raise ValueError(str(exc)) from None
        return self

    def workload(self, base_url: str, *, background: bool = False) -> Workload:
        """The canary Workload against an engine at ``base_url``."""
        path = "/v1/chat/completions" if self.api == "chat" else "/v1/completions"
        fields = self.model_dump(exclude={"name", "api", "shape", "duration_s"})
        duration = BACKGROUND_DURATION_S if background else None
        if background:
            fields |= {"num_requests": None, "warmup_requests": 0}
        if self.shape is not None:
            fields = {k: v for k, v in fields.items() if k not in SHAPE_DECIDES}
            fields["shape"] = shapes.load(self.shape)  # ShapeError: file, field and why
            if self.duration_s and not background:
                fields["num_requests"], duration = None, self.duration_s
        workload = Workload(endpoint=base_url + path, duration_s=duration, **fields)
        problems = check(workload)
        if problems:
            raise UsageError(f"workload {self.name!r}: " + "; ".join(problems))
        return workload

    def describe(self, *, background: bool = False) -> str:
        """The workload in one line: name, requests, streams, prompt and output tokens."""
        count = "alongside until the canary ends" if background else f"{self.num_requests} requests"
        if self.shape is not None and self.duration_s and not background:
            count = f"{self.duration_s:g} s at its rate"
        if self.shape is not None:
            return (
                f"{self.name}: {count}, at most {self.concurrency} streams, replaying {self.shape}"
            )
        rate = f", {self.request_rate:g} req/s" if self.request_rate else ""
        cancel = (
            f", {self.cancel_share:.0%} cancel after {self.cancel_after_ms:g} ms"
            if self.cancel_share
            else ""
        )
        return (
            f"{self.name}: {count}, {self.concurrency} streams{rate}, {self.prompt_length} prompt "
            f"({self.prefix_length} shared prefix) + {self.output_length} output tokens{cancel}"
        )


class Experiment(BaseModel):
    """A named set of flag changes to the baseline (null removes a baseline flag)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9._=-]+$", max_length=40)
    engine_args: dict[str, EngineValue | None] = Field(default_factory=dict)


@dataclass(frozen=True)
class Config:
    """One configuration to measure: its name, the flag changes and the full flags."""

    name: str
    changes: dict[str, EngineValue | None]
    engine_args: dict[str, EngineValue]
    argv: list[str]

    def label(self) -> str:
        """The matrix's 配置参数 cell: name and the flags that differ from the baseline."""
        if self.name == BASELINE:
            return (
                f"{BASELINE}: `{' '.join(self.argv)}`"
                if self.argv
                else f"{BASELINE} (vLLM defaults)"
            )
        parts = [
            " ".join(to_argv({k: v})) if v is not None else f"no --{k}"
            for k, v in self.changes.items()
        ]
        return f"{self.name}: `{' '.join(parts)}`"


class SearchSettings(BaseModel):
    """How a ``space`` is searched: TPE (default) or the full grid, how many trials, the seed."""

    model_config = ConfigDict(extra="forbid")

    sampler: Sampler = "tpe"
    trials: int | None = Field(default=None, ge=1)  # None: half the space, at most 30
    seed: int = 0
    startup_trials: int | None = Field(default=None, ge=0)  # None: a third of the trials

    def budget(self, space: Space) -> int:
        """Trials to measure: ``trials``, else half the space (at most 30); never more than
        the space holds; the grid measures it all."""
        if self.sampler == "grid":
            return space.size if self.trials is None else min(self.trials, space.size)
        wanted = self.trials or min(MAX_DEFAULT_TRIALS, max(1, space.size // 2))
        return min(wanted, space.size)


class TunePlan(BaseModel):
    """The whole experiment: configurations (or a space to search), workload, gates, and what
    the draft should say."""

    model_config = ConfigDict(extra="forbid")

    title: str = Field(default="vLLM tuning experiment", min_length=1, max_length=200)
    context: str = ""
    deciders: list[str] = Field(default_factory=list)
    baseline: dict[str, EngineValue] = Field(default_factory=dict)
    experiments: list[Experiment] = Field(default_factory=list)
    space: dict[str, SearchDimension] = Field(default_factory=dict)
    objective: Objective | None = None
    search: SearchSettings = Field(default_factory=SearchSettings)
    workload: WorkloadSpec = Field(default_factory=WorkloadSpec)
    background: list[WorkloadSpec] = Field(default_factory=list)
    gates: AdrGates | None = None
    # 'Nx before' gates (name -> N) and the before-run's per-request values they are judged
    # against, two-sample, as the drift job's re-validation judged them (a re-tune sets them;
    # the limits in ``gates`` are then N x the before-run's p99, shown beside the test)
    ratios: dict[str, float] = Field(default_factory=dict)
    before: Samples | None = None
    match: list[Condition] = Field(default_factory=list)
    cause: list[str] = Field(default_factory=list)  # what the draft says it fixes (its ``cause``)
    gateway: GatewayRules | None = None

    @model_validator(mode="after")
    def _experiments_or_space(self) -> TunePlan:
        if self.experiments and self.space:
            raise ValueError("give experiments: (measured in turn) or space: (searched), not both")
        return self

    def trial_gates(self) -> Gates:
        """What judges each trial: the gates on their point values (many short runs, ranked;
        the change a search drafts is judged on its statistics at /apply-adr), but 'Nx before'
        gates two-sample against ``before``, as the rule that failed was judged."""
        if self.gates is None:
            return Gates(decide="point")
        return gates_from(self.gates, decide="point", ratios=self.ratios, before=self.before)

    def check_kind(self, *, source: str = "plan") -> None:
        """UsageError unless the plan measures experiments, or searches a space for an
        objective (checked once the command line's options are merged into a file's plan)."""
        if not self.experiments and not self.space:
            raise UsageError(
                f"{source}: give at least one experiment (--exp NAME=FLAGS, or experiments: in "
                "--plan), or a space to search (--space FLAG=V1,V2,... with --maximize METRIC, "
                "or space: and objective: in --plan)"
            )
        if self.space and self.objective is None:
            raise UsageError(
                f"{source}: a search needs an objective: --maximize goodput_rps (or "
                "objective: {maximize: goodput_rps} in the plan); see docs/tune.md"
            )
        if self.objective is not None and not self.space:
            raise UsageError(
                f"{source}: an objective is for a search: declare the space to search "
                "(--space FLAG=V1,V2,..., or space: in the plan)"
            )

    @property
    def searches(self) -> bool:
        """Whether this plan searches a space (else it measures its experiments in turn)."""
        return bool(self.space)

    def search_space(self, *, source: str = "plan") -> Space:
        """The checked space; UsageError on a flag the allowlist refuses or a bad value."""
        check = check_engine_args(self.baseline)
        if check:
            field, why = check[0]
            raise UsageError(f"{source}: baseline: {field.removeprefix('fix.engine_args.')}: {why}")
        return build_space(self.space, source=source)

    def trial_config(self, number: int, flags: Flags) -> Config:
        """Trial ``number``: the baseline with the searched flags set."""
        merged: dict[str, EngineValue] = {canonical(k): v for k, v in self.baseline.items()}
        merged.update(flags)
        return _config(f"t{number:02d}", dict(flags), merged, source=f"trial {number}")

    def configs(self, *, source: str = "plan") -> list[Config]:
        """Baseline first, then each experiment; UsageError on a flag the allowlist refuses."""
        names = [BASELINE] + [e.name for e in self.experiments]
        if len(set(names)) != len(names):
            raise UsageError(
                f"{source}: experiment names must be unique and not {BASELINE!r}: {names}"
            )
        configs = [_config(BASELINE, {}, self.baseline, source=f"{source}: baseline")]
        for exp in self.experiments:
            merged: dict[str, EngineValue] = {canonical(k): v for k, v in self.baseline.items()}
            for key, value in exp.engine_args.items():
                if value is None:
                    merged.pop(canonical(key), None)
                else:
                    merged[canonical(key)] = value
            configs.append(
                _config(
                    exp.name, exp.engine_args, merged, source=f"{source}: experiment {exp.name}"
                )
            )
        return configs


def _config(
    name: str, changes: dict[str, EngineValue | None], args: dict[str, EngineValue], *, source: str
) -> Config:
    problems = check_engine_args(
        {k: v for k, v in changes.items() if v is not None}
    ) + check_engine_args(args)
    if problems:
        field, why = problems[0]
        raise UsageError(f"{source}: {field.removeprefix('fix.engine_args.')}: {why}")
    return Config(name=name, changes=dict(changes), engine_args=dict(args), argv=to_argv(args))


def load_plan(path: Path) -> TunePlan:
    """Read a YAML plan; UsageError naming the file, the field and why."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise UsageError(f"{path}: cannot read the plan: {exc}") from exc
    try:
        return TunePlan.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"]) or "plan"
        raise UsageError(f"{path}: {field}: {error['msg']}") from exc
