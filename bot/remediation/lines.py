"""Gates and canary numbers as plain lines: the Slack card, the console, the incident page and
the scheduled jobs all say them the same way.

``gate_lines``: the gates as set (before any canary); ``verdict_lines``: a canary's verdict on
them, gate by gate, with the number measured and a mark; ``number_lines``: the numbers.
"""

from __future__ import annotations

from collections.abc import Mapping

from bot.canary import Verdict
from bot.kernel.numbers import catalogue, change, in_unit

# the catalogue's numbers as lines name them: gate -> (label, sign, unit), key -> (label, unit)
GATE_LABELS = {m.gate: (m.phrase, "≤" if m.worse_up else "≥", m.unit) for m in catalogue.METRICS}
NUMBER_LABELS = {m.key: (m.phrase, m.unit) for m in catalogue.HEADLINE}


def value_text(value: float | None, unit: str) -> str:
    """'212.4 ms', '93.0 %' or 'n/a'."""
    return "n/a" if value is None else in_unit(value, unit)


def gate_lines(gates: dict[str, float], relative: dict[str, str] | None = None) -> list[str]:
    """'TTFT p99 ≤ 350.0 ms', one per gate; relative: 'TPOT p99 ≤ 0.5x before (= 855.0 ms)'."""
    out = []
    relative = relative or {}
    for key, (label, op, unit) in GATE_LABELS.items():
        limit = gates.get(key)
        if key in relative:
            pending = "after the before-run" if "before" in relative[key] else "no normal yet"
            number = f"= {value_text(limit, unit)}" if limit is not None else pending
            out.append(f"{label} {op} {relative[key]} ({number})")
        elif limit is not None:
            out.append(f"{label} {op} {value_text(limit, unit)}")
    return out


def verdict_lines(verdict: Verdict, setters: Mapping[str, str]) -> str:
    """One line per gate: the measured number, the gate, the ADR that set it, and a mark."""
    return "\n".join(
        f"{':white_check_mark:' if r.passed else ':x:'} {r.shown()} "
        f"(gate {r.bound()}, {setters.get(r.name, 'always on')})"
        for r in verdict.results
    )


def number_lines(
    numbers: dict[str, float | None], before: dict[str, float | None] | None = None
) -> list[str]:
    """'TTFT p99 212.4 ms', one per measured number; with the before-run of the same canary,
    the change: 'TPOT p99 1,710.0 → 214.8 ms (-87 %)'."""
    out = []
    for key, (label, unit) in NUMBER_LABELS.items():
        if key not in numbers:
            continue
        now, was = numbers.get(key), (before or {}).get(key)
        if was is None or now is None:
            out.append(f"{label} {value_text(now, unit)}")
        else:
            out.append(f"{label} {change(key, was, now)}")
    return out
