"""Turns a canary run's raw records into the four metrics, SLO attainment and gate verdicts.

Client-side numbers come from the request records; engine-side numbers from the difference of
two /metrics scrapes that bracket the run. Goodput needs both: tokens delivered to clients by
requests that finished normally, over all tokens the engine generated in the window.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from bot.canary.client import Outcome, RequestRecord
from bot.canary.fragmentation import FragmentationSample
from bot.probes.vllm_metrics import EngineWindow

PERCENTILES = {"p50": 50, "p90": 90, "p99": 99}
FRAGMENTATION_DEFINITIONS = {
    "observed": "1 - resident_tokens / (kv_cache_usage_perc * (num_gpu_blocks - 1) * block_size),"
    " mean over in-flight samples",
    "internal": "sum(ceil(n/B)*B - n) / sum(ceil(n/B)*B) over in-flight sequences,"
    " mean over samples",
}
UNMEASURED_HINTS = {
    "max_ttft_p99_ms": ": no request finished normally",
    "max_tpot_p99_ms": ": no request finished normally with more than one token",
    "min_goodput_ratio": ": no tokens streamed",
    "max_kv_fragmentation": (
        ": no in-flight /metrics sample saw KV usage (check --metrics-url, lower "
        "--sample-interval or send more requests)"
    ),
}


@dataclass(frozen=True)
class Gates:
    """Canary limits (an ADR's `gates`); None means not gated."""

    max_ttft_p99_ms: float | None = None
    max_tpot_p99_ms: float | None = None
    min_goodput_ratio: float | None = None
    max_kv_fragmentation: float | None = None

    def slo(self) -> tuple[float | None, float | None]:
        """The per-request TTFT and TPOT limits (ms) that SLO attainment counts against."""
        return self.max_ttft_p99_ms, self.max_tpot_p99_ms


@dataclass(frozen=True)
class GateResult:
    """One gate: its limit, the measured value and whether it passed."""

    name: str
    limit: float
    value: float | None
    passed: bool
    reason: str


def summarize(values_ms: Sequence[float]) -> dict[str, float | None]:
    """p50/p90/p99 (linear interpolation, as numpy) and mean of a list of milliseconds."""
    if not values_ms:
        return {key: None for key in (*PERCENTILES, "mean")}
    array = np.asarray(values_ms, dtype=float)
    out: dict[str, float | None] = {
        key: float(np.percentile(array, pct, method="linear")) for key, pct in PERCENTILES.items()
    }
    out["mean"] = float(array.mean())
    return out


def slo_attainment(
    records: Sequence[RequestRecord], *, ttft_ms: float | None, tpot_ms: float | None
) -> float | None:
    """Share of all requests that finished normally within the TTFT and TPOT limits."""
    if not records:
        return None
    met = 0
    for record in records:
        if record.outcome is not Outcome.OK:
            continue
        ttft, tpot = record.ttft_s, record.tpot_s
        if ttft_ms is not None and (ttft is None or ttft * 1000 > ttft_ms):
            continue
        if tpot_ms is not None and tpot is not None and tpot * 1000 > tpot_ms:
            continue
        met += 1
    return met / len(records)


def fragmentation_summary(samples: Sequence[FragmentationSample]) -> dict[str, Any]:
    """Mean of each view over the samples where it was defined."""
    observed = [s.observed for s in samples if s.observed is not None]
    internal = [s.internal for s in samples if s.internal is not None]
    return {
        "observed": float(np.mean(observed)) if observed else None,
        "internal": float(np.mean(internal)) if internal else None,
        "observed_max": float(np.max(observed)) if observed else None,
        "samples": len(samples),
        "samples_with_kv": len(observed),
        "definition": FRAGMENTATION_DEFINITIONS,
    }


@dataclass
class CanaryReport:
    """Everything a run measured; ``as_dict`` is the JSON contract of latency_checker."""

    workload: dict[str, Any]
    records: Sequence[RequestRecord]
    engine: EngineWindow | None
    samples: Sequence[FragmentationSample]
    gates: Gates
    wall_s: float
    client_cpu_s: float
    timeline: list[dict[str, Any]] = field(default_factory=list)  # engine gauges per sample
    gate_results: list[GateResult] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.gate_results = self._check_gates()

    # -- client-side numbers -------------------------------------------------------------
    def outcomes(self) -> dict[str, int]:
        """Requests by outcome."""
        counts = {o.value: 0 for o in Outcome}
        for record in self.records:
            counts[(record.outcome or Outcome.FAILED).value] += 1
        return {**counts, "total": len(self.records)}

    def ok_records(self) -> list[RequestRecord]:
        """Requests that finished normally."""
        return [r for r in self.records if r.outcome is Outcome.OK]

    def ttft_ms(self) -> dict[str, float | None]:
        """TTFT of requests that finished normally."""
        return summarize([r.ttft_s * 1000 for r in self.ok_records() if r.ttft_s is not None])

    def tpot_ms(self) -> dict[str, float | None]:
        """TPOT of requests that finished normally with more than one token."""
        return summarize([r.tpot_s * 1000 for r in self.ok_records() if r.tpot_s is not None])

    def itl_ms(self) -> dict[str, float | None]:
        """Gaps between token-carrying chunks, all requests that finished normally."""
        return summarize([gap * 1000 for r in self.ok_records() for gap in r.itl_s])

    def delivered_tokens(self) -> int:
        """Output tokens delivered by requests that finished normally."""
        return sum(r.output_tokens for r in self.ok_records())

    def streamed_tokens(self) -> int:
        """Output tokens any request received, cancelled ones included."""
        return sum(r.output_tokens for r in self.records)

    def goodput_ratio(self) -> tuple[float | None, str]:
        """Delivered / engine-generated tokens, and where the denominator came from."""
        delivered = self.delivered_tokens()
        if self.engine is not None and self.engine.generation_tokens:
            return min(delivered / self.engine.generation_tokens, 1.0), "engine"
        streamed = self.streamed_tokens()
        if streamed:
            # Without the engine's count, tokens generated after a client left are invisible:
            # this is an upper bound, and the report says so.
            return delivered / streamed, "client (upper bound: no engine metrics)"
        return None, "none"

    # -- gates ---------------------------------------------------------------------------
    def _check_gates(self) -> list[GateResult]:
        goodput, _ = self.goodput_ratio()
        frag = fragmentation_summary(self.samples)["observed"]
        checks = [
            ("max_ttft_p99_ms", self.gates.max_ttft_p99_ms, self.ttft_ms()["p99"], "max"),
            ("max_tpot_p99_ms", self.gates.max_tpot_p99_ms, self.tpot_ms()["p99"], "max"),
            ("min_goodput_ratio", self.gates.min_goodput_ratio, goodput, "min"),
            ("max_kv_fragmentation", self.gates.max_kv_fragmentation, frag, "max"),
        ]
        results = []
        for name, limit, value, kind in checks:
            if limit is None:
                continue
            if value is None or math.isnan(value):
                hint = UNMEASURED_HINTS.get(name, "")
                results.append(
                    GateResult(name, limit, None, False, f"could not be measured in this run{hint}")
                )
            elif kind == "max":
                ok = value <= limit
                results.append(
                    GateResult(
                        name, limit, value, ok, f"{value:.4g} {'<=' if ok else '>'} {limit:.4g}"
                    )
                )
            else:
                ok = value >= limit
                results.append(
                    GateResult(
                        name, limit, value, ok, f"{value:.4g} {'>=' if ok else '<'} {limit:.4g}"
                    )
                )
        return results

    @property
    def passed(self) -> bool:
        """All gates passed (a run with no gates passes)."""
        return all(g.passed for g in self.gate_results)

    def failed_gates(self) -> list[GateResult]:
        """The gates that did not pass."""
        return [g for g in self.gate_results if not g.passed]

    def as_dict(self) -> dict[str, Any]:
        """The JSON report."""
        goodput, goodput_source = self.goodput_ratio()
        ttft_limit, tpot_limit = self.gates.slo()
        streamed = self.streamed_tokens()
        engine = self.engine.as_dict() if self.engine else None
        return {
            "passed": self.passed,
            "ttft_ms": self.ttft_ms(),
            "tpot_ms": self.tpot_ms(),
            "itl_ms": self.itl_ms(),
            "e2e_ms": summarize([r.e2e_s * 1000 for r in self.ok_records() if r.e2e_s is not None]),
            "goodput_ratio": goodput,
            "goodput_source": goodput_source,
            "slo_attainment": slo_attainment(self.records, ttft_ms=ttft_limit, tpot_ms=tpot_limit),
            "slo": {"ttft_ms": ttft_limit, "tpot_ms": tpot_limit},
            "kv_fragmentation": fragmentation_summary(self.samples),
            "wasted_prefill_tokens": self.engine.wasted_prefill_tokens if self.engine else None,
            "requests": self.outcomes(),
            "tokens": {
                "delivered": self.delivered_tokens(),
                "streamed": streamed,
                "engine_generated": self.engine.generation_tokens if self.engine else None,
                "prompt_sent": sum(
                    r.prompt_tokens or r.planned_prompt_tokens for r in self.records
                ),
            },
            "throughput": {
                "wall_s": self.wall_s,
                "output_tokens_per_s": streamed / self.wall_s if self.wall_s > 0 else None,
                "requests_per_s": len(self.records) / self.wall_s if self.wall_s > 0 else None,
            },
            "client_cpu": {
                "seconds": self.client_cpu_s,
                "per_1000_tokens": self.client_cpu_s / streamed * 1000 if streamed else None,
            },
            "errors": _top_errors(self.records),
            "engine": engine,
            "gates": [asdict(g) for g in self.gate_results],
            "workload": self.workload,
            "timeline": self.timeline,
        }


def _top_errors(records: Sequence[RequestRecord], limit: int = 5) -> list[dict[str, Any]]:
    counts: dict[str, int] = {}
    for record in records:
        if record.error:
            counts[record.error] = counts.get(record.error, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])[:limit]
    return [{"error": error, "count": count} for error, count in ranked]
