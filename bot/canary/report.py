"""Turns a canary run's raw records into the four metrics, SLO attainment and gate verdicts.

Client-side numbers come from the request records; engine-side numbers from the difference of
two /metrics scrapes that bracket the run. Goodput needs both: tokens delivered to clients by
requests that finished normally, over all tokens the engine generated in the window.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bot.adr.workload import WorkloadShape
from bot.canary.client import Outcome, RequestRecord
from bot.canary.schema import (
    CanaryReport,
    ClientCpu,
    ErrorCount,
    Fragmentation,
    QuantileInterval,
    RequestCounts,
    Samples,
    SloLimits,
    Spread,
    Throughput,
    TimelinePoint,
    TokenCounts,
)
from bot.canary.stats import DEFAULT_CONFIDENCE, quantile_interval
from bot.canary.verdict import Gates, Verdict, judge, judged, percentile
from bot.diagnosis.probes import EngineWindow, FragmentationSample

PERCENTILES = {"p50": 50, "p90": 90, "p99": 99}
FRAGMENTATION_DEFINITIONS = {
    "observed": "1 - resident_tokens / (kv_cache_usage_perc * (num_gpu_blocks - 1) * block_size),"
    " mean over in-flight samples",
    "internal": "sum(ceil(n/B)*B - n) / sum(ceil(n/B)*B) over in-flight sequences,"
    " mean over samples",
}


def summarize(values_ms: Sequence[float]) -> Spread:
    """p50/p90/p99 (linear interpolation, as numpy) and mean of a list of milliseconds.

    A value of inf is a failed request: a percentile it reaches is unbounded, stored as null,
    and ``infinite`` says how many there were (so JSON stays valid and nothing looks faster).
    """
    ordered = sorted(values_ms)
    infinite = sum(1 for v in ordered if math.isinf(v))
    out: dict[str, float | None] = {}
    if ordered:
        for key, pct in PERCENTILES.items():
            value = percentile(ordered, pct)
            out[key] = value if math.isfinite(value) else None
        out["mean"] = None if infinite else float(np.mean(ordered))
    interval = None
    if ordered:
        found = quantile_interval(ordered, 0.99, DEFAULT_CONFIDENCE)
        interval = QuantileInterval(
            q=0.99, confidence=found.confidence, n=found.n, low=found.low, high=found.high
        )
    return Spread(**out, count=len(ordered), infinite=infinite, p99_interval=interval)


def slo_attainment(
    records: Sequence[RequestRecord], *, ttft_ms: float | None, tpot_ms: float | None
) -> float | None:
    """Share of all requests that finished normally within the TTFT and TPOT limits.

    Failed and cancelled requests are misses: they are in the denominator, never in the count.
    """
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


def fragmentation_summary(samples: Sequence[FragmentationSample]) -> Fragmentation:
    """Mean of each view over the samples where it was defined."""
    observed = [s.observed for s in samples if s.observed is not None]
    internal = [s.internal for s in samples if s.internal is not None]
    return Fragmentation(
        observed=float(np.mean(observed)) if observed else None,
        internal=float(np.mean(internal)) if internal else None,
        observed_max=float(np.max(observed)) if observed else None,
        samples=len(samples),
        samples_with_kv=len(observed),
        definition=FRAGMENTATION_DEFINITIONS,
    )


# Requests the engine may end in a window beyond the canary's own without meaning other clients
# (a request of the run's warmup or a retried connection crossing the window's edge).
OTHERS_SLACK = 2
OTHERS_SHARE = 0.1
# Clients may count a few tokens the engine's counter does not (a chat's role chunk, a step
# not yet counted at the last scrape): beyond this share the engine page saw only part of the
# traffic (one replica of a Service), and no goodput can be read from it.
COUNTING_TOLERANCE = 0.02
ONE_PAGE = "one /metrics page: one replica's when the endpoint is a Service (pass --replica)"


@dataclass
class CanaryMeasurement:
    """Everything a run measured; ``report`` is the JSON contract of latency_checker
    (``bot.canary.schema.CanaryReport``).

    ``shape``: the workload shape the run sent: the one replayed (``--workload``), or the one
    its fixed parameters describe (``bot.canary.shape_replay.fixed_shape``); always set.
    """

    shape: WorkloadShape
    workload: dict[str, Any]
    records: Sequence[RequestRecord]
    engine: EngineWindow | None
    samples: Sequence[FragmentationSample]
    gates: Gates
    wall_s: float
    client_cpu_s: float
    timeline: list[TimelinePoint] = field(default_factory=list)  # engine gauges per sample
    warnings: list[str] = field(default_factory=list)  # said beside the numbers, not fatal
    replicas: int = 0  # engines merged into ``engine`` (--replica); 0: one page as given
    replica_details: dict[str, Any] = field(default_factory=dict)  # each replica's numbers

    # -- client-side numbers -------------------------------------------------------------
    def outcomes(self) -> RequestCounts:
        """Requests by outcome, and the failed ones by cause ('HTTP 429', 'timeout', ...)."""
        counts = {o.value: 0 for o in Outcome}
        causes: dict[str, int] = {}
        for record in self.records:
            counts[(record.outcome or Outcome.FAILED).value] += 1
            if record.outcome is Outcome.FAILED or record.outcome is None:
                cause = record.cause or "unknown"
                causes[cause] = causes.get(cause, 0) + 1
        failed_by_cause = dict(sorted(causes.items(), key=lambda kv: -kv[1]))
        return RequestCounts(**counts, total=len(self.records), failed_by_cause=failed_by_cause)

    def ok_records(self) -> list[RequestRecord]:
        """Requests that finished normally."""
        return [r for r in self.records if r.outcome is Outcome.OK]

    def judged_records(self) -> list[RequestRecord]:
        """Requests latency is judged on: all but those the client itself gave up on."""
        return [r for r in self.records if r.outcome is not Outcome.CANCELLED]

    def ttft_values(self) -> list[float]:
        """TTFT (ms) of every request that did not cancel itself; no first token counts as inf."""
        return ttft_values(self.records)

    def tpot_values(self) -> list[float]:
        """TPOT (ms) of requests with more than one token; every failed request counts as inf."""
        return tpot_values(self.records)

    def ttft_ms(self) -> Spread:
        """TTFT's spread (``ttft_values``)."""
        return summarize(self.ttft_values())

    def tpot_ms(self) -> Spread:
        """TPOT's spread (``tpot_values``)."""
        return summarize(self.tpot_values())

    def e2e_ms(self) -> Spread:
        """End-to-end latency; every failed request counts as inf."""
        return summarize(
            [
                r.e2e_s * 1000 if r.outcome is Outcome.OK and r.e2e_s is not None else math.inf
                for r in self.judged_records()
            ]
        )

    def itl_ms(self) -> Spread:
        """Gaps between token-carrying chunks, all requests that finished normally."""
        return summarize([gap * 1000 for r in self.ok_records() for gap in r.itl_s])

    def delivered_tokens(self) -> int:
        """Output tokens delivered by requests that finished normally."""
        return sum(r.output_tokens for r in self.ok_records())

    def streamed_tokens(self) -> int:
        """Output tokens any request received, cancelled ones included."""
        return sum(r.output_tokens for r in self.records)

    def others_requests(self) -> int | None:
        """Requests the engine ended in the canary's window beyond the canary's own: other
        clients were served beside it (None: the engine does not say)."""
        if self.engine is None or self.engine.requests_finished is None:
            return None
        ended = self.engine.requests_finished + (self.engine.aborted_requests or 0)
        return max(0, round(ended) - len(self.records))

    def goodput_ratio(self) -> tuple[float | None, str]:
        """Delivered / engine-generated tokens, and where the denominator came from.

        The engine's count is the canary's only when the engine served nobody else in the
        window: beside other clients (a production engine, a target under traffic) it counts
        their tokens too, and the ratio would read their traffic as the canary's waste, so the
        canary's own requests are read instead (delivered / streamed), and the source says so.
        """
        delivered = self.delivered_tokens()
        streamed = self.streamed_tokens()
        others = self.others_requests()
        if others is not None and others > max(OTHERS_SLACK, OTHERS_SHARE * len(self.records)):
            if streamed:
                return delivered / streamed, f"shared (the engine also ended {others} requests "
                "of other clients: the canary's own, delivered / streamed)"
            return None, "none"
        partial = self.partial_engine()
        if partial is not None:
            return None, partial
        if self.engine is not None and self.engine.generation_tokens:
            # Never clamped: a ratio above 1 (within the tolerance) is a counting difference.
            return delivered / self.engine.generation_tokens, "engine"
        if streamed:
            # Without the engine's count, tokens generated after a client left are invisible:
            # this is an upper bound, and the report says so.
            return delivered / streamed, "client (upper bound: no engine metrics)"
        return None, "none"

    def partial_engine(self) -> str | None:
        """Why the engine column is not the whole fleet, or None: clients received more tokens
        than the engine counted, so some engine the page does not cover served them."""
        generated = self.engine.generation_tokens if self.engine else None
        delivered = self.delivered_tokens()
        if generated is None or delivered <= generated * (1 + COUNTING_TOLERANCE):
            return None
        return (
            f"partial: clients received {delivered:,} tokens but the engine page counted "
            f"{generated:,.0f} (over {COUNTING_TOLERANCE:.0%} more): it is not the whole fleet "
            "(a Service's /metrics is one replica's); list every replica with --replica URL"
        )

    def engine_scope(self) -> str | None:
        """What the engine column covers: the fleet (replicas merged) or one page."""
        if self.engine is None:
            return None
        if self.replicas:
            return f"fleet: {self.replicas} replica{'s' if self.replicas > 1 else ''} merged"
        return ONE_PAGE

    def fragmentation(self) -> Fragmentation:
        """KV fragmentation; the observed view is unknown when the engine page is partial
        (the canary's resident tokens on every replica over one replica's KV slots)."""
        summary = fragmentation_summary(self.samples)
        partial = self.partial_engine()
        if partial is not None:
            return summary.model_copy(
                update={"observed": None, "observed_max": None, "unknown": partial}
            )
        return summary

    # -- the report and its verdict ------------------------------------------------------
    def numbers(self) -> CanaryReport:
        """The report without the verdict."""
        goodput, goodput_source = self.goodput_ratio()
        partial = self.partial_engine()
        ttft_limit, tpot_limit = self.gates.slo()
        streamed = self.streamed_tokens()
        outcomes = self.outcomes()
        return CanaryReport(
            ttft_ms=self.ttft_ms(),
            tpot_ms=self.tpot_ms(),
            itl_ms=self.itl_ms(),
            e2e_ms=self.e2e_ms(),
            goodput_ratio=goodput,
            goodput_source=goodput_source,
            slo_attainment=slo_attainment(self.records, ttft_ms=ttft_limit, tpot_ms=tpot_limit),
            slo=SloLimits(ttft_ms=ttft_limit, tpot_ms=tpot_limit),
            kv_fragmentation=self.fragmentation(),
            wasted_prefill_tokens=self.engine.wasted_prefill_tokens if self.engine else None,
            requests=outcomes,
            other_clients_requests=self.others_requests(),
            error_rate=outcomes.failed / outcomes.total if outcomes.total else None,
            tokens=TokenCounts(
                delivered=self.delivered_tokens(),
                streamed=streamed,
                engine_generated=self.engine.generation_tokens if self.engine else None,
                prompt_sent=sum(r.prompt_tokens or r.planned_prompt_tokens for r in self.records),
            ),
            throughput=Throughput(
                wall_s=self.wall_s,
                output_tokens_per_s=streamed / self.wall_s if self.wall_s > 0 else None,
                requests_per_s=len(self.records) / self.wall_s if self.wall_s > 0 else None,
            ),
            client_cpu=ClientCpu(
                seconds=self.client_cpu_s,
                per_1000_tokens=self.client_cpu_s / streamed * 1000 if streamed else None,
            ),
            errors=_top_errors(self.records),
            engine=self.engine,
            engine_scope=self.engine_scope(),
            engine_replicas=self.replica_details or None,
            workload=self.workload,
            workload_shape=self.shape,
            timeline=self.timeline,
            warnings=[*self.warnings, *([partial] if partial else [])],
            samples=samples_of(self.records),
            looks=self.gates.looks,
        )

    def verdict(self) -> Verdict:
        """The gates' verdict on this run (``bot.canary.verdict``, the one judge)."""
        return judge(self.numbers(), self.gates)

    @property
    def passed(self) -> bool:
        """Every gate passed (the error gate is always on)."""
        return self.verdict().passed

    def report(self) -> CanaryReport:
        """The report, with the verdict."""
        return judged(self.numbers(), self.gates).report


def ttft_values(records: Sequence[RequestRecord]) -> list[float]:
    """TTFT (ms) of every request that did not cancel itself; no first token counts as inf."""
    return [
        math.inf if r.ttft_s is None else r.ttft_s * 1000
        for r in records
        if r.outcome is not Outcome.CANCELLED
        and (r.ttft_s is not None or r.outcome is not Outcome.OK)
    ]


def tpot_values(records: Sequence[RequestRecord]) -> list[float]:
    """TPOT (ms) of requests with more than one token; every failed request counts as inf."""
    values = []
    for r in records:
        if r.outcome is Outcome.CANCELLED:
            continue
        if r.outcome is not Outcome.OK:
            values.append(math.inf)
        elif r.tpot_s is not None:
            values.append(r.tpot_s * 1000)
    return values


def samples_of(records: Sequence[RequestRecord]) -> Samples:
    """The per-request values the statistics read (a failed request: null, infinitely slow;
    ITL: each request that finished normally, its gaps)."""
    return Samples(
        ttft_ms=[_finite_ms(v) for v in ttft_values(records)],
        tpot_ms=[_finite_ms(v) for v in tpot_values(records)],
        itl_ms=[
            [round(g * 1000, 2) for g in r.itl_s]
            for r in records
            if r.outcome is Outcome.OK and r.itl_s
        ],
    )


def _finite_ms(value: float) -> float | None:
    """A value for JSON: an infinitely slow (failed) request is null."""
    return value if math.isfinite(value) else None


def _top_errors(records: Sequence[RequestRecord], limit: int = 5) -> list[ErrorCount]:
    counts: dict[str, int] = {}
    for record in records:
        if record.error:
            counts[record.error] = counts.get(record.error, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])[:limit]
    return [ErrorCount(error=error, count=count) for error, count in ranked]
