"""The canary report is one model: its JSON Schema in docs is the model's, every report the
canary makes validates against it and reads back equal, and reports stored by earlier releases
(the repository's recorded tune runs) still parse."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from bot.app.cli import cli
from bot.canary.client import Outcome, RequestRecord
from bot.canary.report import CanaryMeasurement
from bot.canary.schema import CanaryReport
from bot.canary.verdict import Gates, judged, values_of
from bot.diagnosis.probes.fragmentation import FragmentationSample
from bot.diagnosis.probes.vllm_metrics import parse_page, read_window
from tests.workload_pages import chat

REPO = Path(__file__).parent.parent
DOC = REPO / "docs" / "canary-report.schema.json"
VLLM = Path(__file__).parent / "fixtures" / "vllm-0.32.0"


def _record(ttft_s: float, e2e_s: float, tokens: int, outcome: Outcome) -> RequestRecord:
    r = RequestRecord(sent_at=10.0, first_token_at=10.0 + ttft_s, finished_at=10.0 + e2e_s)
    r.output_tokens, r.outcome = tokens, outcome
    return r


def _measured() -> CanaryMeasurement:
    """A run with an engine window read from two recorded vLLM pages, a failed request (an
    unbounded TTFT p99) and a fragmentation sample: every part of the report filled."""
    before, after = (parse_page((VLLM / f"{n}.prom").read_text(), url="x", at=t)
                     for n, t in (("before", 0.0), ("after", 10.0)))  # fmt: skip
    window = replace(read_window(before, after), requests_finished=3.0, generation_tokens=90.0)
    failed = _record(0.1, 0.2, 0, Outcome.FAILED)
    failed.first_token_at, failed.error, failed.cause = None, "HTTP 429: slow down", "HTTP 429"
    records = [_record(0.1, 1.1, 30, Outcome.OK), _record(0.2, 1.2, 30, Outcome.OK), failed]
    sample = FragmentationSample(at=0.1, observed=0.2, internal=0.05, resident_tokens=10,
                                 kv_usage=0.2)  # fmt: skip
    return CanaryMeasurement(
        shape=chat(), workload={"concurrency": 3}, records=records, engine=window,
        samples=[sample], gates=Gates.of(max_ttft_p99_ms=350, min_goodput_ratio=0.5), wall_s=2.0,
        client_cpu_s=0.1,
    )  # fmt: skip


def test_the_schema_in_docs_is_the_models() -> None:
    printed = CliRunner().invoke(cli, ["canary-schema"], catch_exceptions=False)
    assert printed.exit_code == 0, printed.output
    assert json.loads(printed.output) == json.loads(DOC.read_text()), (
        "docs/canary-report.schema.json is out of date: run "
        "`ruleloop canary-schema > docs/canary-report.schema.json`"
    )


def test_a_report_validates_against_the_schema_and_reads_back_equal() -> None:
    report = _measured().report()
    data = json.loads(report.model_dump_json())
    jsonschema.validate(data, json.loads(DOC.read_text()))
    assert report.ttft_ms.p99 is None and report.ttft_ms.infinite == 1  # the failed request
    assert report.passed is False and [g.name for g in report.gates if not g.passed] == [
        "max_ttft_p99_ms", "max_error_rate",
    ]  # fmt: skip
    back = CanaryReport.model_validate(data)
    assert back == CanaryReport.model_validate(report.json_dict())
    assert back.engine == report.engine  # the engine window, its estimates and bounds
    assert values_of(back) == values_of(report)  # the gates read the same numbers back


def test_the_schema_refuses_a_report_of_another_shape() -> None:
    schema = json.loads(DOC.read_text())
    data = _measured().report().json_dict()
    for broken in ({**data, "ttft_ms": {"p99": "fast"}}, {**data, "requests": {"ok": 1.5}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, schema)


def test_reports_stored_by_earlier_releases_still_parse() -> None:
    files = sorted(REPO.glob("adr/**/*.runs/*.json"))
    assert files, "the repository's recorded canary reports are missing"
    for path in files:
        stored = json.loads(path.read_text(encoding="utf-8"))["report"]
        report = CanaryReport.of(stored)
        assert report.ttft_ms.p99 == stored["ttft_ms"]["p99"], path
        assert report.engine is not None, path
        # numbers the old release did not write are unknown, never zero
        assert report.engine.goodput.value is None or "goodput" in stored["engine"], path
        (ttft,) = [g for g in judged(stored, Gates.of(max_ttft_p99_ms=1e9)).report.gates
                   if g.name == "max_ttft_p99_ms"]  # fmt: skip
        assert ttft.passed and ttft.value == stored["ttft_ms"]["p99"], path
