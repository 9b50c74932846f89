"""Quantiles of a Prometheus histogram's cumulative buckets, as ``histogram_quantile`` computes
them, and whether a quantile is only a bound (it fell in the first or the +Inf bucket)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from bot.kernel.numbers.reading import Bound


def quantile_bound(q: float, buckets: Mapping[float, float]) -> Bound | None:
    """Whether the q-quantile of cumulative ``buckets`` is only a bound: AT_MOST when it falls
    in the first bucket (its value is then that bucket's edge), MORE_THAN in the +Inf bucket."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    rank = q * buckets[bounds[-1]]
    first = bounds[0]  # the lowest bucket: [0, its edge]
    if buckets[first] >= rank:
        return Bound.MORE_THAN if math.isinf(first) else Bound.AT_MOST
    finite = [b for b in bounds if not math.isinf(b)]
    if finite and buckets[finite[-1]] < rank:
        return Bound.MORE_THAN
    return None


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """Quantile from cumulative buckets, interpolated linearly inside a bucket (as Prometheus).

    Returns None when the buckets hold no observation. A quantile that falls in the +Inf bucket
    returns the largest finite bound, as Prometheus does.
    """
    if not buckets:
        return None
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (
                count - lower_count
            )
        lower_bound, lower_count = bound, count
    return lower_bound


def quantile_bucket(q: float, buckets: Mapping[float, float]) -> tuple[float, float] | None:
    """The bucket (lower edge, upper edge] the q-quantile of cumulative ``buckets`` falls in:
    all a histogram knows of a quantile (the lower edge is 0 for the first bucket, the upper
    one inf for the +Inf bucket). None when the buckets hold no observation.

    The bucket is the one ``histogram_quantile`` interpolates in; a point inside it would be a
    guess, so none is given.
    """
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    total = buckets[bounds[-1]]
    rank = q * total
    slack = 1e-9 * total  # shares summed in floating point may miss the rank by a hair
    lower = 0.0
    for bound in bounds:
        if buckets[bound] >= rank - slack:
            return (lower, bound)
        lower = bound
    return (lower, math.inf)
