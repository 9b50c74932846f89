"""One replica or all of them (bot/diagnosis/replicas.py): the rule on hand-made histograms.

Each replica's TTFT is given as observations per bucket (vLLM's own TTFT edges); the rule holds
a replica's p99 against the median of the others' p99s, each from its own histogram.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from bot.diagnosis import replica_text
from bot.diagnosis.probes.types import Severity
from bot.diagnosis.replicas import (
    ALIKE,
    MIN_REQUESTS,
    SLOW,
    UNKNOWN,
    Buckets,
    FleetVerdict,
    judge,
)

EDGES = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)


def ttft(observations: Mapping[float, int]) -> dict[str, Buckets]:
    """Cumulative TTFT buckets from observations per upper edge (+Inf included)."""
    out, running = {}, 0.0
    for edge in (*EDGES, float("inf")):
        running += observations.get(edge, 0)
        out[edge] = running
    return {"ttft_p99_ms": out}


FAST = {0.02: 10, 0.04: 28, 0.06: 2}  # 40 requests, p99 in the 40-60 ms bucket
SLOW_ONE = {0.25: 5, 0.5: 35}  # 40 requests, p99 in the 250-500 ms bucket


def verdict(**replicas: Mapping[float, int]) -> FleetVerdict:
    return judge({f"10.0.0.{name[1:]}:8000": ttft(obs) for name, obs in replicas.items()})


def test_one_slow_replica_of_two_is_named_with_its_numbers() -> None:
    found = verdict(r7=SLOW_ONE, r8=FAST)
    assert found.kind == "outlier" and [r.address for r in found.slow] == ["10.0.0.7:8000"]
    (row,) = found.slow
    (judged,) = row.slow
    assert judged.others == 1 and judged.reference is not None
    (finding,) = replica_text.findings(found, fleet_slow=True)
    assert finding.severity is Severity.WARNING
    assert finding.message == (
        "one replica of 2 is slow: 10.0.0.7:8000 TTFT p99 497 ms vs 56.0 ms on the other 1"
    )
    assert replica_text.line(found) == (
        "replicas: 10.0.0.7:8000 TTFT p99 497 ms (slow) · 1 other ≤ 56.0 ms"
    )
    assert "drain or restart 10.0.0.7:8000" in replica_text.by_hand(found)
    summary = replica_text.summary_json(found)
    assert summary.slow == ["10.0.0.7:8000"] and summary.rows[0].state == SLOW
    assert summary.rows[1].model_dump(exclude_unset=True) == {
        "replica": "10.0.0.8:8000", "state": ALIKE, "node": None, "requests": 40,
        "ttft_p99_ms": 56.0, "bounds": {}, "why": "", "note": None,
    }  # fmt: skip


def test_all_healthy_no_replica_finding() -> None:
    found = verdict(r7=FAST, r8=FAST, r9={0.02: 12, 0.04: 27, 0.06: 1})
    assert found.kind == "alike" and found.slow == []
    assert replica_text.findings(found, fleet_slow=False) == []
    assert replica_text.line(found).endswith("· none stands out")


def test_all_slow_is_fleet_wide_not_one_replica() -> None:
    found = verdict(r7=SLOW_ONE, r8=SLOW_ONE, r9={0.25: 10, 0.5: 30})
    assert found.kind == "alike" and found.slow == []
    (finding,) = replica_text.findings(found, fleet_slow=True)
    assert finding.severity is Severity.INFO
    assert "no replica stands out" in finding.message and "fleet-wide" in finding.message


def test_too_few_requests_cannot_tell_never_a_guess() -> None:
    few = {0.5: 3, 1.0: 2}  # 5 requests, all slow: still too few to judge
    found = verdict(r7=few, r8=FAST)
    assert found.slow == []
    states = {r.address: r.state for r in found.rows}
    assert states == {"10.0.0.7:8000": UNKNOWN, "10.0.0.8:8000": UNKNOWN}  # 8 has no other
    (finding,) = replica_text.findings(found, fleet_slow=True)
    assert finding.message.startswith("cannot tell for 2 of 2 replicas")
    assert replica_text.line(found).startswith("replicas: 2, cannot tell")
    one = verdict(r7=few, r8=FAST, r9=FAST)
    (unknown,) = replica_text.findings(one, fleet_slow=False)
    assert unknown.message == (
        f"cannot tell whether 10.0.0.7:8000 is slow (TTFT p99: 5 requests in the window, "
        f"{MIN_REQUESTS} needed)"
    )


def test_one_stray_request_or_a_small_gap_is_not_an_outlier() -> None:
    stray = {0.02: 10, 0.04: 29, 2.5: 1}  # one request of 40 took 2 s
    assert verdict(r7=stray, r8=FAST).slow == []
    one_bucket = {0.04: 10, 0.06: 28, 0.08: 2}  # a bucket above, under 2x
    assert verdict(r7=one_bucket, r8=FAST).slow == []
    # the real engines, healthy again on a shared box: 2 of 24 over the other's p99 edge, p99 2.3x
    noisy = judge({"a:1": {"tpot_p99_ms": {0.01: 22, 0.025: 24, math.inf: 24}},
                   "b:1": {"tpot_p99_ms": {0.01: 24, 0.025: 24, math.inf: 24}}})  # fmt: skip
    assert noisy.slow == [] and noisy.kind == "alike"


def test_two_slow_of_forty_do_not_hide_each_other_and_the_line_stays_short() -> None:
    replicas = {f"r{n}": FAST for n in range(1, 39)}
    found = verdict(**replicas, r39=SLOW_ONE, r40={0.5: 5, 1.0: 35})
    assert [r.address for r in found.slow] == ["10.0.0.40:8000", "10.0.0.39:8000"]
    line = replica_text.line(found)
    assert line == (
        "replicas: 10.0.0.40:8000 TTFT p99 997 ms (slow) · 10.0.0.39:8000 TTFT p99 497 ms "
        "(slow) · 38 others ≤ 56.0 ms"
    )
    (finding,) = replica_text.findings(found, fleet_slow=True)
    assert finding.message.startswith("2 replicas of 40 are slow: 10.0.0.40:8000 TTFT p99 997 ms")
    assert "the median of the other 39" in finding.message
    many = verdict(**{f"r{n}": FAST for n in range(1, 35)},
                   **{f"r{n}": SLOW_ONE for n in range(35, 41)})  # fmt: skip
    assert len(many.slow) == 6 and len(replica_text.line(many)) < 200
    assert "3 more slow" in replica_text.line(many)


def test_a_discovered_slow_replica_gets_its_pod_and_node_in_the_advice() -> None:
    found = dataclasses.replace(
        verdict(r7=SLOW_ONE, r8=FAST),
        pods={"10.0.0.7:8000": "vllm-7d9f-x2k4q", "10.0.0.8:8000": "vllm-7d9f-p8m1z"},
        nodes={"10.0.0.7:8000": "gpu-node-3", "10.0.0.8:8000": "gpu-node-1"},
    )
    advice = replica_text.by_hand(found)
    assert "`kubectl delete pod vllm-7d9f-x2k4q`" in advice and "x2k4q" in advice
    assert "p8m1z" not in advice  # the healthy one is left alone
    assert advice.endswith("on node gpu-node-3")
    (finding,) = replica_text.findings(found, fleet_slow=True)
    assert finding.message.startswith("one replica of 2 is slow: 10.0.0.7:8000 (node gpu-node-3)")
