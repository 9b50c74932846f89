"""A workload shape in one line a person reads: the line an ADR's Context section carries.

"Measured at prompt p50 500–1,000 / p99 2,000–5,000 tokens, output p50 100–200 tokens, 30.0 %
prefix-cache hits, 4 req/s, 8 concurrent." A length quantile is written as the bucket of vLLM's
histogram it fell in (``TokenRange.text``, docs/workload.md): a canary's fixed 2,048-token
prompt reads "p50 2,000–5,000", never a point interpolated inside the bucket; one in the first
bucket reads "≤ 1", one in the +Inf bucket "> 10,000". Other numbers are written by
``bot.kernel.numbers.text.show``.
"""

from __future__ import annotations

from collections.abc import Callable

from bot.adr.workload.shape import Lengths, WorkloadShape
from bot.kernel.numbers import show

PREFIX = "Measured at "
Point = Callable[[Lengths, str], str]  # how one quantile is written


def _lengths(lengths: Lengths, names: tuple[str, ...], point: Point) -> str:
    return " / ".join(f"{name} {point(lengths, name)}" for name in names) + " tokens"


def _bucket(lengths: Lengths, name: str) -> str:
    return lengths.quantile(name).text()


def _interpolated(lengths: Lengths, name: str) -> str:
    return show("tokens", getattr(lengths, name), lengths.bounds.get(name))


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
    return _line(shape, _bucket)


def earlier_context_line(shape: WorkloadShape) -> str:
    """The line an earlier ruleloop wrote for ``shape`` (interpolated points, "p50 3,064"):
    only to recognise it in an ADR written then, so it is not kept beside the new one."""
    return _line(shape, _interpolated)


def _line(shape: WorkloadShape, point: Point) -> str:
    parts = [
        f"prompt {_lengths(shape.prompt_tokens, ('p50', 'p99'), point)}",
        f"output {_lengths(shape.output_tokens, ('p50',), point)}",
    ]
    if (prefix := _prefix(shape)) is not None:
        parts.append(prefix)
    parts.append(_arrivals(shape))
    return PREFIX + ", ".join(parts) + "."
