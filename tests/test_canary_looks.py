"""A sized canary looks again while a gate is undecided: it stops at the first look where every
p99 gate is decided, else sends as many requests again, each look judged at its share of the
error (``Gates.looks``). The engine here is a real HTTP server whose first-token wait is set per
request, so each test builds the TTFTs it needs; the before-run is 200 ms a request, and the gate
is "TTFT at most 0.5x before" (100 ms). Margins are 80 ms or more either side of it."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from bot.adr import AdrGates
from bot.canary import Gates, Samples
from bot.canary.runner import CanaryRun
from bot.canary.schema import CanaryReport
from bot.canary.stats import min_pairs
from bot.canary.verdict import judged
from bot.canary.workload import Workload
from tests.fakes.sse_engine import SseEngine

N = 16  # the sized count, the first look
FAST, SLOW = 0.02, 0.2  # a request's first-token wait: well under 100 ms, well over it


def gates(looks: int) -> Gates:
    return Gates(
        AdrGates(max_ttft_p99_ms=1e9), ratios=(("max_ttft_p99_ms", 0.5),),
        before=Samples(ttft_ms=[200.0] * N), looks=looks,
    )  # fmt: skip


async def run(first_token_s: Callable[[int], float], looks: int) -> tuple[CanaryRun, CanaryReport]:
    async with SseEngine(first_token_s=first_token_s) as engine:
        workload = Workload(
            endpoint=f"{engine.base_url}/v1/completions", concurrency=4, num_requests=N,
            output_length=2,
        )  # fmt: skip
        canary = CanaryRun(workload, gates=gates(looks))
        report = judged((await canary.run()).report(), canary.gates).report
    return canary, report


def half_slow_then_fast(i: int) -> float:
    """The first look's requests alternate (no evidence either way); later ones are fast."""
    return (SLOW if i % 2 else FAST) if i < N else FAST


def always_half_slow(i: int) -> float:
    return SLOW if i % 2 else FAST


def ttft_gate(report: CanaryReport):  # noqa: ANN201
    (line,) = [g for g in report.gates if g.name == "max_ttft_p99_ms"]
    return line


async def test_a_run_decided_at_its_first_look_stops_there() -> None:
    canary, report = await run(lambda i: FAST, looks=2)
    assert len(canary.records) == N and report.looks == 2
    assert ttft_gate(report).decided == "met" and report.passed
    assert not [w for w in report.warnings if w.startswith("look")]


async def test_an_undecided_first_look_goes_on_and_decides_at_the_second() -> None:
    canary, report = await run(half_slow_then_fast, looks=2)
    assert len(canary.records) == 2 * N
    assert f"look 1 of 2: TTFT p99 not decided on {N} requests; {N} more" in report.warnings
    gate = ttft_gate(report)
    assert gate.decided == "met" and gate.sample == 2 * N and report.passed
    # each look at half the error: the p-value clears 0.005, not only 0.01
    assert gate.p_value is not None and gate.p_value < 0.005


async def test_one_look_cannot_go_on_and_the_same_run_is_inconclusive() -> None:
    canary, report = await run(half_slow_then_fast, looks=1)
    assert len(canary.records) == N and report.looks == 1
    assert ttft_gate(report).decided == "inconclusive" and not report.passed


async def test_undecided_at_the_last_look_is_inconclusive_and_fails() -> None:
    canary, report = await run(always_half_slow, looks=2)
    assert len(canary.records) == 2 * N
    gate = ttft_gate(report)
    assert gate.decided == "inconclusive" and not report.passed
    assert "not decided" in gate.reason
    # each of two looks at 99.5 %, said as such (rounded, it read "not decided at 100%")
    assert "not decided at 99.5% (p=" in gate.reason and "100%" not in gate.reason, gate.reason


def test_each_look_is_judged_at_its_share_of_the_error() -> None:
    one, two = gates(1), gates(2)
    assert (one.test_confidence(), two.test_confidence()) == (0.99, 0.995)
    # a quantile's interval: each end at (1 - c) / looks, never looser than asked
    assert one.interval_confidence() == two.interval_confidence() == 0.99
    assert gates(4).interval_confidence() == pytest.approx(0.995)
    assert min_pairs(0.995) >= min_pairs(0.99)
    assert two.requests_needed() == min_pairs(0.995)


async def test_a_count_given_as_a_bound_is_one_look() -> None:
    async with SseEngine() as engine:
        workload = Workload(endpoint=f"{engine.base_url}/v1/completions", num_requests=4)
        canary = CanaryRun(workload, gates=gates(2), size=False)
    assert canary.gates.looks == 1
