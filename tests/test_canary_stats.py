"""The verdict's arithmetic (bot/canary/stats.py), checked against what it claims: an interval
covers the true quantile as often as its confidence says, the U test's p-value is the
permutation p-value it approximates, and a judge says "inconclusive" where the data cannot
decide, instead of passing or failing on four requests' maximum."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bot.canary import stats
from bot.canary.client import Outcome, RequestRecord
from bot.canary.render import summary_table
from bot.canary.report import CanaryMeasurement
from bot.canary.schema import CanaryReport
from bot.canary.stats import (
    hodges_lehmann,
    judge_clustered,
    judge_limit,
    judge_ratio,
    min_requests,
    quantile_interval,
    u_test_values,
)
from bot.canary.verdict import Gates, how_sure
from bot.remediation.ports import RemediationView
from bot.surfaces.slack.remediation_views import remediation_card
from tests.workload_pages import chat

RNG_SEED = 20261205


def lognormal(rng: np.random.Generator, n: int, scale: float = 1.0) -> list[float]:
    """Latency-like values: a long right tail (median 20, p99 about 85)."""
    return [float(v) for v in scale * rng.lognormal(mean=3.0, sigma=0.62, size=n)]


TRUE_P99 = float(np.exp(3.0 + 0.62 * 2.3263478740408408))  # lognormal's p99


@pytest.mark.parametrize(("n", "confidence"), [(400, 0.95), (600, 0.99), (60, 0.9)])
def test_the_interval_covers_the_true_quantile_as_often_as_it_says(
    n: int, confidence: float
) -> None:
    rng = np.random.default_rng(RNG_SEED)
    trials, covered, unbounded = 1000, 0, 0
    for _ in range(trials):
        interval = quantile_interval(lognormal(rng, n), 0.99, confidence)
        low = -np.inf if interval.low is None else interval.low
        high = np.inf if interval.high is None else interval.high
        covered += low <= TRUE_P99 <= high
        unbounded += interval.high is None
    # distribution-free: at least the confidence (order statistics are conservative), within
    # the binomial noise of 1,000 trials
    assert covered / trials >= confidence - 0.02, (covered, trials)
    assert (unbounded > 0) == (n < min_requests(0.99, confidence))


def test_four_requests_cannot_bound_a_p99_from_above() -> None:
    interval = quantile_interval([40.0, 10.0, 30.0, 20.0], 0.99, 0.95)
    assert (interval.n, interval.low, interval.high) == (4, 30.0, None)
    assert interval.text() == "[30.0, ∞)"


def test_min_requests_is_the_first_sample_bounded_on_both_sides() -> None:
    need = min_requests(0.99, 0.95)
    assert need == 368  # ln(0.025) / ln(0.99)
    values = [float(v) for v in range(1, need + 1)]
    assert quantile_interval(values, 0.99, 0.95).high == need  # the maximum, reached
    assert quantile_interval(values[:-1], 0.99, 0.95).high is None  # one fewer: unbounded
    assert min_requests(0.5, 0.95) == 6


def test_a_failed_request_at_an_end_makes_that_end_unbounded() -> None:
    values = [float(v) for v in range(1, 400)] + [float("inf")] * 20
    interval = quantile_interval(values, 0.99, 0.95)
    assert interval.high is None and interval.low is not None


def test_the_u_tests_p_value_is_the_permutation_p_value() -> None:
    rng = np.random.default_rng(RNG_SEED)
    a, b = lognormal(rng, 30, 1.3), lognormal(rng, 30)
    p = u_test_values(a, b).p_value
    # the same statistic's null distribution by relabelling the pooled values
    pooled, n = np.array(a + b), len(a)

    def u(first: np.ndarray, second: np.ndarray) -> float:
        return float((first[:, None] > second[None, :]).sum())

    seen = u(pooled[:n], pooled[n:])
    perms = 4000
    beyond = sum(u(x[:n], x[n:]) >= seen for x in (rng.permutation(pooled) for _ in range(perms)))
    assert p == pytest.approx(beyond / perms, abs=0.02)
    assert u_test_values(b, a).p_value == pytest.approx(1 - p, abs=0.02)  # one-sided


def test_hodges_lehmann_is_the_shift_between_two_runs() -> None:
    before = [10.0, 12.0, 15.0, 20.0, 40.0]
    assert hodges_lehmann([v - 5 for v in before], before) == -5.0
    assert hodges_lehmann(before, before) == 0.0


def test_a_fix_that_halves_latency_is_met_with_enough_requests() -> None:
    rng = np.random.default_rng(RNG_SEED)
    before, after = lognormal(rng, 100), lognormal(rng, 100, scale=0.3)
    judged = judge_ratio(before, after, 0.5)
    assert judged.outcome == "met", judged.why
    assert judged.p_value is not None and judged.p_value < 0.01 and judged.shift is not None
    assert "n=100 after, 100 before" in judged.why and "below 0.5x before" in judged.why


def test_a_change_that_does_nothing_is_never_met_under_half_of_before() -> None:
    """The bad case: A/A. The point-p99 judge keeps it when the after-run's maximum happens to
    be half the before-run's; the statistical one misses it with data, and with four requests
    it cannot tell."""
    rng = np.random.default_rng(RNG_SEED)
    many = judge_ratio(lognormal(rng, 200), lognormal(rng, 200), 0.5)
    assert many.outcome == "missed", many.why
    outcomes = {judge_ratio(lognormal(rng, 4), lognormal(rng, 4), 0.5).outcome for _ in range(200)}
    assert "met" not in outcomes and "inconclusive" in outcomes


def test_a_limit_is_decided_only_when_the_interval_is_on_one_side() -> None:
    rng = np.random.default_rng(RNG_SEED)
    values = lognormal(rng, 1000)  # p99 about 85
    assert judge_limit(values, 0.99, 200.0).outcome == "met"
    missed = judge_limit(values, 0.99, 50.0)
    assert missed.outcome == "missed" and "not ≤ 50" in missed.why
    few = judge_limit(values[:4], 0.99, 200.0)
    assert few.outcome == "inconclusive", few.why
    assert "528 requests bound a p99 on both sides" in few.why and "(n=4)" in few.why
    at_least = judge_limit([0.97] * 20 + [0.99] * 20, 0.5, 0.95, kind="min")
    assert at_least.outcome == "met", at_least.why


def _run(ttfts_ms: list[float], gates: Gates) -> CanaryReport:
    """A canary report (no engine page) of requests with these TTFTs, each 9 tokens."""
    records = []
    for ttft in ttfts_ms:
        r = RequestRecord(sent_at=0.0, first_token_at=ttft / 1000, finished_at=ttft / 1000 + 0.08)
        r.output_tokens, r.outcome = 9, Outcome.OK
        records.append(r)
    return CanaryMeasurement(
        shape=chat(), workload={}, records=records, engine=None, samples=[], gates=gates,
        wall_s=10.0, client_cpu_s=0.1,
    ).report()  # fmt: skip


def test_every_p99_gate_says_how_sure_it_is_beside_its_verdict() -> None:
    """The report's gate lines and the CLI's table: met with 1,000 requests far under the
    limit, missed far over it, inconclusive with four (whatever their point p99 says), and the
    gate passes only when met."""
    rng = np.random.default_rng(RNG_SEED)
    many = lognormal(rng, 1000)  # p99 about 85 ms
    for limit, said in ((200.0, "met"), (50.0, "missed")):
        report = _run(many, Gates.of(max_ttft_p99_ms=limit))
        (ttft, _) = report.gates
        assert ttft.statistics is not None and ttft.statistics.startswith(f"{said}: p99 in ["), (
            ttft.statistics
        )
        assert "at 99% (n=1000)" in ttft.statistics
        assert f"statistics: {ttft.statistics}" in summary_table(report)
    four = _run(many[:4], Gates.of(max_ttft_p99_ms=200.0))
    # the point p99 is under the limit, but four requests cannot show it: the gate fails
    assert not four.passed and four.gates[0].decided == "inconclusive"
    assert four.gates[0].reason.startswith("TTFT p99 ") and ", but (not decided at 99%" in (
        four.gates[0].reason
    )
    low = sorted(many[:4])[2]  # the third of four: the p99 is above it, how far is unknown
    assert four.gates[0].statistics == (
        f"inconclusive: p99 in [{low:.1f}, ∞) at 99% (n=4) straddles 200: not decided; "
        "528 requests bound a p99 on both sides"
    )
    assert four.ttft_ms.p99_interval is not None and four.ttft_ms.p99_interval.high is None


def test_the_card_says_how_sure_the_kept_or_rolled_back_verdict_is() -> None:
    """/apply-adr's card: the point p99 decided, and beside it how sure that was, short enough
    for a phone: four requests cannot decide a p99 at 99 %, a thousand can."""
    rng = np.random.default_rng(RNG_SEED)
    many = lognormal(rng, 1000)
    four = how_sure(_run(many[:4], Gates.of(max_ttft_p99_ms=200.0)))
    assert four == ["TTFT p99: not decided at 99% (n=4; a p99 needs 528)"]
    assert how_sure(_run(many, Gates.of(max_ttft_p99_ms=200.0))) == [
        "TTFT p99: met at 99% (n=1000)"
    ]
    assert how_sure(_run(many, Gates.of(min_goodput_ratio=0.5))) == []  # no p99 gate
    view = RemediationView(
        id=7, adr_id="ADR-1", adr_title="t", target="prod-a", actuator="local",
        requested_by="U1", state="promoted", diff=[], gates={"max_ttft_p99_ms": 200.0},
        two_person=True, numbers={"ttft_p99_ms": 120.0}, how_sure=four,
    )  # fmt: skip
    _, blocks = remediation_card(view)
    shown = json.dumps(blocks, ensure_ascii=False)
    assert "*How sure:* TTFT p99: not decided at 99% (n=4; a p99 needs 528)" in shown


def test_an_adrs_confidence_decides_its_gates_sizes_its_canary_and_is_said() -> None:
    """``gates.confidence`` (0.99 unset): 400 requests cannot bound a p99 at 99 % (528 needed),
    they can at 95 % (368); the verdict, the size and the card say the ADR's confidence."""
    from bot.adr import AdrGates
    from bot.canary.verdict import gates_from

    rng = np.random.default_rng(RNG_SEED)
    runs = lognormal(rng, 400)  # p99 about 85 ms
    strict = gates_from(AdrGates(max_ttft_p99_ms=200.0))
    lenient = gates_from(AdrGates(max_ttft_p99_ms=200.0, confidence=0.95))
    assert (strict.confidence, strict.requests_needed()) == (0.99, 528)
    assert (lenient.confidence, lenient.requests_needed()) == (0.95, min_requests(0.99, 0.95))
    assert lenient.requests_needed() == 368
    undecided, met = _run(runs, strict), _run(runs, lenient)
    assert not undecided.passed and undecided.gates[0].decided == "inconclusive"
    assert met.passed and met.gates[0].decided == "met"
    assert "(met at 95%:" in met.gates[0].reason and met.gates[0].confidence == 0.95
    assert how_sure(met) == ["TTFT p99: met at 95% (n=400)"]
    assert how_sure(undecided) == ["TTFT p99: not decided at 99% (n=400; a p99 needs 528)"]
    # resolved gates and the numbers a re-read keeps still carry it
    resolved = AdrGates(max_tpot_p99_ms="0.5x before", confidence=0.95).resolve(
        {}, before={"tpot_p99_ms": 40.0}
    )
    assert resolved.confidence == 0.95 and resolved.max_tpot_p99_ms == 20.0
    assert gates_from(resolved, numbers_only=True).confidence == 0.95


def correlated_gaps(rng: np.random.Generator, requests: int, gaps: int) -> list[list[float]]:
    """ITL-like gaps: each request has its own speed (a long prompt beside it, a busy batch),
    so one request's gaps move together; the gaps around it vary less."""
    speeds = rng.lognormal(0.0, 0.6, size=requests)
    return [[float(v) for v in s * rng.lognormal(0.0, 0.3, size=gaps)] for s in speeds]


@pytest.mark.parametrize("share_above", [0.013, 0.0075])
def test_itl_gaps_are_judged_with_their_requests_as_the_units(
    share_above: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The limit sits at the gaps' true (1 - share_above) quantile: above 1 % the gate is not
    met, below it is not missed. Counting every gap as independent (design effect 1) calls it
    wrongly often; with the requests as the units the judge does not (it says "not decided")."""
    rng = np.random.default_rng(RNG_SEED)
    population = np.concatenate([np.ravel(correlated_gaps(rng, 1000, 30)) for _ in range(40)])
    limit = float(np.quantile(population, 1 - share_above))
    wrong = "met" if share_above > 0.01 else "missed"
    trials = 120
    runs = [correlated_gaps(rng, 100, 30) for _ in range(trials)]
    ours = sum(judge_clustered(g, 0.99, limit).outcome == wrong for g in runs)
    monkeypatch.setattr(stats, "design_effect", lambda groups, limit: 1.0)
    naive = sum(judge_clustered(g, 0.99, limit).outcome == wrong for g in runs)
    assert ours <= 1 and naive >= 4, (ours, naive)


def test_every_gap_above_the_limit_in_a_few_requests_is_worth_a_few_observations() -> None:
    """Requests whose gaps are alike are worth one observation each: 50 such requests cannot
    show a p99 under the limit (a p99 needs 528), however many gaps they hold."""
    alike = [[10.0 + i * 0.1] * 40 for i in range(50)]
    judgement = judge_clustered(alike, 0.99, 100.0)
    assert (
        judgement.outcome == "inconclusive" and "over 50 effective of 50 requests" in judgement.why
    )


def _itl_run(gaps_ms: list[list[float]], limit: float) -> CanaryReport:
    records = []
    for gaps in gaps_ms:
        r = RequestRecord(sent_at=0.0, first_token_at=0.02, finished_at=0.02 + sum(gaps) / 1000)
        r.output_tokens, r.outcome, r.itl_s = len(gaps) + 1, Outcome.OK, [g / 1000 for g in gaps]
        records.append(r)
    return CanaryMeasurement(
        shape=chat(), workload={}, records=records, engine=None, samples=[],
        gates=Gates.of(max_itl_p99_ms=limit), wall_s=10.0, client_cpu_s=0.1,
    ).report()  # fmt: skip


def test_an_itl_gate_is_decided_by_its_statistics_and_says_so() -> None:
    rng = np.random.default_rng(RNG_SEED)
    gaps = correlated_gaps(rng, 600, 30)  # worth about 750 independent gaps: a p99 needs 528
    p99 = float(np.quantile(np.ravel(gaps), 0.99))
    for limit, said in ((p99 * 3, "met"), (p99 / 3, "missed")):
        report = _itl_run(gaps, limit)
        (gate,) = [g for g in report.gates if g.name == "max_itl_p99_ms"]
        assert gate.decided == said and gate.passed is (said == "met"), gate.statistics
        assert gate.sample == 600 and "effective of 600 requests" in (gate.statistics or "")
    few = _itl_run(gaps[:5], p99 * 1.2)
    assert few.gates[0].decided == "inconclusive" and not few.passed
    assert how_sure(few) == ["ITL p99: not decided at 99% (n=5)"]  # not "a p99 needs 528"
    assert len(few.samples.itl_ms) == 5 and few.samples.itl_ms[0] == [round(g, 2) for g in gaps[0]]
