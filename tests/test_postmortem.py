"""The post-incident ADR draft (from real canary reports) and the review of drafts."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from bot.adr.match import match
from bot.adr.models import Adr, AdrGates, Condition, Fix, MatrixRow
from bot.adr.parse import load, parse
from bot.adr.render import render
from bot.adr.store import AdrStore
from bot.adr.validate import validate
from bot.adr.workload.describe import context_line
from bot.canary.client import Outcome, RequestRecord
from bot.canary.report import CanaryMeasurement, Gates
from bot.canary.schema import CanaryReport as Report
from bot.canary.verdict import PASSED, gates_from, judged, values_of
from bot.diagnosis.models import Baseline, Diagnosis
from bot.diagnosis.probes.fragmentation import FragmentationSample
from bot.diagnosis.probes.types import Finding, Severity
from bot.kernel.errors import AdrError, NotAllowed, UsageError
from bot.kernel.numbers import Measured
from bot.postmortem import AppliedFix, CanaryFacts, IncidentFacts, build_postmortem
from bot.postmortem.draft import INCIDENT_ROW
from bot.postmortem.review import check_reviewer, decided, rejection_note
from tests.workload_pages import chat, long_system_prompt

REPO = Path(__file__).resolve().parents[1]
SEED = REPO / "adr" / "ADR-20260831-01-kv-cache-paging-throughput.md"
DAY = dt.date(2026, 12, 1)
ADR_ID = "ADR-20261201-01"
T0 = dt.datetime(2026, 12, 1, 2, 13, tzinfo=dt.UTC)


# --- inputs: a real seed ADR, real canary reports, a real diagnosis summary -----------------
def _seed() -> Adr:
    return load(SEED)


def _real_reports() -> list[dict[str, Any]]:
    """Canary JSON reports of a real `ruleloop tune` run on this CPU (with background load)."""
    files = sorted(REPO.glob("adr/**/*.runs/*.json"))
    assert files, "the repository's recorded canary reports are missing"
    return [json.loads(f.read_text(encoding="utf-8"))["report"] for f in files]


def _record(ttft_s: float, e2e_s: float, tokens: int) -> RequestRecord:
    r = RequestRecord(sent_at=10.0, first_token_at=10.0 + ttft_s, finished_at=10.0 + e2e_s)
    r.output_tokens, r.outcome = tokens, Outcome.OK
    return r


def _plain_report(ttft_s: float) -> dict[str, Any]:
    """A canary report made the way `ruleloop canary --output-json` makes it (no background)."""
    records = [_record(ttft_s * k, ttft_s * k + 1.0, 33) for k in (0.5, 0.8, 1.0, 1.1)]
    sample = FragmentationSample(
        at=0.1, observed=0.123456, internal=0.05, resident_tokens=10, kv_usage=0.2
    )
    report = CanaryMeasurement(
        shape=chat(), workload={"concurrency": 4}, records=records, engine=None, samples=[sample],
        gates=Gates.of(max_ttft_p99_ms=350), wall_s=2.0, client_cpu_s=0.1,
    )  # fmt: skip
    return report.report().json_dict()


def _summary(*, ttft: float = 2431.27, goodput: float | None = 0.6187) -> dict[str, Any]:
    seed = _seed()
    headline = {
        "ttft_p99_ms": ttft,
        "tpot_p99_ms": 31.04,
        "goodput_ratio": goodput,
        "kv_fragmentation": None,
    }
    diagnosis = Diagnosis(
        target="prod-a", runbook="vllm-latency", headline=Measured.of(headline),
        baseline=Baseline.from_adrs([seed], {}),
        findings=[Finding(Severity.CRITICAL, "TTFT p99 far above the gate", "vllm_metrics")],
        matches=[match(seed, Measured.of(headline))], readings=Measured(), details={},
        sampling_s=5.0, at=T0,
    )  # fmt: skip
    return diagnosis.summary().json_dict()


def _incident(**changes: Any) -> IncidentFacts:
    facts: dict[str, Any] = {
        "id": 42, "title": "VLLMHighTTFT (instance=10.0.0.5:8000)", "target": "prod-a",
        "opened_at": T0, "closed_at": T0 + dt.timedelta(minutes=45),
        "labels": {"alertname": "VLLMHighTTFT", "instance": "10.0.0.5:8000", "severity": "page"},
        "annotations": ["TTFT p99 on 10.0.0.5:8000 is 2.431s (alert line 1s)"],
        "diagnosis": _summary(),
    }  # fmt: skip
    return IncidentFacts(**(facts | changes))


def _canaries() -> list[CanaryFacts]:
    """The real reports, handed over out of time order."""
    reports = _real_reports()
    labels = ["before: vLLM defaults", "after ADR-20260831-01", "after ADR-20260831-01, retry"]
    runs = [
        CanaryFacts.from_report(label=label, report=report, at=T0 + dt.timedelta(minutes=10 * i))
        for i, (label, report) in enumerate(zip(labels, reports, strict=False))
    ]
    return [runs[1], *runs[2:], runs[0]]


def _applied(state: str, **changes: Any) -> AppliedFix:
    facts: dict[str, Any] = {
        "adr": _seed(), "state": state,
        "before_flags": {"max-num-batched-tokens": 8192, "block-size": 16},
        "after_flags": {"max-num-batched-tokens": 2048, "block-size": 32, "enable-chunked-prefill": True},
        "requested_by": "U0ONCALL", "approved_by": ["U0LEAD"],
        "failed_gates": ["TTFT p99 1849.9ms > 350ms"] if state == "rolled_back" else [],
    }  # fmt: skip
    return AppliedFix(**(facts | changes))


def _draft(applied: AppliedFix | None, **changes: Any) -> Adr:
    args: dict[str, Any] = {
        "adr_id": ADR_ID, "day": DAY, "incident": _incident(), "canaries": _canaries(),
        "applied": applied, "deciders": ["inference-platform-oncall", "U0ONCALL"],
    }  # fmt: skip
    return build_postmortem(**(args | changes))


def _cells(row: MatrixRow) -> tuple[float | None, ...]:
    return (row.ttft_p99_ms, row.tpot_p99_ms, row.goodput_ratio, row.kv_fragmentation)


def _rounded(report: dict[str, Any], *, mixed: bool) -> tuple[float | None, ...]:
    # Without its background classes a report is read as a plain canary's.
    v = values_of(
        Report.of(report if mixed else {k: x for k, x in report.items() if k != "background"})
    )
    row = MatrixRow(config="x", ttft_p99_ms=v.ttft_p99_ms, tpot_p99_ms=v.tpot_p99_ms,
                    goodput_ratio=v.goodput_ratio, kv_fragmentation=v.kv_fragmentation)  # fmt: skip
    return _cells(row)


# --- the draft ------------------------------------------------------------------------------
def test_build_matrix_has_one_row_per_canary_run_in_time_order_with_its_json_numbers() -> None:
    adr = _draft(_applied("promoted"))
    runs = sorted(_canaries(), key=lambda c: c.at)
    assert [row.config for row in adr.matrix] == [INCIDENT_ROW, *(run.label for run in runs)]
    for row, run in zip(adr.matrix[1:], runs, strict=True):
        assert run.mixed  # recorded beside background load: the engine's goodput, internal frag
        assert _cells(row) == _rounded(dict(run.report), mixed=True)
        assert _cells(row) != _rounded(dict(run.report), mixed=False)
    assert "of the canary's own requests (background load beside them)" in adr.matrix_notes
    assert "stored with incident #42" in adr.matrix_notes


def test_the_context_names_the_background_load_the_gates_were_measured_beside() -> None:
    """One workload per record: the workload line is the gated requests'; the context also
    names what loaded the engine beside them (here the recorded run's 2 agent streams of
    2,048-token prompts), and a plain canary's draft says nothing of the kind."""
    adr = _draft(_applied("promoted"))
    (line,) = [ln for ln in adr.context.splitlines() if ln.startswith("- 负载 (load):")]
    assert line.endswith("ungated: agent: 2 streams of 2,048-token prompts, 8 output tokens")
    plain = CanaryFacts.from_report(label="after", report=_plain_report(0.2), at=T0)
    assert "负载" not in _draft(_applied("promoted"), canaries=[plain]).context


def test_build_matrix_reads_a_plain_canary_report_as_tune_does() -> None:
    report = _plain_report(0.2)
    run = CanaryFacts.from_report(label="after ADR-20260831-01", report=report, at=T0)
    adr = _draft(_applied("promoted"), canaries=[run])
    assert not run.mixed
    assert _cells(adr.matrix[1]) == _rounded(report, mixed=False)
    assert adr.matrix[1].kv_fragmentation == 0.123
    assert adr.matrix[1].verdict == PASSED  # 220ms TTFT p99, 25ms TPOT, all delivered
    assert "observed: 1 - resident tokens" in adr.matrix_notes


def test_build_canary_verdicts_use_the_applied_adrs_gates() -> None:
    adr = _draft(_applied("rolled_back"))
    for row in adr.matrix[1:]:
        assert row.verdict.startswith("不达标 (fail: TTFT p99 ")
        assert "> 350ms" in row.verdict and "> 35ms" in row.verdict


def test_build_reads_the_verdict_stored_with_a_run_judged_by_the_same_gates() -> None:
    """The change's own canary was judged when it ran (bot.canary.verdict judges once): the
    draft writes that verdict, not one of its own. Made to fail by judging the numbers again
    (the marked reason below is then lost)."""
    report = judged(_plain_report(0.5), gates_from(_seed().gates)).report.json_dict()
    entry = next(g for g in report["gates"] if g["name"] == "max_ttft_p99_ms")
    assert not entry["passed"]  # 550ms TTFT p99 against the seed's 350ms
    entry["reason"] = "TTFT p99 as stored"
    run = CanaryFacts.from_report(label="after ADR-20260831-01", report=report, at=T0)
    adr = _draft(_applied("rolled_back", failed_gates=[]), canaries=[run])
    # ... and its TPOT, under the limit on four requests' points, not decided (it fails too)
    assert adr.matrix[1].verdict.startswith("不达标 (fail: TTFT p99 as stored; TPOT p99 ")
    assert "not decided at 99%" in adr.matrix[1].verdict
    assert "failed gates: TTFT p99 as stored" in adr.context
    # A run stored with a verdict by other gates (TTFT and errors only) is judged by the
    # ADR's from its numbers: its stored words are not the ADR's verdict.
    judged_elsewhere = _plain_report(0.5)
    judged_elsewhere["gates"][0]["reason"] = "TTFT p99 as stored"
    other = CanaryFacts.from_report(label="x", report=judged_elsewhere, at=T0)
    assert other.failures(gates_from(_seed().gates)) == ["TTFT p99 548.5ms > 350ms"]


def test_build_incident_row_is_the_diagnosis_headline_with_missing_numbers_empty() -> None:
    row = _draft(None).matrix[0]
    assert row.config == INCIDENT_ROW
    assert _cells(row) == (2431.3, 31.0, 0.619, None)
    assert row.verdict == "事故现场 (incident: TTFT p99 2431.3ms > 350ms; goodput 61.9% < 95%)"


def test_build_incident_row_marks_bounds_and_estimates_and_judges_only_what_they_decide() -> None:
    summary = _summary(goodput=0.935)
    summary["headline"] |= {"tpot_p99_ms": 10.0, "kv_fragmentation": 0.12}
    summary["bounds"] = {"tpot_p99_ms": "<="}  # the quantile fell in TPOT's first bucket
    summary["spans"] = {"goodput_ratio": [0.90, 0.97], "kv_fragmentation": [0.0, 0.24]}
    adr = _draft(None, incident=_incident(diagnosis=summary))
    row = adr.matrix[0]
    text = render(adr)
    assert "| 2431.3ms | ≤10ms | 93.5% (90-97%) | 12% (0-24%) |" in text
    assert parse(text).matrix[0] == row
    # goodput's span reaches both sides of the 95 % gate: not a symptom, and the row says why
    assert row.verdict == (
        "事故现场 (incident: TTFT p99 2431.3ms > 350ms; goodput 93.5% (90-97%) against 95%: "
        "undecided)"
    )
    assert adr.match == [Condition(metric="ttft_p99_ms", op=">", value=350.0)]
    assert "TPOT p99 ≤10ms" in adr.context and "KV fragmentation 12% (0-24%)" in adr.context


def test_build_match_is_the_symptoms_observed_at_the_gates() -> None:
    adr = _draft(_applied("promoted"))
    assert adr.match == [
        Condition(metric="ttft_p99_ms", op=">", value=350.0),
        Condition(metric="goodput_ratio", op="<", value=0.95),
    ]


def test_build_match_falls_back_to_the_applied_adrs_match_when_nothing_was_out_of_gate() -> None:
    quiet = _incident(diagnosis=_summary(ttft=120.0, goodput=0.99))
    adr = _draft(_applied("promoted"), incident=quiet)
    assert adr.match == _seed().match
    assert adr.matrix[0].verdict == "事故现场 (incident: within the gates)"


def test_build_incident_row_says_which_gates_it_cannot_be_judged_by() -> None:
    """The demo's ADR gates TPOT at 0.5x the before-run (a canary's number, not the
    diagnosis's) and goodput at 80 % (the diagnosis read none): the row says so instead of
    "within the gates"; a number it can judge is still judged."""
    relative = _seed().model_copy(
        update={"gates": AdrGates.model_validate(
            {"max_tpot_p99_ms": "0.5x before", "min_goodput_ratio": 0.80}
        )}
    )  # fmt: skip
    unread = _incident(diagnosis=_summary(goodput=None))
    adr = _draft(_applied("promoted", adr=relative), incident=unread)
    assert adr.matrix[0].verdict == (
        "事故现场 (incident: not judged: TPOT p99 0.5x before: a canary's measure, not the "
        "diagnosis's; goodput not measured)"
    )
    gated = relative.model_copy(update={"gates": relative.gates.model_copy(  # type: ignore[union-attr]
        update={"max_ttft_p99_ms": 350.0})})  # fmt: skip
    adr = _draft(_applied("promoted", adr=gated), incident=unread)
    assert adr.matrix[0].verdict == (
        "事故现场 (incident: TTFT p99 2431.3ms > 350ms; not judged: TPOT p99 0.5x before: a "
        "canary's measure, not the diagnosis's; goodput not measured)"
    )
    quiet = _incident(diagnosis=_summary(ttft=120.0, goodput=None))
    assert (
        _draft(_applied("promoted", adr=gated), incident=quiet)
        .matrix[0]
        .verdict.startswith(
            "事故现场 (incident: within the gates it can be judged by; not judged: TPOT p99"
        )
    )


def test_build_kept_fix_becomes_the_fix_and_rules() -> None:
    seed = _seed()
    adr = _draft(_applied("promoted"))
    assert adr.status == "proposed" and adr.supersedes == []
    assert adr.fix == seed.fix and adr.gates == seed.gates
    assert adr.title == (
        "prod-a: VLLMHighTTFT (instance=10.0.0.5:8000) — ADR-20260831-01 kept "
        "(--enable-chunked-prefill --max-num-batched-tokens 2048 --block-size 32)"
    )
    assert "固化引擎参数 (engine flag): `--max-num-batched-tokens 2048` (was 8192)." in adr.rules
    assert (
        "固化引擎参数 (engine flag): `--enable-chunked-prefill` (was unset: vLLM default)."
        in adr.rules
    )
    assert "固化引擎参数 (engine flag): `--block-size 32` (was 16)." in adr.rules
    assert any("X-Request-Timeout" in rule for rule in adr.rules)
    assert adr.rules[-1].startswith(
        "发布门禁 (release gate): `python -m latency_checker --max-ttft-p99-ms 350 "
        "--max-tpot-p99-ms 35 --min-goodput-ratio 0.95`"
    )
    assert (
        "kept — promoted. Last canary (after ADR-20260831-01, retry): TTFT p99 1937.1ms"
        in adr.context
        and "approved by U0LEAD" in adr.context
    )


def test_build_rolled_back_fix_is_not_a_fix_and_rules_warn_with_numbers() -> None:
    kept, rolled = _draft(_applied("promoted")), _draft(_applied("rolled_back"))
    assert rolled.fix == Fix() and kept.fix != rolled.fix
    assert rolled.title.endswith("— ADR-20260831-01 rolled back")
    warning = rolled.rules[0]
    assert warning.startswith(
        "不要对此症状应用 (do not apply) `--enable-chunked-prefill --max-num-batched-tokens 2048 "
        "--block-size 32` (ADR-20260831-01) on `prod-a` without new evidence"
    )
    assert "TTFT p99 1849.9ms > 350ms" in warning
    assert not any(rule.startswith("固化引擎参数") for rule in rolled.rules)
    assert "rolled back — failed gates: TTFT p99 1849.9ms > 350ms" in rolled.context
    assert "`--max-num-batched-tokens 8192 --block-size 16`" in rolled.context


def test_build_rolled_back_without_recorded_gates_reads_them_from_the_last_canary() -> None:
    rolled = _draft(_applied("rolled_back", failed_gates=[]))
    assert "TPOT p99 187.6ms > 35ms" in rolled.rules[0]


def test_build_without_a_fix_says_what_is_known() -> None:
    adr = _draft(None, canaries=[])
    assert adr.fix == Fix() and adr.matrix[1:] == []
    assert adr.gates == AdrGates(max_ttft_p99_ms=350, max_tpot_p99_ms=35, min_goodput_ratio=0.95)
    assert adr.rules[0] == (
        "已知 (known): on `prod-a` the engine showed TTFT p99 > 350ms; Goodput < 95%; "
        "no fix has been applied yet."
    )
    assert "/apply-adr ADR-20260831-01 prod-a" in adr.rules[1]
    assert "Opened 2026-12-01 02:13 UTC, closed 2026-12-01 02:58 UTC" in adr.context
    assert "TTFT p99 2431.3ms (gate ≤ 350ms, ADR-20260831-01)" in adr.context


def test_build_without_diagnosis_or_gates_is_still_a_draft() -> None:
    adr = _draft(None, incident=_incident(diagnosis=None, closed_at=None))
    assert adr.gates is None and adr.match == []
    assert _cells(adr.matrix[0]) == (None, None, None, None)
    assert [row.verdict for row in adr.matrix[1:]] == ["canary failed (no ADR gates)"] * 3
    assert "still open when this draft was written" in adr.context


def test_build_title_is_one_line_of_at_most_200_characters() -> None:
    adr = _draft(None, incident=_incident(title="Very\nlong " * 60))
    assert "\n" not in adr.title and len(adr.title) == 200 and adr.title.endswith("…")


def test_build_refuses_an_id_of_another_day() -> None:
    with pytest.raises(UsageError, match="must carry the draft's date 20261201"):
        _draft(None, adr_id="ADR-20261130-01")


def test_build_records_the_workload_of_the_canary_that_judged_the_change() -> None:
    judged = long_system_prompt()
    for state in ("promoted", "rolled_back"):
        adr = _draft(_applied(state, shape=judged))
        assert adr.workload == judged
        text = render(adr)
        assert text.split("## 2. ", 1)[0].rstrip().endswith(context_line(judged))
        assert parse(text) == adr
    # no change judged, or a canary that said no shape: no workload, and no line
    for applied in (None, _applied("promoted")):
        adr = _draft(applied)
        assert adr.workload is None and "Measured at" not in render(adr)


@pytest.mark.parametrize("state", ["promoted", "rolled_back", "failed", None])
def test_build_renders_parses_back_and_validates(tmp_path: Path, state: str | None) -> None:
    adr = _draft(_applied(state, shape=chat()) if state else None)
    assert parse(render(adr)) == adr
    store = AdrStore(root=tmp_path / "adr")
    store.root.mkdir()
    (store.root / SEED.name).write_text(SEED.read_text(encoding="utf-8"), encoding="utf-8")
    path = store.write_draft(adr)
    assert load(path) == adr
    assert [str(p) for p in validate(store.root)] == []


# --- review -----------------------------------------------------------------------------------
# The decision a review makes of a draft (the bot keeps it in the store: bot.postmortem.records).
def _decided(adr: Adr | None = None, **changes: Any) -> Adr:
    args: dict[str, Any] = {
        "status": "accepted", "reviewer": "U0LEAD", "note": "accepted by U0LEAD.", "day": DAY,
        "name": f"{ADR_ID}-x.md",
    }  # fmt: skip
    return decided(adr or _draft(_applied("promoted")), **(args | changes))


def test_accepting_a_draft_records_the_reviewer_and_the_review() -> None:
    draft = _draft(_applied("promoted"))
    record = _decided(draft)
    assert record.status == "accepted"
    assert record.deciders == ["inference-platform-oncall", "U0ONCALL", "U0LEAD"]
    assert record.notes == "## 评审记录 (Review)\n\n- 2026-12-01: accepted by U0LEAD."
    assert record.fix == _seed().fix and record.matrix == draft.matrix


def test_accepting_keeps_a_reviewer_already_among_the_deciders_once() -> None:
    assert _decided(reviewer="U0ONCALL").deciders == ["inference-platform-oncall", "U0ONCALL"]


def test_a_draft_that_is_no_longer_proposed_cannot_be_decided() -> None:
    rejected = _draft(_applied("promoted")).model_copy(update={"status": "rejected"})
    with pytest.raises(AdrError, match="status: already rejected"):
        _decided(rejected)


def test_a_draft_without_gates_cannot_be_accepted() -> None:
    with pytest.raises(AdrError, match="an accepted ADR needs canary gates"):
        _decided(_draft(None, incident=_incident(diagnosis=None)))


def test_a_rejection_records_its_reason_on_one_line_and_needs_one() -> None:
    note = rejection_note(ADR_ID, reviewer="U0LEAD", reason="one\nincident is not\nevidence")
    record = _decided(status="rejected", note=note)
    assert record.status == "rejected"
    assert record.notes.endswith("- 2026-12-01: rejected by U0LEAD: one incident is not evidence")
    with pytest.raises(UsageError, match="say why"):
        rejection_note(ADR_ID, reviewer="U0LEAD", reason="  ")


@pytest.mark.parametrize(
    ("reviewer", "author", "reviewers", "refusal"),
    [
        ("U0LEAD", "U0ONCALL", ["U0LEAD"], None),
        ("U0LEAD", "U0ONCALL", ["*"], None),
        ("U0ONCALL", "U0ONCALL", ["U0ONCALL", "U0LEAD"], "You wrote this draft \\(U0ONCALL\\)"),
        ("U0ONCALL", "U0ONCALL", ["*"], "another reviewer must"),
        ("U0OTHER", "U0ONCALL", ["U0LEAD", "U0SRE"], "Allowed: <@U0LEAD>, <@U0SRE>"),
        ("U0LEAD", "U0ONCALL", [], "set `review = \\[...\\]` under \\[access\\]"),
    ],
)
def test_check_reviewer(
    reviewer: str, author: str, reviewers: list[str], refusal: str | None
) -> None:
    if refusal is None:
        check_reviewer(reviewer=reviewer, author=author, reviewers=reviewers)
    else:
        with pytest.raises(NotAllowed, match=refusal):
            check_reviewer(reviewer=reviewer, author=author, reviewers=reviewers)


def test_the_draft_says_how_sure_the_verdict_was_and_what_no_gate_watched() -> None:
    """The kept change's statistics and its guardrails reach the draft the team reviews; a
    change without them (no before-run) says neither."""
    sure = "TPOT p99: met at 99% (p=0.00047; n=8, 8 before)"
    worse = "TTFT p99 187ms → 420ms (2.2x): worse beyond 20% and noise (above 1.2x before ...)"
    adr = _draft(_applied("promoted", how_sure=[sure], watched=[worse]))
    assert f"- 把握 (how sure): {sure}." in adr.context
    assert f"- 未设门禁的指标 (watched, not gated; against the before-run): {worse}." in adr.context
    plain = _draft(_applied("promoted"))
    assert "把握" not in plain.context and "watched, not gated" not in plain.context
