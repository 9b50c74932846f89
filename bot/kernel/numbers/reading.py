"""A number that knows what it is: its value, where it was measured, and whether it is a bound.

vLLM's latency histograms know a quantile only to its bucket. One that falls in the first bucket
is only known to be at most that bucket's edge (TPOT's first bucket ends at 10 ms, so a fast
engine's "9.9 ms" is "<= 10 ms"); one in the `+Inf` bucket only to be more than the last finite
edge. Such a number is a bound everywhere it goes: in JSON (a ``bounds`` map beside the numbers,
"<=" or ">"), on every surface ("≤ 10.0 ms"), and in every comparison, which it decides only
where the bound decides it (``compare``): otherwise the comparison is undecided, never a guess.

A passive estimate (KV fragmentation from the gauges, goodput with requests in flight) is known
only within a span [low, high]; it travels as a ``spans`` map beside the numbers, reads
"12.0 % (0.0–24.0 %)" on every surface, and decides a comparison only where the whole span does.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class Bound(StrEnum):
    """How a bounded number relates to its value."""

    AT_MOST = "<="  # the quantile fell in the histogram's first bucket
    MORE_THAN = ">"  # it fell in the +Inf bucket


class Source(StrEnum):
    """Where a number was measured: like is compared only with like."""

    CLIENT = "client"  # the canary's own clock, request by request
    ENGINE = "engine"  # the engine's histograms over a window (two scrapes)
    ESTIMATE = "estimate"  # a passive estimate with stated assumptions


# metric -> bound, beside a mapping of numbers (JSON: {"tpot_p99_ms": "<="})
Bounds = Mapping[str, Bound]
# metric -> (low, high) of an estimate, beside a mapping of numbers (JSON: [low, high])
Spans = Mapping[str, tuple[float, float]]


@dataclass(frozen=True)
class Reading:
    """One number: ``value`` (for a bound, the bound's edge), its bound, if it is one, and the
    span an estimate lies in, if it is one."""

    value: float
    bound: Bound | None = None
    span: tuple[float, float] | None = None

    @property
    def exact(self) -> bool:
        """A measured number, neither a bound nor an estimate's span."""
        return self.bound is None and self.span is None

    def interval(self) -> tuple[float, float]:
        """The values it may be: a point, [0, edge], [edge, inf] or an estimate's span."""
        if self.span is not None:
            return self.span
        if self.bound is Bound.AT_MOST:
            return (min(0.0, self.value), self.value)
        if self.bound is Bound.MORE_THAN:
            return (self.value, math.inf)
        return (self.value, self.value)


@dataclass(frozen=True)
class Measured:
    """Numbers by metric (None: not measured), which of them are only bounds, and the spans of
    those that are estimates."""

    numbers: Mapping[str, float | None]
    bounds: Bounds = field(default_factory=dict)
    spans: Spans = field(default_factory=dict)

    @classmethod
    def from_json(cls, numbers: object, bounds: object = None, spans: object = None) -> Measured:
        """Numbers stored as JSON (a diagnosis summary's ``headline`` with its ``bounds`` and
        ``spans``); what is not a number is not measured."""
        plain = {
            str(k): float(v)
            for k, v in (numbers.items() if isinstance(numbers, Mapping) else ())
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        return cls(plain, bounds_of(bounds), spans_of(spans))

    def reading(self, key: str) -> Reading | None:
        """One number with its bound or span; None when not measured."""
        value = self.numbers.get(key)
        if value is None:
            return None
        return Reading(value, self.bounds.get(key), self.spans.get(key))


@dataclass(frozen=True)
class Estimate:
    """A number known only within bounds (a passive estimate from gauges): the value (None: it
    cannot be said), the bounds under the stated assumptions, and how it was read or why not.
    Never clamped: a value outside what it can be is unknown, not 0 or 100 %."""

    value: float | None
    low: float | None
    high: float | None
    basis: str

    @classmethod
    def unknown(cls, reason: str) -> Estimate:
        """Nothing can be said, for this reason."""
        return cls(None, None, None, reason)


def spans_of(raw: object) -> dict[str, tuple[float, float]]:
    """A ``spans`` map read back from JSON ({metric: [low, high]}); malformed entries dropped."""
    if not isinstance(raw, Mapping):
        return {}
    out = {}
    for key, value in raw.items():
        if not isinstance(value, list | tuple) or len(value) != 2:
            continue
        low, high = value
        numbers = all(isinstance(x, int | float) and not isinstance(x, bool) for x in value)
        if numbers and math.isfinite(low) and math.isfinite(high) and low <= high:
            out[str(key)] = (float(low), float(high))
    return out


def spans_json(spans: Spans) -> dict[str, list[float]]:
    """A ``spans`` map as JSON."""
    return {k: [low, high] for k, (low, high) in spans.items()}


def bounds_of(raw: object) -> dict[str, Bound]:
    """A ``bounds`` map read back from JSON; unknown entries are dropped."""
    if not isinstance(raw, Mapping):
        return {}
    out = {}
    for key, value in raw.items():
        try:
            out[str(key)] = Bound(value)
        except ValueError:
            continue
    return out


_ALL: dict[str, Callable[[tuple[float, float], tuple[float, float]], bool]] = {
    "<": lambda v, lim: v[1] < lim[0],
    "<=": lambda v, lim: v[1] <= lim[0],
    ">": lambda v, lim: v[0] > lim[1],
    ">=": lambda v, lim: v[0] >= lim[1],
}
# The comparison operators a condition may use ({metric, op, value}: no expressions).
OPS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}
_NEGATION = {"<": ">=", "<=": ">", ">": "<=", ">=": "<"}


def compare(value: Reading, op: str, limit: Reading) -> bool | None:
    """Whether ``value op limit`` holds: True or False where the bounds decide it, else None.

    Two known numbers compare as numbers. With a bound or a span on either side it holds
    only if it holds for every value the bounds allow, fails only if it fails for every one.
    """
    if value.exact and limit.exact:
        return bool(OPS[op](value.value, limit.value))
    v, lim = value.interval(), limit.interval()
    if op in ("==", "!="):
        disjoint = v[1] < lim[0] or lim[1] < v[0]
        return (op == "!=") if disjoint else None
    if _ALL[op](v, lim):
        return True
    if _ALL[_NEGATION[op]](v, lim):
        return False
    return None
