"""Compare two workload shapes dimension by dimension, and say which drifted.

Each dimension has a distance and a documented threshold (the constants below); a dimension
drifted when its distance is over the threshold. docs/workload.md explains the choices.

- prompt and output lengths, the distribution: the Kolmogorov–Smirnov distance over the bucket
  edges both shapes have, i.e. the largest gap between the shares of requests at or below an
  edge. Over buckets this is a lower bound of the KS distance of the lengths themselves.
- prompt and output lengths, p50 and p99: the ratio new / old, drifted when it is over
  ``RATIO_LIMIT`` either way. A quantile that is only a bound (first or +Inf bucket) makes the
  ratio a bound, which decides only when the bound does (``bot.numbers.reading.compare``);
  otherwise the dimension is undecided and does not count as drifted.
- prefix-cache hit rate: the absolute difference in points.
- request rate: the relative change against the old rate. Two shapes read over different
  replica counts (or one per replica, one summed over a fleet) compare each replica's rate
  (a fleet's divided by its replicas), and the line says so: the same traffic spread over
  more replicas by an autoscaler is not drift.

A dimension one of the shapes does not know (no hit rate, no shared edges) is "not compared".
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from bot.numbers.reading import Bound, Reading, compare
from bot.numbers.text import in_unit, show
from bot.workload.shape import Arrivals, Lengths, WorkloadShape

# The thresholds: over them, a dimension drifted (docs/workload.md says why each).
KS_LIMIT = 0.2  # largest gap in the share of requests at or below some length
RATIO_LIMIT = 2.0  # p50 or p99 new / old, either way
HIT_RATE_LIMIT = 0.20  # prefix-cache hit rate, absolute (20 points)
RATE_LIMIT = 0.5  # request rate, relative to the old one (50 %)
KS_NOISE = 1.36  # the two-sample KS critical value at 95 %: 1.36 * sqrt((n + m) / (n m))

DRIFTED, ALIKE = "DRIFTED", "alike"


@dataclass(frozen=True)
class Dimension:
    """One dimension of a diff: what was compared, its distance, the threshold, the verdict.

    ``old``/``new``: the compared values (for a distribution, the share of requests at or below
    ``edge``, where the gap is largest). ``decided``: False when the numbers cannot tell (bounds
    on both sides, or a value one shape lacks); such a dimension never counts as drifted.
    """

    name: str
    label: str
    old: float | None
    new: float | None
    distance: float | None
    threshold: float
    drifted: bool
    decided: bool
    line: str
    old_bound: Bound | None = None
    new_bound: Bound | None = None
    edge: float | None = None

    def as_dict(self) -> dict[str, object]:
        """Plain dict for JSON (bounds as '<=' or '>', an infinite edge as '+Inf')."""
        data = asdict(self)
        data["old_bound"] = None if self.old_bound is None else str(self.old_bound)
        data["new_bound"] = None if self.new_bound is None else str(self.new_bound)
        return data


@dataclass(frozen=True)
class ShapeDiff:
    """All dimensions of a diff; it drifted when any one did."""

    dimensions: tuple[Dimension, ...]

    @property
    def drifted(self) -> bool:
        """Whether any dimension drifted."""
        return any(d.drifted for d in self.dimensions)

    def lines(self) -> list[str]:
        """One line per dimension, for a person."""
        return [d.line for d in self.dimensions]

    def as_dict(self) -> dict[str, object]:
        """The structured result, for --json."""
        return {
            "drifted": self.drifted,
            "drifted_dimensions": [d.name for d in self.dimensions if d.drifted],
            "thresholds": {
                "ks": KS_LIMIT,
                "quantile_ratio": RATIO_LIMIT,
                "hit_rate_points": HIT_RATE_LIMIT,
                "request_rate_relative": RATE_LIMIT,
            },
            "dimensions": [d.as_dict() for d in self.dimensions],
        }


def diff(old: WorkloadShape, new: WorkloadShape) -> ShapeDiff:
    """Every dimension of ``new`` against ``old``."""
    dims: list[Dimension] = []
    for key, label, a, b in (
        ("prompt_tokens", "prompt tokens", old.prompt_tokens, new.prompt_tokens),
        ("output_tokens", "output tokens", old.output_tokens, new.output_tokens),
    ):
        dims.append(distribution(key, label, a, b))
        dims.extend(quantile_ratio(key, label, q, a, b) for q in ("p50", "p99"))
    dims.append(hit_rate(old.prefix.hit_rate, new.prefix.hit_rate))
    dims.append(arrivals_rate(old.arrivals, new.arrivals))
    return ShapeDiff(tuple(dims))


def arrivals_rate(old: Arrivals, new: Arrivals) -> Dimension:
    """The request rate like for like: as read when both were read alike (same replicas, same
    basis), else each replica's rate."""
    if (old.replicas, old.per) == (new.replicas, new.per):
        basis = "" if old.replicas == 1 else f" ({old.basis})"
        return request_rate(old.request_rate, new.request_rate, basis=basis)
    basis = f" per replica ({old.basis} -> {new.basis})"
    return request_rate(old.per_replica_rate, new.per_replica_rate, basis=basis)


def _verdict(drifted: bool, decided: bool, why: str = "") -> str:
    if drifted:
        return DRIFTED
    return ALIKE if decided else f"undecided{f' ({why})' if why else ''}"


def distribution(key: str, label: str, old: Lengths, new: Lengths) -> Dimension:
    """KS distance over the shared finite bucket edges."""
    name, label = f"{key}.distribution", f"{label} distribution"
    a, b = old.cumulative(), new.cumulative()
    shared = sorted(e for e in set(a) & set(b) if not math.isinf(e))
    if not shared:
        line = f"{label}: no bucket edge in common: not compared"
        return Dimension(name, label, None, None, None, KS_LIMIT, False, False, line)
    gap, edge = max((abs(b[e] - a[e]), e) for e in shared)
    drifted = gap > KS_LIMIT
    n, m = old.count, new.count
    noise = KS_NOISE * math.sqrt((n + m) / (n * m))
    caution = (
        f"; with {n:,} and {m:,} requests, sampling alone can reach {noise:.2f}"
        if noise > KS_LIMIT
        else ""
    )
    line = (
        f"{label}: ≤ {in_unit(edge, '')} tokens {in_unit(a[edge], 'ratio')} -> "
        f"{in_unit(b[edge], 'ratio')} of requests (KS {gap:.2f}, limit {KS_LIMIT:g}): "
        f"{_verdict(drifted, True)}{caution}"
    )
    return Dimension(
        name, label, a[edge], b[edge], round(gap, 4), KS_LIMIT, drifted, True, line, edge=edge
    )


def ratio_of(old: Reading, new: Reading) -> Reading | None:
    """new / old with its bound: a bound on either side bounds the ratio; None when the two
    bounds pull opposite ways (nothing can be said) or a value is not positive."""
    if old.value <= 0 or new.value <= 0:
        return None
    flipped = {Bound.AT_MOST: Bound.MORE_THAN, Bound.MORE_THAN: Bound.AT_MOST}
    sides = {b for b in (new.bound, flipped.get(old.bound) if old.bound else None) if b}
    if len(sides) > 1:
        return None
    return Reading(new.value / old.value, next(iter(sides), None))


def _factor(ratio: Reading) -> str:
    """'4.0x', '23.4x smaller', 'more than 4.0x', 'at most 1.5x'."""
    grow = ratio.value >= 1
    factor = ratio.value if grow else 1 / ratio.value
    text = f"{factor:.1f}x" + ("" if grow or f"{factor:.1f}" == "1.0" else " smaller")
    if ratio.bound is None:
        return text
    # A bound on the ratio: away from 1 it is "more than", towards 1 "at most".
    away = (ratio.bound is Bound.MORE_THAN) == grow
    return ("more than " if away else "at most ") + text


def quantile_ratio(key: str, label: str, q: str, old: Lengths, new: Lengths) -> Dimension:
    """p50 or p99, new / old, against RATIO_LIMIT either way."""
    name, label = f"{key}.{q}", f"{label} {q}"
    a, b = old.reading(q), new.reading(q)
    shown = f"{label} {show('tokens', a.value, a.bound)} -> {show('tokens', b.value, b.bound)}"
    ratio = ratio_of(a, b)
    if ratio is None:
        line = f"{shown} (limit {RATIO_LIMIT:g}x): undecided (both only bounds, the same way)"
        return Dimension(
            name, label, a.value, b.value, None, RATIO_LIMIT, False, False, line,
            old_bound=a.bound, new_bound=b.bound,
        )  # fmt: skip
    grew = compare(ratio, ">", Reading(RATIO_LIMIT))
    shrank = compare(ratio, "<", Reading(1 / RATIO_LIMIT))
    drifted = grew is True or shrank is True
    decided = drifted or (grew is False and shrank is False)
    distance = max(ratio.value, 1 / ratio.value)
    line = (
        f"{shown} ({_factor(ratio)}, limit {RATIO_LIMIT:g}x): "
        f"{_verdict(drifted, decided, 'a bound decides neither way')}"
    )
    return Dimension(
        name, label, a.value, b.value, round(distance, 4), RATIO_LIMIT, drifted, decided, line,
        old_bound=a.bound, new_bound=b.bound,
    )  # fmt: skip


def hit_rate(old: float | None, new: float | None) -> Dimension:
    """Prefix-cache hit rate: absolute difference against HIT_RATE_LIMIT."""
    name, label = "prefix.hit_rate", "prefix-cache hit rate"
    limit = f"limit {HIT_RATE_LIMIT * 100:.0f} points"
    shown = f"{label} {show('hit_rate', old)} -> {show('hit_rate', new)}"
    if old is None or new is None:
        line = f"{shown} ({limit}): not compared (a shape has no hit rate)"
        return Dimension(name, label, old, new, None, HIT_RATE_LIMIT, False, False, line)
    gap = abs(new - old)
    drifted = gap > HIT_RATE_LIMIT
    line = f"{shown} ({(new - old) * 100:+.0f} points, {limit}): {_verdict(drifted, True)}"
    return Dimension(name, label, old, new, round(gap, 4), HIT_RATE_LIMIT, drifted, True, line)


def request_rate(old: float, new: float, *, basis: str = "") -> Dimension:
    """Finished requests per second: relative change against RATE_LIMIT. ``basis`` says what
    the rates are of when not simply one replica's (' per replica (... -> ...)')."""
    name, label = "arrivals.request_rate", "request rate"
    change = (new - old) / old
    drifted = abs(change) > RATE_LIMIT
    line = (
        f"{label}{basis} {in_unit(old, '')} -> {in_unit(new, '')} req/s ({change * 100:+.0f} %, "
        f"limit {RATE_LIMIT * 100:.0f} %): {_verdict(drifted, True)}"
    )
    return Dimension(name, label, old, new, round(abs(change), 4), RATE_LIMIT, drifted, True, line)
