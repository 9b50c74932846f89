"""Test helpers for workload shapes: vLLM /metrics pages as text, and shapes from known lengths.

``vllm_page`` writes the metric families a capture reads, in the format vLLM 0.32 writes them
(tests/fixtures/vllm-0.32.0/*.prom): cumulative since the engine started, so a test builds a
window from the requests finished before it and those finished in it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import UTC, datetime

from bot.adr.workload.shape import Arrivals, Lengths, Prefix, WorkloadShape, new_shape

VLLM_EDGES = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
LABELS = 'engine="0",model_name="tiny-llama"'
CAPTURED_AT = datetime(2026, 9, 1, 12, 0, tzinfo=UTC)


def _histogram(name: str, values: Sequence[int]) -> list[str]:
    lines = [f"# HELP {name} Number of tokens per finished request.", f"# TYPE {name} histogram"]
    for edge in VLLM_EDGES:
        count = sum(1 for v in values if v <= edge)
        lines.append(
            f'{name}_bucket{{engine="0",le="{float(edge)}",model_name="tiny-llama"}} {float(count)}'
        )
    lines.append(
        f'{name}_bucket{{engine="0",le="+Inf",model_name="tiny-llama"}} {float(len(values))}'
    )
    lines.append(f"{name}_count{{{LABELS}}} {float(len(values))}")
    lines.append(f"{name}_sum{{{LABELS}}} {float(sum(values))}")
    return lines


def vllm_page(
    *,
    prompts: Sequence[int],
    outputs: Sequence[int] | None = None,
    running: float = 0.0,
    hits: float = 0.0,
    queries: float = 0.0,
    completions: int | None = None,
    chats: int = 0,
) -> str:
    """A vLLM page after these requests finished (lengths in tokens), with these counters."""
    outputs = list(outputs) if outputs is not None else [16] * len(prompts)
    completions = len(prompts) - chats if completions is None else completions
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{LABELS}}} {float(running)}",
        "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of tokens.",
        "# TYPE vllm:prefix_cache_queries_total counter",
        f"vllm:prefix_cache_queries_total{{{LABELS}}} {float(queries)}",
        "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of tokens.",
        "# TYPE vllm:prefix_cache_hits_total counter",
        f"vllm:prefix_cache_hits_total{{{LABELS}}} {float(hits)}",
        "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
        "# TYPE vllm:prompt_tokens_total counter",
        f"vllm:prompt_tokens_total{{{LABELS}}} {float(sum(prompts))}",
        "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{{{LABELS}}} {float(sum(outputs))}",
        "# HELP vllm:request_success_total Count of successfully processed requests.",
        "# TYPE vllm:request_success_total counter",
        f'vllm:request_success_total{{engine="0",finished_reason="length",model_name="tiny-llama"}} {float(len(prompts))}',
        *_histogram("vllm:request_prompt_tokens", prompts),
        *_histogram("vllm:request_generation_tokens", outputs),
        "# HELP http_requests_total Total number of requests by method, status and handler.",
        "# TYPE http_requests_total counter",
        f'http_requests_total{{handler="/v1/completions",method="POST",status="2xx"}} {float(completions)}',
        f'http_requests_total{{handler="/v1/chat/completions",method="POST",status="2xx"}} {float(chats)}',
        'http_requests_total{handler="/v1/models",method="GET",status="2xx"} 2.0',
    ]
    return "\n".join(lines) + "\n"


def lengths(values: Sequence[int]) -> Lengths:
    """The Lengths vLLM's histogram would give for these request lengths."""
    cumulative = {float(e): float(sum(1 for v in values if v <= e)) for e in VLLM_EDGES}
    cumulative[float("inf")] = float(len(values))
    return Lengths.from_cumulative(cumulative, total=float(sum(values)))


def shape(
    prompts: Sequence[int],
    outputs: Sequence[int],
    *,
    rate: float = 4.0,
    hit_rate: float | None = 0.3,
    source: str = "file",
) -> WorkloadShape:
    """A shape of requests with these lengths."""
    return new_shape(
        source=source,
        captured_at=CAPTURED_AT,
        api="completions",
        prompt_tokens=lengths(prompts),
        output_tokens=lengths(outputs),
        prefix=Prefix(hit_rate=hit_rate),
        arrivals=Arrivals(request_rate=rate, concurrency=8.0),
    )


def long_system_prompt(n: int = 200, seed: int = 1) -> WorkloadShape:
    """Agents behind one long system prompt: prompts of 2,100-3,900 tokens (p50 ~3,000; the
    histogram's p50 is 3,500, the middle of vLLM's 2,000-5,000 bucket)."""
    rng = random.Random(seed)
    return shape(
        [rng.randint(2100, 3900) for _ in range(n)], [rng.randint(50, 400) for _ in range(n)]
    )


def chat(n: int = 200, seed: int = 2) -> WorkloadShape:
    """Chat turns: prompts of 64-192 tokens (p50 ~128)."""
    rng = random.Random(seed)
    return shape([rng.randint(64, 192) for _ in range(n)], [rng.randint(50, 400) for _ in range(n)])


def with_process(page: str, started: float) -> str:
    """The page as served by the process that started at ``started`` (seconds since the epoch):
    prometheus_client's process collector, which names the engine process (engine_identity)."""
    return page + (
        "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n"
        "# TYPE process_start_time_seconds gauge\n"
        f"process_start_time_seconds {started!r}\n"
    )
