"""ITL p99, the number added through the catalogue alone (issue 32): an ADR gates it, the
canary's report gives it, the verdict judges it (the bad case too), a match condition reads it,
and what the seed's files keep (the ADR matrix, the snapshots) is unchanged."""

from __future__ import annotations

from bot.adr.metrics import METRICS
from bot.adr.models import AdrGates, MatrixRow
from bot.adr.parse import MATRIX_COLUMNS
from bot.adr.relative import NORMAL_METRICS
from bot.canary.client import Outcome, RequestRecord
from bot.canary.report import CanaryReport
from bot.canary.shape_replay import fixed_shape
from bot.canary.verdict import Gates, gates_from, judge
from bot.canary.workload import Workload
from bot.diagnosis.service import MATCH_READINGS
from bot.remediation.lines import gate_lines

SHAPE = fixed_shape(Workload(endpoint="http://x/v1/completions"), request_rate=1.0)


def streamed(gaps_s: list[float]) -> RequestRecord:
    """A request that streamed len(gaps)+1 tokens, ``gaps_s`` apart."""
    r = RequestRecord(sent_at=0.0, first_token_at=0.1, finished_at=0.1 + sum(gaps_s))
    r.output_tokens, r.outcome, r.itl_s = len(gaps_s) + 1, Outcome.OK, gaps_s
    return r


def report(gaps_s: list[float], gates: Gates) -> dict[str, object]:
    records = [streamed(gaps_s) for _ in range(20)]
    run = CanaryReport(shape=SHAPE, workload={}, records=records, engine=None, samples=[],
                       gates=gates, wall_s=1.0, client_cpu_s=0.1)  # fmt: skip
    return run.as_dict()


def test_an_adr_gate_on_itl_p99_passes_a_smooth_stream_and_fails_a_stuttering_one() -> None:
    gates = gates_from(AdrGates(max_itl_p99_ms=50))
    assert gates.max_itl_p99_ms == 50
    smooth = judge(report([0.02] * 10, gates), gates)
    stutter = judge(report([0.02] * 9 + [0.4], gates), gates)
    assert smooth.passed and [r.name for r in smooth.results] == [
        "max_itl_p99_ms",
        "max_error_rate",
    ]
    assert not stutter.passed
    assert stutter.failures == ["ITL p99 400ms > 50ms"]


def test_itl_p99_is_matchable_said_as_a_gate_and_kept_out_of_the_seeds_tables() -> None:
    assert METRICS["itl_p99_ms"][0] == "itl_ms.p99"
    assert MATCH_READINGS["itl_p99_ms"] == "vllm_metrics.itl_p99_ms"
    assert gate_lines({"max_itl_p99_ms": 50.0}) == ["ITL p99 ≤ 50.0 ms"]
    assert "itl_p99_ms" not in MatrixRow.model_fields and len(MATRIX_COLUMNS) == 6
    assert "itl_p99_ms" not in NORMAL_METRICS  # snapshots keep fixed columns: no normal yet
