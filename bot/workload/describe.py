"""A workload shape in one line a person reads: the line an ADR's Context section carries.

"Measured at prompt p50 512 / p99 2,048 tokens, output p50 128 tokens, 30.0 % prefix-cache hits,
4 req/s, 8 concurrent." Every number is written by ``bot.numbers.text.show``, a quantile that is
only a bound with its sign ("≤ 10 tokens", "> 10,000 tokens"). The quantiles are the shape's
own, interpolated inside vLLM's 1-2-5 buckets (docs/workload.md): a canary's fixed 2,048-token
prompt, all in the 2,000-5,000 bucket, reads as "p50 3,500".
"""

from __future__ import annotations

from bot.numbers.text import show
from bot.workload.shape import Lengths, WorkloadShape

PREFIX = "Measured at "


def _quantile(lengths: Lengths, name: str) -> str:
    return f"{name} {show('tokens', getattr(lengths, name), lengths.bounds.get(name))}"


def _lengths(lengths: Lengths, names: tuple[str, ...]) -> str:
    return " / ".join(_quantile(lengths, name) for name in names) + " tokens"


def _prefix(shape: WorkloadShape) -> str | None:
    """Declared prefix groups when there are any, else the measured prefix-cache hit rate."""
    groups = shape.prefix.groups
    if groups:
        return ", ".join(
            f"{show('prefix_share', g.share)} sharing a {show('tokens', g.length)}-token prefix"
            for g in groups
        )
    if shape.prefix.hit_rate is not None:
        return f"{show('hit_rate', shape.prefix.hit_rate)} prefix-cache hits"
    return None  # not measured: nothing is said rather than a guess


def _arrivals(shape: WorkloadShape) -> str:
    arrivals = shape.arrivals
    rate = f"{show('tokens', arrivals.request_rate)} req/s"
    if arrivals.replicas > 1 or arrivals.per == "fleet":  # one replica's is the plain rate
        rate += f" {arrivals.basis}"
    if arrivals.concurrency is None:
        return rate
    return f"{rate}, {show('tokens', arrivals.concurrency)} concurrent"


def context_line(shape: WorkloadShape) -> str:
    """The shape as the one sentence an ADR's Context section says it was measured under."""
    parts = [
        f"prompt {_lengths(shape.prompt_tokens, ('p50', 'p99'))}",
        f"output {_lengths(shape.output_tokens, ('p50',))}",
    ]
    if (prefix := _prefix(shape)) is not None:
        parts.append(prefix)
    parts.append(_arrivals(shape))
    return PREFIX + ", ".join(parts) + "."
