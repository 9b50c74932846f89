"""One replica or all of them: the rule that finds the replicas slower than the rest of a fleet.

For TTFT, TPOT and queue time, each replica's p99 comes from its own histogram over the window
(its buckets' deltas), never from the fleet's merged one. A replica is slow on a metric when:

1. it had at least MIN_REQUESTS observations, and so had every other replica counted in the
   reference (fewer: "cannot tell", never a guess);
2. the reference is the (upper) median of those others' p99s: the majority says what normal is,
   so two slow replicas of forty do not hide each other, as they would behind "the rest merged"
   (whose p99 any second slow replica with over 1 % of the traffic owns);
3. at least SHARE_BEYOND of its requests (a quarter: its p75) lie past the upper edge of the
   bucket holding the reference's p99, where a replica like the others has about 1 %: known
   from the counts, whatever the values inside the buckets, and a few stray requests (a noisy
   neighbour for a second) never make a replica slow;
4. its p99 is at least FACTOR times the reference's (each as Prometheus interpolates it; a bound
   at its edge, which can only understate the ratio here).

Every replica slow alike is no outlier: the cause is fleet-wide. docs/fleet.md says why these
numbers.

A prefill/decode target's replicas are judged within their own pool (POOL_METRICS): a prefill
replica against the other prefill replicas on TTFT and queue time, a decode replica against the
other decode replicas on TPOT and queue time (a decode replica's TTFT is not the user's).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from bot.diagnosis.probes.exposition import Exposition
from bot.diagnosis.probes.sampling import TPOT, SampledWindow
from bot.diagnosis.probes.vllm_metrics import ITL, QUEUE_TIME, TTFT
from bot.diagnosis.runbooks.runner import RunbookResult
from bot.kernel.numbers import Bound, histogram_quantile, quantile_bound, show

MIN_REQUESTS = 20  # under it, a quarter of a replica's requests is 4 or fewer: strays
SHARE_BEYOND = 0.25
FACTOR = 2.0  # under 2x, uneven routing (the long prompts on one replica) can do it
SLOW, ALIKE, UNKNOWN = "slow", "ok", "cannot tell"
Buckets = Mapping[float, float]  # cumulative counts by upper edge (seconds), over the window


@dataclass(frozen=True)
class ReplicaMetric:
    """A latency judged per replica: its key, its label, its histograms (first with data)."""

    key: str
    label: str
    names: tuple[tuple[str, ...], ...]


METRICS = (
    ReplicaMetric("ttft_p99_ms", "TTFT p99", (TTFT,)),
    ReplicaMetric("tpot_p99_ms", "TPOT p99", (TPOT, ITL)),  # ITL where the engine has no TPOT
    ReplicaMetric("queue_time_p99_ms", "queue time p99", (QUEUE_TIME,)),
)
LABEL = {m.key: m.label for m in METRICS}
POOL_METRICS = {"prefill": (METRICS[0], METRICS[2]), "decode": (METRICS[1], METRICS[2])}


@dataclass(frozen=True)
class P99:
    """The p99 of one histogram: milliseconds (a bound at its edge), the edge of its bucket."""

    buckets: Buckets
    value: float | None
    bound: Bound | None
    edge: float | None  # upper edge (s) of the bucket its rank falls in
    count: int

    @classmethod
    def of(cls, buckets: Buckets) -> P99:
        """The p99 of cumulative ``buckets``."""
        count = max(buckets.values(), default=0.0)
        if count <= 0:
            return cls(buckets, None, None, None, 0)
        bound = quantile_bound(0.99, buckets)
        value = histogram_quantile(0.99, buckets)
        if bound is Bound.AT_MOST:
            value = min(buckets)  # at most the first edge, not a point inside it
        edge = next(e for e in sorted(buckets) if buckets[e] >= 0.99 * count)
        ms = None if value is None else value * 1000.0
        return cls(buckets, ms, bound, edge, int(round(count)))

    def beyond(self, edge: float) -> float | None:
        """Its observations past ``edge`` (None when its histogram has no such edge)."""
        return None if edge not in self.buckets else self.count - self.buckets[edge]


@dataclass(frozen=True)
class ReplicaVerdict:
    """One replica on one metric: its p99, the others' median it was held against, the verdict."""

    metric: str
    p99: P99
    reference: P99 | None
    others: int  # replicas the reference is the median of
    state: str
    why: str


@dataclass(frozen=True)
class ReplicaRow:
    """One replica and its judgements, by metric."""

    address: str
    judged: Mapping[str, ReplicaVerdict]
    note: str | None = None

    @property
    def state(self) -> str:
        """Slow on any metric; else ok when any could be judged; else cannot tell."""
        states = {j.state for j in self.judged.values()}
        return SLOW if SLOW in states else (ALIKE if ALIKE in states else UNKNOWN)

    @property
    def slow(self) -> list[ReplicaVerdict]:
        """Its slow metrics, the farthest from its reference first."""
        return sorted((j for j in self.judged.values() if j.state == SLOW), key=ratio, reverse=True)

    def value(self, key: str) -> float | None:
        """Its p99 on ``key`` in ms."""
        judged = self.judged.get(key)
        return None if judged is None else judged.p99.value


@dataclass(frozen=True)
class FleetVerdict:
    """Every replica judged, worst first."""

    rows: tuple[ReplicaRow, ...]
    # where discovery found them (a Service's EndpointSlices): each replica's pod and node
    nodes: Mapping[str, str] = field(default_factory=dict)
    pods: Mapping[str, str] = field(default_factory=dict)
    # prefill/decode disaggregation: each replica's pool, in which alone it was judged
    pools: Mapping[str, str] = field(default_factory=dict)

    @property
    def slow(self) -> list[ReplicaRow]:
        """The outliers."""
        return [r for r in self.rows if r.state == SLOW]

    @property
    def kind(self) -> str:
        """'outlier', 'alike' (no replica stands out) or 'cannot tell'."""
        if self.slow:
            return "outlier"
        return "alike" if any(r.state == ALIKE for r in self.rows) else "cannot tell"


def ratio(judged: ReplicaVerdict) -> float:
    """Its p99 over its reference's (infinite against a zero or missing reference)."""
    own, ref = judged.p99.value, None if judged.reference is None else judged.reference.value
    return math.inf if not ref or own is None else own / ref


def judge(
    histograms: Mapping[str, Mapping[str, Buckets]],
    notes: Mapping[str, str | None] | None = None,
    metrics: Sequence[ReplicaMetric] = METRICS,
) -> FleetVerdict:
    """Each replica against the others, metric by metric (``histograms[address][metric]``)."""
    p99s = {a: {m.key: P99.of(h.get(m.key, {})) for m in metrics} for a, h in histograms.items()}
    rows = []
    for address, own in p99s.items():
        judged = {
            m.key: _judge(m.key, own[m.key], [p[m.key] for a, p in p99s.items() if a != address])
            for m in metrics
            if own[m.key].count or any(p[m.key].count for p in p99s.values())
        }
        rows.append(ReplicaRow(address, judged, (notes or {}).get(address)))
    return FleetVerdict(tuple(sorted(rows, key=_worst_first)))


def judge_pools(
    histograms: Mapping[str, Mapping[str, Buckets]],
    pools: Mapping[str, str],
    notes: Mapping[str, str | None] | None = None,
) -> FleetVerdict:
    """Each pool's replicas against the others of their pool, on that pool's metrics."""
    rows: list[ReplicaRow] = []
    for pool, metrics in POOL_METRICS.items():
        own = {a: h for a, h in histograms.items() if pools.get(a) == pool}
        rows.extend(judge(own, notes, metrics).rows)
    return FleetVerdict(tuple(sorted(rows, key=_worst_first)), pools=dict(pools))


def _worst_first(row: ReplicaRow) -> tuple[int, float, str]:
    order = {SLOW: 0, ALIKE: 1, UNKNOWN: 2}[row.state]
    slow = row.slow
    size = ratio(slow[0]) if slow else (row.value(METRICS[0].key) or 0.0)
    return order, -size, row.address


def _judge(metric: str, own: P99, others: Sequence[P99]) -> ReplicaVerdict:
    """Rule 1-4 of the module docstring for one replica on one metric."""
    counted = sorted((o for o in others if o.count >= MIN_REQUESTS and o.value is not None),
                     key=lambda o: o.value or 0.0)  # fmt: skip
    if own.count < MIN_REQUESTS:
        why = f"{own.count} requests in the window, {MIN_REQUESTS} needed"
        return ReplicaVerdict(metric, own, None, len(counted), UNKNOWN, why)
    if not counted:
        why = f"no other replica had {MIN_REQUESTS} requests in the window"
        return ReplicaVerdict(metric, own, None, 0, UNKNOWN, why)
    ref = counted[len(counted) // 2]  # the upper median: with 2 others, the slower one
    if ref.edge is None or math.isinf(ref.edge):
        return ReplicaVerdict(
            metric, own, ref, len(counted), ALIKE, "the others' p99 is past every edge"
        )
    beyond = own.beyond(ref.edge)
    if beyond is None:
        why = "its histogram's buckets differ from the others'"
        return ReplicaVerdict(metric, own, ref, len(counted), UNKNOWN, why)
    times = ratio(ReplicaVerdict(metric, own, ref, 0, "", ""))
    edge = show(metric, ref.edge * 1000.0)
    past = beyond >= SHARE_BEYOND * own.count
    why = f"{times:.1f}x the others' median; {beyond:.0f} of its {own.count} requests over {edge}"
    return ReplicaVerdict(
        metric, own, ref, len(counted), SLOW if past and times >= FACTOR else ALIKE, why
    )


def histograms(window: SampledWindow, addresses: Sequence[str]) -> dict[str, dict[str, Buckets]]:
    """Each replica's histograms over the window, from the merged pages' ``replica`` label."""
    first, last = window.pages[0], window.pages[-1]
    return {
        address: {m.key: _delta(first, last, m, {"replica": address}) for m in METRICS}
        for address in addresses
    }


def _delta(
    first: Exposition, last: Exposition, metric: ReplicaMetric, where: Mapping[str, str]
) -> Buckets:
    """The buckets' deltas of the first of the metric's histograms that gained any."""
    delta: dict[float, float] = {}
    for names in metric.names:
        name = last.first_present(f"{n}_bucket" for n in names)
        if name is None:
            continue
        base = name.removesuffix("_bucket")
        before = first.buckets(base, where=where)
        delta = {le: c - before.get(le, 0.0) for le, c in last.buckets(base, where=where).items()}
        if max(delta.values(), default=0.0) > 0:
            return delta
    return delta


def of_run(result: RunbookResult) -> FleetVerdict | None:
    """The verdict on a runbook's run: None for one engine, or with no window to split."""
    window = result.windows.get("vllm_metrics")
    probe = result.details.get("vllm_metrics") or result.details.get("queue_cancel") or {}
    listed: Mapping[str, Mapping[str, Any]] = probe.get("replicas") or {}
    if window is None or len(listed) < 2 or not _labelled(window.pages[-1]):
        return None  # one engine; or one replica answered alone (its pages carry no label)
    notes = {address: numbers.get("note") for address, numbers in listed.items()}
    pools = {a: str(n["pool"]) for a, n in listed.items() if n.get("pool")}
    split = histograms(window, list(listed))
    verdict = judge_pools(split, pools, notes) if pools else judge(split, notes)
    return replace(
        verdict,
        nodes={a: str(n["node"]) for a, n in listed.items() if n.get("node")},
        pods={a: str(n["pod"]) for a, n in listed.items() if n.get("pod")},
    )


def _labelled(page: Exposition) -> bool:
    return any("replica" in labels for rows in page.samples.values() for labels, _ in rows)
