"""The canary report: one pydantic model, the JSON contract of ``latency_checker --output-json``.

Every canary in the bot (the remediation gate, ``ruleloop tune``, the scheduler's baseline, the
drift before-run, the live canary stage) yields this model; it is stored as its JSON and parsed
back with ``CanaryReport.model_validate`` where a stored row is read, once. ``ruleloop canary
schema`` prints its JSON Schema (docs/canary-report.schema.json is that output).

Every field has a default so that a report written by an older release (or a hand-written one
in a test) still parses: a number it lacks is unknown (None), never 0.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from bot.adr.workload import WorkloadShape
from bot.diagnosis.probes import EngineWindow


class _Part(BaseModel):
    """A part of the report: unknown keys of a newer release are kept, not refused."""

    model_config = ConfigDict(extra="allow", ser_json_inf_nan="null")


class QuantileInterval(_Part):
    """A quantile's distribution-free confidence interval (order statistics) over ``n``
    values: an end the sample cannot reach is null, unbounded (a p99 of 4 requests has no
    upper end), never clamped to the maximum (``bot.canary.stats``)."""

    q: float
    confidence: float
    n: int
    low: float | None = None
    high: float | None = None


class Spread(_Part):
    """A latency's p50/p90/p99 and mean (ms, linear interpolation as numpy) over ``count``
    requests; ``infinite`` failed requests reached it (a percentile they reach is null);
    ``p99_interval``: how sure the p99 is (null in a report of an earlier release)."""

    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    mean: float | None = None
    count: int = 0
    infinite: int = 0
    p99_interval: QuantileInterval | None = None

    def p99_judged(self) -> float | None:
        """The p99 the gates read: inf when failed requests made it unbounded."""
        if self.p99 is None and self.infinite:
            return math.inf
        return self.p99


class Fragmentation(_Part):
    """KV-cache fragmentation, each view's mean over the samples where it was defined."""

    observed: float | None = None
    internal: float | None = None
    observed_max: float | None = None
    samples: int = 0
    samples_with_kv: int = 0
    definition: dict[str, str] = Field(default_factory=dict)
    unknown: str | None = None  # why the observed view cannot be read (a partial engine page)


class RequestCounts(_Part):
    """Requests by how they ended, and the failed ones by cause ('HTTP 429', 'timeout')."""

    ok: int = 0
    cancelled: int = 0
    failed: int = 0
    total: int = 0
    failed_by_cause: dict[str, int] = Field(default_factory=dict)


class SloLimits(_Part):
    """The per-request limits (ms) SLO attainment counts against (None: not limited)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None


class TokenCounts(_Part):
    """Output tokens delivered (finished requests), streamed (any request), the engine's count
    over the window, and the prompt tokens sent."""

    delivered: int | None = None
    streamed: int | None = None
    engine_generated: float | None = None
    prompt_sent: int | None = None


class Throughput(_Part):
    """The run's wall time and rates."""

    wall_s: float | None = None
    output_tokens_per_s: float | None = None
    requests_per_s: float | None = None


class ClientCpu(_Part):
    """CPU the canary's own client spent: a busy client reads tokens late."""

    seconds: float | None = None
    per_1000_tokens: float | None = None


class ErrorCount(_Part):
    """One error text and how many requests ended with it."""

    error: str
    count: int


class GateLine(_Part):
    """One gate of the verdict: its limit, the measured value (null: unbounded or not
    measured; the reason says which), whether it passed, why, and what it read.
    ``statistics``: a per-request gate (TTFT, TPOT p99) decided on its statistics: met,
    missed or inconclusive, with n and the confidence; ``passed`` follows it."""

    name: str
    limit: float
    value: float | None = None
    passed: bool
    reason: str
    source: str = ""  # not said by a report stored before gates named their source
    statistics: str | None = None
    decided: str | None = None  # statistics' word: met | missed | inconclusive
    sample: int | None = None  # the requests it read
    sample_before: int | None = None  # 'Nx before': the before-run's requests it read
    p_value: float | None = None  # 'Nx before': of the one-sided U test behind the word
    interval: list[float | None] | None = None  # a limit: the p99's interval (null: unbounded)
    confidence: float | None = None  # what the statistics decided at (0.99)


class Samples(_Part):
    """Each judged request's TTFT and TPOT (ms), in the order the run recorded them: what the
    statistics read (null: a failed request, infinitely slow)."""

    ttft_ms: list[float | None] = Field(default_factory=list)
    tpot_ms: list[float | None] = Field(default_factory=list)
    # each request's gaps between token-carrying chunks (ms, to 0.01), those that finished
    itl_ms: list[list[float]] = Field(default_factory=list)

    def values(self, key: str) -> list[float]:
        """One metric's values, a failed request as inf."""
        return [math.inf if v is None else v for v in getattr(self, key)]


class TimelinePoint(_Part):
    """Engine gauges at one in-flight scrape (for charts)."""

    t_s: float
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    resident_tokens: int = 0


class BackgroundClass(_Part):
    """What a background load class beside the canary saw, client side only."""

    workload: dict[str, Any] = Field(default_factory=dict)
    ttft_ms: Spread = Field(default_factory=Spread)
    tpot_ms: Spread = Field(default_factory=Spread)
    requests: RequestCounts = Field(default_factory=RequestCounts)
    tokens: TokenCounts = Field(default_factory=TokenCounts)
    errors: list[ErrorCount] = Field(default_factory=list)


class ReplicaNumbers(_Part):
    """One replica's main numbers over the run's window, beside the fleet's merged ones
    (None where it gave none; ``note``: why, e.g. it restarted or stopped answering)."""

    url: str = ""
    pod: str | None = None
    node: str | None = None
    ttft_p99_ms: float | None = None
    tpot_p99_ms: float | None = None
    itl_p99_ms: float | None = None
    queue_time_p99_ms: float | None = None
    requests_finished: float | None = None
    goodput_ratio: float | None = None
    note: str | None = None


class CanaryReport(_Part):
    """Everything a canary run measured, and its verdict (``passed`` and ``gates``: null and
    empty until judged). The four numbers are ``ttft_ms.p99``, ``tpot_ms.p99``,
    ``goodput_ratio`` and ``kv_fragmentation.observed``; ``bot.canary.verdict`` says which of
    them the gates read, and why (``goodput_source``)."""

    passed: bool | None = None
    ttft_ms: Spread = Field(default_factory=Spread)
    tpot_ms: Spread = Field(default_factory=Spread)
    itl_ms: Spread = Field(default_factory=Spread)
    e2e_ms: Spread = Field(default_factory=Spread)
    goodput_ratio: float | None = None
    goodput_source: str = "none"
    slo_attainment: float | None = None
    slo: SloLimits = Field(default_factory=SloLimits)
    kv_fragmentation: Fragmentation = Field(default_factory=Fragmentation)
    wasted_prefill_tokens: float | None = None
    requests: RequestCounts = Field(default_factory=RequestCounts)
    other_clients_requests: int | None = None  # ended in the window, not the canary's
    error_rate: float | None = None
    tokens: TokenCounts = Field(default_factory=TokenCounts)
    throughput: Throughput = Field(default_factory=Throughput)
    client_cpu: ClientCpu = Field(default_factory=ClientCpu)
    errors: list[ErrorCount] = Field(default_factory=list)
    engine: EngineWindow | None = None  # the engine's own /metrics over the run's window
    engine_scope: str | None = None  # the fleet (replicas merged) or one page
    engine_replicas: dict[str, ReplicaNumbers] | None = None  # each replica's own numbers
    workload: dict[str, Any] = Field(default_factory=dict)  # the parameters the run sent
    workload_shape: WorkloadShape | None = None  # the shape it sent (replayed or fixed)
    timeline: list[TimelinePoint] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    background: list[BackgroundClass] = Field(default_factory=list)
    gates: list[GateLine] = Field(default_factory=list)
    samples: Samples = Field(default_factory=Samples)
    # the looks the run planned (``Gates.looks``): 1, a fixed count; more, a sized run that
    # could go on while a gate was undecided, each look judged at its share of the error
    looks: int = 1

    def json_dict(self) -> dict[str, Any]:
        """The report as JSON-safe data (an unbounded number is null), for a JSON column."""
        data: dict[str, Any] = self.model_dump(mode="json")
        return data

    def shape_json(self) -> dict[str, Any] | None:
        """The workload shape the run sent, as JSON (None: the report does not say)."""
        shape = self.workload_shape
        return None if shape is None else shape.model_dump(mode="json")

    @classmethod
    def of(cls, data: CanaryReport | dict[str, Any] | None) -> CanaryReport:
        """A report from stored JSON (None or empty: a report that measured nothing)."""
        if isinstance(data, CanaryReport):
            return data
        return cls.model_validate(data or {})
