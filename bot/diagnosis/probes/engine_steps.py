"""What the engine's scheduler did over a sampled window: the readings that name causes.

vLLM v1 exposes how many tokens each scheduler step carried (``vllm:iteration_tokens_total``),
why requests wait (``vllm:num_requests_waiting_by_reason``), how many it refused
(``vllm:admission_rejections_total``), how much of each prompt the prefix cache served, and what a
request's time to first token was made of (queue time, prefill time). Each is read from the same
first and last scrapes as the window's other numbers (on merged fleet pages, counters and buckets
are sums, so the readings are the fleet's). A metric the engine lacks reads as None, never 0.

Step sizes are known only to their histogram bucket: the largest step is a span of whole tokens
(lower edge + 1 .. upper edge), a bound in the first or the +Inf bucket. Never clamped.

A bucket is not always a step. vLLM (``vllm/v1/metrics/stats.py``) observes, per iteration, the
tokens generated plus the prompt tokens computed, and credits a request's whole uncached prompt
to the iteration its prefill completes in: with chunked prefill (vLLM V1's default) a
6,000-token prompt prefilled 256 tokens a step reads as one "4,097-8,192-token step". So the
largest step is bounded by the engine's step budget (``--max-num-batched-tokens``, the target's
``step_budget``), and a bucket wholly above the budget reads "at most the budget". Without the
budget the reading is the histogram's, and ``step_budget`` reads unknown: a hypothesis that
needs a real step size tests ``step_budget`` too, and says "cannot tell" without it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from bot.diagnosis.probes.exposition import Exposition
from bot.diagnosis.probes.vllm_metrics import counter_delta
from bot.kernel.numbers import Bound, Measured, Reading

STEP_TOKENS = ("vllm:iteration_tokens_total",)
RUNNING, WAITING = ("vllm:num_requests_running",), ("vllm:num_requests_waiting",)
TTFT = ("vllm:time_to_first_token_seconds",)
WAITING_BY_REASON = ("vllm:num_requests_waiting_by_reason",)
REJECTIONS = ("vllm:admission_rejections_total",)
PROMPT_CACHED = ("vllm:prompt_tokens_cached_total",)
PROMPT_BY_SOURCE = ("vllm:prompt_tokens_by_source_total",)
QUEUE_TIME = ("vllm:request_queue_time_seconds",)
PREFILL_TIME = ("vllm:request_prefill_time_seconds",)
STEP_METRICS = frozenset(
    (*STEP_TOKENS, *WAITING_BY_REASON, *REJECTIONS, *PROMPT_CACHED, *PROMPT_BY_SOURCE,
     *QUEUE_TIME, *PREFILL_TIME)
)  # fmt: skip

STEP_READINGS = {
    "max_step_tokens": "largest scheduler step of the window, tokens (to its histogram bucket, "
    "at most the step budget: above it, a chunked prompt's credit)",
    "step_budget": "the engine's --max-num-batched-tokens as configured (the target's "
    "step_budget): the most tokens one step carries; unknown when not configured",
    "prefill_step_share": "share of scheduler steps that surely carried prefill: more tokens "
    "than every request that could have been decoding in the window (a lower bound)",
    "queue_ttft_share": "of the requests that finished: queue time's share of queue + prefill",
    "prefill_ttft_share": "of the requests that finished: prefill time's share of queue + prefill",
    "waiting_capacity": "peak requests waiting for scheduling capacity (KV blocks or a free "
    "sequence slot)",
    "rejections_per_s": "requests the engine refused at admission, per second",
    "cached_prompt_share": "share of the window's prompt tokens the prefix cache served",
}


def read_steps(
    pages: Sequence[Exposition], decode_bound: float | None, step_budget: int | None = None
) -> Measured:
    """Every step reading of the window whose first and last scrapes are ``pages[0]`` and
    ``pages[-1]`` (the scrapes between give the waiting peak); ``decode_bound`` is the most
    tokens a step of decode alone can carry (``decode_bound()``); ``step_budget`` the engine's
    --max-num-batched-tokens, None when unknown."""
    before, after = pages[0], pages[-1]
    duration = max(after.at - before.at, 1e-9)
    steps = _step_delta(before, after)
    queue_share = _queue_share(before, after)
    plain = Measured.of(
        {
            "queue_ttft_share": queue_share,
            "prefill_ttft_share": None if queue_share is None else 1.0 - queue_share,
            "waiting_capacity": _peak_waiting(pages[1:] or pages, "capacity"),
            "rejections_per_s": _per_s(counter_delta(before, after, REJECTIONS), duration),
            "cached_prompt_share": _ratio(
                counter_delta(before, after, PROMPT_CACHED),
                counter_delta(before, after, PROMPT_BY_SOURCE),
            ),
        }
    )
    return plain | Measured(
        {
            "max_step_tokens": _largest_step(steps, step_budget) if steps else None,
            "step_budget": None if step_budget is None else Reading(float(step_budget)),
            "prefill_step_share": _prefill_share(steps, decode_bound) if steps else None,
        }
    )


def _step_delta(before: Exposition, after: Exposition) -> dict[float, float]:
    """The window's steps per bucket (cumulative counts by upper edge); {} when none or absent."""
    name = STEP_TOKENS[0]
    b0, b1 = before.buckets(name), after.buckets(name)
    delta = {le: max(c - b0.get(le, 0.0), 0.0) for le, c in b1.items()}
    return delta if delta and max(delta.values()) > 0 else {}


def _largest_step(steps: Mapping[float, float], budget: int | None = None) -> Reading:
    """The bucket of the largest step: the first edge whose cumulative count is the total;
    bounded by ``budget`` (a bucket above it holds chunked prompts' credit, not steps)."""
    edges = sorted(steps)
    total = steps[edges[-1]]
    top = next(i for i, le in enumerate(edges) if steps[le] >= total)
    low = 0.0 if top == 0 else math.floor(edges[top - 1]) + 1.0
    if budget is not None and low > budget:
        return Reading(float(budget), Bound.AT_MOST)
    if top == 0:
        return Reading(edges[0], Bound.AT_MOST)
    if math.isinf(edges[top]):
        return Reading(edges[top - 1], Bound.MORE_THAN)
    high = edges[top] if budget is None else min(edges[top], float(budget))
    return Reading(high, span=(low, high) if high > low else None)


def decode_bound(before: Exposition, after: Exposition) -> float | None:
    """The most requests that can have decoded in one step of the window: those running or
    queued (perhaps preempted) at its start, plus those that had their first token in it. One
    token each: a bigger step surely carried prefill. None without the gauges."""
    running = before.total(RUNNING[0])
    started = counter_delta(before, after, (f"{TTFT[0]}_count",))
    if running is None or started is None:
        return None
    return running + (before.total(WAITING[0]) or 0.0) + started


def _prefill_share(steps: Mapping[float, float], running_peak: float | None) -> Reading | None:
    """Steps with more tokens than ``running_peak`` (the decode bound) over all steps: those
    in buckets wholly above it surely, those in the bucket it falls inside perhaps (the span)."""
    if running_peak is None:
        return None
    edges = sorted(steps)
    total = steps[edges[-1]]
    # cumulative counts: steps of at most the last edge <= R, of at most the first edge >= R
    surely_small = max((steps[le] for le in edges if le <= running_peak), default=0.0)
    maybe_small = min(steps[le] for le in edges if le >= running_peak)
    low, high = (total - maybe_small) / total, (total - surely_small) / total
    return Reading((low + high) / 2, span=(low, high) if high > low else None)


def _queue_share(before: Exposition, after: Exposition) -> float | None:
    """Mean queue time over mean queue + prefill time, of the requests that finished."""
    queue, prefill = _mean(before, after, QUEUE_TIME[0]), _mean(before, after, PREFILL_TIME[0])
    if queue is None or prefill is None or queue + prefill <= 0:
        return None
    return queue / (queue + prefill)


def _mean(before: Exposition, after: Exposition, histogram: str) -> float | None:
    """The mean observation a histogram gained in the window; None when it gained none."""
    count = counter_delta(before, after, (f"{histogram}_count",))
    total = counter_delta(before, after, (f"{histogram}_sum",))
    if not count or total is None:
        return None
    return total / count


def _peak_waiting(pages: Sequence[Exposition], reason: str) -> float | None:
    """The most requests waiting for ``reason`` at any scrape (pages without the gauge, such as
    a merged round a replica missed, say nothing)."""
    name = WAITING_BY_REASON[0]
    values = [v for p in pages if (v := p.total(name, where={"reason": reason})) is not None]
    return max(values) if values else None


def _per_s(count: float | None, duration: float) -> float | None:
    return None if count is None else count / duration


def _ratio(part: float | None, whole: float | None) -> float | None:
    return None if part is None or not whole else part / whole
