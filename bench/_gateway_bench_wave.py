"""What the engine saw of one bench round, and when the round's first wave was sent.

For bench/gateway_bench.py: ``engine_view`` diffs two scrapes of vLLM's /metrics (its own
TTFT and queue-time histograms, and ``vllm:iteration_tokens_total``: tokens per engine step,
so the number of steps and how big they were); ``Arrivals`` records, through aiohttp's trace
hooks, when each request's head was written to the socket (on a direct path that is when it
reached vLLM's socket; through a proxy, when it reached the proxy), so that the spread of the
first wave is printed per path.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import aiohttp

from bot.numbers.histogram import histogram_quantile
from bot.probes.exposition import Exposition

TTFT = "vllm:time_to_first_token_seconds"
QUEUE = "vllm:request_queue_time_seconds"
PREFILL = "vllm:request_prefill_time_seconds"
STEPS = "vllm:iteration_tokens_total"


def _delta(before: Exposition, after: Exposition, name: str) -> tuple[dict[float, float], float]:
    b1, b0 = after.buckets(name), before.buckets(name)
    count = (after.total(f"{name}_count") or 0.0) - (before.total(f"{name}_count") or 0.0)
    return {le: c - b0.get(le, 0.0) for le, c in b1.items()}, count


def engine_view(before_text: str, after_text: str) -> dict[str, float]:
    """vLLM's own view of a round: TTFT and queue time (ms, p50/p99), prefill p50, steps."""
    before = Exposition.parse(before_text, at=0.0)
    after = Exposition.parse(after_text, at=0.0)
    out: dict[str, float] = {}
    for key, name in (("eng_ttft", TTFT), ("eng_queue", QUEUE), ("eng_prefill", PREFILL)):
        buckets, _ = _delta(before, after, name)
        for q in (0.5, 0.99):
            value = histogram_quantile(q, buckets)
            out[f"{key}_p{round(q * 100)}"] = -1.0 if value is None else value * 1000
    steps, count = _delta(before, after, STEPS)
    total = (after.total(f"{STEPS}_sum") or 0.0) - (before.total(f"{STEPS}_sum") or 0.0)
    out["eng_steps"] = count
    out["eng_tokens_per_step"] = total / count if count else 0.0
    big = steps.get(float("inf"), count) - max(
        (c for le, c in steps.items() if le <= 256), default=0.0
    )
    out["eng_steps_over_256_tokens"] = big
    return out


class Arrivals:
    """When each request's head went out (perf_counter), by the ``x-bench-seq`` header."""

    def __init__(self) -> None:
        self.sent: dict[int, float] = {}
        self.config = aiohttp.TraceConfig()
        self.config.on_request_start.append(self._start)
        self.config.on_request_headers_sent.append(self._headers_sent)

    async def _start(self, _s: object, ctx: SimpleNamespace, params: object) -> None:
        ctx.seq = params.headers.get("x-bench-seq")  # type: ignore[attr-defined]

    async def _headers_sent(self, _s: object, ctx: SimpleNamespace, _p: object) -> None:
        seq = getattr(ctx, "seq", None)
        if seq is not None:
            self.sent.setdefault(int(seq), time.perf_counter())

    def wave(self, started: float, first: int) -> dict[str, float]:
        """ms after the round's start at which the first ``first`` requests' heads went out."""
        at = sorted((t - started) * 1000 for s, t in self.sent.items() if s < first)
        if not at:
            return {}
        return {"wave_first_ms": at[0], "wave_p50_ms": at[len(at) // 2], "wave_last_ms": at[-1]}
