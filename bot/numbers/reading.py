"""A number that knows what it is: its value, where it was measured, and whether it is a bound.

vLLM's latency histograms know a quantile only to its bucket. One that falls in the first bucket
is only known to be at most that bucket's edge (TPOT's first bucket ends at 10 ms, so a fast
engine's "9.9 ms" is "<= 10 ms"); one in the `+Inf` bucket only to be more than the last finite
edge. Such a number is a bound everywhere it goes: in JSON (a ``bounds`` map beside the numbers,
"<=" or ">"), on every surface ("≤ 10.0 ms"), and in every comparison, which it decides only
where the bound decides it (``compare``): otherwise the comparison is undecided, never a guess.
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


@dataclass(frozen=True)
class Reading:
    """One number: ``value`` (for a bound, the bound's edge), its bound, if it is one."""

    value: float
    bound: Bound | None = None

    def interval(self) -> tuple[float, float]:
        """The values it may be: a point, [0, edge] or [edge, inf]."""
        if self.bound is Bound.AT_MOST:
            return (min(0.0, self.value), self.value)
        if self.bound is Bound.MORE_THAN:
            return (self.value, math.inf)
        return (self.value, self.value)

    def times(self, factor: float) -> Reading:
        """``factor`` times this number (a multiple of a bound is a bound)."""
        return Reading(self.value * factor, self.bound)


@dataclass(frozen=True)
class Measured:
    """Numbers by metric (None: not measured), and which of them are only bounds."""

    numbers: Mapping[str, float | None]
    bounds: Bounds = field(default_factory=dict)

    def reading(self, key: str) -> Reading | None:
        """One number with its bound; None when not measured."""
        value = self.numbers.get(key)
        return None if value is None else Reading(value, self.bounds.get(key))


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

    Two known numbers compare as numbers. With a bound on either side the comparison holds
    only if it holds for every value the bounds allow, fails only if it fails for every one.
    """
    if value.bound is None and limit.bound is None:
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
