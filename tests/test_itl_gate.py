"""ITL p99, the number added through the catalogue alone (issue 32): an ADR gates it, the
canary's report gives it, the verdict judges it (the bad case too), a match condition reads it,
the snapshots keep it so it has a normal, a gate may be '2x normal' or '2x before' of it, and
the seed's ADR matrix is unchanged."""

from __future__ import annotations

import datetime as dt

import pytest

from bot.adr.metrics import METRICS
from bot.adr.models import AdrGates, Condition, MatrixRow
from bot.adr.parse import MATRIX_COLUMNS
from bot.adr.relative import NORMAL_METRICS, NoNormal, Relative
from bot.canary.client import Outcome, RequestRecord
from bot.canary.report import CanaryMeasurement
from bot.canary.shape_replay import fixed_shape
from bot.canary.verdict import Gates, gates_from, judge, values_of
from bot.canary.workload import Workload
from bot.diagnosis.normal import NormalReader
from bot.diagnosis.service import MATCH_READINGS
from bot.kernel.store import service as store
from bot.kernel.store.db import Database
from bot.remediation.lines import gate_lines
from tests.test_bot_store import db, postgres  # noqa: F401  (store fixtures: SQLite and PostgreSQL)

SHAPE = fixed_shape(Workload(endpoint="http://x/v1/completions"), request_rate=1.0)
AT = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)


def streamed(gaps_s: list[float]) -> RequestRecord:
    """A request that streamed len(gaps)+1 tokens, ``gaps_s`` apart."""
    r = RequestRecord(sent_at=0.0, first_token_at=0.1, finished_at=0.1 + sum(gaps_s))
    r.output_tokens, r.outcome, r.itl_s = len(gaps_s) + 1, Outcome.OK, gaps_s
    return r


def report(gaps_s: list[float], gates: Gates, requests: int = 600) -> dict[str, object]:
    """A report of ``requests`` alike requests: the ITL gate is decided on its statistics, and
    requests whose gaps are alike count once each, so a p99 under the limit needs 528."""
    records = [streamed(gaps_s) for _ in range(requests)]
    run = CanaryMeasurement(shape=SHAPE, workload={}, records=records, engine=None, samples=[],
                       gates=gates, wall_s=1.0, client_cpu_s=0.1)  # fmt: skip
    return run.report()


def test_an_adr_gate_on_itl_p99_passes_a_smooth_stream_and_fails_a_stuttering_one() -> None:
    gates = gates_from(AdrGates(max_itl_p99_ms=50))
    assert gates.limit("max_itl_p99_ms") == 50
    smooth = judge(report([0.02] * 10, gates), gates)
    stutter = judge(report([0.02] * 9 + [0.4], gates), gates)
    assert smooth.passed and [r.name for r in smooth.results] == [
        "max_itl_p99_ms",
        "max_error_rate",
    ]
    assert not stutter.passed
    (failure,) = stutter.failures
    assert failure.startswith("ITL p99 400ms > 50ms (missed at 99%: 600 of 6000 gaps above 50")
    few = judge(report([0.02] * 10, gates, requests=20), gates)  # 20 alike requests: undecided
    assert not few.passed and few.results[0].decided == "inconclusive"


def test_itl_p99_is_matchable_said_as_a_gate_and_kept_out_of_the_seeds_tables() -> None:
    assert METRICS["itl_p99_ms"][0] == "itl_ms.p99"
    assert MATCH_READINGS["itl_p99_ms"] == "vllm_metrics.itl_p99_ms"
    assert gate_lines({"max_itl_p99_ms": 50.0}) == ["ITL p99 ≤ 50.0 ms"]
    assert "itl_p99_ms" not in MatrixRow.model_fields and len(MATRIX_COLUMNS) == 6
    assert "itl_p99_ms" in NORMAL_METRICS  # a snapshot keeps every number: ITL has a normal
    assert Condition(metric="itl_p99_ms", op=">", value="2x normal").value == Relative(2.0)


async def test_an_itl_gate_of_2x_normal_resolves_against_the_snapshots_and_judges(
    db: Database,  # noqa: F811
) -> None:
    for i, itl in enumerate([18.0, 20.0, 25.0]):  # normal: the median, 20 ms
        with db.transaction() as s:
            store.add_snapshot(s, target="t", at=AT + dt.timedelta(minutes=5 * i),
                               source="test", numbers={"tpot_p99_ms": 9.0, "itl_p99_ms": itl})  # fmt: skip
    normal = await NormalReader(db=db, last=3).read("t")
    gates = gates_from(AdrGates(max_itl_p99_ms="2x normal").resolve(normal.numbers))
    assert gates.limit("max_itl_p99_ms") == 40.0
    assert judge(report([0.03] * 10, gates), gates).passed
    assert judge(report([0.03] * 9 + [0.4], gates), gates).failures[0].startswith(
        "ITL p99 400ms > 40ms (missed at 99%"
    )


def test_an_itl_gate_of_2x_before_resolves_against_the_before_runs_canary_and_judges() -> None:
    absolute = Gates(max_error_rate=0.01)
    before = values_of(report([0.05] * 10, absolute)).numbers()  # what the change flow keeps
    assert before["itl_p99_ms"] == 50.0
    gates = gates_from(AdrGates(max_itl_p99_ms="2x before").resolve({}, before=before))
    assert gates.limit("max_itl_p99_ms") == 100.0
    assert judge(report([0.06] * 10, gates), gates).passed  # a bit slower, within 2x
    assert judge(report([0.05] * 9 + [0.4], gates), gates).failures[0].startswith(
        "ITL p99 400ms > 100ms (missed at 99%"
    )
    with pytest.raises(NoNormal, match="the before-run measured no itl_p99_ms"):
        AdrGates(max_itl_p99_ms="2x before").resolve({}, before={"tpot_p99_ms": 9.0})
