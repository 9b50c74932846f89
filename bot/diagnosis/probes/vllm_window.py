"""The vLLM metrics probe: the engine's own /metrics over a sampling window, read into the four
numbers (TTFT, TPOT, goodput ratio, KV-cache fragmentation) and their context."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import ClassVar

from pydantic import Field

from bot.adr.workload import WorkloadShape, context_line
from bot.diagnosis.probes.context import ProbeContext, TargetRef
from bot.diagnosis.probes.engine_signals import SIGNAL_READINGS, read_signals
from bot.diagnosis.probes.engine_steps import STEP_READINGS, decode_bound, read_steps
from bot.diagnosis.probes.fleet_window import FleetWindow
from bot.diagnosis.probes.replicas import Pool
from bot.diagnosis.probes.sampling import SampledWindow
from bot.diagnosis.probes.types import Finding, Params, ProbeResult, Severity
from bot.diagnosis.probes.workload_capture import shape_from_fleet
from bot.kernel import RuleloopError
from bot.kernel.numbers import Estimate, Measured, show_reading


class WindowParams(Params):
    """A sampling window: how long, and how often to scrape inside it."""

    window_s: float = Field(default=10.0, gt=0, le=600)
    interval_s: float = Field(default=1.0, gt=0, le=60)


VLLM_READINGS = {
    "ttft_p99_ms": "time to first token, p99, engine histogram over the window",
    "ttft_p50_ms": "time to first token, median",
    "tpot_p99_ms": "time per output token, p99 (vLLM's per-request TPOT histogram)",
    "itl_p99_ms": "gap between tokens, p99",
    "e2e_p99_ms": "request latency end to end, p99",
    "goodput_ratio": "of the output tokens of requests that ended in the window, the share of "
    "the finished ones (not aborted); requests still running count as neither (estimate)",
    "kv_fragmentation": "allocated KV slots holding no token (estimate from running requests "
    "and used blocks; bounds in details)",
    "kv_cache_usage": "peak share of KV-cache blocks in use",
    "requests_running": "peak requests being decoded",
    "requests_waiting": "peak requests queued",
    "preemptions_per_s": "KV-cache preemptions per second",
    "prefix_cache_hit_rate": "prefix-cache hits / queries",
    "generation_tokens_per_s": "output tokens per second",
    "requests_finished": "requests that finished in the window",
    "aborted_share": "of the requests that had their first token in the window, the share "
    "surely aborted after it (from counts: running at both ends, first tokens, finished, less "
    "those queued at the end, which may be preempted)",
    **STEP_READINGS,
    **SIGNAL_READINGS,
}


def _bounds(estimate: Estimate) -> list[float] | None:
    """[low, high] of an estimate, None when it is unknown."""
    if estimate.low is None or estimate.high is None:
        return None
    return [estimate.low, estimate.high]


def aborted_share(
    aborted: float | None, first_tokens: int, waiting_at_end: float | None = None
) -> float | None:
    """Aborted requests over first tokens, at least: a request queued at the window's end may
    be a preempted one (vLLM counts the preemption only when it resumes), not an aborted one,
    so those are not counted. Unknown without the counts; a count at most 0 is none."""
    if aborted is None or first_tokens <= 0:
        return None
    return max(aborted - (waiting_at_end or 0.0), 0.0) / first_tokens


def fragmentation_details(fragmentation: Estimate | str) -> dict[str, object]:
    """The bounds and basis of the KV fragmentation reading (its value is the midpoint)."""
    if isinstance(fragmentation, str):
        return {"kv_fragmentation_bounds": None, "kv_fragmentation_basis": fragmentation}
    return {
        "kv_fragmentation_bounds": [fragmentation.low, fragmentation.high],
        "kv_fragmentation_basis": f"estimate: {fragmentation.basis}",
    }


class VllmMetricsProbe:
    """The engine's own /metrics over a sampling window: the four numbers and their context."""

    name: ClassVar[str] = "vllm_metrics"
    params_model: ClassVar[type[Params]] = WindowParams

    def readings(self, params: Params) -> Mapping[str, str]:
        """Always the same readings."""
        return VLLM_READINGS

    async def run(self, *, target: TargetRef, params: Params, ctx: ProbeContext) -> ProbeResult:
        """Sample the window and read it."""
        assert isinstance(params, WindowParams)
        fleet = await ctx.window(
            target.target, seconds=params.window_s, interval_s=params.interval_s
        )
        window = fleet.window
        engine = window.engine
        fragmentation = window.kv_fragmentation()
        estimated = Measured(
            {
                "ttft_p99_ms": engine.ttft_ms.reading("p99"),
                "ttft_p50_ms": engine.ttft_ms.reading("p50"),
                "tpot_p99_ms": window.tpot_ms.reading("p99"),
                "itl_p99_ms": engine.itl_ms.reading("p99"),
                "e2e_p99_ms": engine.e2e_ms.reading("p99"),
                "goodput_ratio": engine.goodput.reading(),
                "kv_fragmentation": None
                if isinstance(fragmentation, str)
                else fragmentation.reading(),
            }
        )
        readings = {
            "kv_cache_usage": window.peak("kv_cache_usage"),
            "requests_running": window.peak("requests_running"),
            "requests_waiting": window.peak("requests_waiting"),
            "preemptions_per_s": engine.preemptions_per_s,
            "prefix_cache_hit_rate": engine.prefix_cache_hit_rate,
            "generation_tokens_per_s": engine.generation_tokens_per_s,
            "requests_finished": engine.requests_finished,
            "aborted_share": aborted_share(
                engine.aborted_requests, engine.ttft_ms.count, engine.requests_waiting
            ),
        }
        decoders = decode_bound(window.pages[0], window.pages[-1])
        steps = read_steps(
            window.pages, decode_bound=decoders, step_budget=target.target.step_budget
        )
        details: dict[str, object] = {
            "window_s": engine.duration_s,
            "ttft_count": engine.ttft_ms.count,
            "goodput_bounds": _bounds(engine.goodput),
            "goodput_basis": engine.goodput.basis,
            "aborted_requests": engine.aborted_requests,
            **fragmentation_details(fragmentation),
            **fleet.details(),  # each replica's own numbers, beside the merged ones
        }
        workload, unknown = _workload(fleet, at=dt.datetime.now(dt.UTC))
        details["workload"] = context_line(workload) if workload else f"not read: {unknown}"
        merged = estimated | Measured.of(readings)
        return ProbeResult(
            readings=from_pools(merged, fleet) | steps | read_signals(window.pages),
            details=details, window=window,
            workload=workload, workload_unknown=unknown, findings=pool_findings(fleet),
        )  # fmt: skip


# Prefill/decode disaggregation: the readings each pool gives (docs/fleet.md "Prefill and
# decode pools"). A decode replica's TTFT is its own leg's, after the prefill pool's; a prefill
# replica generates one token per request, so its TPOT and finished requests are not the user's.
FROM_POOL: dict[str, Pool] = {
    "ttft_p99_ms": "prefill",
    "ttft_p50_ms": "prefill",
    "tpot_p99_ms": "decode",
    "itl_p99_ms": "decode",
    "goodput_ratio": "decode",
    "requests_finished": "decode",
    "generation_tokens_per_s": "decode",
}


def from_pools(merged: Measured, fleet: FleetWindow) -> Measured:
    """The readings with each of FROM_POOL taken from its pool's merged window (as they were
    for a fleet of like engines)."""
    if not fleet.pools:
        return merged
    own = {pool: _pool_readings(window) for pool, window in fleet.pools.items()}
    nothing = Measured()
    return Measured(
        {
            k: own.get(FROM_POOL[k], nothing).reading(k) if k in FROM_POOL else r
            for k, r in merged.readings.items()
        }
    )


def _pool_readings(window: SampledWindow) -> Measured:
    engine = window.engine
    return Measured(
        {
            "ttft_p99_ms": engine.ttft_ms.reading("p99"),
            "ttft_p50_ms": engine.ttft_ms.reading("p50"),
            "tpot_p99_ms": window.tpot_ms.reading("p99"),
            "itl_p99_ms": engine.itl_ms.reading("p99"),
            "goodput_ratio": engine.goodput.reading(),
        }
    ) | Measured.of(
        {
            "requests_finished": engine.requests_finished,
            "generation_tokens_per_s": engine.generation_tokens_per_s,
        }
    )


def pool_findings(fleet: FleetWindow) -> list[Finding]:
    """Which pool each headline number comes from (none for a fleet of like engines)."""
    if not fleet.pools:
        return []
    said = []
    for key, label in (("ttft_p99_ms", "TTFT p99"), ("tpot_p99_ms", "TPOT p99")):
        pool = FROM_POOL[key]
        window = fleet.pools.get(pool)
        reading = None if window is None else _pool_readings(window).reading(key)
        shown = show_reading(key, reading)
        n = sum(r.replica.pool == pool for r in fleet.replicas)
        said.append(f"{label} {shown} from the {pool} pool ({n} replica{'s' * (n != 1)})")
    return [
        Finding(
            Severity.INFO,
            "prefill/decode pools: " + "; ".join(said) + ": a decode replica's TTFT (after "
            "the prefill pool's) is not the user's, so TTFT is judged on the prefill pool and "
            "TPOT and finished requests on the decode pool",
            "vllm_metrics: pools (docs/fleet.md)",
        )
    ]


def _workload(fleet: FleetWindow, *, at: dt.datetime) -> tuple[WorkloadShape | None, str]:
    """Production's workload in the window (what the requests that finished in it were), or
    why it could not be read (none finished, a restart)."""
    try:
        return shape_from_fleet(fleet, captured_at=at), ""
    except RuleloopError as exc:
        return None, str(exc)
