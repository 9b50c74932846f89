"""The four-metric arithmetic: fragmentation formulas, percentiles, goodput, SLOs and gates."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bot.canary.client import Outcome, RequestRecord
from bot.canary.report import CanaryMeasurement, slo_attainment, summarize
from bot.canary.shape_replay import fixed_shape
from bot.canary.verdict import Gates, values_of
from bot.canary.workload import Workload
from bot.diagnosis.probes.fragmentation import (
    FragmentationSample,
    internal_fragmentation,
    observed_fragmentation,
    resident_lengths,
    used_blocks,
)
from bot.diagnosis.probes.vllm_metrics import EngineWindow, parse_page, read_window

VLLM = Path(__file__).parent / "fixtures" / "vllm-0.32.0"
# The report always says the shape it sent; these reports are of the fixed default workload.
SHAPE = fixed_shape(Workload(endpoint="http://x/v1/completions"), request_rate=1.0)


@pytest.mark.parametrize(
    ("lengths", "block", "expected"),
    [
        ([32], 32, 0.0),
        ([33], 32, 31 / 64),
        ([1, 1], 16, 30 / 32),
        ([100, 28], 32, (28 + 4) / (128 + 32)),
        ([256, 300, 129], 128, (0 + 84 + 127) / (256 + 384 + 256)),
        ([0, 16], 16, 0.0),  # empty sequences hold no block
    ],
)
def test_internal_fragmentation_matches_paged_attention_formula(lengths, block, expected) -> None:
    assert internal_fragmentation(lengths, block) == pytest.approx(expected)


def test_internal_fragmentation_of_nothing_is_none() -> None:
    assert internal_fragmentation([], 16) is None


def test_internal_fragmentation_rejects_bad_block_size() -> None:
    with pytest.raises(ValueError, match="block size"):
        internal_fragmentation([1], 0)


@pytest.mark.parametrize(
    ("resident", "usage", "blocks", "block", "expected"),
    [
        (256, 2 / 8191, 8192, 128, 0.0),
        (192, 2 / 8191, 8192, 128, 0.25),
        (1000, 2 / 8191, 8192, 128, None),  # more resident than allocated: unknown, not 0
        (10, 0.0, 8192, 128, None),
        (0, 0.5, 8192, 128, None),
    ],
)
def test_observed_fragmentation(resident, usage, blocks, block, expected) -> None:
    value = observed_fragmentation(
        resident_tokens=resident, kv_usage=usage, num_gpu_blocks=blocks, block_size=block
    )
    assert value == (None if expected is None else pytest.approx(expected))
    assert value is None or 0.0 <= value <= 1.0


def test_used_blocks_accounts_for_vllms_null_block() -> None:
    assert used_blocks(4 / 8191, 8192) == 4


def test_resident_lengths_counts_shared_prefix_once() -> None:
    lengths, total = resident_lengths([(100, 5), (100, 7), (100, 0)], shared_prefix=64)
    assert lengths == [105, 107, 100]
    assert total == 312 - 2 * 64


def test_summarize_uses_linear_interpolation_like_numpy() -> None:
    values = [float(v) for v in range(1, 101)]
    out = summarize(values)
    assert out.p99 == pytest.approx(np.percentile(values, 99))
    assert out.p50 == pytest.approx(50.5)
    assert out.mean == pytest.approx(50.5)
    assert summarize([]).model_dump() == {
        "p50": None, "p90": None, "p99": None, "mean": None, "count": 0, "infinite": 0,
        "p99_interval": None,
    }  # fmt: skip
    # 100 values cannot bound a p99 from above: the interval says so, never the maximum
    assert out.p99_interval is not None
    assert (out.p99_interval.n, out.p99_interval.high) == (100, None)


def record(
    ttft_s: float, e2e_s: float, tokens: int, outcome: Outcome = Outcome.OK
) -> RequestRecord:
    r = RequestRecord(sent_at=10.0, first_token_at=10.0 + ttft_s, finished_at=10.0 + e2e_s)
    r.output_tokens, r.outcome = tokens, outcome
    return r


def test_tpot_excludes_first_token_and_single_token_requests() -> None:
    assert record(0.1, 1.1, 11).tpot_s == pytest.approx(0.1)
    assert record(0.1, 0.1, 1).tpot_s is None


def test_slo_attainment_counts_ok_requests_within_both_limits() -> None:
    records = [
        record(0.1, 1.1, 11),  # ttft 100 ms, tpot 100 ms: meets
        record(0.5, 1.5, 11),  # ttft 500 ms: misses ttft
        record(0.1, 3.1, 11),  # tpot 300 ms: misses tpot
        record(0.1, 0.2, 2, Outcome.CANCELLED),
    ]
    assert slo_attainment(records, ttft_ms=200, tpot_ms=150) == pytest.approx(1 / 4)
    assert slo_attainment(records, ttft_ms=None, tpot_ms=None) == pytest.approx(3 / 4)


def make_report(records, gates: Gates, samples=()) -> CanaryMeasurement:
    return CanaryMeasurement(
        shape=SHAPE, workload={}, records=records, engine=None, samples=list(samples), gates=gates,
        wall_s=1.0, client_cpu_s=0.1,
    )  # fmt: skip


def test_goodput_without_engine_is_a_labelled_client_upper_bound() -> None:
    report = make_report([record(0.1, 1.1, 30), record(0.1, 0.5, 10, Outcome.CANCELLED)], Gates())
    value, source = report.goodput_ratio()
    assert value == pytest.approx(30 / 40)
    assert source.startswith("client")


@pytest.mark.parametrize(
    ("gates", "passed", "failed_names"),
    [
        # two requests under the limit cannot show that a p99 is: not decided, and it fails
        (Gates.of(max_ttft_p99_ms=1000), False, ["max_ttft_p99_ms"]),
        (Gates.of(max_ttft_p99_ms=50), False, ["max_ttft_p99_ms"]),
        (Gates.of(max_tpot_p99_ms=50, min_goodput_ratio=0.5), False, ["max_tpot_p99_ms"]),
        (Gates.of(max_kv_fragmentation=0.3), False, ["max_kv_fragmentation"]),  # not measured
        (Gates(), True, []),
    ],
)
def test_gates_name_each_failure(gates, passed, failed_names) -> None:
    report = make_report([record(0.1, 1.1, 11), record(0.2, 1.2, 11)], gates)
    assert report.passed is passed
    assert [g.name for g in report.verdict().failed] == failed_names


def test_gate_on_unmeasurable_value_fails_with_reason() -> None:
    report = make_report([record(0.1, 1.1, 11)], Gates.of(max_kv_fragmentation=0.5))
    gate, error_gate = report.verdict().results
    assert not gate.passed and gate.value is None and gate.reason == "KV fragmentation not measured"
    assert error_gate.name == "max_error_rate" and error_gate.passed


def test_report_json_has_the_contract_keys() -> None:
    sample = FragmentationSample(
        at=0.1, observed=0.2, internal=0.1, resident_tokens=10, kv_usage=0.1
    )
    data = (
        make_report([record(0.1, 1.1, 11)], Gates.of(max_ttft_p99_ms=500), [sample])
        .report()
        .json_dict()
    )
    for key in (
        "ttft_ms",
        "tpot_ms",
        "goodput_ratio",
        "slo_attainment",
        "kv_fragmentation",
        "wasted_prefill_tokens",
        "requests",
        "engine",
        "gates",
        "passed",
    ):
        assert key in data
    assert set(data["ttft_ms"]) == {
        "p50", "p90", "p99", "mean", "count", "infinite", "p99_interval"
    }  # fmt: skip
    assert data["samples"] == {
        "ttft_ms": [pytest.approx(100.0)], "tpot_ms": [pytest.approx(100.0)], "itl_ms": [],
    }  # fmt: skip
    assert data["looks"] == 1  # a report judged as it was planned: one look
    assert data["kv_fragmentation"]["observed"] == pytest.approx(0.2)
    assert data["kv_fragmentation"]["internal"] == pytest.approx(0.1)
    assert data["requests"] == {
        "ok": 1, "cancelled": 0, "failed": 0, "total": 1, "failed_by_cause": {}
    }  # fmt: skip
    assert data["error_rate"] == 0.0
    assert data["gates"][0] == {
        "name": "max_ttft_p99_ms", "limit": 500, "value": pytest.approx(100.0), "passed": False,
        "reason": "TTFT p99 100ms <= 500ms, but (not decided at 99%: p99 in (-∞, ∞) at 99% (n=1) "
        "straddles 500: not decided; 528 requests bound a p99 on both sides)",
        "source": "TTFT p99: client side; requests that failed count as infinitely slow",
        "statistics": "inconclusive: p99 in (-∞, ∞) at 99% (n=1) straddles 500: not decided; "
        "528 requests bound a p99 on both sides",
        "decided": "inconclusive", "sample": 1, "sample_before": None, "p_value": None,
        "interval": [None, None], "confidence": 0.99,
    }  # fmt: skip
    assert [g["name"] for g in data["gates"]] == ["max_ttft_p99_ms", "max_error_rate"]


def engine_window(*, finished: float, generated: float) -> EngineWindow:
    """A real window read from two recorded vLLM pages, with these counts."""
    before, after = (parse_page((VLLM / f"{n}.prom").read_text(), url="x", at=t)
                     for n, t in (("before", 0.0), ("after", 10.0)))  # fmt: skip
    window = read_window(before, after)
    return replace(window, requests_finished=finished, aborted_requests=0.0,
                   generation_tokens=generated)  # fmt: skip


def test_goodput_reads_the_engine_when_it_served_the_canary_alone() -> None:
    records = [record(0.1, 1.1, 30), record(0.1, 1.1, 30)]
    report = replace(make_report(records, Gates()), engine=engine_window(finished=2, generated=80))
    assert report.goodput_ratio() == (pytest.approx(60 / 80), "engine")
    assert report.numbers().other_clients_requests == 0


def test_goodput_beside_other_clients_reads_the_canarys_own_requests() -> None:
    """A production engine's other clients are not the canary's waste: 2 canary requests
    beside 40 others would read 60 / 2,000 tokens from the engine's count."""
    records = [record(0.1, 1.1, 30), record(0.1, 1.1, 30)]
    shared = replace(
        make_report(records, Gates()), engine=engine_window(finished=42, generated=2000)
    )
    value, source = shared.goodput_ratio()
    assert value == pytest.approx(1.0) and source.startswith("shared (the engine also ended 40 ")
    assert values_of(shared.report()).goodput_source == "shared"
