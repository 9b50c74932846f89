"""What the replica rule's verdict says (bot/diagnosis/replicas.py): the findings, the one line a
phone shows for 2 or 40 replicas, what to do by hand, and the summary's JSON."""

from __future__ import annotations

from collections.abc import Sequence

from bot.diagnosis.probes.types import Finding, Severity
from bot.diagnosis.replicas import (
    ALIKE,
    FACTOR,
    LABEL,
    METRICS,
    MIN_REQUESTS,
    POOL_METRICS,
    SHARE_BEYOND,
    SLOW,
    UNKNOWN,
    FleetVerdict,
    ReplicaRow,
    ReplicaVerdict,
)
from bot.kernel.numbers import show
from bot.kernel.store import ReplicaRule, StoredFleet, StoredReplica

SOURCE = "replicas: one or all (docs/fleet.md)"
MAX_NAMED = 3  # replicas named in the one line; the rest are counted
MAX_IN_FINDING = 5


def _p99(judged: ReplicaVerdict) -> str:
    bound = judged.p99.bound
    return f"{LABEL[judged.metric]} {show(judged.metric, judged.p99.value, bound)}"


def _others(n: int) -> str:
    return "1 other" if n == 1 else f"{n} others"


def _named(rows: Sequence[ReplicaRow], limit: int) -> str:
    """'a, b and 3 more'."""
    names = [r.address for r in rows[:limit]]
    more = len(rows) - len(names)
    return ", ".join(names) + (f" and {more} more" if more else "")


def line(verdict: FleetVerdict) -> str:
    """'replicas: 10.0.0.7:8000 TTFT p99 490 ms (slow) · 1 other ≤ 50.0 ms': the worst few
    named, the rest counted (as short with 40 replicas as with 2); a prefill/decode target's
    pools each said on its own ('replicas: prefill pool: ...; decode pool: ...')."""
    if not verdict.pools:
        return "replicas: " + _line(verdict.rows, METRICS[0].key)
    return "replicas: " + "; ".join(
        f"{pool} pool: " + _line([r for r in verdict.rows if verdict.pools.get(r.address) == pool],
                                 metrics[0].key)
        for pool, metrics in POOL_METRICS.items()
    )  # fmt: skip


def _line(rows: Sequence[ReplicaRow], first: str) -> str:
    """The line of some replicas judged together; ``first``: the metric named when none is
    slow."""
    slow = [r for r in rows if r.state == SLOW]
    judged = [r for r in rows if r.state == ALIKE]
    unknown = [r for r in rows if r.state == UNKNOWN]
    named = slow[:MAX_NAMED] or judged[:1]
    if not named:
        return (f"{len(rows)}, cannot tell (fewer than {MIN_REQUESTS} "
                "requests each in the window)")  # fmt: skip
    key = named[0].slow[0].metric if slow else first
    parts = [_worst(r, key) for r in named]
    if len(slow) > MAX_NAMED:
        parts.append(f"{len(slow) - MAX_NAMED} more slow")
    rest = [r for r in judged if r not in named and r.value(key) is not None]
    if rest:
        top = max(rest, key=lambda r: r.value(key) or 0.0)
        parts.append(f"{_others(len(rest))} ≤ {show(key, top.value(key))}")
    if unknown:
        parts.append(f"{len(unknown)} cannot tell")
    if not slow:
        parts.append("none stands out")
    return " · ".join(parts)


def _worst(row: ReplicaRow, key: str) -> str:
    if row.slow:
        return f"{row.address} {_p99(row.slow[0])} (slow)"
    judged = row.judged.get(key)
    return f"worst {row.address}" + ("" if judged is None else f" {_p99(judged)}")


def findings(verdict: FleetVerdict, *, fleet_slow: bool) -> list[Finding]:
    """The outliers (a warning); with none while the fleet is slow, that it is fleet-wide;
    and the replicas it cannot tell about."""
    out = []
    slow = verdict.slow
    if slow:
        out.append(Finding(Severity.WARNING, _slow_message(verdict), SOURCE))
    elif fleet_slow and verdict.kind == "alike":
        out.append(Finding(Severity.INFO, _fleet_wide_message(verdict), SOURCE))
    unknown = [r for r in verdict.rows if r.state == UNKNOWN]
    if unknown:
        out.append(Finding(Severity.INFO, _unknown_message(verdict, unknown), SOURCE))
    return out


def _slow_message(verdict: FleetVerdict) -> str:
    """'one replica of 2 is slow: 10.0.0.7:8000 TTFT p99 490 ms vs 38.0 ms on the other 1'."""
    slow, total = verdict.slow, len(verdict.rows)
    pools = {verdict.pools.get(r.address) for r in slow}
    pool = pools.pop() if len(pools) == 1 else None
    if pool:  # one pool's outliers, judged within it: 'one replica of 2 in the prefill pool'
        total = sum(p == pool for p in verdict.pools.values())
    within = f" in the {pool} pool" if pool else ""
    head = (f"one replica of {total}{within} is slow" if len(slow) == 1
            else f"{len(slow)} replicas of {total}{within} are slow")  # fmt: skip
    named = []
    for row in slow[:MAX_IN_FINDING]:
        node = verdict.nodes.get(row.address)
        own = verdict.pools.get(row.address) if not pool else None
        where = (
            row.address + (f" ({own} pool)" if own else "") + (f" (node {node})" if node else "")
        )
        named.append(where + " " + ", ".join(_against(j) for j in row.slow))
    more = len(slow) - len(named)
    return f"{head}: " + "; ".join(named) + (f"; and {more} more (incident page)" if more else "")


def _against(judged: ReplicaVerdict) -> str:
    """'TTFT p99 490 ms vs 38.0 ms on the other 1' (the median of several others' p99s)."""
    ref = judged.reference
    assert ref is not None  # a slow judgement always has one
    others = ("on the other 1" if judged.others == 1
              else f"the median of the other {judged.others}")  # fmt: skip
    return f"{_p99(judged)} vs {show(judged.metric, ref.value, ref.bound)} {others}"


def _fleet_wide_message(verdict: FleetVerdict) -> str:
    key = METRICS[0].key
    values = [v for r in verdict.rows if r.state == ALIKE and (v := r.value(key)) is not None]
    spread = (f" ({LABEL[key]} {show(key, min(values))} to {show(key, max(values))})"
              if values else "")  # fmt: skip
    n = sum(1 for r in verdict.rows if r.state == ALIKE)
    return (
        f"no replica stands out: the {n} replicas judged are alike{spread}, none {FACTOR:g}x "
        "the others' median: the cause is fleet-wide, not one replica"
    )


def _unknown_message(verdict: FleetVerdict, unknown: Sequence[ReplicaRow]) -> str:
    if len(unknown) == 1:
        row = unknown[0]
        why = "; ".join(f"{LABEL[j.metric]}: {j.why}" for j in row.judged.values()
                        if j.state == UNKNOWN)  # fmt: skip
        return f"cannot tell whether {row.address} is slow ({why or 'no requests'})"
    return (
        f"cannot tell for {len(unknown)} of {len(verdict.rows)} replicas (each needs "
        f"{MIN_REQUESTS} requests in the window): {_named(unknown, MAX_IN_FINDING)}"
    )


def by_hand(verdict: FleetVerdict) -> str:
    """What to do about the outliers by hand (the bot changes no single replica yet): with
    their pods and nodes when discovery found them, the exact commands."""
    slow = verdict.slow
    one = len(slow) == 1
    pods = [verdict.pods[r.address] for r in slow[:MAX_IN_FINDING] if r.address in verdict.pods]
    nodes = sorted({verdict.nodes[r.address] for r in slow if r.address in verdict.nodes})
    if pods:
        how = "delete its pod so its ReplicaSet replaces it" if one else "one at a time"
        restart = f"{how}: `kubectl delete pod {' '.join(pods)}`"
    else:
        restart = "take it out of the load balancer, or delete its pod" if one else "one at a time"
    if nodes:
        where = f"on node {', '.join(nodes)}"
    else:
        where = "and its node" if one else "and whether they share a node"
        where += " (`kubectl get pod -o wide`)"
    gpu = "its GPU" if one else "their GPUs"
    return (
        f"drain or restart {_named(slow, MAX_IN_FINDING)} ({restart}); check {gpu} "
        f"(`nvidia-smi`: clocks, temperature, XID errors) {where}"
    )


def summary_json(verdict: FleetVerdict) -> StoredFleet:
    """The verdict in the diagnosis summary (the store, the incident page)."""
    return StoredFleet(
        kind=verdict.kind,
        line=line(verdict),
        rule=ReplicaRule(min_requests=MIN_REQUESTS, factor=FACTOR, share_beyond=SHARE_BEYOND),
        slow=[r.address for r in verdict.slow],
        by_hand=by_hand(verdict) if verdict.slow else None,
        rows=[_row_json(r, verdict.nodes.get(r.address), verdict.pools.get(r.address))
              for r in verdict.rows],
    )  # fmt: skip


def _row_json(row: ReplicaRow, node: str | None, pool: str | None = None) -> StoredReplica:
    first = row.judged.get(METRICS[0].key)
    p99s = {key: None if (v := j.p99.value) is None else round(v, 3)
            for key, j in row.judged.items()}  # fmt: skip
    shown = row.slow or [j for j in row.judged.values() if j.state == UNKNOWN][:1]
    return StoredReplica.model_validate(
        {
            "replica": row.address,
            "state": row.state,
            "node": node,
            "requests": None if first is None else first.p99.count,
            **p99s,
            "bounds": {k: str(j.p99.bound) for k, j in row.judged.items() if j.p99.bound},
            "why": "; ".join(f"{LABEL[j.metric]}: {j.why}" for j in shown),
            "note": row.note,
            **({"pool": pool} if pool else {}),  # prefill/decode: the pool it was judged in
        }
    )
