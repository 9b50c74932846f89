"""The queue/cancel probe: how long requests wait, and how much work cancelled requests waste.

Engine side (vLLM /metrics over the sampling window): queue time, queue depth, prefill tokens
spent on aborted requests (prompt_tokens_total grows for them, request_prompt_tokens_sum
does not) and decode tokens of aborted requests. Only requests that ended in the window count:
the tokens of requests still in flight at either end are estimated and left out, with bounds
(bot/diagnosis/probes/vllm_metrics.py has the method); a share whose bounds are too wide is None.
Gateway side, when the target has a gateway: its request outcomes and wasted tokens (names in
bot/gateway/metrics.py); there, requests still running when the window closes are not counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from bot.diagnosis.probes.context import ProbeContext, TargetRef
from bot.diagnosis.probes.exposition import Exposition
from bot.diagnosis.probes.types import Params, ProbeResult
from bot.diagnosis.probes.vllm_metrics import MetricsScraper, Quantiles
from bot.diagnosis.probes.vllm_window import WindowParams
from bot.kernel.numbers import Measured
from bot.kernel.runtime.redact import redact

GATEWAY_REQUESTS = "ruleloop_gateway_requests_total"
GATEWAY_OUTPUT = "ruleloop_gateway_output_tokens_total"
GATEWAY_PROMPT = "ruleloop_gateway_prompt_tokens_total"
GATEWAY_TTFT = "ruleloop_gateway_ttft_seconds"
GATEWAY_METRICS = frozenset({GATEWAY_REQUESTS, GATEWAY_OUTPUT, GATEWAY_PROMPT, GATEWAY_TTFT})
ADMITTED = ("ok", "client_cancel", "deadline", "upstream_error")
CANCELLED = ("client_cancel", "deadline")

READINGS = {
    "queue_time_p99_ms": "time requests waited in vLLM's queue, p99",
    "queue_time_p50_ms": "time requests waited in vLLM's queue, median",
    "requests_waiting": "peak requests queued in the engine",
    "waiting_share": "peak share of the engine's requests that were queued, not running",
    "wasted_prefill_tokens": "prefill tokens spent on requests aborted in the window (engine)",
    "wasted_prefill_share": "share of the window's prefill tokens spent on requests aborted in it",
    "wasted_decode_tokens": "output tokens of requests aborted in the window (engine)",
    "wasted_decode_share": "share of the output of requests that ended that went to aborted ones",
    "cancelled_share": "share of admitted requests cancelled or timed out (gateway)",
    "gateway_wasted_output_tokens": "output tokens streamed to requests that did not end ok",
    "gateway_rejected": "requests the gateway refused for its token budget",
    "gateway_ttft_p99_ms": "time to first token at the gateway (arrival to first byte), p99",
    "engine_ttft_p99_ms": "time to first token at the engine over the same window, p99",
}


def _share(part: float | None, whole: float | None) -> float | None:
    return None if part is None or not whole else part / whole


def _complement(share: float | None) -> float | None:
    return None if share is None else 1.0 - share


class QueueCancelProbe:
    """Queue and cancellation readings for one target."""

    name: ClassVar[str] = "queue_cancel"
    params_model: ClassVar[type[Params]] = WindowParams

    def readings(self, params: Params) -> Mapping[str, str]:
        """Always the same readings (gateway ones are None without a gateway)."""
        return READINGS

    async def run(self, *, target: TargetRef, params: Params, ctx: ProbeContext) -> ProbeResult:
        """Read the engine window, bracketed by two gateway scrapes when there is a gateway."""
        assert isinstance(params, WindowParams)
        gateway = None
        if target.target.gateway_url:
            gateway = MetricsScraper(
                f"{target.target.gateway_url}/metrics", client=ctx.http, clock=ctx.monotonic,
                require_vllm=False,
            )  # fmt: skip
        g0 = await gateway(only=GATEWAY_METRICS) if gateway else None
        fleet = await ctx.window(
            target.target, seconds=params.window_s, interval_s=params.interval_s
        )
        window = fleet.window
        g1 = await gateway(only=GATEWAY_METRICS) if gateway else None
        engine = window.engine
        peak_share = max(
            (
                _share(p.requests_waiting, (p.requests_waiting or 0) + (p.requests_running or 0))
                or 0.0
                for p in window.points
            ),
            default=None,
        )
        readings: dict[str, float | None] = {
            "queue_time_p99_ms": engine.queue_time_ms.p99,
            "queue_time_p50_ms": engine.queue_time_ms.p50,
            "requests_waiting": window.peak("requests_waiting"),
            "waiting_share": peak_share,
            "wasted_prefill_tokens": engine.wasted_prefill.value,
            "wasted_prefill_share": engine.wasted_prefill_share.value,
            "wasted_decode_tokens": engine.wasted_generation.value,
            "wasted_decode_share": _complement(engine.goodput.value),
            **gateway_readings(g0, g1),
        }
        ttft = gateway_ttft(g0, g1)
        quantiles = {
            "engine_ttft_p99_ms": engine.ttft_ms.reading("p99"),
            "gateway_ttft_p99_ms": ttft.reading("p99") if ttft else None,
        }
        details = {
            "gateway": target.target.gateway_url and redact(target.target.gateway_url),
            "aborted_requests": engine.aborted_requests,
            **{
                f"{name}_bounds": None if e.low is None or e.high is None else [e.low, e.high]
                for name, e in (
                    ("wasted_prefill_tokens", engine.wasted_prefill),
                    ("wasted_prefill_share", engine.wasted_prefill_share),
                    ("wasted_decode_tokens", engine.wasted_generation),
                )
            },
            "wasted_prefill_basis": engine.wasted_prefill_share.basis,
            "wasted_decode_basis": engine.goodput.basis,
            **fleet.details(),
        }
        return ProbeResult(readings=Measured.of(readings) | Measured(quantiles), details=details)


def gateway_ttft(before: Exposition | None, after: Exposition | None) -> Quantiles | None:
    """The gateway's TTFT quantiles between its two scrapes (None: no gateway)."""
    if before is None or after is None:
        return None
    return Quantiles.from_histogram(before, after, [GATEWAY_TTFT])


def gateway_readings(
    before: Exposition | None, after: Exposition | None
) -> dict[str, float | None]:
    """Cancelled share, wasted output and budget rejections between two gateway scrapes."""
    if before is None or after is None:
        return {
            "cancelled_share": None,
            "gateway_wasted_output_tokens": None,
            "gateway_rejected": None,
        }

    def delta(name: str, label: str, value: str) -> float:
        where = {label: value}
        return max(
            (after.total(name, where=where) or 0.0) - (before.total(name, where=where) or 0.0), 0.0
        )

    admitted = sum(delta(GATEWAY_REQUESTS, "outcome", o) for o in ADMITTED)
    cancelled = sum(delta(GATEWAY_REQUESTS, "outcome", o) for o in CANCELLED)
    return {
        "cancelled_share": _share(cancelled, admitted),
        "gateway_wasted_output_tokens": delta(GATEWAY_OUTPUT, "kind", "wasted"),
        "gateway_rejected": delta(GATEWAY_REQUESTS, "outcome", "rejected"),
    }
