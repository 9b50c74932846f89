"""Builds the post-incident ADR draft from an incident's plain facts.

The facts are plain data (no store rows): the alert and the diagnosis summary of the incident,
each canary run with its full JSON report, and the fix that was applied, if any. The draft
follows the seed's template: context, a Metrics Matrix whose first row is the incident as the
diagnosis saw it and whose other rows are the canary runs (numbers exactly as `ruleloop tune`
reads them, `bot.canary.verdict.values_of`), and the rules the outcome supports.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bot.adr import Adr, AdrGates, Condition, Fix, MatrixRow, canonical, date_of_id
from bot.adr.workload import WorkloadShape
from bot.canary import (
    GATES,
    MEASURED,
    PASSED,
    CanaryReport,
    GateResult,
    Gates,
    Values,
    Verdict,
    gates_from,
    judge_values,
    judged_limits,
    source_note,
    values_of,
)
from bot.diagnosis import GATE_OF, summary_numbers
from bot.kernel import UsageError
from bot.kernel.numbers import FOUR, Measured, Reading, compact, compare
from bot.kernel.store import ChangeState, DiagnosisSummary

INCIDENT_ROW = "Incident (diagnosis, engine view)"
TITLE_LIMIT = 200
ANNOTATION_LIMIT = 300
ANNOTATIONS_SHOWN = 5


@dataclass(frozen=True)
class IncidentFacts:
    """The incident: its alert, when it ran, and the diagnosis summary (`Diagnosis.summary()`)."""

    id: int
    title: str
    target: str | None
    opened_at: dt.datetime
    closed_at: dt.datetime | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Sequence[str] = ()  # the alerts' summary / description texts
    diagnosis: DiagnosisSummary = field(default_factory=DiagnosisSummary)

    def __post_init__(self) -> None:
        # a summary given as its stored JSON (or None: not diagnosed) is parsed here, once
        object.__setattr__(self, "diagnosis", DiagnosisSummary.of(self.diagnosis))


@dataclass(frozen=True)
class CanaryFacts:
    """One canary run of the incident: its matrix label and full JSON report."""

    label: str
    passed: bool
    report: CanaryReport
    at: dt.datetime
    mixed: bool = False  # measured beside background load (see bot.canary.verdict)

    @classmethod
    def from_report(
        cls, *, label: str, report: CanaryReport | dict[str, Any], at: dt.datetime
    ) -> CanaryFacts:
        """Facts of a report (stored JSON is parsed here, once); mixed when the report carries
        background classes."""
        parsed = CanaryReport.of(report)
        return cls(
            label=label, passed=bool(parsed.passed), report=parsed, at=at,
            mixed=bool(parsed.background),
        )  # fmt: skip

    def values(self) -> Values:
        """The four matrix numbers of this run."""
        return values_of(self.report)

    def failures(self, gates: Gates) -> list[str]:
        """The gates this run missed: the verdict stored with it when ``gates`` are the ones it
        was judged by (the change's own canary; bot.canary.verdict judges once), else its
        numbers against ``gates`` (a run recorded under other gates, e.g. a tune run, or a
        report kept before verdicts were stored)."""
        stored = stored_verdict(self.report)
        if stored is not None and _limits(stored) == _limits(gates):
            return stored.failures
        return judge_values(self.values(), gates).failures


def stored_verdict(report: CanaryReport) -> Verdict | None:
    """The verdict written into a canary report (its ``gates`` list), None when it has none."""
    if not report.gates:
        return None
    return Verdict(
        tuple(
            GateResult(g.name, g.limit, g.value, g.passed, g.reason, g.source) for g in report.gates
        )
    )


def _limits(judged: Verdict | Gates) -> dict[str, float]:
    """The limits a verdict was judged by, or that gates set ('measured' is not a limit)."""
    if isinstance(judged, Verdict):
        return {r.name: r.limit for r in judged.results if r.name != MEASURED}
    return {name: limit for name in GATES if (limit := judged.limit(name)) is not None}


@dataclass(frozen=True)
class AppliedFix:
    """The ADR applied during the incident and how it ended (a remediation, as plain data)."""

    adr: Adr
    state: str  # how it ended (a ChangeState): promoted | rolled_back | failed | ...
    before_flags: Mapping[str, object] = field(default_factory=dict)
    after_flags: Mapping[str, object] = field(default_factory=dict)
    requested_by: str = ""
    approved_by: Sequence[str] = ()
    failed_gates: Sequence[str] = ()
    limits: Mapping[str, float] = field(default_factory=dict)  # the numbers its canary used
    shape: WorkloadShape | None = None  # the workload the canary that judged it sent
    how_sure: Sequence[str] = ()  # each per-request gate as its statistics decided it
    watched: Sequence[str] = ()  # ungated numbers the change made worse (guardrails)

    @property
    def judged(self) -> AdrGates | None:
        """The gates as the numbers its canary was judged by ('0.5x before' as 855 ms)."""
        if self.adr.gates is None or not self.limits:
            return self.adr.gates
        return judged_limits(self.adr.gates, self.limits)

    @property
    def kept(self) -> bool:
        """The change passed its canary and was promoted."""
        return self.state == ChangeState.PROMOTED


def build_postmortem(
    *,
    adr_id: str,
    day: dt.date,
    incident: IncidentFacts,
    canaries: Sequence[CanaryFacts],
    applied: AppliedFix | None,
    deciders: Sequence[str],
) -> Adr:
    """The proposed ADR recording an incident: context, measured matrix and rules."""
    if date_of_id(adr_id) != day:
        raise UsageError(f"the ADR id {adr_id} must carry the draft's date {day:%Y%m%d}")
    runs = sorted(canaries, key=lambda run: _utc(run.at))
    summary = incident.diagnosis
    headline = summary_numbers(summary)
    gates = applied.adr.gates if applied is not None else _baseline_gates(summary)
    judged = applied.judged if applied is not None else gates  # numbers, where resolved
    symptoms = _symptoms(headline, gates)
    kept = applied is not None and applied.kept
    return Adr(
        id=adr_id,
        title=_title(incident, applied),
        status="proposed",
        date=day,
        deciders=list(dict.fromkeys(deciders)),
        match=symptoms or (list(applied.adr.match) if applied is not None else []),
        cause=_cause(summary, applied),
        fix=applied.adr.fix if kept and applied is not None else Fix(),
        gates=gates,
        # what the matrix's verdict on the change was measured under; the template says it in
        # a line of the Context section
        workload=applied.shape if applied is not None else None,
        context=_context(incident, runs, applied, judged),
        matrix=[_incident_row(headline, gates), *(_canary_row(run, judged) for run in runs)],
        matrix_notes=_notes(incident, runs),
        rules=_rules(incident, applied, gates, symptoms, runs),
    )


# --- front matter -------------------------------------------------------------------------
def _cause(summary: DiagnosisSummary, applied: AppliedFix | None) -> list[str]:
    """The cause the draft answers: the one the diagnosis supported (its first: the most likely),
    else the one the applied ADR answers; none when neither names one."""
    supported = summary.supported()
    if supported:
        return supported[:1]
    return list(applied.adr.cause) if applied is not None else []


def _baseline_gates(summary: DiagnosisSummary) -> AdrGates | None:
    """Without an applied ADR: the strictest gates of the accepted ADRs (the diagnosis baseline)."""
    limits = {
        GATE_OF[key]: float(value) for key, (value, _) in summary.baseline.items() if key in GATE_OF
    }
    return AdrGates.of_numbers(limits) if limits else None


def _symptoms(headline: Measured, gates: AdrGates | None) -> list[Condition]:
    """One condition per headline number that was outside its gate, at the gate's value (a
    bound or an estimate's span only where it is outside whatever the value is)."""
    if gates is None:
        return []
    found = []
    for key, _, _, worse_up in FOUR:
        reading, limit = headline.reading(key), getattr(gates, GATE_OF[key])
        if reading is None or not isinstance(limit, float):  # unset, or relative to a canary
            continue
        op = ">" if worse_up else "<"
        if compare(reading, op, Reading(limit)) is True:
            found.append(Condition(metric=key, op=op, value=float(limit)))
    return found


def _title(incident: IncidentFacts, applied: AppliedFix | None) -> str:
    if applied is None:
        outcome = "diagnosed, no fix applied yet"
    elif applied.kept:
        outcome = f"{applied.adr.id} kept ({_flags(applied.adr.fix.engine_args) or 'gateway only'})"
    elif applied.state == ChangeState.ROLLED_BACK:
        outcome = f"{applied.adr.id} rolled back"
    else:
        outcome = f"{applied.adr.id} {applied.state}"
    title = _one_line(f"{incident.target or 'unknown target'}: {incident.title} — {outcome}")
    return _clip(title, TITLE_LIMIT)


# --- section 1: context -------------------------------------------------------------------
def _context(
    incident: IncidentFacts,
    runs: Sequence[CanaryFacts],
    applied: AppliedFix | None,
    gates: AdrGates | None,
) -> str:
    closed = (
        f"closed {_when(incident.closed_at)}"
        if incident.closed_at is not None
        else "still open when this draft was written"
    )
    lines = [
        f"Incident #{incident.id} on `{incident.target or 'unknown target'}`: "
        f"{_one_line(incident.title)}. Opened {_when(incident.opened_at)}, {closed}.",
        "",
    ]
    if incident.labels:
        labels = ", ".join(f"{k}={_one_line(str(v))}" for k, v in sorted(incident.labels.items()))
        lines.append(f"- 告警 (alert labels): `{labels}`")
    for text in list(incident.annotations)[:ANNOTATIONS_SHOWN]:
        lines.append(f"- 告警说明 (alert): {_clip(_one_line(text), ANNOTATION_LIMIT)}")
    lines += _diagnosis_lines(incident.diagnosis)
    if applied is not None:
        lines += _applied_lines(incident, applied, runs, gates)
    if runs:
        listed = "; ".join(f"{_when(run.at)} {_one_line(run.label)}" for run in runs)
        lines.append(f"- 金丝雀 (canary runs, in the matrix in time order): {listed}")
        lines += _background_lines(runs[-1])
    return "\n".join(lines)


def _background_lines(run: CanaryFacts) -> list[str]:
    """What loaded the engine beside the gated requests, so the record names all the traffic
    its gates were measured under (the workload line describes the gated requests only)."""
    classes = [b.workload for b in run.report.background]
    if not classes:
        return []
    described = "; ".join(
        f"{_one_line(str(w.get('name') or 'background'))}: {w.get('concurrency')} streams of "
        f"{w.get('prompt_length'):,}-token prompts, {w.get('output_length'):,} output tokens"
        for w in classes
        if isinstance(w.get("prompt_length"), int) and isinstance(w.get("output_length"), int)
    )
    if not described:
        return []
    return [
        "- 负载 (load): the gates were measured on the canary's own requests (the workload line "
        f"below) while these loaded the same engine, ungated: {described}"
    ]


def _diagnosis_lines(summary: DiagnosisSummary) -> list[str]:
    if not summary.diagnosed:
        return ["- 诊断 (diagnosis): none recorded for this incident."]
    headline = summary_numbers(summary)
    baseline = summary.baseline
    numbers = []
    for key, label, _, worse_up in FOUR:
        reading = headline.reading(key)
        text = f"{label} {_number(key, reading)}"
        if limit := baseline.get(key):
            text += f" (gate {'≤' if worse_up else '≥'} {_number(key, limit[0])}, {limit[1]})"
        numbers.append(text)
    lines = [
        f"- 诊断 (diagnosis, engine side, runbook `{summary.runbook or '?'}`): "
        + ", ".join(numbers)
        + f"; worst finding: {summary.worst}."
    ]
    matches = summary.matches
    lines.append(
        f"- 匹配的 ADR (accepted ADRs matching): {', '.join(matches)}"
        if matches
        else "- 匹配的 ADR (accepted ADRs matching): none."
    )
    return lines


def _applied_lines(
    incident: IncidentFacts,
    applied: AppliedFix,
    runs: Sequence[CanaryFacts],
    gates: AdrGates | None,
) -> list[str]:
    adr = applied.adr
    approved = ", ".join(applied.approved_by) or "nobody recorded"
    lines = [
        f"- 处置 (applied): {adr.id} `{_flags(adr.fix.engine_args) or 'no engine flags'}` on "
        f"`{incident.target or 'unknown target'}`, requested by {applied.requested_by or '?'}, "
        f"approved by {approved}. This draft records how {adr.id} did here; it supersedes "
        "nothing (decide that in review)."
    ]
    last = runs[-1].values() if runs else None
    if applied.kept:
        numbers = f" Last canary ({_one_line(runs[-1].label)}): {_four(last)}." if last else ""
        lines.append(f"- 结果 (outcome): kept — promoted.{numbers}")
    else:
        failed = _failed(applied, runs[-1] if runs else None, gates)
        state = "rolled back" if applied.state == ChangeState.ROLLED_BACK else applied.state
        before = _flags(applied.before_flags) or "vLLM defaults"
        lines.append(
            f"- 结果 (outcome): {state} — {failed or 'no canary verdict recorded'}. "
            f"Serving flags before the change: `{before}`."
        )
    if applied.how_sure:
        lines.append(f"- 把握 (how sure): {'; '.join(applied.how_sure)}.")
    if applied.watched:
        lines.append(
            f"- 未设门禁的指标 (watched, not gated; against the before-run): "
            f"{'; '.join(applied.watched)}."
        )
    return lines


def _failed(applied: AppliedFix, last: CanaryFacts | None, gates: AdrGates | None) -> str:
    if applied.failed_gates:
        return "failed gates: " + "; ".join(applied.failed_gates)
    if last is None or gates is None:
        return ""
    missed = last.failures(gates_from(gates, numbers_only=True))
    return "failed gates: " + "; ".join(missed) if missed else ""


# --- section 2: metrics matrix ------------------------------------------------------------
def _incident_row(headline: Measured, gates: AdrGates | None) -> MatrixRow:
    values = Values(
        ttft_p99_ms=headline.numbers.get("ttft_p99_ms"),
        tpot_p99_ms=headline.numbers.get("tpot_p99_ms"),
        goodput_ratio=headline.numbers.get("goodput_ratio"),
        kv_fragmentation=headline.numbers.get("kv_fragmentation"),
    )
    if not headline.numbers:
        verdict = "事故现场 (incident: not diagnosed)"
    elif gates is None:
        verdict = "事故现场 (incident)"
    else:
        verdict = f"事故现场 (incident: {_incident_verdict(headline, gates)})"
    # the engine's histograms know a quantile to its bucket, the gauges fragmentation to a span
    return _row(INCIDENT_ROW, values, verdict, headline)


def _canary_row(run: CanaryFacts, gates: AdrGates | None) -> MatrixRow:
    values = run.values()
    if gates is None or gates.is_empty():
        verdict = f"canary {'passed' if run.passed else 'failed'} (no ADR gates)"
    else:
        missed = run.failures(gates_from(gates, numbers_only=True))
        verdict = f"不达标 (fail: {'; '.join(missed)})" if missed else PASSED
    return _row(_one_line(run.label) or "canary", values, verdict)


def _incident_verdict(headline: Measured, gates: AdrGates) -> str:
    """What the gates say of the diagnosis's numbers: those it was outside, and the gates it
    cannot be judged by (a gate relative to a canary's before-run is not the diagnosis's
    measure; a number the diagnosis did not read is unknown), never "within" a gate unchecked."""
    missed = _outside(headline, gates)
    unjudged = [
        f"{GATES[key][0]} {value}: a canary's measure, not the diagnosis's"
        for key, value in gates.relative().items()
    ]
    limits = gates_from(gates, numbers_only=True)
    checked = 0
    for name, (label, key, _kind, _write) in GATES.items():
        if name == "max_error_rate" or limits.limit(name) is None:
            continue
        if headline.reading(key) is None:
            unjudged.append(f"{label} not measured")
        else:
            checked += 1
    if missed:
        said = "; ".join(missed)
    elif checked:
        said = "within the gates" if not unjudged else "within the gates it can be judged by"
    else:
        said = ""
    not_judged = "not judged: " + "; ".join(unjudged) if unjudged else ""
    return "; ".join(part for part in (said, not_judged) if part) or "no gates"


def _outside(headline: Measured, gates: AdrGates) -> list[str]:
    """The gates the diagnosis's numbers were outside, in the canary verdict's words; a bound or
    an estimate's span that reaches both sides says so. A number the diagnosis could not read
    is not a symptom: only what was measured is gated."""
    limits = gates_from(gates, numbers_only=True)
    out = []
    for name, (label, key, kind, write) in GATES.items():
        limit, reading = limits.limit(name), headline.reading(key)
        if name == "max_error_rate" or limit is None or reading is None:
            continue
        op = ">" if kind == "max" else "<"
        outside = compare(reading, op, Reading(limit))
        if outside is None:
            out.append(f"{label} {_number(key, reading)} against {write(limit)}: undecided")
        elif outside:
            out.append(f"{label} {_number(key, reading)} {op} {write(limit)}")
    return out


def _row(config: str, values: Values, verdict: str, known: Measured | None = None) -> MatrixRow:
    """A matrix row; ``known`` says which of its numbers are only bounds or spans."""
    row = MatrixRow(
        config=config,
        ttft_p99_ms=values.ttft_p99_ms,
        tpot_p99_ms=values.tpot_p99_ms,
        goodput_ratio=_ratio(values.goodput_ratio),
        kv_fragmentation=_ratio(values.kv_fragmentation),
        verdict=verdict,
    )
    if known is None:
        return row
    shown = {key: r for key, *_ in FOUR if getattr(row, key) is not None
             and (r := known.reading(key)) is not None}  # fmt: skip
    return MatrixRow.model_validate(
        {
            **row.model_dump(),
            "bounds": {k: r.bound for k, r in shown.items() if r.bound is not None},
            "spans": {k: r.span for k, r in shown.items() if r.span is not None},
        }
    )


def _notes(incident: IncidentFacts, runs: Sequence[CanaryFacts]) -> str:
    runbook = incident.diagnosis.runbook
    notes = [
        f"{INCIDENT_ROW}: the diagnosis's numbers from vLLM's own /metrics over its sampling "
        f"window{f' (runbook `{runbook}`)' if runbook else ''}, not a canary run."
    ]
    kinds = sorted({run.mixed for run in runs})
    for mixed in kinds:
        prefix = (
            ("Rows with background load: " if mixed else "Rows without: ") if len(kinds) > 1 else ""
        )
        notes.append(prefix + source_note(mixed=mixed))
    if runs:
        notes.append(
            f"Canary JSON: stored with incident #{incident.id} (one report per canary row, "
            "as `ruleloop canary --output-json` writes it)."
        )
    return "\n\n".join(notes)


# --- section 3: solidified rules ----------------------------------------------------------
def _rules(
    incident: IncidentFacts,
    applied: AppliedFix | None,
    gates: AdrGates | None,
    symptoms: Sequence[Condition],
    runs: Sequence[CanaryFacts],
) -> list[str]:
    target = f"`{incident.target or 'unknown target'}`"
    gate = [gate_rule(gates)] if gates is not None and not gates.is_empty() else []
    if applied is None:
        return [*_known(incident, symptoms, target), *gate]
    adr, flags = applied.adr, _flags(applied.adr.fix.engine_args) or "its gateway rules"
    if applied.kept:
        return [*_flag_rules(applied), *_gateway_rules(adr.fix), *gate]
    failed = _failed(applied, runs[-1] if runs else None, gates) or "no canary verdict recorded"
    if applied.state == ChangeState.ROLLED_BACK:
        return [
            f"不要对此症状应用 (do not apply) `{flags}` ({adr.id}) on {target} without new "
            f"evidence: its canary here missed the gates ({failed}) and it was rolled back. "
            "Measure alternatives with `ruleloop tune` first.",
            *gate,
        ]
    return [
        f"{adr.id} did not complete on {target} (state {applied.state}; {failed}): nothing "
        f"measured says whether `{flags}` helps this symptom. Find why before applying it again.",
        *gate,
    ]


def _known(incident: IncidentFacts, symptoms: Sequence[Condition], target: str) -> list[str]:
    summary = incident.diagnosis
    if symptoms:
        seen = "; ".join(
            f"{_metric_label(c.metric)} {c.op} "
            + (_number(c.metric, c.value) if isinstance(c.value, float) else str(c.value))
            for c in symptoms
        )
        rules = [
            f"已知 (known): on {target} the engine showed {seen}; no fix has been applied yet."
        ]
    elif summary.diagnosed:
        rules = [f"已知 (known): on {target} the diagnosis numbers stayed within the gates."]
    else:
        rules = [f"已知 (known): no diagnosis numbers were recorded for {target}."]
    matches = summary.matches
    if matches:
        rules.append(
            f"Accepted ADRs match these numbers ({', '.join(matches)}): apply one with "
            f"`/apply-adr {matches[0]} {incident.target or ''}`".rstrip()
            + " and record the outcome."
        )
    else:
        rules.append(
            "No accepted ADR matches these numbers: measure candidate flags with "
            "`ruleloop tune` before deciding."
        )
    return rules


def _flag_rules(applied: AppliedFix) -> list[str]:
    before = {canonical(k): v for k, v in applied.before_flags.items()}
    rules = []
    for key, value in applied.adr.fix.engine_args.items():
        name = canonical(key)
        rules.append(
            f"固化引擎参数 (engine flag): `{_flag(name, value)}` ({_was(before.get(name))})."
        )
    return rules


def _gateway_rules(fix: Fix) -> list[str]:
    g = fix.gateway
    if g is None:
        return []
    rules = []
    if g.require_request_timeout:
        rules.append(f"代理层必须校验 {g.timeout_header} (the gateway requires a request timeout).")
    if g.drop_on_cancel:
        rules.append("客户端 Cancel 时立即中止上游请求，丢弃残余计算 (drop work on cancel).")
    if g.max_in_flight_tokens is not None:
        rules.append(f"网关在途 token 上限 (gateway in-flight tokens): {g.max_in_flight_tokens}.")
    if g.upstream_timeout_s is not None:
        rules.append(f"上游超时 (gateway upstream timeout): {g.upstream_timeout_s:g} s.")
    return rules


def gate_rule(gates: AdrGates) -> str:
    """The seed's release-gate rule: the latency_checker command line for these gates."""
    return (
        f"发布门禁 (release gate): `python -m latency_checker {gates.cli_flags()}`，"
        "不达标则终止发布并回滚 (a failed gate stops the release and rolls back)."
    )


# --- small formatting helpers -------------------------------------------------------------
def _flag(name: str, value: object) -> str:
    if isinstance(value, bool):
        return f"--{name}" if value else f"--no-{name}"
    return f"--{name} {value}"


def _flags(flags: Mapping[str, object]) -> str:
    return " ".join(_flag(canonical(k), v) for k, v in flags.items())


def _was(value: object) -> str:
    if value is None:
        return "was unset: vLLM default"
    if isinstance(value, bool):
        return f"was {'on' if value else 'off'}"
    return f"was {value}"


def _number(key: str, value: Reading | float | None) -> str:
    """A number in the seed's compact form, with its bound or span."""
    if value is None:
        return "n/a"
    reading = value if isinstance(value, Reading) else Reading(value)
    unit = next((u for k, _, u, _ in FOUR if k == key), "ms")
    return compact(reading.value, unit, reading.bound, reading.span)


def _metric_label(key: str) -> str:
    return next((label for k, label, _, _ in FOUR if k == key), key)


def _four(values: Values) -> str:
    return ", ".join(f"{label} {_number(key, getattr(values, key))}" for key, label, _, _ in FOUR)


def _ratio(value: float | None) -> float | None:
    # A ratio outside 0-1 is a broken reading; the matrix cannot hold it.
    return value if value is None or 0 <= value <= 1 else None


def _utc(at: dt.datetime) -> dt.datetime:
    return at.replace(tzinfo=dt.UTC) if at.tzinfo is None else at.astimezone(dt.UTC)


def _when(at: dt.datetime) -> str:
    return f"{_utc(at):%Y-%m-%d %H:%M} UTC"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"
