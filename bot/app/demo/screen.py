"""The demo's last screen: the four numbers normal / incident / after the fix, verdict, paths,
and the second act's shapes and re-validation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bot.app.demo.drift_act import DriftShown, console_line
from bot.kernel.numbers import FOUR, Measured, show_reading

Numbers = Mapping[str, float | None]


@dataclass(frozen=True)
class DemoResult:
    """What one demo run showed, for the last screen."""

    adr_id: str
    normal: Measured
    incident: Measured
    after: Measured  # the incident's load on the changed engine (empty: not measured)
    state: str  # the remediation's end: promoted, rolled_back, failed, ...
    matched: Sequence[str]  # the matching ADR's conditions, explained
    gates: Sequence[str]  # each gate with the canary's number and whether it was met
    chart: Path | None
    draft: Path
    drift: DriftShown | None = None  # the second act (None: the fix was not kept)
    notes: Sequence[str] = field(default_factory=tuple)
    how_sure: Sequence[str] = field(default_factory=tuple)  # each per-request gate's statistics
    watched: Sequence[str] = field(default_factory=tuple)  # ungated numbers, before vs after


def render(result: DemoResult) -> str:
    """The screen, as plain text."""
    verdict = {
        "promoted": "promoted: the canary met every gate",
        "rolled_back": "rolled back: the canary missed a gate",
    }.get(result.state, result.state)
    cells = {
        key: [
            show_reading(key, n.reading(key))
            for n in (result.normal, result.incident, result.after)
        ]
        for key, *_ in FOUR
    }
    # an estimate's span ("12.0 % (0.0–24.0 %)") widens its column
    width = max(14, *(len(c) + 2 for row in cells.values() for c in row))
    rows = [f"  {'':<18}{'normal':>{width}}{'incident':>{width}}{'after the fix':>{width + 2}}"]
    for key, label, *_ in FOUR:
        normal, incident, after = cells[key]
        rows.append(f"  {label:<18}{normal:>{width}}{incident:>{width}}{after:>{width + 2}}")
    lines = [
        "",
        "=" * 64,
        f"ruleloop demo: {result.adr_id} {verdict}",
        "=" * 64,
        *rows,
        *(f"  {note}" for note in result.notes),
        "",
        f"matched {result.adr_id}: " + "; ".join(result.matched),
        f"canary verdict: {verdict}",
        *(f"  {gate}" for gate in result.gates),
        *(f"  how sure: {line}" for line in result.how_sure),
        *(
            ["watched, not gated (the same canary before and after the fix):"]
            if result.watched
            else []
        ),
        *(f"  {line}" for line in result.watched),
        "",
        f"chart: {result.chart if result.chart is not None else 'none drawn'}",
        f"draft: {result.draft}",
        *_drift_lines(result.adr_id, result.drift),
    ]
    return "\n".join(lines) + "\n"


def _drift_lines(adr_id: str, drift: DriftShown | None) -> list[str]:
    """The second act: the rule's traffic, production's now, and the re-validation."""
    if drift is None:
        return []
    return [
        "",
        "the next workload (the scheduler's workload-drift job):",
        f"  {adr_id} was kept under: {drift.rule}",
        f"  production now sends:   {drift.live}",
        *(f"  moved: {line}" for line in drift.moved),
        *([f"  before on the live traffic: {drift.before}"] if drift.before else []),
        *(f"  re-validated: {line}" for line in drift.verdict),
        "  drift thread posted" if drift.posted else "  no thread posted",
        *([f"  next step offered: {drift.next_step}"] if drift.next_step else []),
        *([f"  re-tune: {console_line(drift.retune)}"] if drift.retune else []),
        *([f"  drafted for the live workload: {drift.retune_draft}"] if drift.retune_draft else []),
    ]
