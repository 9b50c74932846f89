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
from typing import TypedDict


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
    """Readings by name: each one a ``Reading``, or None where it was looked for and not
    measured. The one way a set of numbers travels (a probe's, a runbook's, a diagnosis's
    headline, a target's normal); JSON keeps it as three maps (``json``, ``from_json``)."""

    readings: Mapping[str, Reading | None] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        numbers: Mapping[str, float | None],
        bounds: Bounds | None = None,
        spans: Spans | None = None,
    ) -> Measured:
        """From a map of numbers and, beside it, the bounds and spans of those that have them."""
        bounds, spans = bounds or {}, spans or {}
        return cls(
            {
                k: None if v is None else Reading(v, bounds.get(k), spans.get(k))
                for k, v in numbers.items()
            }
        )

    @classmethod
    def from_json(cls, numbers: object, bounds: object = None, spans: object = None) -> Measured:
        """Numbers stored as JSON (a diagnosis summary's ``headline`` with its ``bounds`` and
        ``spans``); what is not a number is not measured."""
        plain = {
            str(k): float(v)
            for k, v in (numbers.items() if isinstance(numbers, Mapping) else ())
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        return cls.of(plain, bounds_of(bounds), spans_of(spans))

    def json(self) -> MeasuredJson:
        """The three maps JSON keeps: numbers (null: not measured; NaN and infinity, which
        JSON has not, too), the bounds ("<=", ">") and the spans ([low, high])."""
        numbers = {k: None if r is None or not math.isfinite(r.value) else r.value
                   for k, r in self.readings.items()}  # fmt: skip
        return MeasuredJson(
            numbers=numbers,
            bounds={k: str(r.bound) for k, r in self.readings.items() if r and r.bound},
            spans={k: list(r.span) for k, r in self.readings.items() if r and r.span},
        )

    def reading(self, key: str) -> Reading | None:
        """One number with its bound or span; None when not measured."""
        return self.readings.get(key)

    def value(self, key: str) -> float | None:
        """One number's value (a bound's edge); None when not measured."""
        found = self.readings.get(key)
        return None if found is None else found.value

    @property
    def numbers(self) -> dict[str, float | None]:
        """The values by name (None: not measured), for what reads plain numbers."""
        return {k: None if r is None else r.value for k, r in self.readings.items()}

    def pick(self, names: Mapping[str, str]) -> Measured:
        """Readings renamed: ``names`` maps a new name to the name it reads here (those not
        here are left out)."""
        return Measured({new: self.readings[old] for new, old in names.items()
                         if old in self.readings})  # fmt: skip

    def under(self, prefix: str) -> Measured:
        """Every reading named ``prefix.name`` (a runbook names a probe's readings so)."""
        return Measured({f"{prefix}.{k}": r for k, r in self.readings.items()})

    def __or__(self, other: Measured) -> Measured:
        """Both sets of readings; ``other``'s win where both have one."""
        return Measured({**self.readings, **other.readings})


class MeasuredJson(TypedDict):
    """``Measured`` as JSON keeps it: three maps by name."""

    numbers: dict[str, float | None]
    bounds: dict[str, str]
    spans: dict[str, list[float]]


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

    def reading(self) -> Reading | None:
        """The estimate as a reading (its span, where it has one); None when unknown."""
        if self.value is None:
            return None
        if self.low is None or self.high is None or not self.high > self.low:
            return Reading(self.value)
        return Reading(self.value, span=(self.low, self.high))


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
