"""The statistics as the gate uses them, and the guardrails beside it (bot/canary/verdict.py,
bot/canary/guardrails.py): an 'Nx before' gate is judged two-sample against the before-run's
per-request values, a run is sized so that its gates can be decided at all, and an ungated number
the change made worse beyond noise is said (the TTFT a TPOT fix doubled), each judge shown
failing on its bad case."""

from __future__ import annotations

import numpy as np

from bot.adr import AdrGates
from bot.canary.client import Outcome, RequestRecord
from bot.canary.guardrails import StandingGate, standing, watch
from bot.canary.runner import CanaryRun
from bot.canary.stats import min_pairs, min_requests
from bot.canary.verdict import Gates, how_sure, judged
from bot.canary.workload import Workload
from tests.canary_reports import measured, report_of

RNG_SEED = 20261205


def _values(rng: np.random.Generator, n: int, median_ms: float) -> list[float]:
    """Latency-like values with a long right tail around ``median_ms``."""
    return [float(v) for v in median_ms * rng.lognormal(mean=0.0, sigma=0.4, size=n)]


def test_a_half_before_gate_keeps_a_fix_that_helps_on_eight_requests_and_says_its_p_value() -> None:
    rng = np.random.default_rng(RNG_SEED)
    before = report_of(_values(rng, 8, 40.0), _values(rng, 8, 100.0))
    fixed = report_of(_values(rng, 8, 40.0), _values(rng, 8, 14.0))
    point_limit = 0.5 * (before.tpot_ms.p99_judged() or 0.0)
    gates = Gates(AdrGates(max_tpot_p99_ms=point_limit), ratios=(("max_tpot_p99_ms", 0.5),),
                  before=before.samples)  # fmt: skip
    kept = judged(fixed, gates)
    assert kept.passed, kept.failures
    (line,) = [g for g in kept.report.gates if g.name == "max_tpot_p99_ms"]
    assert (line.decided, line.sample, line.sample_before) == ("met", 8, 8)
    assert line.p_value is not None and line.p_value < 0.01
    assert how_sure(kept.report) == [f"TPOT p99: met at 99% (p={line.p_value:.2g}; n=8, 8 before)"]


def test_a_change_that_does_nothing_is_not_met_under_half_before_whatever_its_maximum_says() -> (
    None
):
    """A/A: the same engine twice. The old judge compared two maxima and passed whenever the
    after-run's worst request happened to be under half the before-run's; the U test sees two
    samples of one distribution and cannot call it met."""
    rng = np.random.default_rng(RNG_SEED)
    lucky = 0
    for _ in range(200):
        before = report_of(_values(rng, 8, 40.0), _values(rng, 8, 100.0))
        after = report_of(_values(rng, 8, 40.0), _values(rng, 8, 100.0))
        limit = 0.5 * (before.tpot_ms.p99_judged() or 0.0)
        point_passes = (after.tpot_ms.p99_judged() or 0.0) <= limit
        lucky += point_passes
        gates = Gates(AdrGates(max_tpot_p99_ms=limit), ratios=(("max_tpot_p99_ms", 0.5),),
                      before=before.samples)  # fmt: skip
        verdict = judged(after, gates).verdict
        assert not verdict.passed, verdict.failures
    assert lucky > 0, "the point judge this replaces passes some A/A runs: the bad case exists"


def test_a_run_too_short_to_decide_is_inconclusive_and_fails_saying_why() -> None:
    rng = np.random.default_rng(RNG_SEED)
    before = report_of(_values(rng, 4, 40.0), _values(rng, 4, 100.0))
    fixed = report_of(_values(rng, 4, 40.0), _values(rng, 4, 14.0))
    gates = Gates(
        AdrGates(max_tpot_p99_ms=50.0), ratios=(("max_tpot_p99_ms", 0.5),), before=before.samples
    )
    verdict = judged(fixed, gates).verdict
    assert not verdict.passed
    (undecided,) = verdict.inconclusive
    assert "not decided at 99%" in undecided.reason and "n=4 after, 4 before" in undecided.reason


def test_a_canary_is_sized_so_that_its_gates_can_be_decided() -> None:
    workload = Workload(endpoint="http://127.0.0.1:9/v1/completions", num_requests=12)
    by_limit = CanaryRun(workload, gates=Gates.of(max_ttft_p99_ms=350.0))
    assert by_limit.workload.num_requests == min_requests(0.99, 0.99) == 528
    assert by_limit.warnings == ["sized 12 -> 528 requests: the gates cannot be decided at 99% on"
                                 " fewer"]  # fmt: skip
    by_ratio = CanaryRun(
        Workload(endpoint=workload.endpoint, num_requests=4),
        gates=Gates(AdrGates(max_tpot_p99_ms=10.0), ratios=(("max_tpot_p99_ms", 0.5),)),
    )
    assert by_ratio.workload.num_requests == min_pairs(0.99) == 5
    untouched = CanaryRun(workload, gates=Gates.of(min_goodput_ratio=0.9))  # no per-request gate
    assert untouched.workload.num_requests == 12 and untouched.warnings == []
    timed = CanaryRun(Workload(endpoint=workload.endpoint, num_requests=None, duration_s=5.0),
                      gates=Gates.of(max_ttft_p99_ms=350.0))  # fmt: skip
    assert timed.workload.num_requests is None  # bounded by time: its verdict says if too short


def test_an_ungated_ttft_that_doubled_is_flagged_and_one_that_held_is_not() -> None:
    rng = np.random.default_rng(RNG_SEED)
    before = report_of(_values(rng, 40, 120.0), _values(rng, 40, 100.0))
    doubled = report_of(_values(rng, 40, 240.0), _values(rng, 40, 14.0))
    (ttft, *rest) = watch(before, doubled, gated={"tpot_p99_ms"})
    assert ttft.key == "ttft_p99_ms" and ttft.regressed and ttft.worse
    assert "worse beyond 20% and noise (above 1.2x before at 99%: p=" in ttft.text()
    assert "n=40, 40 before" in ttft.text()
    assert all(w.key != "tpot_p99_ms" for w in rest)  # gated: its gate judged it
    same = report_of(_values(rng, 40, 120.0), _values(rng, 40, 14.0))
    (held, *_) = watch(before, same, gated={"tpot_p99_ms"})
    assert held.key == "ttft_p99_ms" and not held.regressed, held.text()
    three = report_of(_values(rng, 3, 120.0), _values(rng, 3, 100.0))
    few = watch(three, report_of(_values(rng, 3, 240.0), _values(rng, 3, 14.0)))
    (few_ttft,) = [w for w in few if w.key == "ttft_p99_ms"]
    assert few_ttft.worse and not few_ttft.regressed  # worse on points; three a side: not tested
    assert "not beyond noise" in few_ttft.text()


def test_an_error_rate_that_rose_beyond_noise_is_flagged() -> None:
    rng = np.random.default_rng(RNG_SEED)
    before = report_of(_values(rng, 100, 40.0), _values(rng, 100, 20.0))
    failing = report_of(_values(rng, 80, 40.0), _values(rng, 80, 20.0), failed=20)
    (errors,) = [w for w in watch(before, failing) if w.key == "error_rate"]
    assert errors.regressed and errors.text().startswith("error rate 0% → 20%: worse beyond 20%")
    assert "(more at 99%: p=" in errors.text()
    one = report_of(_values(rng, 99, 40.0), _values(rng, 99, 20.0), failed=1)
    (barely,) = [w for w in watch(before, one) if w.key == "error_rate"]
    assert not barely.worse  # one failure in a hundred: within the band


SLO = {"max_ttft_p99_ms": StandingGate(350.0, "ADR-20260831-01")}  # a team's standing latency gate


def test_a_canary_clearly_over_a_standing_gate_misses_it_and_says_which_adr_set_it() -> None:
    """The incident page's kept canary at TTFT p99 452 ms over the team's 350 ms: the standing
    gate is judged as a gate (its p99's interval lies over the limit) and counts as regressed."""
    rng = np.random.default_rng(RNG_SEED)
    over = report_of(_values(rng, 40, 450.0), _values(rng, 40, 10.0))
    (slo,) = standing(over, SLO)
    assert slo.regressed and slo.worse
    text = slo.text()
    assert text.startswith("TTFT p99 ") and "against the standing gate ≤ 350ms" in text, text
    assert "(ADR-20260831-01): missed (p99 in [" in text and "(n=40)" in text, text


def test_a_short_canary_under_a_standing_gate_is_not_decided_not_held() -> None:
    """Twelve requests cannot bound a p99 from above: under the limit on its point value, the
    standing gate is said as not decided, and neither regressed nor worse."""
    rng = np.random.default_rng(RNG_SEED)
    under = report_of(_values(rng, 12, 100.0), _values(rng, 12, 10.0))
    (slo,) = standing(under, SLO)
    assert not slo.regressed and not slo.worse
    assert ": not decided (p99 in [" in slo.text() and "528 requests bound a p99" in slo.text()
    # and over the limit on twelve: worse on its point value, not decided, not regressed
    mixed = report_of([100.0] * 10 + [400.0, 900.0], [10.0] * 12)
    (slo,) = standing(mixed, SLO)
    assert slo.worse and not slo.regressed
    assert ": over it, not decided (" in slo.text(), slo.text()


def test_a_standing_goodput_gate_is_judged_on_the_runs_value() -> None:
    """Goodput is a ratio of the whole run: below a standing minimum it is missed (as the
    change's own goodput gate would be), above it held."""
    records = []
    for broke in (False,) * 6 + (True,) * 2:  # two streams break after 9 tokens: not delivered
        r = RequestRecord(sent_at=0.0, first_token_at=0.04, finished_at=0.12)
        r.output_tokens, r.outcome = 9, Outcome.FAILED if broke else Outcome.OK
        records.append(r)
    report = measured(records)
    assert report.goodput_ratio == 0.75
    goodput = {"min_goodput_ratio": StandingGate(0.95, "ADR-20260831-01")}
    (slo,) = standing(report, goodput)
    assert slo.regressed, slo.text()
    (held,) = standing(report, {"min_goodput_ratio": StandingGate(0.5, "ADR-X")})
    assert not held.regressed and not held.worse and ": held (" in held.text(), held.text()
    assert standing(report, {}) == []


def test_how_sure_says_the_confidence_the_gates_decided_at() -> None:
    rng = np.random.default_rng(RNG_SEED)
    before = report_of(_values(rng, 8, 40.0), _values(rng, 8, 100.0))
    fixed = report_of(_values(rng, 8, 40.0), _values(rng, 8, 14.0))
    for confidence, said in ((0.95, "met at 95%"), (0.99, "met at 99%")):
        gates = Gates(AdrGates(max_tpot_p99_ms=50.0), ratios=(("max_tpot_p99_ms", 0.5),),
                      before=before.samples, confidence=confidence)  # fmt: skip
        (line,) = how_sure(judged(fixed, gates).report)
        assert line.startswith(f"TPOT p99: {said} (p="), line
