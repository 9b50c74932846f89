"""An incident scenario: one small YAML file with the engine, the load, the fault and the truth.

    name: step-mixing
    title: Long prompts prefilled whole beside decoding chats
    engine: [--max-num-batched-tokens, "8192", --max-num-seqs, "4"]
    streams:
      - {count: 2, prompt: 64, output: 64}
      - {count: 1, prompt: step, output: 8}   # step: the longest prompt one step takes whole
    window: {chats: 30, step_prompts: 4}
    truth:
      causes: [prefill_decode_mixing]
      ruled_out: [kv_cache_pressure, queueing, abandoned_work]
    subset: fast

Sizes that depend on the machine are named, not numbers (``step``, ``kv_share``,
``per_seq``), so a scenario induces its condition on a machine of any speed: bench/incidents/
README.md lists them. ``truth`` is what responders would have established: the causes (none for
a healthy engine or a noisy neighbour), the causes that must be ruled out, the causes the data
cannot decide (an honest "cannot tell" is the right answer there), and the ADR that should be
offered (``adr: none`` for none; left out: not graded).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from bot.adr import causes as vocabulary
from bot.kernel import UsageError

Size = int | Literal["step", "kv_share"]
SUBSETS = ("fast", "full")  # fast: the CI subset, on every landing; full: `make eval` only


class StreamSpec(BaseModel):
    """``count`` clients (or ``per_seq`` per sequence slot of the engine) of one shape."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    count: int | None = Field(default=None, ge=1, le=64)
    per_seq: int | None = Field(default=None, ge=1, le=8)
    prompt: Size = 64  # tokens; step: the longest prompt one scheduler step prefills whole
    output: Size = 64  # tokens; kv_share: together the streams need twice the KV cache
    cancel_after: int | None = Field(default=None, ge=1)  # hang up holding this many tokens
    prefix: int = Field(default=0, ge=0, le=32767)  # tokens every prompt opens with (one prefix)

    @model_validator(mode="after")
    def _one_count(self) -> StreamSpec:
        if (self.count is None) == (self.per_seq is None):
            raise ValueError("give count: N (clients) or per_seq: N (clients per sequence slot)")
        if isinstance(self.prompt, int) and not 1 <= self.prompt <= 32768:
            raise ValueError(f"prompt {self.prompt} is outside 1..32768 tokens")
        if isinstance(self.output, int) and not 1 <= self.output <= 32768:
            raise ValueError(f"output {self.output} is outside 1..32768 tokens")
        if self.prefix and isinstance(self.prompt, int) and self.prefix >= self.prompt:
            raise ValueError(f"prefix {self.prefix} leaves nothing of a {self.prompt}-token prompt")
        return self


class Window(BaseModel):
    """The diagnosis's sampling window: the longest of these, each a multiple of what was
    measured on this engine (a chat alone, the step prompt alone, a round of the KV answers)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    chats: float = Field(default=30, gt=0, le=1000)
    step_prompts: float = Field(default=0, ge=0, le=100)
    kv_rounds: float = Field(default=0, ge=0, le=100)


class Fleet(BaseModel):
    """Replicas behind nginx (round-robin); ``sick``: flags added to the first replica only."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    replicas: int = Field(default=1, ge=1, le=4)
    sick: list[str] = Field(default_factory=list, max_length=20)

    @model_validator(mode="after")
    def _sick_needs_others(self) -> Fleet:
        if self.sick and self.replicas < 2:
            raise ValueError("sick: flags for one replica of several: give replicas: 2 or more")
        return self


class GatewaySpec(BaseModel):
    """`ruleloop gateway` in front of the engine; ``delay_chats``: a delay between the gateway
    and the engine, as long as this many chats alone (at least 250 ms); 0: none."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    delay_chats: float = Field(default=0, ge=0, le=1000)


class Proven(BaseModel):
    """The traffic the rule in force was proven on: run first, and its shape (captured from the
    engine's /metrics, as production's is) becomes the workload of the rule in force (the first
    accepted ADR given). ``drift_check``: the drift job compares the incident's traffic with it
    before the alert, as ``[scheduler] workload_every_s`` does."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    streams: list[StreamSpec] = Field(min_length=1, max_length=8)
    drift_check: bool = False


class FixSpec(BaseModel):
    """The fix to try once the diagnosis is in: ``adr``'s engine flags on the engine, behind the
    ADR's gates, judged on this canary beside the scenario's load; ``right``: what a right gate
    does with it here (kept: the fix helps this incident; rolled_back: it does not)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    adr: str = Field(pattern=r"^ADR-\d{8}-\d{2}$")
    right: Literal["kept", "rolled_back"]
    concurrency: int = Field(default=4, ge=1, le=32)
    num_requests: int = Field(default=8, ge=4, le=1000)
    prompt_length: int = Field(default=128, ge=1, le=32768)
    output_length: int = Field(default=8, ge=2, le=4096)


class Fault(BaseModel):
    """What is done to the machine besides the load: busy processes beside the engine."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpu_hogs: int = Field(default=0, ge=0, le=8)


class Truth(BaseModel):
    """What responders established: the grade is read against it (bot/eval/grades.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    causes: list[str] = Field(default_factory=list)  # empty: no cause in the engine
    related: list[str] = Field(default_factory=list)  # naming one of these is partly right
    ruled_out: list[str] = Field(default_factory=list)  # must be ruled out
    cannot_tell: list[str] = Field(default_factory=list)  # the data cannot decide these
    adr: str | None = None  # the ADR that should be offered; "none": none should be

    @model_validator(mode="after")
    def _known(self) -> Truth:
        known = vocabulary.known()
        for field in ("causes", "related", "ruled_out", "cannot_tell"):
            unknown = [c for c in getattr(self, field) if c not in known]
            if unknown:
                raise ValueError(f"{field}: unknown cause {unknown[0]!r} (known: "
                                 f"{', '.join(known)})")  # fmt: skip
        clash = set(self.causes) & (set(self.ruled_out) | set(self.cannot_tell))
        if clash:
            raise ValueError(f"{sorted(clash)[0]} is both a cause and ruled out or undecidable")
        return self


class Scenario(BaseModel):
    """One induced incident and its truth."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,63}$")
    title: str = Field(min_length=1, max_length=200)
    engine: list[str] = Field(default_factory=list, max_length=40)  # vLLM flags
    streams: list[StreamSpec] = Field(min_length=1, max_length=8)
    window: Window = Window()
    fault: Fault = Fault()
    fleet: Fleet = Fleet()
    gateway: GatewaySpec | None = None
    proven: Proven | None = None  # a rule in force, proven on this traffic first
    fix: FixSpec | None = None  # a fix to try behind its gates once the diagnosis is in
    alert: dict[str, str] = Field(
        default_factory=lambda: {"alertname": "VLLMTimeToFirstTokenP99High"}
    )
    truth: Truth
    subset: Literal["fast", "full"] = "full"
    path: Path | None = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _fix_on_one_engine(self) -> Scenario:
        if self.fix is not None and (self.fleet.replicas > 1 or self.gateway is not None):
            raise ValueError("fix: is tried on one engine (no fleet:, no gateway:)")
        return self

    def serving(self) -> tuple[tuple[str, ...], int, tuple[str, ...]]:
        """What serves it (flags, replicas, the sick one's flags): one start per distinct key."""
        return tuple(self.engine), self.fleet.replicas, tuple(self.fleet.sick)

    def flag(self, name: str, default: int) -> int:
        """An integer engine flag's value (``--max-num-seqs 4``), else vLLM's default."""
        if f"--{name}" in self.engine:
            at = self.engine.index(f"--{name}")
            if at + 1 < len(self.engine) and self.engine[at + 1].isdigit():
                return int(self.engine[at + 1])
        return default


def load_scenario(path: Path) -> Scenario:
    """One scenario file, or a UsageError naming the file and what is wrong in it."""
    try:
        raw = yaml.safe_load(path.read_text("utf-8"))
    except (OSError, yaml.YAMLError, RecursionError) as exc:
        raise UsageError(f"{path}: not readable YAML ({type(exc).__name__}: {exc})") from None
    if not isinstance(raw, dict):
        raise UsageError(f"{path}: a scenario is a mapping (name:, streams:, truth:, ...)")
    try:
        scenario = Scenario.model_validate({**raw, "path": path})
    except (ValidationError, OverflowError) as exc:
        first = exc.errors()[0] if isinstance(exc, ValidationError) else {"msg": str(exc)}
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise UsageError(f"{path}: {where + ': ' if where else ''}{first['msg']}") from None
    if scenario.name != path.stem:
        raise UsageError(f"{path}: name {scenario.name!r} differs from the file's name "
                         f"({path.stem}.yaml): name the file after the scenario")  # fmt: skip
    return scenario


def load_catalogue(directory: Path, *, subset: str = "full", only: list[str] | None = None
                   ) -> list[Scenario]:  # fmt: skip
    """The scenarios of ``directory`` in the ``subset`` (fast: those marked fast; full: all),
    or those named in ``only``; grouped by engine flags (each engine starts once), in file
    order within a group."""
    if not directory.is_dir():
        raise UsageError(f"no scenario directory at {directory}")
    scenarios = [load_scenario(p) for p in sorted(directory.glob("*.yaml"))]
    if not scenarios:
        raise UsageError(f"no scenarios (*.yaml) in {directory}")
    if only:
        unknown = sorted(set(only) - {s.name for s in scenarios})
        if unknown:
            raise UsageError(f"no scenario named {unknown[0]!r} in {directory} (there: "
                             f"{', '.join(s.name for s in scenarios)})")  # fmt: skip
        scenarios = [s for s in scenarios if s.name in only]
    elif subset == "fast":
        scenarios = [s for s in scenarios if s.subset == "fast"]
    engines: list[tuple[tuple[str, ...], int, tuple[str, ...]]] = []
    for s in scenarios:
        if s.serving() not in engines:
            engines.append(s.serving())
    return sorted(scenarios, key=lambda s: engines.index(s.serving()))
