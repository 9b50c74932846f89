"""Canary analysis on live traffic: the canary replicas judged against the baseline replicas.

A target with ``canary_replicas`` runs the new flags in a canary Deployment beside its baseline
replicas, behind the same Service: both groups serve the same live traffic over the same
minutes, so they are like for like by construction (the way Kayenta and Argo Rollouts analyse
a canary). One fleet window scrapes every replica of both groups in the same rounds
(``ProbeContext.window``); each group's pages are merged on their own (``fleet_merge``), and
the requests each group finished in the window are compared, TTFT and the decode time (vLLM's
per-request TPOT histogram, its inter-token latency where the engines lack it).

The rule, for each of TTFT and TPOT:

* a one-sided Mann-Whitney U test of "the canary is slower" on the histograms' buckets: the
  observations of one bucket are tied (a pair in the same bucket counts half), the variance
  is tie-corrected and the p-value is the normal approximation with a continuity correction
  (``math.erfc``), as scipy's ``mannwhitneyu(..., alternative="greater", method="asymptotic")``
  computes it on the bucket values (``bot.canary.stats``, the one judge's arithmetic). Only the
  bucket edges both groups have are used, so a canary on a vLLM with other buckets is still
  read exactly, only coarser;
* the canary is WORSE when p < ALPHA and its p50 or p99 is at least MIN_WORSE worse than the
  baseline's (significant and large enough to matter; a real but tiny slowdown is kept);
* either group with fewer than MIN_REQUESTS observations cannot be judged.

Verdict: "roll back" when either metric is worse; else "cannot judge" when either could not be
judged, or when a replica of either group did not answer every scrape or restarted (its
numbers are not the whole window); else "keep". Cannot judge fails like every gate that cannot
be measured (bot/canary/verdict.py): the text says why.

The ITL fallback counts tokens, not requests: a request's tokens are not independent, so its
p-value is optimistic; the effect-size floor still holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from bot.canary.stats import UTest, u_test
from bot.diagnosis.probes import (
    ITL,
    TPOT,
    TTFT,
    FleetWindow,
    Member,
    ProbeContext,
    Quantiles,
    Replica,
    ReplicaWindow,
    SampledWindow,
    merge_rounds,
    resolve_replicas,
)
from bot.kernel import ProbeError, Target
from bot.kernel.numbers import Bound

ALPHA = 0.01  # one-sided significance per metric: a false roll back 1 time in 100 at most
MIN_WORSE = 0.20  # the canary's p50 or p99 must be at least 20 % above the baseline's
MIN_REQUESTS = 50  # observations per group; fewer cannot tell a slowdown from chance
INTERVAL_S = 10.0  # between scrapes: only the first and last count, the rest watch for restarts

Decision = Literal["keep", "roll back", "cannot judge"]
EXIT_CODES: dict[Decision, int] = {"keep": 0, "roll back": 1, "cannot judge": 2}


@dataclass(frozen=True)
class MetricJudgement:
    """One latency metric: both groups' quantiles, the test, and what they say."""

    name: str  # "TTFT", "TPOT" or "ITL"
    canary: Quantiles
    baseline: Quantiles
    test: UTest | None  # None: it could not be judged
    worse: bool
    why: str | None = None  # why it could not be judged

    def line(self) -> str:
        """One short line: both groups' p50/p99 and counts, the p-value."""

        def group(q: Quantiles) -> str:
            p50, p99 = (_ms(q.bounds.get(k), v) for k, v in (("p50", q.p50), ("p99", q.p99)))
            return f"p50 {p50} / p99 {p99} ms (n={q.count})"

        test = f"p={self.test.p_value:.2g}" if self.test else f"not judged: {self.why}"
        return (
            f"{self.name}: canary {group(self.canary)} vs baseline {group(self.baseline)}; {test}"
        )


@dataclass(frozen=True)
class LiveVerdict:
    """Keep, roll back or cannot judge, with the reason and each metric's numbers."""

    decision: Decision
    reason: str
    metrics: tuple[MetricJudgement, ...] = ()

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.decision]

    def text(self) -> str:
        """Short lines, readable on a phone."""
        rule = (
            f"rule: one-sided Mann-Whitney U on buckets, p < {ALPHA:g} and p50 or p99 "
            f">= {MIN_WORSE:.0%} worse; >= {MIN_REQUESTS} requests per group"
        )
        lines = [f"live canary: {self.decision.upper()}: {self.reason}"]
        return "\n".join([*lines, *(m.line() for m in self.metrics), rule])


def bucket_counts(window: SampledWindow, name: str, edges: Sequence[float]) -> list[float]:
    """Observations per bucket gained over the window, in the buckets ending at ``edges``."""
    first, last = window.pages[0].buckets(name), window.pages[-1].buckets(name)
    cumulative = [last[e] - first.get(e, 0.0) for e in edges]
    return [c - p for c, p in zip(cumulative, [0.0, *cumulative[:-1]], strict=True)]


def judge_metric(
    names: Sequence[str], canary: SampledWindow, baseline: SampledWindow
) -> MetricJudgement:
    """One metric (the first of ``names`` both groups have) by the module's rule."""
    present = [n for n in names if all(w.pages[-1].has(f"{n}_bucket") for w in (canary, baseline))]
    name = present[0] if present else names[0]
    label = "TTFT" if name in TTFT else "TPOT" if name in TPOT else "ITL"
    quantiles = [
        Quantiles.from_histogram(w.pages[0], w.pages[-1], [name]) for w in (canary, baseline)
    ]
    ours, theirs = quantiles

    def unjudged(why: str) -> MetricJudgement:
        return MetricJudgement(label, ours, theirs, test=None, worse=False, why=why)

    if not present:
        return unjudged(f"{name} is missing from a group's pages")
    short = [
        g for g, q in zip(("canary", "baseline"), quantiles, strict=True) if q.count < MIN_REQUESTS
    ]
    if short:
        return unjudged(f"{' and '.join(short)} under {MIN_REQUESTS} observations")
    edges = sorted(set(canary.pages[-1].buckets(name)) & set(baseline.pages[-1].buckets(name)))
    if len(edges) < 2:
        return unjudged("the two groups share no histogram bucket edges")
    test = u_test(bucket_counts(canary, name, edges), bucket_counts(baseline, name, edges))
    worse = test.p_value < ALPHA and any(
        c is not None and b is not None and c >= (1 + MIN_WORSE) * b
        for c, b in ((ours.p50, theirs.p50), (ours.p99, theirs.p99))
    )
    return MetricJudgement(label, ours, theirs, test=test, worse=worse)


def judge(canary: SampledWindow, baseline: SampledWindow) -> LiveVerdict:
    """The verdict on two groups' windows over the same minutes."""
    metrics = (judge_metric(TTFT, canary, baseline), judge_metric((*TPOT, *ITL), canary, baseline))
    worse = [m.name for m in metrics if m.worse]
    if worse:
        return LiveVerdict("roll back", f"the canary is slower in {' and '.join(worse)}", metrics)
    unjudged = [m.name for m in metrics if m.test is None]
    if unjudged:
        return LiveVerdict("cannot judge", f"{' and '.join(unjudged)} not judged", metrics)
    return LiveVerdict("keep", "the canary is not measurably slower", metrics)


def group_window(views: Sequence[ReplicaWindow], times: Sequence[float]) -> SampledWindow:
    """One group's replicas merged as the fleet's are (each an engine of its own)."""
    members = [
        Member(labels={"replica": v.replica.address}, pages=dict(enumerate(v.window.pages)))
        for v in views
        if v.window is not None
    ]
    return SampledWindow(pages=tuple(merge_rounds(members, times)))


def judge_fleet(fleet: FleetWindow, canary_urls: Sequence[str]) -> LiveVerdict:
    """The verdict on one window over both groups (the canary's replicas by their URLs)."""
    troubled = [f"{v.replica.address}: {'; '.join(v.notes)}" for v in fleet.replicas if v.notes]
    if troubled:
        return LiveVerdict(
            "cannot judge", "not read over the whole window: " + " | ".join(troubled)
        )
    canary_at = {Replica(url).address for url in canary_urls}
    times = [page.at for page in fleet.window.pages]
    canary = [v for v in fleet.replicas if v.replica.address in canary_at]
    baseline = [v for v in fleet.replicas if v.replica.address not in canary_at]
    return judge(group_window(canary, times), group_window(baseline, times))


async def analyse(
    name: str, target: Target, ctx: ProbeContext, *, seconds: float, interval_s: float = INTERVAL_S
) -> LiveVerdict:
    """Sample the target's baseline and canary replicas together for ``seconds``; the verdict.
    A target without canary replicas cannot be judged."""
    if not target.canary_replicas:
        return LiveVerdict("cannot judge", f"target {name} lists no canary_replicas")
    try:
        canary_at = {Replica(url).address for url in target.canary_replicas}
        # a Service's endpoints may hold the canary's pods too: they are not the baseline
        baseline = [r.url for r in await resolve_replicas(target) if r.address not in canary_at]
        if not baseline:
            return LiveVerdict("cannot judge", f"target {name} has no baseline replica")
        both = target.model_copy(
            update={"replicas": [*baseline, *target.canary_replicas], "canary_replicas": []}
        )
        fleet = await ctx.window(both, seconds=seconds, interval_s=interval_s)
    except ProbeError as exc:
        return LiveVerdict("cannot judge", str(exc))
    return judge_fleet(fleet, target.canary_replicas)


def _ms(bound: Bound | None, value: float | None) -> str:
    """A quantile as written: "≤10" where it fell in the first bucket (only a bound)."""
    if value is None:
        return "-"
    sign = {Bound.AT_MOST: "≤", Bound.MORE_THAN: ">"}[bound] if bound else ""
    return f"{sign}{value:.3g}"
