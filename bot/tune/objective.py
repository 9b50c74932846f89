"""What a search optimises, and how one measured trial scores against it and the gates.

The plan declares one metric and its direction; the gates (the plan's, or an ADR's with
``--gates-from``) are the constraints:

    objective:
      maximize: goodput_rps      # requests/s that finished within the gates' TTFT and TPOT
    gates: {max_ttft_p99_ms: 2000, max_tpot_p99_ms: 150}

A trial is *feasible* when the canary met every gate. An infeasible trial keeps its measured
value (the search may learn from it) but carries its violations, one number per gate (how far
past the limit, as a share of it), so the sampler ranks it below every feasible trial. A trial
that measured nothing (vLLM refused the flags, the engine did not start, the canary crashed)
has no value at all: the search marks it failed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator

from bot.canary import GATES, MEASURED, CanaryReport, Gates, Spread, Verdict, judge

Direction = Literal["maximize", "minimize"]
Metric = Literal[
    "goodput_rps",
    "requests_per_s",
    "output_tokens_per_s",
    "ttft_p99_ms",
    "tpot_p99_ms",
    "e2e_p99_ms",
]
# metric -> (the only sensible direction, what it is, in words)
METRICS: dict[str, tuple[Direction, str]] = {
    "goodput_rps": ("maximize", "requests/s that finished within the gates' TTFT and TPOT limits"),
    "requests_per_s": ("maximize", "requests/s the canary completed"),
    "output_tokens_per_s": ("maximize", "output tokens/s streamed to the canary"),
    "ttft_p99_ms": ("minimize", "TTFT p99, ms"),
    "tpot_p99_ms": ("minimize", "TPOT p99, ms"),
    "e2e_p99_ms": ("minimize", "end-to-end latency p99, ms"),
}
UNBOUNDED = 1e6  # the violation of a gate whose value was unbounded (failed requests)


class Objective(BaseModel):
    """``maximize: METRIC`` or ``minimize: METRIC`` (one of ``METRICS``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    maximize: Metric | None = None
    minimize: Metric | None = None

    @model_validator(mode="after")
    def _one_direction(self) -> Objective:
        if (self.maximize is None) == (self.minimize is None):
            raise ValueError(
                "give exactly one of maximize: or minimize:, e.g. maximize: goodput_rps"
            )
        wanted, _ = METRICS[self.metric]
        if wanted != self.direction:
            raise ValueError(f"{self.metric} is better when higher or lower? {wanted} it")
        return self

    @property
    def metric(self) -> str:
        """The metric's name."""
        return self.maximize or self.minimize or ""

    @property
    def direction(self) -> Direction:
        """maximize or minimize."""
        return "maximize" if self.maximize else "minimize"

    def describe(self) -> str:
        """'maximize goodput_rps (requests/s that finished within ...)'."""
        return f"{self.direction} {self.metric} ({METRICS[self.metric][1]})"

    def value(self, report: CanaryReport) -> float | None:
        """The metric in a canary report; None when the report has no such number, inf when
        failed requests made a latency percentile unbounded."""
        throughput = report.throughput
        if self.metric == "goodput_rps":
            attained, rate = report.slo_attainment, throughput.requests_per_s
            return None if attained is None or rate is None else attained * rate
        if self.metric == "requests_per_s":
            return throughput.requests_per_s
        if self.metric == "output_tokens_per_s":
            return throughput.output_tokens_per_s
        spread = getattr(report, self.metric.removesuffix("_p99_ms") + "_ms", None)
        return spread.p99_judged() if isinstance(spread, Spread) else None

    def better(self, a: float, b: float) -> bool:
        """Whether ``a`` beats ``b``."""
        return a > b if self.direction == "maximize" else a < b


@dataclass(frozen=True)
class TrialOutcome:
    """One trial as the search sees it: a value and the gates' violations, or why it failed."""

    value: float | None = None
    constraints: dict[str, float] = field(default_factory=dict)
    failed: str | None = None

    @property
    def feasible(self) -> bool:
        """Measured and within every gate."""
        return self.failed is None and all(v <= 0 for v in self.constraints.values())


def outcome(objective: Objective, report: CanaryReport | None, gates: Gates) -> TrialOutcome:
    """Score a measured canary report; a trial without one is a failure (say why elsewhere)."""
    if report is None:
        return TrialOutcome(failed="not measured")
    value = objective.value(report)
    if value is None or math.isnan(value):
        return TrialOutcome(failed=f"the canary report has no {objective.metric}")
    return TrialOutcome(value=value, constraints=violations(judge(report, gates)))


def violations(verdict: Verdict) -> dict[str, float]:
    """Per gate, how far past its limit the value is, as a share of the limit (<= 0: met)."""
    out: dict[str, float] = {}
    for result in verdict.results:
        if result.name == MEASURED:
            out[result.name] = 0.0 if result.passed else 1.0
            continue
        kind = GATES[result.name][2]
        value, limit = result.value, result.limit
        if value is None or math.isnan(value) or math.isinf(value):
            over = UNBOUNDED
        elif kind == "max":
            over = value / limit - 1 if limit > 0 else (UNBOUNDED if value > 0 else 0.0)
        else:
            over = limit / value - 1 if value > 0 else UNBOUNDED
        out[result.name] = min(over, 0.0) if result.passed else max(over, 1e-9)
    return out
