"""Compare two workload shapes dimension by dimension, and say which drifted.

Each dimension has a distance and a documented threshold (the constants below); a dimension
drifted when its distance is over the threshold. docs/workload.md explains the choices.

- prompt and output lengths, the distribution: the Kolmogorov–Smirnov distance over the bucket
  edges both shapes have, i.e. the largest gap between the shares of requests at or below an
  edge. Over buckets this is a lower bound of the KS distance of the lengths themselves.
- prompt and output lengths, p50 and p99: each is known only to the bucket it fell in
  (``TokenRange``: (2,000, 5,000], "≤ 1" in the first bucket, "> 10,000" in the +Inf one), so
  two are compared as ranges. Ranges that overlap are alike ("about the same bucket": a change
  inside one bucket is not drift). Disjoint ones give the factor new / old as a bound from
  their nearest edges ("more than 2.5x bigger"): drifted when that bound is over
  ``RATIO_LIMIT``, alike when even the far edges are within it, else undecided, which does not
  count as drifted. ``distance`` is the nearest-edge factor (1 when they overlap).
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

from bot.adr.workload.shape import Arrivals, Lengths, TokenRange, WorkloadShape, edge_text
from bot.kernel.numbers import Bound, in_unit, show

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
    old_range: tuple[float, float] | None = None
    new_range: tuple[float, float] | None = None

    def as_dict(self) -> dict[str, object]:
        """Plain dict for JSON (bounds as '<=' or '>', an infinite edge as '+Inf')."""
        data = asdict(self)
        data["old_bound"] = None if self.old_bound is None else str(self.old_bound)
        data["new_bound"] = None if self.new_bound is None else str(self.new_bound)
        for key in ("old_range", "new_range"):
            span = getattr(self, key)
            data[key] = None if span is None else [edge_text(edge) for edge in span]
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


def diff(old: WorkloadShape, new: WorkloadShape, *, rate: bool = True) -> ShapeDiff:
    """Every dimension of ``new`` against ``old`` (``rate`` False: what the requests are, not
    how many come: an incident is often a surge of the very traffic a rule was proven on)."""
    dims: list[Dimension] = []
    for key, label, a, b in (
        ("prompt_tokens", "prompt tokens", old.prompt_tokens, new.prompt_tokens),
        ("output_tokens", "output tokens", old.output_tokens, new.output_tokens),
    ):
        dims.append(distribution(key, label, a, b))
        dims.extend(quantile_ratio(key, label, q, a, b) for q in ("p50", "p99"))
    dims.append(hit_rate(old.prefix.hit_rate, new.prefix.hit_rate))
    if rate:
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


def ratio_bounds(old: TokenRange, new: TokenRange) -> tuple[float, float]:
    """The factor new / old can be, either way (>= 1), from the nearest edges and from the far
    ones; (1, far) when the ranges overlap (the factor may be 1)."""
    if new.least >= old.most:  # grew (or the same length, when both are one length)
        nearest, far = new.least / old.most, _div(new.most, old.least)
    elif old.least >= new.most:  # shrank
        nearest, far = old.least / new.most, _div(old.most, new.least)
    else:
        nearest = 1.0
        far = max(_div(new.most, old.least), _div(old.most, new.least))
    return nearest, far


def _div(a: float, b: float) -> float:
    return math.inf if b <= 0 else a / b


# A bound is rounded away from what it allows: "more than 1.9x" for 1.95, "to 2.1x" for 2.04.
def _down(x: float) -> str:
    return f"{math.floor(x * 10 + 1e-9) / 10:.1f}"


def _up(x: float) -> str:
    return f"{math.ceil(x * 10 - 1e-9) / 10:.1f}"


def _change(old: TokenRange, new: TokenRange, nearest: float) -> str:
    """'about the same bucket', 'ranges overlap', 'more than 2.5x bigger', '4.0x smaller'."""
    if old == new:
        return "about the same bucket" if old.point is None else "the same"
    if old.overlaps(new):
        return "ranges overlap"
    way = "bigger" if new.least >= old.most else "smaller"
    exact = old.point is not None and new.point is not None
    return f"{'' if exact else 'more than '}{_down(nearest)}x {way}"


def quantile_ratio(key: str, label: str, q: str, old: Lengths, new: Lengths) -> Dimension:
    """p50 or p99 as the buckets know them (``TokenRange``), new against old: drifted only when
    even the nearest edges are more than RATIO_LIMIT apart, alike when the ranges overlap (a
    change inside one bucket is not drift) or even the far edges are within it."""
    name, label = f"{key}.{q}", f"{label} {q}"
    a, b = old.quantile(q), new.quantile(q)
    nearest, far = ratio_bounds(a, b)
    exact = a.point is not None and b.point is not None
    # the factor is more than the nearest edges give, unless both are one length each
    drifted = nearest > RATIO_LIMIT or (nearest == RATIO_LIMIT and not exact)
    decided = drifted or a.overlaps(b) or far <= RATIO_LIMIT
    why = f"from {_down(nearest)}x to " + ("any factor" if math.isinf(far) else f"{_up(far)}x")
    line = (
        f"{label} {a.text()} -> {b.text()} tokens ({_change(a, b, nearest)}, "
        f"limit {RATIO_LIMIT:g}x): {_verdict(drifted, decided, why)}"
    )
    return Dimension(
        name, label, a.point, b.point, round(nearest, 4), RATIO_LIMIT, drifted, decided, line,
        old_bound=_bound(a), new_bound=_bound(b), old_range=(a.low, a.high),
        new_range=(b.low, b.high),
    )  # fmt: skip


def _bound(span: TokenRange) -> Bound | None:
    if span.low <= 0:
        return Bound.AT_MOST
    return Bound.MORE_THAN if math.isinf(span.high) else None


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
