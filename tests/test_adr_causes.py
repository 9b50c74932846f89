"""ADRs name the cause they answer (issue 33): the ``cause:`` field's round trip, `adr validate`
refusing an unknown cause with its file, line and the known names, ``by_cause`` offering an ADR
only when the diagnosis does not rule its cause out, the shipped ADRs' causes, and the
post-incident draft naming the incident's supported cause.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

from bot.adr.causes import BUILTIN
from bot.adr.match import MatchResult, by_cause
from bot.adr.parse import load, parse
from bot.adr.render import render
from bot.adr.validate import validate
from bot.app.cli.adr import adr as adr_cli
from bot.kernel.store.summary import CauseEntry, DiagnosisSummary
from tests.test_postmortem import _applied, _draft, _incident

ROOT = Path(__file__).parent.parent
SEED = ROOT / "adr" / "ADR-20260831-01-kv-cache-paging-throughput.md"
DEMO = ROOT / "bot" / "app" / "demo" / "ADR-20261129-02-cpu-demo-scheduler-step.md"


def result(*causes: str, adr_id: str = "ADR-20260831-01") -> MatchResult:
    """A match of the seed ADR, answering ``causes``."""
    adr = load(SEED).model_copy(update={"id": adr_id, "cause": list(causes)})
    return MatchResult(adr, ())


def verdict(
    cause: str, state: str, number: str | None = "3 % of the KV cache in use"
) -> CauseEntry:
    missing = ["vllm_metrics.kv_cache_usage"] if state == "cannot_tell" else []
    return CauseEntry(cause=cause, verdict=state, number=number, missing=missing)


def test_the_cause_field_round_trips_as_one_name_or_a_list() -> None:
    one = load(SEED)
    assert one.cause == ["kv_cache_pressure"]
    assert "\ncause: kv_cache_pressure\nfix:" in render(one)
    two = one.model_copy(update={"cause": ["kv_cache_pressure", "queueing"]})
    assert "cause:\n- kv_cache_pressure\n- queueing\n" in render(two)
    assert parse(render(two)) == two
    none = one.model_copy(update={"cause": []})
    assert "cause" not in render(none).split("---")[1] and parse(render(none)) == none


@pytest.mark.parametrize("bad", ["KV cache", "kv_cache_pressure, queueing", "1st"])
def test_a_cause_that_is_not_a_name_is_refused_when_parsed(bad: str) -> None:
    text = SEED.read_text().replace("cause: kv_cache_pressure", f"cause: {bad}")
    with pytest.raises(Exception, match="is not a cause name"):
        parse(text)


def test_validate_refuses_an_unknown_cause_with_file_line_and_known_names(tmp_path: Path) -> None:
    path = tmp_path / SEED.name
    path.write_text(SEED.read_text().replace("cause: kv_cache_pressure", "cause: kv_cache_full"))
    line = path.read_text().splitlines().index("cause: kv_cache_full") + 1
    [problem] = validate(path)
    assert (problem.file, problem.field) == (str(path), f"cause (line {line})")
    assert "unknown cause 'kv_cache_full'" in problem.why
    assert all(name in problem.why for name in BUILTIN)
    run = CliRunner().invoke(adr_cli, ["validate", str(path), "--no-vllm"])
    assert run.exit_code != 0 and f"cause (line {line})" in run.output
    path.write_text(SEED.read_text())
    assert validate(path) == []


def test_the_shipped_adrs_name_the_cause_they_answer() -> None:
    assert load(SEED).cause == ["kv_cache_pressure"]
    assert load(DEMO).cause == ["prefill_decode_mixing"]
    shipped = ROOT / "bot" / "shipped" / "adr" / SEED.name
    assert load(shipped).cause == ["kv_cache_pressure"]
    for draft in (ROOT / "adr" / "drafts").glob("ADR-*.md"):
        assert load(draft).cause, draft


def test_an_adr_whose_cause_is_supported_is_offered() -> None:
    offered, lines = by_cause(
        [result("kv_cache_pressure")], [verdict("kv_cache_pressure", "supported")]
    )
    assert [r.adr.id for r in offered] == ["ADR-20260831-01"] and lines == []


def test_an_adr_whose_cause_is_ruled_out_is_not_offered_and_one_line_says_why() -> None:
    offered, lines = by_cause(
        [result("kv_cache_pressure"), result(adr_id="ADR-20260901-01")],
        [verdict("kv_cache_pressure", "ruled_out")],
    )
    assert [r.adr.id for r in offered] == ["ADR-20260901-01"]  # no cause: as before
    assert lines == [
        "ADR-20260831-01 answers kv_cache_pressure, ruled out: 3 % of the KV cache in use"
    ]


def test_one_supported_cause_of_several_is_enough() -> None:
    both = result("kv_cache_pressure", "queueing")
    offered, _ = by_cause(
        [both], [verdict("kv_cache_pressure", "ruled_out"), verdict("queueing", "supported")]
    )
    assert offered == [both]
    offered, lines = by_cause(
        [both], [verdict("kv_cache_pressure", "ruled_out"), verdict("queueing", "ruled_out")]
    )
    assert offered == [] and lines[0].count("ruled out") == 2


def test_an_adr_whose_cause_the_diagnosis_cannot_tell_is_offered_on_its_numbers_and_says_so() -> (
    None
):
    offered, lines = by_cause(
        [result("kv_cache_pressure")], [verdict("kv_cache_pressure", "cannot_tell")]
    )
    assert len(offered) == 1
    assert lines == ["ADR-20260831-01 answers kv_cache_pressure: cannot tell (no vllm_metrics.kv_cache_usage); "
                     "offered on its numbers alone"]  # fmt: skip
    offered, lines = by_cause([result("gpu_fault")], [])  # a runbook that tests no cause
    assert len(offered) == 1 and lines == []
    both = result("gpu_fault", "queueing")
    offered, lines = by_cause([both], [verdict("queueing", "cannot_tell")])
    assert (
        offered == [both]
        and "gpu_fault: not tested by this runbook; queueing: cannot tell" in lines[0]
    )


def test_verdicts_are_read_back_from_a_stored_summary() -> None:
    stored = {"causes": [{"cause": "queueing", "verdict": "supported", "number": "80 %", "missing": []},
                         {"verdict": "supported"}, "junk"]}  # fmt: skip
    assert DiagnosisSummary.of(stored).causes == [
        CauseEntry(cause="queueing", verdict="supported", number="80 %")
    ]
    assert DiagnosisSummary.of({}).causes == []


def test_the_post_incident_draft_names_the_incidents_supported_cause() -> None:
    supported = {"cause": "prefill_decode_mixing", "verdict": "supported", "number": "8192 tokens"}
    incident = _incident()
    with_cause = dataclasses.replace(
        incident, diagnosis={**incident.diagnosis.json_dict(), "causes": [supported]}
    )
    assert _draft(_applied("promoted"), incident=with_cause).cause == ["prefill_decode_mixing"]
    assert _draft(_applied("promoted")).cause == ["kv_cache_pressure"]  # the applied ADR's
    assert _draft(None).cause == []


def test_validate_knows_the_causes_the_runbooks_declare(tmp_path: Path) -> None:
    path = tmp_path / SEED.name
    path.write_text(SEED.read_text().replace("cause: kv_cache_pressure", "cause: lora_swapping"))
    runbooks = tmp_path / "runbooks"
    runbooks.mkdir()
    run = CliRunner().invoke(
        adr_cli, ["validate", str(path), "--no-vllm", "--runbooks", str(runbooks)]
    )
    assert run.exit_code != 0 and "unknown cause 'lora_swapping'" in run.output
    (runbooks / "lora.yaml").write_text(
        "causes:\n  - {name: lora_swapping, title: adapters swap}\n"
    )
    run = CliRunner().invoke(
        adr_cli, ["validate", str(path), "--no-vllm", "--runbooks", str(runbooks)]
    )
    assert run.exit_code == 0, run.output
