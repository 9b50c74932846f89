"""The one verdict: failed requests fail the gate, and every consumer reads the same verdict."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.adr.models import AdrGates
from bot.canary.client import Outcome, RequestRecord
from bot.canary.render import summary_table
from bot.canary.report import CanaryMeasurement
from bot.canary.schema import CanaryReport as Report
from bot.canary.shape_replay import fixed_shape
from bot.canary.verdict import (
    DEFAULT_MAX_ERROR_RATE,
    Gates,
    Values,
    gates_from,
    judge,
    judge_values,
    judged,
    values_of,
)
from bot.canary.workload import Workload
from bot.kernel.errors import UsageError
from bot.postmortem.draft import CanaryFacts, _canary_row
from bot.remediation.lines import verdict_lines
from bot.tune.matrix import TrialRow
from bot.tune.plan import Config

# The report always says the shape it sent; these reports are of the fixed default workload.
SHAPE = fixed_shape(Workload(endpoint="http://x/v1/completions"), request_rate=1.0)
GATES = Gates.of(max_ttft_p99_ms=350, max_tpot_p99_ms=35, min_goodput_ratio=0.95)


def ok(ttft_s: float, tpot_s: float = 0.02, tokens: int = 11) -> RequestRecord:
    r = RequestRecord(
        sent_at=0.0, first_token_at=ttft_s, finished_at=ttft_s + tpot_s * (tokens - 1)
    )
    r.output_tokens, r.outcome = tokens, Outcome.OK
    return r


def failed(cause: str = "HTTP 429") -> RequestRecord:
    r = RequestRecord(sent_at=0.0, finished_at=0.001)
    r.outcome, r.cause, r.error = Outcome.FAILED, cause, f"{cause}: too many tokens in flight"
    return r


def silent() -> RequestRecord:
    """A request that finished normally with no token read: a framing the client missed."""
    r = RequestRecord(sent_at=0.0, finished_at=0.1)
    r.outcome = Outcome.OK
    return r


def report_of(records: list[RequestRecord], gates: Gates = GATES) -> CanaryMeasurement:
    return CanaryMeasurement(
        shape=SHAPE, workload={}, records=records, engine=None, samples=[], gates=gates, wall_s=1.0,
        client_cpu_s=0.1,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("values", "failures"),
    [
        (Values(300, 30, 0.99, 0.1, 0.0), []),
        (Values(412.34, 30, 0.99, None, 0.0), ["TTFT p99 412.3ms > 350ms"]),
        (Values(300, 41, 0.9, None, 0.0), ["TPOT p99 41ms > 35ms", "goodput 90% < 95%"]),
        (Values(None, 30, None, None, 0.0), ["TTFT p99 not measured", "goodput not measured"]),
        (Values(300, 30, 0.99, None, 0.02), ["error rate 2% > 1%"]),
        (
            Values(math.inf, 30, 0.99, None, 0.5, failed=50, total=100),
            [
                "TTFT p99 unbounded: 50 of 100 requests failed (a failed request counts as "
                "infinitely slow) > 350ms",
                "error rate 50% > 1%",
            ],
        ),
    ],
)
def test_judge_values_says_which_gate_and_by_how_much(values: Values, failures: list[str]) -> None:
    assert judge_values(values, GATES).failures == failures


def test_the_seed_gate_fails_a_release_whose_requests_are_99_percent_429() -> None:
    data = report_of([ok(0.05)] + [failed() for _ in range(99)]).report().json_dict()
    assert data["passed"] is False
    failed_gates = {g["name"]: g for g in data["gates"] if not g["passed"]}
    assert set(failed_gates) == {"max_ttft_p99_ms", "max_tpot_p99_ms", "max_error_rate"}
    assert failed_gates["max_error_rate"]["reason"] == "error rate 99% > 1%"
    assert data["requests"]["failed_by_cause"] == {"HTTP 429": 99}
    assert data["ttft_ms"]["p99"] is None and data["ttft_ms"]["infinite"] == 99
    table = summary_table(Report.of(data))
    assert "failed by cause: 99 x HTTP 429" in table
    assert "TTFT p99             ∞ (failed requests)" in table
    assert table.rstrip().endswith("verdict: GATE FAILED")


def test_the_error_gate_is_on_without_any_other_gate() -> None:
    clean = report_of([ok(0.05)] * 99 + [ok(0.06)], Gates())
    assert clean.passed and [r.name for r in clean.verdict().results] == ["max_error_rate"]
    two_failed = report_of([ok(0.05)] * 98 + [failed("timeout"), failed("transport")], Gates())
    assert not two_failed.passed
    assert two_failed.verdict().failures == ["error rate 2% > 1%"]
    assert Gates().max_error_rate == DEFAULT_MAX_ERROR_RATE


NOT_MEASURED = (
    "not measured: 4 requests succeeded but streamed no tokens (check the server's event framing)"
)


def test_a_run_whose_requests_succeeded_without_tokens_fails_as_not_measured() -> None:
    # Once a canary read no event of a CRLF-framed server: 4 ok, 0 tokens, "all gates passed".
    data = report_of([silent()] * 4, Gates()).report().json_dict()
    assert data["passed"] is False and data["error_rate"] == 0.0
    assert [(g["name"], g["passed"]) for g in data["gates"]] == [
        ("measured", False), ("max_error_rate", True),
    ]  # fmt: skip
    assert data["gates"][0]["reason"] == NOT_MEASURED
    table = summary_table(Report.of(data))
    assert f"FAIL  measured: {NOT_MEASURED}" in table
    assert table.rstrip().endswith("verdict: GATE FAILED")


@pytest.mark.parametrize(
    ("values", "failures"),
    [
        (Values(None, None, None, None, 0.0, ok=1, delivered_tokens=0, total=1),
         ["not measured: 1 request succeeded but streamed no tokens (check the server's event"
          " framing)"]),
        (Values(None, None, None, None, 0.0, ok=4, delivered_tokens=1, total=4), []),
        (Values(None, None, None, None, 0.0, ok=4, delivered_tokens=None, total=4), []),
        (Values(None, None, None, None, 1.0, ok=0, delivered_tokens=0, total=4, failed=4),
         ["error rate 100% > 1%"]),
    ],
    ids=["nothing streamed", "a token", "tokens not reported", "all failed"],
)  # fmt: skip
def test_not_measured_only_when_requests_succeeded_and_none_streamed_a_token(
    values: Values, failures: list[str]
) -> None:
    assert judge_values(values, Gates()).failures == failures


def test_a_run_where_some_requests_streamed_tokens_was_measured() -> None:
    assert report_of([ok(0.05)] + [silent()] * 3, Gates()).passed


def test_values_of_reads_the_ok_requests_and_their_tokens() -> None:
    values = values_of(
        Report.of({"requests": {"ok": 4, "total": 5, "failed": 1}, "tokens": {"delivered": 0}})
    )
    assert (values.ok, values.delivered_tokens) == (4, 0)
    assert values_of(Report.of({"requests": {"ok": 4, "total": 4}})).delivered_tokens is None


def test_the_scheduler_shows_the_not_measured_rule_as_an_always_on_gate() -> None:
    verdict = judge(report_of([silent()] * 4, Gates()).report(), Gates())
    assert verdict_lines(verdict, {}).splitlines()[0] == (
        ":x: tokens delivered 0 (gate ≥ 1, always on)"
    )


def test_cancelled_requests_are_not_failures_but_miss_the_slo() -> None:
    cancelled = RequestRecord(sent_at=0.0, first_token_at=0.04, finished_at=0.1)
    cancelled.output_tokens, cancelled.outcome = 3, Outcome.CANCELLED
    data = report_of([ok(0.05)] * 3 + [cancelled]).report().json_dict()
    assert data["error_rate"] == 0.0 and data["ttft_ms"]["count"] == 3
    assert data["slo_attainment"] == pytest.approx(3 / 4)


@settings(max_examples=300, deadline=None)
@given(
    ttfts=st.lists(st.floats(0.001, 10.0), min_size=1, max_size=60),
    flips=st.lists(st.integers(0, 59), max_size=60),
)
def test_more_failures_never_report_better_latency(ttfts: list[float], flips: list[int]) -> None:
    """Turn any requests of a run into failures: no percentile, no gate gets better."""
    base = [ok(t, tpot_s=t / 50) for t in ttfts]
    worse = [failed() if i in flips else r for i, r in enumerate(base)]
    a, b = report_of(base).report().json_dict(), report_of(worse).report().json_dict()
    for key in ("ttft_ms", "tpot_ms", "e2e_ms"):
        for pct in ("p50", "p90", "p99"):
            va = math.inf if a[key][pct] is None else a[key][pct]
            vb = math.inf if b[key][pct] is None else b[key][pct]
            assert vb >= va - 1e-9, (key, pct)
    assert a["slo_attainment"] >= b["slo_attainment"]
    passed_a = {g["name"] for g in a["gates"] if g["passed"]}
    passed_b = {g["name"] for g in b["gates"] if g["passed"]}
    assert passed_b <= passed_a


def test_values_of_reads_the_canarys_own_goodput_and_internal_fragmentation_beside_load() -> None:
    report: dict[str, Any] = {
        "ttft_ms": {"p99": 120.0}, "tpot_ms": {"p99": 40.0}, "goodput_ratio": 0.4,
        "kv_fragmentation": {"observed": 0.7, "internal": 0.1},
        "tokens": {"delivered": 490, "streamed": 500},
        "requests": {"total": 10, "failed": 0},
    }  # fmt: skip
    plain = values_of(Report.of(report))
    assert (plain.goodput_ratio, plain.kv_fragmentation) == (0.4, 0.7)
    mixed = values_of(Report.of(report | {"background": [{"workload": {"name": "long prompts"}}]}))
    assert (mixed.goodput_ratio, mixed.kv_fragmentation) == (0.98, 0.1)
    (goodput_gate,) = [
        r
        for r in judge(Report.of(report | {"background": [{}]}), GATES).results
        if r.name == "min_goodput_ratio"
    ]
    assert goodput_gate.passed
    assert goodput_gate.source.startswith("goodput of the canary's own requests")
    nothing = values_of(
        Report.of(report | {"background": [{}], "tokens": {"delivered": 0, "streamed": 0}})
    )
    assert nothing.goodput_ratio is None  # nothing streamed: not measured, never 100 %


def test_a_relative_gate_must_be_resolved_before_a_canary_checks_it() -> None:
    unresolved = AdrGates(max_ttft_p99_ms=350, max_tpot_p99_ms="2x normal")
    assert not unresolved.resolved and unresolved.limits() == {"max_ttft_p99_ms": 350.0}
    with pytest.raises(UsageError, match="must be resolved against measured numbers"):
        gates_from(unresolved)
    with pytest.raises(UsageError, match="gate max_tpot_p99_ms is Relative"):
        Gates(unresolved)  # a canary's gates are numbers, however they are built
    numbers = gates_from(unresolved, numbers_only=True)
    assert numbers.limit("max_tpot_p99_ms") is None and numbers.limit("max_ttft_p99_ms") == 350
    assert numbers.limits.resolved and numbers == Gates.of(max_ttft_p99_ms=350)


# --- every consumer reads the same verdict -------------------------------------------------
STORED = {
    "passing": [ok(0.05)] * 600,  # a p99 is decided on 528 requests or more
    "slow": [ok(0.05)] * 30 + [ok(0.9)] * 10,
    "mostly 429": [ok(0.05)] + [failed() for _ in range(39)],
    "a few timeouts": [ok(0.05)] * 38 + [failed("timeout")] * 2,
    "no tokens streamed": [silent()] * 40,
}


@pytest.mark.parametrize("name", list(STORED))
@pytest.mark.parametrize("background", [False, True])
def test_cli_tune_remediation_scheduler_and_draft_agree_on_a_stored_report(
    name: str, background: bool
) -> None:
    adr_gates = AdrGates(max_ttft_p99_ms=350, max_tpot_p99_ms=35)
    gates = gates_from(adr_gates)
    stored = report_of(STORED[name], gates).report().json_dict()
    if background:  # as the remediation gate and tune store a mixed run
        stored = judged(
            stored | {"background": [{"workload": {"name": "long"}}]}, gates
        ).report.json_dict()
    cli = stored["passed"]  # what latency_checker exits on (0 / 1)
    remediation = judged(stored, gates)  # as the remediation gate judges a canary
    row = TrialRow(
        Config("x", {}, {}, []), values=values_of(Report.of(stored)),
        failures=judge(Report.of(stored), gates).failures,
    )  # fmt: skip
    marks = verdict_lines(judge(Report.of(stored), gates), {})
    facts = CanaryFacts.from_report(label="canary", report=stored, at=dt.datetime(2026, 1, 1))
    draft_row = _canary_row(facts, adr_gates)
    verdicts = {
        "cli": cli,
        "remediation": remediation.passed,
        "tune": row.passed,
        "scheduler": ":x:" not in marks,
        "draft": not draft_row.verdict.startswith("不达标"),
    }
    assert len(set(verdicts.values())) == 1, verdicts
    assert cli is (name == "passing")
