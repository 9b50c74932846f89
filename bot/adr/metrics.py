"""The metric names an ADR's ``match`` conditions may use, and where each is in a report.

Its own module because both the record model (which refuses an unknown name) and the matcher
(which reads the number) need it, and the matcher needs the model: kept in either, the two
would import each other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from bot.kernel.numbers import catalogue


def _cancelled_share(report: Mapping[str, Any]) -> object:
    requests = report.get("requests") or {}
    total = requests.get("total") if isinstance(requests, Mapping) else None
    if not total:
        return None
    return requests.get("cancelled", 0) / total


# name -> (where it is in a canary report, what it means): the catalogue's numbers, then the
# numbers only a match condition reads
METRICS: dict[str, tuple[str | Callable[[Mapping[str, Any]], object], str]] = {
    **{m.key: (m.report, m.meaning) for m in catalogue.METRICS},
    "ttft_p50_ms": ("ttft_ms.p50", "time to first token, median, client side"),
    "tpot_p50_ms": ("tpot_ms.p50", "time per output token, median, client side"),
    "e2e_p99_ms": ("e2e_ms.p99", "request latency end to end, p99"),
    "slo_attainment": ("slo_attainment", "share of requests within the TTFT and TPOT limits"),
    "kv_fragmentation_internal": (
        "kv_fragmentation.internal",
        "KV fragmentation, PagedAttention definition",
    ),
    "wasted_prefill_tokens": ("wasted_prefill_tokens", "prefill tokens spent on aborted requests"),
    "cancelled_share": (_cancelled_share, "share of requests the client gave up on"),
    "engine_ttft_p99_ms": ("engine.ttft_ms.p99", "TTFT p99 from the engine's histogram"),
    "engine_itl_p99_ms": ("engine.itl_ms.p99", "inter-token latency p99 from the engine"),
    "queue_time_p99_ms": ("engine.queue_time_ms.p99", "time requests waited in vLLM's queue, p99"),
    "kv_cache_usage": ("engine.kv_cache_usage", "share of KV-cache blocks in use (0-1)"),
    "requests_waiting": ("engine.requests_waiting", "requests queued in the engine"),
    "requests_running": ("engine.requests_running", "requests being decoded"),
    "preemptions_per_s": (
        "engine.preemptions_per_s",
        "KV-cache preemptions (swaps/recomputes) per s",
    ),
    "prefix_cache_hit_rate": ("engine.prefix_cache_hit_rate", "prefix-cache hits / queries"),
    "concurrency": ("workload.concurrency", "streams in flight"),
    "prompt_length": ("workload.prompt_length", "prompt tokens per request"),
    "prefix_length": ("workload.prefix_length", "shared system-prompt tokens per request"),
}
