"""The demo's last screen: the four numbers normal / incident / after the fix, verdict, paths."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bot.numbers.reading import Measured
from bot.numbers.text import FOUR, show

Numbers = Mapping[str, float | None]


@dataclass(frozen=True)
class Result:
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
    notes: Sequence[str] = field(default_factory=tuple)


def render(result: Result) -> str:
    """The screen, as plain text."""
    verdict = {
        "promoted": "promoted: the canary met every gate",
        "rolled_back": "rolled back: the canary missed a gate",
    }.get(result.state, result.state)
    rows = [f"  {'':<18}{'normal':>14}{'incident':>14}{'after the fix':>16}"]
    for key, label, *_ in FOUR:
        cells = [
            show(key, n.numbers.get(key), n.bounds.get(key))
            for n in (result.normal, result.incident, result.after)
        ]
        rows.append(f"  {label:<18}{cells[0]:>14}{cells[1]:>14}{cells[2]:>16}")
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
        "",
        f"chart: {result.chart if result.chart is not None else 'none drawn'}",
        f"draft: {result.draft}",
    ]
    return "\n".join(lines) + "\n"
