"""What the engine saw of one bench round, and when the round's first wave was sent.

For bench/gateway_bench.py: ``engine_view`` diffs two scrapes of vLLM's /metrics (its own
TTFT and queue-time histograms, and ``vllm:iteration_tokens_total``: tokens per engine step,
so the number of steps and how big they were); ``Arrivals`` records, through aiohttp's trace
hooks, when each request's head was written to the socket (on a direct path that is when it
reached vLLM's socket; through a proxy, when it reached the proxy), so that the spread of the
first wave is printed per path. ``stream_to_end`` is the canary's streaming request read to
the body's end, so that no path loses its kept-alive connections (see there).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace

import aiohttp

from bot.canary.client import Outcome, RequestRecord, _handle_event
from bot.diagnosis.probes.exposition import Exposition
from bot.kernel.numbers.histogram import histogram_quantile
from bot.kernel.runtime.sse import SSEParser

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
    for key, name in (("eng_ttft", TTFT), ("eng_queue", QUEUE), ("eng_prefill", PREFILL)):
        _, n = _delta(before, after, name)
        sums = (after.total(f"{name}_sum") or 0.0) - (before.total(f"{name}_sum") or 0.0)
        out[f"{key}_mean"] = sums / n * 1000 if n else -1.0
    out["eng_steps"] = count
    out["eng_tokens_per_step"] = total / count if count else 0.0
    lower = 0.0
    for le, c in sorted(steps.items()):  # steps by size: tokens in (previous edge, le]
        out[f"eng_steps_le_{le:g}"] = c - lower
        lower = c
    return out


class Arrivals:
    """When each request's head went out (wall clock), by its ``x-trace-id`` header (its seq).

    Also counts the connections the session opened (``new``), so a round says whether its wave
    went out on kept-alive connections.
    """

    def __init__(self) -> None:
        self.sent: dict[int, float] = {}
        self.new = 0
        self.config = aiohttp.TraceConfig()
        self.config.on_request_start.append(self._start)
        self.config.on_request_headers_sent.append(self._headers_sent)
        self.config.on_connection_create_end.append(self._new)

    async def _start(self, _s: object, ctx: SimpleNamespace, params: object) -> None:
        ctx.seq = params.headers.get("x-trace-id")  # type: ignore[attr-defined]

    async def _headers_sent(self, _s: object, ctx: SimpleNamespace, _p: object) -> None:
        seq = getattr(ctx, "seq", None)
        if seq is not None:
            self.sent.setdefault(int(seq), time.time())

    async def _new(self, _s: object, _c: SimpleNamespace, _p: object) -> None:
        self.new += 1


def spread(key: str, sent: dict[int, float], started: float, first: int) -> dict[str, float]:
    """ms after ``started`` at which the first ``first`` requests went out: first/p50/last."""
    at = sorted((t - started) * 1000 for s, t in sent.items() if s < first)
    if not at:
        return {}
    return {f"{key}_first_ms": at[0], f"{key}_p50_ms": at[len(at) // 2], f"{key}_last_ms": at[-1]}


def upstream_writes(hooks: Path) -> dict[int, float]:
    """The gateway's ``upstream_write`` stamps (_gateway_trace_hooks.py) by request seq."""
    out: dict[int, float] = {}
    for line in hooks.read_text().splitlines():
        hop, ns, *rest = line.split()
        if hop == "upstream_write" and rest and rest[0].isdigit():
            out.setdefault(int(rest[0]), int(ns) / 1e9)
    return out


async def stream_to_end(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, object],
    record: RequestRecord,
    *,
    headers: dict[str, str] | None = None,
    timeout_s: float = 600,
) -> None:
    """The canary's request and accounting (its event handler), but read to the body's end.

    The canary's client leaves the response at ``[DONE]``; vLLM writes the chunked body's end
    in a write of its own after that event, so aiohttp often finds the response unfinished and
    closes the connection (about one request in three straight to vLLM on this box; never
    through the gateway, which ends the body in the same write as ``[DONE]``). Read to the end,
    every path keeps its connection, and the next request on it opens none.
    """
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url, json=body, headers=headers) as response:
                if response.status != 200:
                    await response.read()
                    record.outcome, record.cause = Outcome.FAILED, f"HTTP {response.status}"
                    record.error = record.cause
                    record.finished_at = time.perf_counter()
                    return
                parser, done = SSEParser(), False
                async for data in response.content.iter_any():
                    now = time.perf_counter()
                    for event in parser.feed(data):
                        if not done and _handle_event(event.data, record, now):
                            done, record.finished_at = True, now
        record.outcome = Outcome.OK if done else Outcome.FAILED
        record.error = None if done else "the stream ended without [DONE]"
    except (TimeoutError, aiohttp.ClientError) as exc:
        record.finished_at = time.perf_counter()
        record.outcome, record.error, record.cause = Outcome.FAILED, repr(exc), "transport"
