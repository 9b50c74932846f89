"""The statistics a canary verdict stands on: how sure a number is, and whether two runs differ.

A p99 of four requests is their maximum; a gate that compares it with a limit, or with half of
another run's maximum, passes or fails by the machine's luck. This module is the judge's
arithmetic, with no I/O (``bench/judge_bench.py`` measures it against the point-p99 judge):

* ``quantile_interval``: a distribution-free confidence interval for a quantile from the order
  statistics (the count of observations below the true quantile is binomial), so a p99 comes
  with its interval and its sample size; an end the sample cannot reach is unbounded (None),
  never clamped to the maximum. ``min_requests`` is the fewest observations whose interval is
  bounded on both sides: 368 for a p99 at 95 % (528 at 99 %), 6 for a p50.
* ``u_test``: a one-sided Mann-Whitney U test (ties count half, tie-corrected variance, normal
  approximation with continuity correction), as scipy's ``mannwhitneyu(...,
  alternative="greater", method="asymptotic")``; on histogram buckets (the live canary) or on
  per-request values (``u_test_values``).
* ``hodges_lehmann``: the median of every pairwise difference, the shift the U test sees.
* ``judge_limit`` and ``judge_ratio``: a gate decided three ways. ``met`` and ``missed`` only when
  the evidence says so at the confidence asked; else ``inconclusive``, with why. Against a limit
  the quantile's interval must lie on one side of it; against ``N x before`` the after-run must
  be significantly below N times the before-run (U test on per-request values), and missed only
  when significantly above it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

Decided = Literal["met", "missed", "inconclusive"]
DEFAULT_CONFIDENCE = 0.99  # an ADR's gates, unless it says otherwise


@dataclass(frozen=True)
class UTest:
    """A one-sided Mann-Whitney U test of "the first group is larger"."""

    u: float  # pairs (first, second) with the first larger, ties counted half
    z: float
    p_value: float


def u_test(larger: Sequence[float], smaller: Sequence[float]) -> UTest:
    """The test on observation counts per bucket, both groups in the same ascending buckets:
    is the first group's distribution shifted above the second's?"""
    n1, n2 = sum(larger), sum(smaller)
    n = n1 + n2
    u = below = ties = 0.0
    for a, b in zip(larger, smaller, strict=True):
        u += a * (below + b / 2)  # second-group observations below it, half those beside it
        below += b
        ties += (a + b) ** 3 - (a + b)
    mean = n1 * n2 / 2
    variance = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1))) if n > 1 else 0.0
    if variance <= 0:  # every observation in one bucket: no evidence either way
        return UTest(u=u, z=0.0, p_value=1.0)
    z = (u - mean - 0.5) / math.sqrt(variance)
    return UTest(u=u, z=z, p_value=0.5 * math.erfc(z / math.sqrt(2)))


def u_test_values(larger: Sequence[float], smaller: Sequence[float]) -> UTest:
    """``u_test`` on per-request values: each distinct value is its own bucket."""
    edges = sorted(set(larger) | set(smaller))
    index = {v: i for i, v in enumerate(edges)}
    first, second = [0.0] * len(edges), [0.0] * len(edges)
    for v in larger:
        first[index[v]] += 1
    for v in smaller:
        second[index[v]] += 1
    return u_test(first, second)


def hodges_lehmann(after: Sequence[float], before: Sequence[float]) -> float:
    """The median of every difference after - before: how far the after-run moved."""
    diffs = np.subtract.outer(np.asarray(after, dtype=float), np.asarray(before, dtype=float))
    return float(np.median(diffs))


def _binomial_cdf(n: int, p: float) -> np.ndarray:
    """P(B <= k) for k = 0..n, B ~ Binomial(n, p), from the pmf in log space (no overflow)."""
    k = np.arange(n + 1, dtype=float)
    log_pmf = (
        math.lgamma(n + 1) - np.vectorize(math.lgamma)(k + 1)
        - np.vectorize(math.lgamma)(n - k + 1) + k * math.log(p) + (n - k) * math.log1p(-p)
    )  # fmt: skip
    cdf: np.ndarray = np.minimum(np.cumsum(np.exp(log_pmf)), 1.0)
    return cdf


@dataclass(frozen=True)
class Interval:
    """A quantile's distribution-free confidence interval over ``n`` observations; an end
    beyond the sample is unknown (None): the sample is too small to bound it there."""

    q: float
    confidence: float
    n: int
    low: float | None
    high: float | None

    def text(self, fmt: str = "{:.1f}") -> str:
        """'[12.0, 31.5]', '[12.0, ∞)' or '(-∞, ∞)': the interval as a bound, never a clamp."""
        low = "(-∞" if self.low is None else "[" + fmt.format(self.low)
        high = "∞)" if self.high is None else fmt.format(self.high) + "]"
        return f"{low}, {high}"


def _ranks(n: int, q: float, confidence: float) -> tuple[int, int]:
    """The 1-based ranks (low, high) of the order statistics that bound the q-quantile with at
    least ``confidence`` (two-sided, alpha/2 each side); 0 or n + 1 where the sample cannot.

    B, the count of observations below the quantile, is Binomial(n, q): the k-th smallest lies
    above the quantile with P(B <= k - 1) and below it with P(B >= k)."""
    tail = (1 - confidence) / 2
    cdf = _binomial_cdf(n, q)
    above = [k for k in range(1, n + 1) if cdf[k - 1] <= tail]  # X_(k) > ξ rarely enough
    below = [k for k in range(1, n + 1) if 1 - cdf[k - 1] <= tail]  # X_(k) < ξ rarely enough
    return (max(above) if above else 0), (min(below) if below else n + 1)


def quantile_interval(values: Sequence[float], q: float, confidence: float = 0.95) -> Interval:
    """The q-quantile's confidence interval from the sorted values (inf values included: a
    failed request is infinitely slow, and an end that falls on one is unbounded)."""
    ordered = sorted(values)
    n = len(ordered)
    low_rank, high_rank = _ranks(n, q, confidence) if n else (0, 1)
    low = ordered[low_rank - 1] if low_rank >= 1 else None
    high = ordered[high_rank - 1] if high_rank <= n else None
    if high is not None and math.isinf(high):
        high = None
    return Interval(q=q, confidence=confidence, n=n, low=low, high=high)


def min_requests(q: float, confidence: float = 0.95) -> int:
    """The fewest observations whose ``quantile_interval`` is bounded on both sides."""
    tail = (1 - confidence) / 2
    # the top end is a sample value once P(every value below the quantile) = q^n <= tail
    # (and the bottom end once (1 - q)^n <= tail)
    return max(math.ceil(math.log(tail) / math.log(q)), math.ceil(math.log(tail) / math.log(1 - q)))


def min_pairs(confidence: float = DEFAULT_CONFIDENCE) -> int:
    """The fewest requests per side whose one-sided U test can be significant at
    ``confidence`` at all (every after-run value below every before-run value): 5 at 99 %."""
    n = 1
    while u_test_values(range(n + 1, 2 * n + 1), range(1, n + 1)).p_value >= 1 - confidence:
        n += 1
    return n


@dataclass(frozen=True)
class Judgement:
    """One gate decided: met, missed or inconclusive, the evidence and the words for it."""

    outcome: Decided
    why: str
    n: int  # after-run observations (and ``n_before`` for a comparison)
    n_before: int | None = None
    interval: Interval | None = None
    p_value: float | None = None  # of the outcome's own test (met: after below; missed: above)
    shift: float | None = None  # Hodges-Lehmann: after - before


def judge_limit(
    values: Sequence[float],
    q: float,
    limit: float,
    *,
    kind: Literal["max", "min"] = "max",
    confidence: float = DEFAULT_CONFIDENCE,
) -> Judgement:
    """A gate "the q-quantile <= limit" (``max``) or ">= limit" (``min``): decided only when
    the quantile's interval lies wholly on one side of the limit."""
    interval = quantile_interval(values, q, confidence)
    low = -math.inf if interval.low is None else interval.low
    high = math.inf if interval.high is None else interval.high
    inside, outside = (
        (high <= limit, low > limit) if kind == "max" else (low >= limit, high < limit)
    )
    side = "≤" if kind == "max" else "≥"
    shown = f"p{q * 100:g} in {interval.text()} at {percent(confidence)} (n={interval.n})"
    if inside:
        return Judgement("met", f"{shown}: {side} {limit:g}", interval.n, interval=interval)
    if outside:
        return Judgement("missed", f"{shown}: not {side} {limit:g}", interval.n, interval=interval)
    need = min_requests(q, confidence)
    more = f"; {need} requests bound a p{q * 100:g} on both sides" if interval.n < need else ""
    why = f"{shown} straddles {limit:g}: not decided{more}"
    return Judgement("inconclusive", why, interval.n, interval=interval)


def judge_ratio(
    before: Sequence[float],
    after: Sequence[float],
    ratio: float,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
) -> Judgement:
    """A gate "after <= ratio x before" on per-request values (lower is better): met when the
    after-run is significantly below ``ratio`` times the before-run (one-sided U test at
    ``confidence``), missed when significantly above it, else inconclusive."""
    n, m = len(after), len(before)
    if not n or not m:
        why = f"no {'after' if not n else 'before'}-run values to compare"
        return Judgement("inconclusive", why, n, m)
    scaled = [ratio * b for b in before]
    alpha = 1 - confidence
    below = u_test_values(scaled, after)  # ratio x before larger: the after-run is below it
    above = u_test_values(after, scaled)
    shift = hodges_lehmann(after, before)
    medians = statistics.median(after) / statistics.median(before) if any(before) else math.inf
    said = (
        f"after/before medians {medians:.2f} (goal ≤ {ratio:g}), shift {shift:+.1f}, "
        f"n={n} after, {m} before"
    )
    if below.p_value < alpha:
        why = f"{said}: below {ratio:g}x before, p={below.p_value:.2g} < {alpha:g}"
        return Judgement("met", why, n, m, p_value=below.p_value, shift=shift)
    if above.p_value < alpha:
        why = f"{said}: above {ratio:g}x before, p={above.p_value:.2g} < {alpha:g}"
        return Judgement("missed", why, n, m, p_value=above.p_value, shift=shift)
    why = f"{said}: not decided at {percent(confidence)} (p={below.p_value:.2g})"
    return Judgement("inconclusive", why, n, m, p_value=below.p_value, shift=shift)


def percent(confidence: float) -> str:
    """'99%', '99.5%' (a look's share of the error): never rounded up to '100%'."""
    return f"{confidence * 100:.3g}%"


def _binomial_tail(n: int, x: int, p: float) -> float:
    """P(B <= x), B ~ Binomial(n, p), summed in log space over k = 0..x (x small: cheap)."""
    if x < 0:
        return 0.0
    if x >= n:
        return 1.0
    if p <= 0:
        return 1.0
    if p >= 1:
        return 0.0
    log_c, total = 0.0, 0.0
    for k in range(x + 1):
        if k:
            log_c += math.log(n - k + 1) - math.log(k)
        total += math.exp(log_c + k * math.log(p) + (n - k) * math.log1p(-p))
    return min(total, 1.0)


def share_bounds(n: int, x: int, error: float) -> tuple[float, float]:
    """Clopper-Pearson one-sided bounds (low, high) on a binomial share from ``x`` of ``n``,
    each wrong with probability at most ``error`` (bisection on the binomial tail)."""

    def solve(f: Callable[[float], float], want: float) -> float:
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            if f(mid) > want:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    high = 1.0 if x >= n else solve(lambda p: _binomial_tail(n, x, p), error)
    low = 0.0 if x <= 0 else 1 - solve(lambda q: _binomial_tail(n, n - x, q), error)
    return low, high


def design_effect(groups: Sequence[Sequence[float]], limit: float) -> float:
    """How many gaps one independent observation is worth: 1 + (mean gaps per request - 1) x
    the within-request correlation, the larger of the correlation of the gaps' logs (one-way
    ANOVA) and of their "above the limit" flags; between 1 and the mean gaps per request."""
    sizes = [len(g) for g in groups if g]
    if len(sizes) < 2:
        return float(max(sizes, default=1))
    m = sum(sizes) / len(sizes)
    icc = max(
        _icc([[math.log(max(v, 1e-6)) for v in g] for g in groups if g]),
        _icc([[1.0 if v > limit else 0.0 for v in g] for g in groups if g]),
    )
    return min(max(1 + (m - 1) * icc, 1.0), m)


def _icc(groups: list[list[float]]) -> float:
    """The intraclass correlation of one-way ANOVA (0 where the values do not vary)."""
    sizes = np.array([len(g) for g in groups], dtype=float)
    k, total = len(groups), float(sizes.sum())
    if total <= k:
        return 1.0  # one value per request: nothing to tell within from between
    values = np.concatenate([np.asarray(g, dtype=float) for g in groups])
    owner = np.repeat(np.arange(k), sizes.astype(int))
    means = np.bincount(owner, weights=values) / sizes
    grand = values.sum() / total
    between = float((sizes * (means - grand) ** 2).sum()) / (k - 1)
    within = float(((values - means[owner]) ** 2).sum()) / (total - k)
    n0 = (total - float((sizes**2).sum()) / total) / (k - 1)
    if within == 0:
        return 1.0  # each request's values alike: its values move as one
    if between + (n0 - 1) * within <= 0:
        return 0.0
    return max((between - within) / (between + (n0 - 1) * within), 0.0)


def judge_clustered(
    groups: Sequence[Sequence[float]],
    q: float,
    limit: float,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
) -> Judgement:
    """A gate "the q-quantile of every gap <= limit" where the gaps come in requests (ITL: one
    request's gaps move together, so they are not independent observations). The pooled share
    of gaps above the limit must be significantly at most 1 - q (met) or above it (missed),
    its Clopper-Pearson bounds taken on the effective count, the gaps divided by the design
    effect (``design_effect``: requests whose gaps are alike count once each)."""
    tail = (1 - confidence) / 2  # each side, as the quantile intervals
    flat = [v for g in groups for v in g]
    requests = sum(1 for g in groups if g)
    if not flat:
        return Judgement("inconclusive", "no gaps between tokens measured", 0)
    above = sum(1 for v in flat if v > limit)
    deff = design_effect(groups, limit)
    n_eff = max(int(len(flat) / deff), 1)
    x_eff = min(round(above / len(flat) * n_eff), n_eff)
    low, high = share_bounds(n_eff, x_eff, tail)
    share = 1 - q
    shown = (
        f"{above} of {len(flat)} gaps above {limit:g} ({above / len(flat):.2%};"
        f" goal ≤ {share:.0%}),"
        f" share in [{low:.2%}, {high:.2%}] at {percent(confidence)} over {n_eff} effective of"
        f" {requests} requests"
    )
    if high <= share:
        return Judgement("met", f"{shown}: p{q * 100:g} ≤ {limit:g}", requests)
    if low > share:
        return Judgement("missed", f"{shown}: p{q * 100:g} > {limit:g}", requests)
    return Judgement("inconclusive", f"{shown}: not decided", requests)
