"""A number knows what it is: histogram quantiles that are only bounds, comparisons they decide
or leave undecided, and the one way every surface writes them."""

from __future__ import annotations

import math

import pytest

from bot.adr.match import check, read_report
from bot.adr.models import Condition
from bot.diagnosis.normal import median
from bot.diagnosis.probes.exposition import Exposition
from bot.diagnosis.probes.vllm_metrics import Quantiles
from bot.kernel.numbers.histogram import quantile_bound
from bot.kernel.numbers.reading import Bound, Measured, Reading, compare, spans_of
from bot.kernel.numbers.text import change, compact, show, show_reading
from bot.kernel.store.summary import DiagnosisSummary

# vLLM's TPOT histogram starts at a 10 ms bucket; its last finite edge here is 20 s
EDGES = (0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 20.0)


def page(counts: dict[float, int], *, at: float) -> Exposition:
    """A scrape of vllm:request_time_per_output_token_seconds with ``counts`` per bucket."""
    lines, cumulative, total = [], 0, 0.0
    lines.append("# TYPE vllm:request_time_per_output_token_seconds histogram")
    for edge in (*EDGES, math.inf):
        cumulative += counts.get(edge, 0)
        total += counts.get(edge, 0) * (edge if math.isfinite(edge) else 30.0)
        le = "+Inf" if math.isinf(edge) else f"{edge}"
        lines.append(f'vllm:request_time_per_output_token_seconds_bucket{{le="{le}"}} {cumulative}')
    lines.append(f"vllm:request_time_per_output_token_seconds_count {cumulative}")
    lines.append(f"vllm:request_time_per_output_token_seconds_sum {total}")
    return Exposition.parse("\n".join(lines) + "\n", at=at)


def tpot(counts: dict[float, int]) -> Quantiles:
    names = ("vllm:request_time_per_output_token_seconds",)
    return Quantiles.from_histogram(page({}, at=0.0), page(counts, at=10.0), names)


def test_a_quantile_in_the_first_bucket_is_at_most_its_edge() -> None:
    fast = tpot({0.01: 200})  # every chat's TPOT under 10 ms (this machine's ~2 ms)
    assert fast.p99 == pytest.approx(10.0)  # the edge, not 9.9 interpolated inside [0, 10]
    assert fast.bounds == {"p50": Bound.AT_MOST, "p90": Bound.AT_MOST, "p99": Bound.AT_MOST}
    assert show("tpot_p99_ms", fast.p99, fast.bounds["p99"]) == "≤ 10.0 ms"


def test_a_quantile_in_the_inf_bucket_is_more_than_the_last_edge() -> None:
    stalled = tpot({0.05: 50, math.inf: 50})
    assert stalled.p99 == pytest.approx(20_000.0) and stalled.bounds["p99"] is Bound.MORE_THAN
    assert show("tpot_p99_ms", stalled.p99, stalled.bounds["p99"]) == "> 20,000 ms"


def test_a_quantile_inside_the_histogram_is_known_to_its_bucket() -> None:
    mixed = tpot({0.01: 10, 0.05: 80, 0.1: 10})
    assert "p99" not in mixed.bounds and "p50" not in mixed.bounds
    assert 50.0 < mixed.p99 <= 100.0  # type: ignore[operator]
    assert quantile_bound(0.99, {}) is None  # no observation: no bound either


@pytest.mark.parametrize(
    ("value", "op", "limit", "expected"),
    [
        (Reading(186.4), ">", Reading(30.0, Bound.AT_MOST), True),  # 186 > (≤ 30)
        (Reading(25.0), ">", Reading(30.0, Bound.AT_MOST), None),  # 25 vs ≤ 30
        (Reading(10.0, Bound.AT_MOST), ">", Reading(150.0), False),  # ≤ 10 is never > 150
        (Reading(10.0, Bound.AT_MOST), "<", Reading(5.0), None),
        (Reading(20_000.0, Bound.MORE_THAN), ">", Reading(150.0), True),
        (Reading(20_000.0, Bound.MORE_THAN), "<=", Reading(30_000.0), None),
        (Reading(71.0), ">", Reading(60.0), True),  # two known numbers: plain comparison
        (Reading(59.0), ">", Reading(60.0), False),
        (Reading(10.0, Bound.AT_MOST), "==", Reading(50.0), False),
    ],
)
def test_a_bound_decides_a_comparison_only_where_it_decides_it(
    value: Reading, op: str, limit: Reading, expected: bool | None
) -> None:
    assert compare(value, op, limit) is expected


def test_a_relative_condition_on_a_bounded_normal_says_when_it_is_undecided() -> None:
    condition = Condition(metric="tpot_p99_ms", op=">", value="3x normal")
    normal, bounds = {"tpot_p99_ms": 10.0}, {"tpot_p99_ms": Bound.AT_MOST}
    bounded = Measured.of(normal, bounds)
    held = check(condition, Measured.of({"tpot_p99_ms": 186.4}), bounded)
    assert held.holds and held.explain() == "tpot_p99_ms 186.4 > 3x normal (= ≤ 30): holds"
    close = check(condition, Measured.of({"tpot_p99_ms": 25.0}), bounded)
    assert not close.holds and not close.decided
    assert close.explain().endswith("undecided (a histogram bound on one side does not decide it)")
    # the same numbers without the bound: decided (25 < 30), as before
    assert not check(condition, Measured.of({"tpot_p99_ms": 25.0}), Measured.of(normal)).holds


def test_normal_is_a_bound_when_its_middle_snapshot_is_one() -> None:
    assert median([(10.0, Bound.AT_MOST), (10.0, Bound.AT_MOST), (12.0, None)]) == (
        10.0,
        Bound.AT_MOST,
    )
    assert median([(10.0, Bound.AT_MOST), (12.0, None), (14.0, None)]) == (12.0, None)
    assert median([]) == (None, None)
    assert median([(10.0, Bound.AT_MOST), (20_000.0, Bound.MORE_THAN)]) == (None, None)


def test_every_surface_writes_a_number_the_same_way() -> None:
    assert show("ttft_p99_ms", 41.26) == "41.3 ms" and show("ttft_p99_ms", 212.4) == "212 ms"
    assert show("ttft_p99_ms", 1710.0) == "1,710 ms"
    assert show("goodput_ratio", 0.93) == "93.0 %"
    assert show("tpot_p99_ms", math.inf) == "∞"
    assert show("tpot_p99_ms", None) == "n/a"
    assert change("tpot_p99_ms", 1710.0, 214.8) == "1,710 → 215 ms (-87 %)"
    assert change("goodput_ratio", 0.9, 0.99) == "90.0 → 99.0 % (+10 %)"


@pytest.mark.parametrize(
    ("span", "op", "limit", "expected"),
    [
        ((0.20, 0.30), ">", 0.15, True),  # the whole span is over the limit
        ((0.05, 0.30), ">", 0.15, None),  # it reaches both sides: undecided, never the midpoint
        ((0.0, 0.10), ">", 0.15, False),
        ((0.0, 0.10), "<=", 0.15, True),
    ],
)
def test_an_estimate_decides_a_comparison_only_where_its_whole_span_does(
    span: tuple[float, float], op: str, limit: float, expected: bool | None
) -> None:
    midpoint = (span[0] + span[1]) / 2
    assert compare(Reading(midpoint, span=span), op, Reading(limit)) is expected


def test_an_estimate_is_written_with_its_span_on_every_surface() -> None:
    assert show("kv_fragmentation", 0.12, span=(0.0, 0.24)) == "12.0 % (0.0–24.0 %)"
    assert show("ttft_p99_ms", 120.0, span=(100.0, 140.0)) == "120 ms (100–140 ms)"
    assert compact(0.12, "ratio", span=(0.0, 0.24)) == "12% (0-24%)"
    assert compact(10.0, "ms", "<=") == "≤10ms" and compact(20_000.0, "ms", ">") == ">20000ms"
    # a span that reads the same at both ends is a number, not a range
    assert show("goodput_ratio", 0.995, span=(0.9951, 0.9952)) == "99.5 %"
    measured = Measured.from_json(
        {"kv_fragmentation": 0.12, "tpot_p99_ms": 10.0, "ttft_p99_ms": "n/a"},
        {"tpot_p99_ms": "<="},
        {"kv_fragmentation": [0.0, 0.24]},
    )
    assert show_reading("kv_fragmentation", measured.reading("kv_fragmentation")) == (
        "12.0 % (0.0–24.0 %)"
    )
    assert show_reading("tpot_p99_ms", measured.reading("tpot_p99_ms")) == "≤ 10.0 ms"
    assert show_reading("ttft_p99_ms", measured.reading("ttft_p99_ms")) == "n/a"


def test_readings_keep_their_bound_and_span_through_json_renames_and_merges() -> None:
    measured = Measured(
        {
            "tpot_p99_ms": Reading(10.0, Bound.AT_MOST),
            "kv_fragmentation": Reading(0.12, span=(0.0, 0.24)),
            "ttft_p99_ms": Reading(float("inf"), Bound.MORE_THAN),
            "goodput_ratio": None,  # looked for, not measured
        }
    )
    kept = measured.json()
    assert kept == {
        "numbers": {"tpot_p99_ms": 10.0, "kv_fragmentation": 0.12, "ttft_p99_ms": None,
                    "goodput_ratio": None},
        "bounds": {"tpot_p99_ms": "<=", "ttft_p99_ms": ">"},
        "spans": {"kv_fragmentation": [0.0, 0.24]},
    }  # fmt: skip
    back = Measured.from_json(kept["numbers"], kept["bounds"], kept["spans"])
    assert back.reading("tpot_p99_ms") == Reading(10.0, Bound.AT_MOST)
    assert back.reading("kv_fragmentation") == Reading(0.12, span=(0.0, 0.24))
    assert back.reading("ttft_p99_ms") is None and back.value("goodput_ratio") is None
    named = measured.under("vllm_metrics").pick({"frag": "vllm_metrics.kv_fragmentation"})
    assert named.readings == {"frag": Reading(0.12, span=(0.0, 0.24))}
    merged = measured | Measured({"tpot_p99_ms": Reading(12.0)})
    assert merged.reading("tpot_p99_ms") == Reading(12.0) and merged.value("kv_fragmentation") == 0.12


def test_spans_read_back_from_json_drop_what_is_not_a_span() -> None:
    raw = {"a": [0.1, 0.2], "b": [0.3, 0.1], "c": [None, 1], "d": "x", "e": [0, float("inf")]}
    assert spans_of(raw) == {"a": (0.1, 0.2)}
    assert spans_of(None) == {}


def test_a_condition_on_an_estimate_says_when_its_span_leaves_it_undecided() -> None:
    condition = Condition(metric="kv_fragmentation", op=">", value=0.15)
    wide = {"metrics": {"kv_fragmentation": 0.175}, "spans": {"kv_fragmentation": [0.05, 0.3]}}
    held = check(condition, read_report(wide))
    assert not held.holds and not held.decided
    assert held.explain() == (
        "kv_fragmentation 0.175 (0.05-0.3) > 0.15: undecided (the estimate's span reaches both "
        "sides of the limit)"
    )
    narrow = {"metrics": {"kv_fragmentation": 0.25}, "spans": {"kv_fragmentation": [0.2, 0.3]}}
    assert check(condition, read_report(narrow)).holds
    # the midpoint alone, as before spans were carried, would have matched the wide one
    assert check(condition, read_report({"metrics": {"kv_fragmentation": 0.175}})).holds


def test_slack_the_console_and_the_page_show_an_estimate_with_its_span_and_judge_it_honestly() -> (
    None
):
    import datetime as dt

    from bot.kernel.chat.messages import IncidentView
    from bot.surfaces.slack.console import render_root
    from bot.surfaces.slack.views import root_message
    from bot.surfaces.web.view import BAD, NEUTRAL, _numbers

    summary = {
        "runbook": "vllm-latency",
        "headline": {"tpot_p99_ms": 10.0, "kv_fragmentation": 0.12, "goodput_ratio": 0.5},
        "bounds": {"tpot_p99_ms": "<="},
        "spans": {"kv_fragmentation": [0.0, 0.24], "goodput_ratio": [0.45, 0.55]},
        # fragmentation's span reaches both sides of 15 %; goodput's is wholly under 95 %
        "baseline": {"kv_fragmentation": [0.15, "ADR-1"], "goodput_ratio": [0.95, "ADR-1"]},
    }
    view = IncidentView(
        id=7, title="VLLMHighTPOT", status="firing", source="alertmanager", target="prod-a",
        opened_at=dt.datetime(2026, 9, 1, tzinfo=dt.UTC), closed_at=None, state="diagnosed",
        summary=summary,
    )  # fmt: skip
    _, blocks = root_message(view)
    shown = str(blocks)
    assert "12.0 % (0.0–24.0 %)  (gate ≤ 15.0 %, ADR-1)" in shown  # no mark: undecided
    assert "50.0 % (45.0–55.0 %) :x:" in shown and "≤ 10.0 ms" in shown
    console = render_root(view)
    assert "KV fragmentation: 12.0 % (0.0–24.0 %)" in console and "TPOT p99: ≤ 10.0 ms" in console
    rows = {row.label: row for row in _numbers(DiagnosisSummary.of(summary), None)}
    assert rows["KV fragmentation"].incident == "12.0 % (0.0–24.0 %)"
    assert rows["KV fragmentation"].incident_tone == NEUTRAL
    assert rows["Goodput"].incident_tone == BAD
