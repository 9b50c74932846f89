"""The incident page's view-model: the store's rows turned into what the template prints.

The four numbers come from three places: normal (the scheduler's snapshots, as the diagnosis
read them), the incident (the diagnosis), and after the fix (the canary of the change that was
kept, when one was). Gates are the accepted ADRs' (the diagnosis's baseline).
"""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bot.adr import Adr
from bot.canary import CanaryReport, values_of
from bot.change import diff
from bot.diagnosis import GATE_OF, cause_text, from_summary, summary_numbers
from bot.incidents import memory
from bot.kernel.numbers import FOUR, Bound, Reading, bounds_of, compare, show_reading
from bot.kernel.store import ChangeState, DiagnosisSummary, StoredReplica
from bot.remediation import STATES, gate_lines, number_lines
from bot.surfaces.web.queries import (
    AlertRow,
    AuditRow,
    CanaryRow,
    DraftRow,
    IncidentRecord,
    IndexRow,
    RemediationRow,
)

AdrLookup = Callable[[str], Adr | None]
GOOD, BAD, NEUTRAL = "good", "bad", "neutral"
ENDED_BAD = {
    ChangeState.ROLLED_BACK,
    ChangeState.FAILED,
    ChangeState.CANCELLED,
    ChangeState.EXPIRED,
    ChangeState.INTERRUPTED,
}


def four_number(key: str, value: Reading | float | None, bound: Bound | None = None) -> str:
    """One of the four numbers as every surface writes it ('≤ 10.0 ms' for a bound, an
    estimate with its span); a failed request's unbounded latency says so."""
    reading = value if isinstance(value, Reading) or value is None else Reading(value, bound)
    text = show_reading(key, reading)
    return "∞ (requests failed)" if text == "∞" else text


def _within(key: str, value: Reading | float | None, gate: float | None) -> str:
    if value is None or gate is None:
        return NEUTRAL
    reading = value if isinstance(value, Reading) else Reading(value)
    worse_up = next(w for k, _, _, w in FOUR if k == key)
    ok = compare(reading, "<=" if worse_up else ">=", Reading(gate))
    return NEUTRAL if ok is None else (GOOD if ok else BAD)


@dataclass(frozen=True)
class NumberRow:
    """One of the four numbers: normal, incident, after the fix, and its gate."""

    label: str
    normal: str
    incident: str
    incident_tone: str
    after: str
    after_tone: str
    gate: str
    gate_adr: str


@dataclass(frozen=True)
class ReplicaLine:
    """One replica of a fleet: its p99s, each from its own histogram, and the rule's verdict."""

    replica: str
    state: str
    tone: str
    requests: str
    ttft: str
    tpot: str
    queue: str
    why: str


@dataclass(frozen=True)
class Fleet:
    """The replica rule's verdict (docs/fleet.md): its line, what to do by hand, every replica."""

    line: str
    by_hand: str | None
    rows: list[ReplicaLine]
    min_requests: int


def _fleet(summary: DiagnosisSummary) -> Fleet | None:
    """The per-replica table of a fleet's diagnosis (None: one engine)."""
    fleet = summary.replicas
    if not fleet:
        return None
    rows = []
    for row in fleet.rows:

        def cell(key: str, row: StoredReplica = row) -> str:
            bound = bounds_of(row.bounds).get(key)
            return four_number(key, getattr(row, key), bound)

        tone = BAD if row.state == "slow" else (GOOD if row.state == "ok" else NEUTRAL)
        pool = (row.model_extra or {}).get("pool")  # prefill/decode: the pool it was judged in
        why = "; ".join(w for w in (pool and f"{pool} pool", row.why, row.note) if w)
        requests = "n/a" if row.requests is None else str(row.requests)
        rows.append(ReplicaLine(row.replica, row.state, tone, requests, cell("ttft_p99_ms"),
                                cell("tpot_p99_ms"), cell("queue_time_p99_ms"), why))  # fmt: skip
    return Fleet(line=fleet.line, by_hand=fleet.by_hand, rows=rows,
                 min_requests=fleet.rule.min_requests)  # fmt: skip


@dataclass(frozen=True)
class PageEvent:
    """One line of the timeline."""

    at: str
    actor: str
    text: str
    tone: str = NEUTRAL


@dataclass(frozen=True)
class AdrCard:
    """A matched accepted ADR."""

    id: str
    title: str
    conditions: list[str]
    fix: list[str]
    gates: list[str]


@dataclass(frozen=True)
class RemediationCard:
    """One change: what it asked, who approved, how the canary judged it, how it ended."""

    id: int
    adr_id: str
    state: str
    tone: str
    requested_by: str
    approved_by: list[str]
    diff: list[str]
    gates: list[str]
    numbers: list[str]
    failures: list[str]
    reason: str
    how_sure: list[str] = field(default_factory=list)  # each per-request gate's statistics
    watched: list[str] = field(default_factory=list)  # ungated numbers made worse (guardrails)


@dataclass(frozen=True)
class CanaryRunView:
    """One canary run and its verdict."""

    label: str
    at: str
    passed: bool
    numbers: list[tuple[str, str]]


@dataclass(frozen=True)
class DraftCard:
    """The post-incident ADR draft."""

    adr_id: str
    state: str
    author: str
    reviewed_by: str | None
    markdown: str | None


@dataclass(frozen=True)
class IncidentPage:
    """Everything the incident template prints."""

    id: int
    title: str
    status: str
    status_tone: str
    source: str
    target: str
    opened: str
    closed: str | None
    alerts: list[str]
    diagnosed: bool
    runbook: str | None
    numbers: list[NumberRow]
    after_label: str | None
    findings: list[tuple[str, str, str]]
    chart: bool
    chart_history: bool  # the chart has the metric's Prometheus history beside the window
    adrs: list[AdrCard]
    remediations: list[RemediationCard]
    canaries: list[CanaryRunView]
    drafts: list[DraftCard]
    timeline: list[PageEvent]
    notes: list[str] = field(default_factory=list)
    fleet: Fleet | None = None  # a fleet's replicas, judged one against the others
    cause_line: str | None = None  # the likely cause and its number (None: not diagnosed)
    causes: cause_text.CauseLines | None = None  # supported, ruled out, cannot tell, gaps
    memory: list[str] = field(default_factory=list)  # the thread's memory lines, as text


def when(at: dt.datetime) -> str:
    """'2026-11-29 19:10:03 UTC'."""
    return f"{at.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S} UTC"


def incident_page(
    record: IncidentRecord, *, adr: AdrLookup, markdown: Callable[[Adr], str]
) -> IncidentPage:
    """The page of one incident."""
    summary = record.summary
    kept = _kept_canary(record)
    numbers = _numbers(summary, None if kept is None else kept.report)
    status = "on demand" if record.source == "slash" else record.status
    tone = GOOD if record.status == "resolved" or record.source == "slash" else BAD
    return IncidentPage(
        id=record.id,
        title=record.title,
        status=status,
        status_tone=tone,
        source=record.source,
        target=record.target or "unknown",
        opened=when(record.opened_at),
        closed=None if record.closed_at is None else when(record.closed_at),
        alerts=[_alert_line(a) for a in record.alerts],
        diagnosed=summary.diagnosed,
        runbook=summary.runbook,
        numbers=numbers,
        after_label=None if kept is None else kept.label,
        findings=list(summary.findings),
        chart=bool(summary.chart),
        chart_history=bool((summary.chart or {}).get("history")),
        adrs=[_adr_card(adr_id, adr) for adr_id in summary.matches],
        remediations=[_remediation(r) for r in record.remediations],
        canaries=[_canary(c) for c in record.canaries],
        drafts=[_draft(d, adr, markdown) for d in record.drafts],
        timeline=[_event(e) for e in record.audit],
        notes=["Diagnosis failed: see the timeline."] if summary.failed else [],
        fleet=_fleet(summary),
        **_causes(summary),
        memory=[remembered(m) for m in record.memories],
    )


def remembered(found: memory.Memory) -> str:
    """The thread's memory line as plain text (the page escapes it as HTML): the same words,
    without Slack's escaping and its bold cause name."""
    line = html.unescape(memory.memory_line(found))
    return line.replace(f"*{found.cause}*", found.cause, 1)


def _causes(summary: DiagnosisSummary) -> dict[str, Any]:
    """The likely cause's line and the causes grouped (none before a diagnosis has them)."""
    if not summary.causes:  # not diagnosed yet, or a runbook without hypotheses
        return {}
    verdicts = from_summary(summary)
    return {"cause_line": cause_text.root_line(verdicts), "causes": cause_text.lines(verdicts)}


def index_rows(rows: Sequence[IndexRow]) -> list[dict[str, Any]]:
    """The index table: one line per incident, newest first."""
    out = []
    for r in rows:
        headline = r.summary.headline
        out.append(
            {
                "id": r.id,
                "title": r.title,
                "status": "on demand" if r.source == "slash" else r.status,
                "tone": GOOD if r.status == "resolved" or r.source == "slash" else BAD,
                "target": r.target or "unknown",
                "opened": when(r.opened_at),
                "numbers": ", ".join(
                    f"{label} {four_number(key, headline.get(key))}"
                    for key, label, _, _ in FOUR
                    if headline.get(key) is not None
                ),
            }
        )
    return out


def _numbers(summary: DiagnosisSummary, kept: CanaryReport | None) -> list[NumberRow]:
    """Each number: normal and the incident (the engine's, like for like, against the strictest
    accepted gate) and the kept change's canary (client side, against the gates it was judged
    by: a different source, so never coloured by the incident's gate)."""
    baseline = summary.baseline
    after = values_of(kept).numbers() if kept is not None else {}
    judged = {g.name: g.passed for g in kept.gates} if kept is not None else {}
    measured, usual = summary_numbers(summary), summary_numbers(summary, "normal")
    rows = []
    for key, label, _, worse_up in FOUR:
        limit, adr = baseline.get(key, (None, ""))
        rows.append(
            NumberRow(
                label=label,
                normal=four_number(key, usual.reading(key)),
                incident=four_number(key, measured.reading(key)),
                incident_tone=_within(key, measured.reading(key), limit),
                after="" if kept is None else four_number(key, after.get(key)),
                after_tone=_judged_tone(judged.get(GATE_OF[key])),
                gate="none"
                if limit is None
                else f"{'≤' if worse_up else '≥'} {four_number(key, limit)}",
                gate_adr=adr,
            )
        )
    return rows


def _judged_tone(passed: bool | None) -> str:
    """Green or red as the canary's own verdict on the gate said; plain when it had none."""
    return NEUTRAL if passed is None else GOOD if passed else BAD


def _kept_canary(record: IncidentRecord) -> CanaryRow | None:
    """The canary that passed on the change that was kept (the "after the fix" numbers)."""
    kept = {r.id for r in record.remediations if r.state == ChangeState.PROMOTED}
    runs = [c for c in record.canaries if c.remediation_id in kept and c.passed]
    after = [c for c in runs if not c.label.startswith("before:")]
    return after[-1] if after else None


def _adr_card(adr_id: str, lookup: AdrLookup) -> AdrCard:
    found = lookup(adr_id)
    if found is None:
        return AdrCard(adr_id, "(no longer in the ADR store)", [], [], [])
    rules = found.fix.gateway.model_dump(exclude_none=True) if found.fix.gateway else {}
    gateway = [f"gateway: {k} = {_flag(v)}" for k, v in rules.items()]
    return AdrCard(
        id=found.id,
        title=found.title,
        conditions=[f"{c.metric} {c.op} {c.value}" for c in found.match],
        fix=[f"--{k}={_flag(v)}" for k, v in found.fix.engine_args.items()] + gateway,
        gates=[f"{k}: {v}" for k, v in found.gates.describe().items()] if found.gates else [],
    )


def _draft(d: DraftRow, lookup: AdrLookup, render: Callable[[Adr], str]) -> DraftCard:
    found = lookup(d.adr_id)
    markdown = None if found is None else render(found)
    return DraftCard(d.adr_id, d.state, d.author, d.reviewed_by, markdown)


def _alert_line(a: AlertRow) -> str:
    return f"{a.name} ({a.status}) since {a.starts_at}" + (f": {a.summary}" if a.summary else "")


def _remediation(r: RemediationRow) -> RemediationCard:
    tone = GOOD if r.state == ChangeState.PROMOTED else (BAD if r.state in ENDED_BAD else NEUTRAL)
    changed = diff(r.before.get("flags", {}), r.after.get("flags", {}))
    return RemediationCard(
        id=r.id,
        adr_id=r.adr_id,
        state=STATES.get(r.state, r.state),
        tone=tone,
        requested_by=r.requested_by,
        approved_by=list(r.approved_by),
        diff=[f"--{name}: {_flag(old)} → {_flag(new)}" for name, old, new in changed],
        gates=gate_lines(dict(r.result.get("gates") or {})),
        numbers=number_lines(
            dict(r.result.get("numbers") or {}), dict(r.result.get("before_numbers") or {})
        ),
        failures=[str(f) for f in r.result.get("failures") or []],
        reason=str(r.result.get("reason") or ""),
        how_sure=[str(s) for s in r.result.get("how_sure") or []],
        watched=[str(w) for w in r.result.get("watched") or []],
    )


def _flag(value: object) -> str:
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _canary(c: CanaryRow) -> CanaryRunView:
    values = values_of(c.report)
    return CanaryRunView(
        label=c.label,
        at=when(c.at),
        passed=c.passed,
        numbers=[(label, four_number(key, getattr(values, key))) for key, label, _, _ in FOUR],
    )


def _event(e: AuditRow) -> PageEvent:
    """One audit entry in words."""
    d = e.detail
    action = e.action
    if action == "incident.opened":
        return PageEvent(when(e.at), e.actor, "alert received: incident opened", BAD)
    if action == "incident.resolved":
        return PageEvent(when(e.at), e.actor, "the alert resolved", GOOD)
    if action == "diagnose.requested":
        return PageEvent(when(e.at), e.actor, f"/diagnose {d.get('target', '')} requested")
    if action == "diagnosis.finished":
        headline = d.get("headline") or {}
        shown = ", ".join(
            f"{label} {four_number(key, headline.get(key))}" for key, label, _, _ in FOUR
        )
        return PageEvent(when(e.at), e.actor, f"diagnosed ({d.get('runbook', '?')}): {shown}")
    if action == "diagnosis.failed":
        why = d.get("error") or f"unexpected error (id {d.get('error_id', '?')})"
        return PageEvent(when(e.at), e.actor, f"diagnosis failed: {why}", BAD)
    if action.startswith("remediation."):
        state = action.split(".", 1)[1]
        text = STATES.get(state, state.replace("_", " "))
        adr, reason = d.get("adr"), d.get("reason")
        good = state in (ChangeState.PROMOTED, "canary_passed")
        tone = GOOD if good else (BAD if state in ENDED_BAD else NEUTRAL)
        text = (f"/apply-adr {adr}: " if adr else "") + text + (f" ({reason})" if reason else "")
        return PageEvent(when(e.at), e.actor, text, tone)
    if action.startswith("adr_draft."):
        return PageEvent(
            when(e.at), e.actor, f"ADR draft {d.get('adr', '')} {action.split('.')[1]}"
        )
    return PageEvent(when(e.at), e.actor, action.replace("_", " ").replace(".", ": "))
