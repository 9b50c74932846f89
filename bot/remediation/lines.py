"""A remediation's gates and canary numbers as plain lines: the Slack card, the console and the
incident page all say them the same way."""

from __future__ import annotations

GATE_LABELS = {
    "max_ttft_p99_ms": ("TTFT p99", "≤", "ms"),
    "max_tpot_p99_ms": ("TPOT p99", "≤", "ms"),
    "min_goodput_ratio": ("goodput", "≥", "ratio"),
    "max_kv_fragmentation": ("KV fragmentation", "≤", "ratio"),
}
NUMBER_LABELS = {
    "ttft_p99_ms": ("TTFT p99", "ms"),
    "tpot_p99_ms": ("TPOT p99", "ms"),
    "goodput_ratio": ("goodput", "ratio"),
    "kv_fragmentation": ("KV fragmentation", "ratio"),
}


def value_text(value: float | None, unit: str) -> str:
    """'212.4 ms', '93.0 %' or 'n/a'."""
    if value is None:
        return "n/a"
    return f"{value:,.1f} ms" if unit == "ms" else f"{value * 100:.1f} %"


def gate_lines(gates: dict[str, float], relative: dict[str, str] | None = None) -> list[str]:
    """'TTFT p99 ≤ 350.0 ms', one per gate; relative: 'TPOT p99 ≤ 2x normal (= 19.8 ms)'."""
    out = []
    relative = relative or {}
    for key, (label, op, unit) in GATE_LABELS.items():
        limit = gates.get(key)
        if key in relative:
            number = (
                f"= {value_text(limit, unit)}" if limit is not None else "no normal measured yet"
            )
            out.append(f"{label} {op} {relative[key]} ({number})")
        elif limit is not None:
            out.append(f"{label} {op} {value_text(limit, unit)}")
    return out


def number_lines(numbers: dict[str, float | None]) -> list[str]:
    """'TTFT p99 212.4 ms', one per measured number."""
    return [
        f"{label} {value_text(numbers.get(key), unit)}"
        for key, (label, unit) in NUMBER_LABELS.items()
        if key in numbers
    ]
